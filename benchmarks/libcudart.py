"""torch's CUDA runtime through ctypes, for the benchmarks that need calls torch does not expose
(raw cudaMalloc and CUDA IPC, cudaMemsetAsync)."""

from __future__ import annotations

import ctypes
import functools

import torch


@functools.cache
def runtime() -> ctypes.CDLL:
    """The libcudart torch itself loaded (same major version)."""
    return ctypes.CDLL(f"libcudart.so.{torch.version.cuda.split('.')[0]}")


def call(name: str, *args) -> None:
    """runtime().name(*args); a CUDA error status raises, naming the call."""
    status = getattr(runtime(), name)(*args)
    if status != 0:
        raise RuntimeError(f"{name} failed with CUDA error {status}")
