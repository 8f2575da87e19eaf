"""Data movement of the reference engine, staged like the hierarchical kernels.

Dispatch: network leg (a source's token goes once to its peer in every destination domain),
then NVLink leg (the peer writes it to every rank of its domain that wants it).
Combine: NVLink leg (the peer pre-reduces the copies of its domain in fp32), then network leg
(the source adds the partial sums of the domains). Only handle contents steer the movement, so
a reused handle moves data exactly like the call that made it.
"""

from __future__ import annotations

import torch

from ..topology import Topology
from .comm import all_gather_ints, all_gather_rows


def forward_to_domain(rows: torch.Tensor, rdma_to_attn: torch.Tensor, tokens: int,
                      topo: Topology, group) -> torch.Tensor:
    """Network leg. ``rows`` [T_r, X...] of each rank -> this rank's receive tiles [N*T, X...]:
    tile n'*T + t holds row t of the peer in domain n' when it is routed to this domain."""
    gathered = all_gather_rows(rows, tokens, group)  # [W, T, X...]
    peers = [topo.peer(n) for n in range(topo.num_of_nodes)]
    tiles = gathered[peers].clone()  # [N, T, X...]
    received = rdma_to_attn[:tokens].transpose(0, 1).to(tiles.device)  # [N, T]
    # Zero through a byte view: masked writes are not defined for every FP8 dtype.
    tiles.view(torch.uint8)[~received] = 0
    return tiles.reshape(topo.num_of_nodes * tokens, *rows.shape[1:])


def scatter_in_domain(tiles: torch.Tensor, sparse_to_dense: torch.Tensor, num_rows: int,
                      topo: Topology, group) -> torch.Tensor:
    """NVLink leg. Every rank of the domain writes its tiles to the rows of this rank."""
    all_tiles = all_gather_rows(tiles, tiles.shape[0], group)
    all_maps = all_gather_rows(sparse_to_dense, sparse_to_dense.shape[0], group)
    out = torch.zeros(num_rows, *tiles.shape[1:], dtype=tiles.dtype, device=tiles.device)
    first = topo.node_rank * topo.ranks_per_domain
    for forwarder in range(first, first + topo.ranks_per_domain):
        rows_here = all_maps[forwarder][:, topo.local_rank].to(torch.int64)
        valid = rows_here >= 0
        out.view(torch.uint8)[rows_here[valid].to(out.device)] = (
            all_tiles[forwarder].view(torch.uint8)[valid.to(out.device)])
    return out


def reduce_in_domain(rows: torch.Tensor, sparse_to_dense: torch.Tensor, topo: Topology, group,
                     column_block: int | None = None) -> torch.Tensor:
    """NVLink leg of combine: fp32 sum over the domain's copies of every forwarded token.

    ``rows`` [D_r, X] fp32 on each rank. With ``column_block`` the copy of local rank j only
    contributes its own columns j*block:(j+1)*block (probabilities); otherwise whole rows add up.
    """
    max_rows = int(all_gather_ints([rows.shape[0]], group).max())
    partial = torch.zeros(sparse_to_dense.shape[0], rows.shape[1], dtype=torch.float32,
                          device=rows.device)
    if max_rows == 0:  # nobody received anything: every partial sum is zero
        return partial
    gathered = all_gather_rows(rows, max_rows, group)  # [W, D_max, X]
    first = topo.node_rank * topo.ranks_per_domain
    for j in range(topo.ranks_per_domain):
        src_rows = sparse_to_dense[:, j].to(torch.int64).to(rows.device)
        valid = src_rows >= 0
        contribution = gathered[first + j][src_rows.clamp(min=0)]
        contribution[~valid] = 0
        if column_block is None:
            partial += contribution
        else:
            cols = slice(j * column_block, (j + 1) * column_block)
            partial[:, cols] += contribution[:, cols]
    return partial


def return_to_source(partial: torch.Tensor, rdma_to_attn: torch.Tensor, tokens: int,
                     num_rows: int, topo: Topology, group,
                     concat_domains: bool = False) -> torch.Tensor:
    """Network leg of combine: every domain's peer sends this rank its partial sums.

    Sums them in ascending domain order, or with ``concat_domains`` places domain m's partial
    in columns block m (probabilities: each domain owns its E*R columns).
    """
    gathered = all_gather_rows(partial, partial.shape[0], group)  # [W, N*T, X]
    all_flags = all_gather_rows(rdma_to_attn, rdma_to_attn.shape[0], group)  # [W, T16, N]
    width = partial.shape[1]
    nodes = topo.num_of_nodes
    out = torch.zeros(num_rows, width * nodes if concat_domains else width,
                      dtype=torch.float32, device=partial.device)
    mine = slice(topo.node_rank * tokens, topo.node_rank * tokens + num_rows)
    for node in range(nodes):
        peer = topo.peer(node)
        arrived = all_flags[peer][:num_rows, topo.node_rank].to(partial.device)
        piece = gathered[peer][mine].clone()
        piece[~arrived] = 0
        if concat_domains:
            out[:, node * width:(node + 1) * width] = piece
        else:
            out += piece
    return out
