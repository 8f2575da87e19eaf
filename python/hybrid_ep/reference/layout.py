"""Metadata preprocessing of the reference engine: the handle's maps from the gathered routing.

Written with whole-tensor operations over the gathered routing maps; docs/semantics.md defines
every entry.
"""

from __future__ import annotations

import torch

from ..layouts import DispatchLayout, PermuteLayout, ceil_div
from ..topology import Topology


def largest_received(routing: torch.Tensor, experts_per_rank: int) -> int:
    """The most rows any rank is routed (before a receive cap), from bool [W, T, E_total]."""
    world, tokens, _ = routing.shape
    to_rank = routing.view(world, tokens, world, experts_per_rank).any(-1)  # [W, T, W]
    return int(to_rank.sum((0, 1)).max())


def dispatch_layout(routing: torch.Tensor, topo: Topology, experts_per_rank: int,
                    received: int | None = None) -> DispatchLayout:
    """``routing``: bool [W, T, E_total], every rank's map zero-padded to the buffer's T.
    Rows at or past ``received`` (the receive cap; None: none) in a destination are dropped:
    -1 in the sparse-to-dense map, not counted in D, no local experts."""
    world, tokens, _ = routing.shape
    ranks, nodes = topo.ranks_per_domain, topo.num_of_nodes
    me, my_node, my_local = topo.rank, topo.node_rank, topo.local_rank
    cap = world * tokens if received is None else received

    to_rank = routing.view(world, tokens, world, experts_per_rank).any(-1)  # [W, T, W]
    flat = to_rank.reshape(world * tokens, world).to(torch.int32)
    row_in_dest = flat.cumsum(0, dtype=torch.int32) - 1
    row_in_dest = torch.where(flat.bool() & (row_in_dest < cap), row_in_dest, -1)
    row_in_dest = row_in_dest.view(world, tokens, world)

    dev = routing.device
    peers = torch.arange(nodes, device=dev) * ranks + my_local
    my_node_ranks = slice(my_node * ranks, (my_node + 1) * ranks)
    sparse_to_dense = row_in_dest[peers][:, :, my_node_ranks].reshape(nodes * tokens, ranks)

    to_node = to_rank.view(world, tokens, nodes, ranks).any(-1)  # [W, T, N]
    rdma_to_attn = torch.zeros(ceil_div(tokens, 16) * 16, nodes, dtype=torch.bool, device=dev)
    rdma_to_attn[:tokens] = to_node[peers][:, :, my_node].transpose(0, 1)
    other_nodes = [n for n in range(nodes) if n != my_node]
    attn_to_rdma = to_node[me][:, other_nodes].contiguous()

    mine = to_rank[:, :, me].reshape(-1)
    routed = int(mine.sum())
    dispatched = min(routed, cap)
    local_experts = routing[:, :, me * experts_per_rank:(me + 1) * experts_per_rank]
    local_expert_routing = torch.zeros(world * tokens, experts_per_rank, dtype=torch.bool,
                                       device=dev)
    local_expert_routing[:dispatched] = (
        local_experts.reshape(world * tokens, -1)[mine][:dispatched])

    return DispatchLayout(
        sparse_to_dense_map=sparse_to_dense.contiguous(),
        rdma_to_attn_map=rdma_to_attn,
        attn_to_rdma_map=attn_to_rdma,
        num_dispatched_tokens_tensor=torch.tensor([dispatched], dtype=torch.int32,
                                                  device=dev),
        local_expert_routing_map=local_expert_routing,
        num_dispatched_tokens=dispatched,
        dropped_rows=torch.tensor([routed - dispatched], dtype=torch.int32, device=dev),
    )


def dense_chunk_layout(routing: torch.Tensor, topo: Topology, experts_per_rank: int,
                       chunk: int, received: int | None = None) -> torch.Tensor:
    """int32 [W*C + 1]: first dispatch row of each (source rank, chunk), then D; rows past
    ``received`` (the receive cap) dropped, so no entry exceeds it."""
    world, tokens, _ = routing.shape
    me = topo.rank
    mine = routing[:, :, me * experts_per_rank:(me + 1) * experts_per_rank].any(-1)  # [W, T]
    chunks = ceil_div(tokens, chunk)
    padded = torch.zeros(world, chunks * chunk, dtype=torch.int32, device=routing.device)
    padded[:, :tokens] = mine.to(torch.int32)
    per_chunk = padded.view(world * chunks, chunk).sum(-1)
    starts = torch.zeros(world * chunks + 1, dtype=torch.int32, device=routing.device)
    starts[1:] = per_chunk.cumsum(0)
    return starts if received is None else starts.clamp(max=received)


def padded_total(raw_counts: torch.Tensor, pad_multiple: int) -> int:
    return int((ceil_div_tensor(raw_counts, pad_multiple) * pad_multiple).sum())


def ceil_div_tensor(values: torch.Tensor, divisor: int) -> torch.Tensor:
    return torch.div(values + divisor - 1, divisor, rounding_mode="floor")


def permute_layout(local_expert_routing: torch.Tensor, num_dispatched: int, pad_multiple: int,
                   num_permuted_tokens: int | None) -> PermuteLayout:
    rows, experts = local_expert_routing.shape
    selected = local_expert_routing[:num_dispatched].to(torch.int64)  # [D, E]
    raw = selected.sum(0)
    padded = ceil_div_tensor(raw, pad_multiple) * pad_multiple
    offsets = padded.cumsum(0) - padded
    total = int(padded.sum())
    out_rows = total if num_permuted_tokens is None else num_permuted_tokens

    rank_in_expert = selected.cumsum(0) - 1
    target = offsets.unsqueeze(0) + rank_in_expert
    keep = selected.bool() & (target < out_rows)
    dense_to_expert = torch.full((rows, experts), -1, dtype=torch.int32,
                                 device=local_expert_routing.device)
    dense_to_expert[:num_dispatched] = torch.where(keep, target, -1).to(torch.int32)
    overflow = bool((selected.bool() & (target >= out_rows)).any())
    present = (out_rows - offsets).clamp(min=0)
    return PermuteLayout(
        dense_to_expert_map=dense_to_expert,
        raw_tokens_per_expert=raw.to(torch.int32),
        padded_tokens_per_expert=torch.minimum(present, padded),
        num_permuted_tokens=out_rows,
        overflow=overflow,
    )
