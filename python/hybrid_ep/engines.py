"""Which engine runs a call: the reference engine on CPU tensors, the CUDA engine on CUDA ones."""

from __future__ import annotations

import torch

from . import native


def select_engine(mode: str, device: torch.device, reference):
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
                "hidden: CUDA tensors need the CUDA engine, which this build of hybrid_ep does "
                f"not contain yet ({native.describe_build()}); it arrives with the CUDA engine "
                "release. Meanwhile HYBRID_EP_ENGINE=reference runs the pure-torch reference "
                "engine on CUDA tensors (slow, for testing).")
        raise NotImplementedError("hidden: the CUDA engine is not wired into HybridEPBuffer yet")
    raise ValueError(f"hidden: on device {device}; expected a CPU or CUDA tensor")
