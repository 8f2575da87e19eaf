"""The compiled core ``hybrid_ep._C``: loaded lazily so the pure-Python parts work without it."""

from __future__ import annotations

import functools
import importlib


@functools.cache
def load():
    """The extension module, or the ImportError that explains why it is missing."""
    try:
        return importlib.import_module("hybrid_ep._C")
    except ImportError as error:  # e.g. a source checkout that was never built
        return error


def module():
    try:
        return importlib.import_module("hybrid_ep._C")
    except ImportError as error:
        raise ImportError(f"hybrid_ep._C is not available ({error}); install the package with "
                          "`pip install .` (or bash tools/setup.sh) to build it") from error


def cuda_engine_built() -> bool:
    loaded = load()
    return not isinstance(loaded, ImportError) and bool(loaded.build_info().get("cuda_engine"))


def describe_build() -> str:
    loaded = load()
    if isinstance(loaded, ImportError):
        return "compiled core missing"
    info = loaded.build_info()
    return f"transport {info['transport']}, CUDA archs {info['cuda_architectures']}"
