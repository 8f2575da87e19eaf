"""The permuted layout computed on the device, without a host synchronisation.

The same arithmetic as the reference's ``permute_layout`` (docs/semantics.md), in whole-tensor
operations that stay on the local expert routing map's device, so non-blocking calls and CUDA
graph capture work. Besides the handle's ``dense_to_expert_map`` it builds the inverse map the
permute kernel gathers with: ``row_source[o] = i * E + e`` for output row o holding dispatch
row i of expert e, -1 for padding and for the tail past the data.
"""

from __future__ import annotations

import torch

from .reference.layout import PermuteLayout, ceil_div_tensor


def padded_counts(raw: torch.Tensor, pad_multiple: int) -> torch.Tensor:
    return ceil_div_tensor(raw, pad_multiple) * pad_multiple


def device_permute_layout(local_expert_routing: torch.Tensor, pad_multiple: int,
                          num_permuted_tokens: int) -> PermuteLayout:
    """``local_expert_routing``: bool [rows, E] on the device, rows at or past the dispatched
    count all False (the metadata kernel writes them so). ``num_permuted_tokens``: P, known on
    the host (given by the caller, or summed from host-side counts in blocking mode)."""
    selected = local_expert_routing
    rows, experts = selected.shape
    device = selected.device
    as_int = selected.to(torch.int32)
    raw = as_int.sum(0, dtype=torch.int32)
    padded = padded_counts(raw, pad_multiple)
    offsets = padded.cumsum(0, dtype=torch.int32) - padded
    target = offsets.unsqueeze(0) + as_int.cumsum(0, dtype=torch.int32) - 1
    P = num_permuted_tokens
    keep = selected & (target < P)
    dense_to_expert = torch.where(keep, target, -1).to(torch.int32)
    overflow = (selected & (target >= P)).any().to(torch.int32).reshape(1)
    present = (P - offsets).clamp(min=0)
    code = (torch.arange(rows, dtype=torch.int32, device=device).unsqueeze(1) * experts
            + torch.arange(experts, dtype=torch.int32, device=device).unsqueeze(0))
    # Rows that land nowhere go to a spill slot P, dropped afterwards.
    slots = torch.where(keep, target, P).to(torch.int64).reshape(-1)
    source = torch.full((P + 1,), -1, dtype=torch.int32, device=device)
    source.scatter_(0, slots, code.reshape(-1))
    return PermuteLayout(
        dense_to_expert_map=dense_to_expert,
        raw_tokens_per_expert=raw,
        padded_tokens_per_expert=torch.minimum(present, padded).to(torch.int64),
        num_permuted_tokens=P,
        overflow=overflow,
        row_source=source[:P],
    )
