"""Which engine runs a call: the reference engine on CPU tensors, the CUDA engine on CUDA ones."""

from __future__ import annotations

import torch

from . import native


class NeedsGrowth(Exception):
    """An engine found, after launching work, that some rank has more tokens than the buffer
    holds; the buffer grows (collectively: every rank sees the same counts) and redoes the call.
    """

    def __init__(self, needed: int):
        super().__init__(needed)
        self.needed = needed


def select_engine(mode: str, device: torch.device, reference, cuda_engine):
    """``cuda_engine`` is a callable that creates (once) and returns the CUDA engine."""
    if mode == "reference":
        return reference
    if device.type == "cpu":
        if mode == "cuda":
            raise ValueError("hidden: on the CPU, but HYBRID_EP_ENGINE=cuda asks for the CUDA "
                             "engine; pass CUDA tensors or unset HYBRID_EP_ENGINE")
        return reference
    if device.type == "cuda":
        if not native.cuda_engine_built():
            raise NotImplementedError(
                "hidden: CUDA tensors need the CUDA engine, whose compiled core hybrid_ep._C "
                f"does not load ({native.load()}); HYBRID_EP_ENGINE=reference runs the "
                "pure-torch reference engine on CUDA tensors (slow, for testing).")
        return cuda_engine()
    raise ValueError(f"hidden: on device {device}; expected a CPU or CUDA tensor")
