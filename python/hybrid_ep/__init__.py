"""hybrid-ep: expert-parallel dispatch/combine for Mixture-of-Experts.

``HybridEPBuffer`` is the API (a drop-in for DeepEP's hybrid-ep class); CPU tensors run on the
pure-torch reference engine (``hybrid_ep.reference``), CUDA tensors on the CUDA engine.
"""

from __future__ import annotations

from importlib import metadata as _metadata

from .buffer import HybridEPBuffer
from .config import ENV_VARS, HybridEPConfig
from .deep_ep_alias import install_as_deep_ep
from .errors import HybridEPMismatchError, HybridEPTimeoutError
from .memory_plan import memory_plan

try:
    __version__ = _metadata.version("hybrid-ep")
except _metadata.PackageNotFoundError:  # a source tree on sys.path
    __version__ = "0.0.0+source"


def build_info() -> dict:
    """Transport, CUDA architectures, toolkit and package versions of this build."""
    from . import native

    info = dict(native.module().build_info())
    import torch

    info["package_version"] = __version__
    info["torch_version"] = torch.__version__
    return info


__all__ = ["ENV_VARS", "HybridEPBuffer", "HybridEPConfig", "HybridEPMismatchError",
           "HybridEPTimeoutError", "__version__", "build_info", "install_as_deep_ep", "memory_plan"]
