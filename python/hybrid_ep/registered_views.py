"""Tensors that view a rank's registered buffer, for writing combine inputs in place.

``HybridEPBuffer.get_combine_input_buffer`` hands out this rank's combine region as a BF16
tensor: expert outputs written there are pulled by the peers as they are, without the copy a
combine otherwise makes of its input. The tensor keeps the runtime that owns the memory alive,
so a buffer that grows or is destroyed while such a tensor exists frees that memory only when
the last tensor viewing it goes.
"""

from __future__ import annotations

import weakref

import torch


class _RegionView:
    """What torch wraps (``__cuda_array_interface__``); torch holds it as long as the storage
    it makes lives, and it holds the runtime."""

    def __init__(self, runtime, address: int, rows: int, cols: int):
        self.runtime = runtime
        # BF16 has no array-interface type string: int16 of the same width, viewed as BF16.
        self.__cuda_array_interface__ = {"shape": (rows, cols), "typestr": "<i2",
                                         "data": (address, False), "version": 2}


class RegisteredViews:
    """The views one engine handed out, tracked weakly: while any lives, its runtime must not
    free the registered buffer."""

    def __init__(self):
        self._alive = weakref.WeakSet()

    def rows(self, runtime, address: int, rows: int, cols: int,
             device: torch.device) -> torch.Tensor:
        region = _RegionView(runtime, address, rows, cols)
        self._alive.add(region)
        return torch.as_tensor(region, device=device).view(torch.bfloat16)

    def of(self, runtime) -> bool:
        """Whether a tensor still views ``runtime``'s memory."""
        return any(region.runtime is runtime for region in self._alive)


def is_combine_region(region: tuple[int, int], hidden: torch.Tensor, claimed: bool,
                        unpermute: bool) -> bool:
    """Whether ``hidden`` is the combine region (address, bytes) itself, i.e.
    get_combine_input_buffer's tensor, which the combine then reads without copying; refuses
    other overlaps, that tensor in combine_with_unpermute and a stale claim."""
    address, size = region
    begin = hidden.data_ptr()
    # The address first, the row count after: a rank without rows must refuse a stale
    # tensor as its peers do, or they would wait for it.
    if begin != address:
        if hidden.numel() and begin < address + size and begin + 2 * hidden.numel() > address:
            raise ValueError("hidden: part of the tensor get_combine_input_buffer returned; "
                             "pass that tensor whole, or expert outputs in a tensor of your "
                             "own")
        return False
    if unpermute:
        raise ValueError("hidden: the tensor get_combine_input_buffer returned, which "
                         "combine_with_unpermute overwrites with its sums; pass the permuted "
                         "expert outputs in a tensor of your own")
    if not claimed:
        raise ValueError("hidden: the tensor get_combine_input_buffer returned serves one "
                         "combine, which has run; call get_combine_input_buffer(handle) "
                         "again (on every rank) before writing the next expert outputs")
    return True
