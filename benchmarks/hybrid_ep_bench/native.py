"""The benchmark's compiled kernels ``hybrid_ep_bench._C`` (the TMA copy ceiling, the start
gate), loaded when a GPU run first needs them: the CPU bench runs without them."""

from __future__ import annotations

import importlib


def module():
    try:
        return importlib.import_module("hybrid_ep_bench._C")
    except ImportError as error:
        raise ImportError(f"hybrid_ep_bench._C is not available ({error}); reinstall the "
                          "benchmark from the hybrid-ep checkout with `pip install "
                          "--no-build-isolation ./benchmarks`") from error
