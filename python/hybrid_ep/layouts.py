"""What a dispatch's metadata produced, as both engines hand it on: the handle's maps
(``DispatchLayout``) and a permute's plan (``PermuteLayout``). docs/semantics.md defines every
entry; the reference engine computes them with torch (reference/layout.py), the CUDA engine on
the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class DispatchLayout:
    sparse_to_dense_map: torch.Tensor  # int32 [T*N, R]
    rdma_to_attn_map: torch.Tensor  # bool [ceil16(T), N]
    attn_to_rdma_map: torch.Tensor  # bool [T, N-1]
    num_dispatched_tokens_tensor: torch.Tensor  # int32 [1]
    local_expert_routing_map: torch.Tensor  # bool [T*W, E]
    # None in the CUDA engine's non-blocking mode: the count stays on the device.
    num_dispatched_tokens: int | None
    # CUDA engine: handle entry 5 of a permute call, from the metadata kernel.
    dense_chunk_layout: torch.Tensor | None = None
    # CUDA engine, blocking permute calls: rows per local expert (host), read at the one sync.
    expert_counts: torch.Tensor | None = None
    # CUDA engine, blocking calls: rows [begin, end) of the dispatch order that are this rank's
    # own tokens (read at the one sync); inside one domain they skip the registered buffer.
    own_rows: tuple[int, int] | None = None
    # int32 [1] on the call's device: rows routed to this rank past the receive cap, dropped
    # (non-blocking calls; a blocking call grows instead and leaves 0). None with a handle.
    dropped_rows: torch.Tensor | None = None


@dataclass
class PermuteLayout:
    dense_to_expert_map: torch.Tensor  # int32 [T*W, E]
    raw_tokens_per_expert: torch.Tensor  # int32 [E]
    padded_tokens_per_expert: torch.Tensor  # int64 [E], clipped to the output
    num_permuted_tokens: int
    overflow: bool | torch.Tensor  # a tensor (int32 [1], on the device) in the CUDA engine
    row_source: torch.Tensor | None = None  # CUDA engine: int32 [P], dispatch row * E + expert
