"""Handles: the tuples dispatch returns and combine (or a backward pass) passes back.

Positions follow docs/semantics.md (the dispatch and permute handles). The last-but-one (permute) or last (dispatch) entry is the call's
``HybridEPConfig``; it ties the handle to its buffer and records the call's mode.
"""

from __future__ import annotations

import torch

from .config import HybridEPConfig
from .layouts import DispatchLayout

DISPATCH_HANDLE_LEN = 7
PERMUTE_HANDLE_LEN = 11


def make_dispatch_handle(layout: DispatchLayout, tokens: int, config: HybridEPConfig,
                         device: torch.device) -> tuple:
    return (
        layout.sparse_to_dense_map.to(device),
        layout.rdma_to_attn_map.to(device),
        layout.attn_to_rdma_map.to(device),
        layout.num_dispatched_tokens_tensor.to(device),
        layout.local_expert_routing_map.to(device),
        tokens,
        config,
    )


def make_permute_handle(layout: DispatchLayout, dense_chunk_layout: torch.Tensor,
                        dense_to_expert_map: torch.Tensor, raw_tokens_per_expert: torch.Tensor,
                        tokens: int, config: HybridEPConfig, overflow_flag: torch.Tensor,
                        device: torch.device) -> tuple:
    return make_dispatch_handle(layout, tokens, config, device)[:5] + (
        dense_chunk_layout.to(device),
        dense_to_expert_map.to(device),
        raw_tokens_per_expert.to(device),
        tokens,
        config,
        overflow_flag.to(device),
    )


def handle_config(handle) -> HybridEPConfig | None:
    if not isinstance(handle, tuple) or len(handle) not in (DISPATCH_HANDLE_LEN,
                                                            PERMUTE_HANDLE_LEN):
        return None
    config = handle[6] if len(handle) == DISPATCH_HANDLE_LEN else handle[9]
    return config if isinstance(config, HybridEPConfig) else None


def check_handle(handle, buffer_config: HybridEPConfig, *, permute: bool,
                 caller: str) -> HybridEPConfig:
    """The handle's config, after checking it belongs to this buffer and to ``caller``'s mode."""
    config = handle_config(handle)
    if config is None:
        kind = type(handle).__name__
        size = len(handle) if isinstance(handle, tuple) else "-"
        raise TypeError(f"handle: expected the tuple returned by dispatch (7 entries) or "
                        f"dispatch_with_permute (11 entries), got a {kind} of {size} entries")
    if config.buffer_id != buffer_config.buffer_id:
        raise ValueError(f"handle: made by another HybridEPBuffer (buffer id {config.buffer_id}, "
                         f"this one is {buffer_config.buffer_id}); a handle only works with "
                         "the buffer that made it")
    if config.layout_key() != buffer_config.layout_key():
        raise ValueError(
            "handle: its config no longer matches the buffer (made with num_local_experts="
            f"{config.num_local_experts}, ranks per domain {config.num_of_ranks_per_node}; now "
            f"{buffer_config.num_local_experts}, {buffer_config.num_of_ranks_per_node}); "
            "dispatch again to get a fresh handle")
    if config.with_permute != permute:
        made_by = "dispatch_with_permute" if config.with_permute else "dispatch"
        partner = "combine_with_unpermute" if config.with_permute else "combine"
        raise ValueError(f"handle: made by {made_by}, so it belongs to {partner} (or "
                         f"{made_by} again), not to {caller}")
    return config


def layout_from_handle(handle) -> DispatchLayout:
    config = handle_config(handle)
    return DispatchLayout(
        sparse_to_dense_map=handle[0],
        rdma_to_attn_map=handle[1],
        attn_to_rdma_map=handle[2],
        num_dispatched_tokens_tensor=handle[3],
        local_expert_routing_map=handle[4],
        num_dispatched_tokens=config.num_dispatched_tokens,
        # A permute handle's entry 5; a dispatch handle's is its token count.
        dense_chunk_layout=handle[5] if config.with_permute else None,
        own_rows=config.own_rows,
    )
