"""Which engine runs a call: the reference engine on CPU tensors, the CUDA engine on CUDA ones."""

from __future__ import annotations

import torch

from . import native

# The capacities a call can outgrow, by their HybridEPConfig field.
TOKENS = "max_num_of_tokens_per_rank"
RECEIVED = "max_num_of_tokens_for_experts"


class NeedsGrowth(Exception):
    """An engine found, after launching work, that some rank has more tokens than the buffer
    holds (``field`` TOKENS) or is routed more rows than its receive regions hold (RECEIVED);
    the buffer grows that capacity to ``needed`` (collectively: every rank sees the same
    counts) and redoes the call.
    """

    def __init__(self, needed: int, field: str = TOKENS):
        super().__init__(needed, field)
        self.needed = needed
        self.field = field


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
