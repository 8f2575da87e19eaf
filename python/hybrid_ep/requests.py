"""The requests HybridEPBuffer hands its engine: one per call, after every check of its arguments.

The buffer validates and normalises a call's arguments into one of these; the engine runs the
whole operation from it (operations.py) and writes back the two things the buffer keeps: whether
the call's agreement ran (collective.py) and the template config, which a call that grows the
buffer replaces.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .call_stamp import CallStamp
from .config import HybridEPConfig


@dataclass(slots=True, kw_only=True)
class Request:
    stamp: CallStamp  # the call's fingerprint, the handle's id included
    config: HybridEPConfig  # the buffer's template; replaced when the call grows the buffer
    handle: tuple | None = None
    made: HybridEPConfig | None = None  # the config of ``handle``
    agreed: bool = False  # set by the engine once the call's agreement has run


@dataclass(slots=True, kw_only=True)
class DispatchRequest(Request):
    """``dispatch`` or ``dispatch_with_permute``: contiguous rows, the routing as a bool map (or
    None with a handle), the arguments checked against the result once it is known."""

    hidden: torch.Tensor
    probs: torch.Tensor | None
    scaling_factor: torch.Tensor | None
    routing_map: torch.Tensor | None
    handle_ids: Iterator[int]  # the buffer's handle count: a new handle takes the next id
    non_blocking: bool = False
    num_dispatched_tokens: int | None = None  # the caller's count, checked
    num_dispatched_tokens_tensor: torch.Tensor | None = None  # filled with the count (dispatch)
    # dispatch_with_permute only
    pad_multiple: int = 1
    num_permuted_tokens: int | None = None  # the output's rows; None: sized from the counts
    fuse: bool = False  # fuse_permute_dispatch


@dataclass(slots=True, kw_only=True)
class CombineRequest(Request):
    """``combine`` or ``combine_with_unpermute``: contiguous BF16 rows of ``handle``'s call."""

    hidden: torch.Tensor
    probs: torch.Tensor | None
    fuse: bool = False  # fuse_unpermute_combine


@dataclass(slots=True, kw_only=True)
class CombineInputRequest(Request):
    """``get_combine_input_buffer``: ``rows`` x ``cols`` BF16 on ``device``."""

    rows: int
    cols: int
    device: torch.device
