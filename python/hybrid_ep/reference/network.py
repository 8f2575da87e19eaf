"""The network legs as the transport performs them: which puts and signals they issue.

A token crosses the network once per destination domain, to the peer with the same local rank
there. Per (chunk, destination domain) the sender issues one put per maximal run of consecutive
tokens for each tensor (rows, probs, FP8 scales) — a dense chunk is one run, so one put per
tensor — and exactly one signal, also when the chunk holds no token for that domain, so the
receiver never waits forever. In the eager form (HYBRID_EP_EAGER) a chunk (dispatch or combine)
with tokens for a domain is instead one put of their records in 4 KiB tiles that carry their own signals
(memory/eager_tiles.h), counted with its tiles and no signal, and an empty one sends nothing.
The dispatch sends chunk c from block c % blocks, the combine
chunk c of the k-th other domain from block (c * (N - 1) + k) % blocks; a block sends on
channel block % channels.
The reference engine counts these operations so that tests (and the CUDA engine's counters)
have an oracle; docs/multi-domain.md (Dispatch, Combine) states the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def plan_runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """Maximal runs of True in a 1-D bool mask, as (start, length), ascending."""
    flags = mask.to(torch.int8)
    edges = torch.diff(flags, prepend=flags.new_zeros(1), append=flags.new_zeros(1))
    starts = torch.nonzero(edges == 1).flatten().tolist()
    ends = torch.nonzero(edges == -1).flatten().tolist()
    return [(s, e - s) for s, e in zip(starts, ends, strict=True)]


def restripe_probs(probs: torch.Tensor, nodes: int) -> torch.Tensor:
    """[T, nodes * E*R] (token-major) -> [nodes, T, E*R] (destination-major), so that the probs
    of a chunk's tokens for one destination domain are one contiguous block (one put)."""
    tokens, columns = probs.shape
    if columns % nodes != 0:
        raise ValueError(f"probs: {columns} columns do not split into {nodes} domains")
    return probs.reshape(tokens, nodes, columns // nodes).transpose(0, 1).contiguous()


@dataclass
class ChannelStats:
    puts: int = 0
    signals: int = 0
    bytes: int = 0
    eager_tiles: int = 0


@dataclass
class TransportStats:
    """Cumulative counters per channel of this rank's sends."""

    channels: list[ChannelStats] = field(default_factory=list)

    @staticmethod
    def with_channels(count: int) -> TransportStats:
        return TransportStats([ChannelStats() for _ in range(count)])

    def plus(self, channels: list[dict]) -> TransportStats:
        """These counts with another source's per channel ({puts, signals, bytes, eager_tiles})
        added."""
        return TransportStats([
            ChannelStats(**{key: getattr(mine, key) + other[key] for key in vars(mine)})
            for mine, other in zip(self.channels, channels, strict=True)])

    def as_dict(self) -> dict:
        per_channel = [vars(c).copy() for c in self.channels]
        totals = {key: sum(c[key] for c in per_channel)
                  for key in ("puts", "signals", "bytes", "eager_tiles")}
        return {"channels": per_channel, **totals}


@dataclass(frozen=True)
class RowWidths:
    """Bytes per token of each tensor a put moves (0: the tensor is not sent)."""

    row: int
    probs: int
    scales: int


EAGER_TILE_BYTES = 4096
EAGER_SIGNAL_BYTES = 16
EAGER_DATA_BYTES = EAGER_TILE_BYTES - EAGER_SIGNAL_BYTES


def _align16(n: int) -> int:
    return -(-n // 16) * 16


def eager_record(widths: RowWidths) -> int:
    """Bytes of one token's record in the eager form: its row, probs and scales, each part from
    a 16-byte boundary."""
    return _align16(_align16(_align16(widths.row) + widths.probs) + widths.scales)


def eager_tiles(payload: int) -> tuple[int, int]:
    """(tiles, wire bytes) of an eager payload of ``payload`` bytes: 4080 data bytes and a
    16-byte signal per tile, the last tile's data rounded up to 16."""
    if payload == 0:
        return 0, 0
    tiles = -(-payload // EAGER_DATA_BYTES)
    last = payload - (tiles - 1) * EAGER_DATA_BYTES
    return tiles, (tiles - 1) * EAGER_TILE_BYTES + _align16(last) + EAGER_SIGNAL_BYTES


def count_dispatch_sends(stats: TransportStats, attn_to_rdma: torch.Tensor, tokens: int,
                         chunk: int, blocks: int, widths: RowWidths,
                         per_token_probs: bool = False, eager: bool = False) -> None:
    """Adds one dispatch's network sends of this rank to ``stats``.

    ``attn_to_rdma`` is the handle's bool [T, N-1] map (this rank's token t goes to the k-th
    other domain); every chunk of the buffer's T tokens is signalled to every other domain.
    With ``per_token_probs`` (HYBRID_EP_PROB_PUTS=token) the probs take one put per token.
    ``eager`` (HYBRID_EP_EAGER): a (chunk, domain) with n tokens is one put of n records in
    tiles (its wire bytes, its tiles counted apart) and no signal; with none, nothing.
    """
    channels = len(stats.channels)
    chunks = -(-tokens // chunk)
    tensors = [w for w in (widths.row, widths.probs, widths.scales) if w]
    for c in range(chunks):
        channel = stats.channels[(c % blocks) % channels]
        rows = attn_to_rdma[c * chunk:(c + 1) * chunk].cpu()
        for k in range(rows.shape[1]):
            runs = plan_runs(rows[:, k])
            sent = sum(length for _, length in runs)
            if eager:
                tiles, wire = eager_tiles(sent * eager_record(widths))
                channel.puts += 1 if sent else 0
                channel.bytes += wire
                channel.eager_tiles += tiles
                continue
            channel.puts += len(runs) * len(tensors)
            if per_token_probs and widths.probs:
                channel.puts += sent - len(runs)
            channel.bytes += sent * sum(tensors)
            channel.signals += 1


def count_combine_sends(stats: TransportStats, rdma_to_attn: torch.Tensor, node_rank: int,
                        tokens: int, chunk: int, blocks: int, widths: RowWidths,
                        eager: bool = False) -> None:
    """Adds one combine's network sends of this rank to ``stats``: the fp32 partial sums (and
    partial probs) of the tokens each other domain's peer sent here go back to that peer.

    ``rdma_to_attn`` is the handle's bool [ceil16(T), N] map (token t of the peer in domain n
    came to this domain). Per (chunk, other domain): one put per maximal run per tensor and
    one signal; chunk c of the k-th other domain (in the order node_rank + 1, node_rank + 2,
    ...) is pair q = c * (N - 1) + k, reduced and sent by block q % blocks on channel
    (q % blocks) % channels, ``blocks`` being the combine's SM count (combine_across.cuh's
    ChunkWalk). ``eager`` (HYBRID_EP_EAGER): as the dispatch's, a (chunk, domain) with n
    tokens is one put of n records (partial and probs) in tiles and no signal; with none,
    nothing.
    """
    channels = len(stats.channels)
    chunks = -(-tokens // chunk)
    tensors = [w for w in (widths.row, widths.probs, widths.scales) if w]
    came = rdma_to_attn[:tokens].cpu()
    nodes = came.shape[1]
    for c in range(chunks):
        rows = came[c * chunk:(c + 1) * chunk]
        for k in range(nodes - 1):
            n = (node_rank + 1 + k) % nodes
            channel = stats.channels[((c * (nodes - 1) + k) % blocks) % channels]
            runs = plan_runs(rows[:, n])
            if eager:
                sent = sum(length for _, length in runs)
                tiles, wire = eager_tiles(sent * eager_record(widths))
                channel.puts += 1 if sent else 0
                channel.bytes += wire
                channel.eager_tiles += tiles
                continue
            channel.puts += len(runs) * len(tensors)
            channel.bytes += sum(length for _, length in runs) * sum(tensors)
            channel.signals += 1
