"""What the GPU tests can use on this machine, probed once at import (in the pytest process).

``AVAILABLE`` is False (with ``SKIP_REASON``) without a CUDA GPU, or when the installed
hybrid_ep has no CUDA engine. The probe creates no CUDA context, so the spawned workers start
clean.

``HYBRID_EP_GPU_TESTS_DRY_RUN=1`` runs the whole GPU suite on the CPU instead (both sides of
every comparison on the reference engine, ``HYBRID_EP_GPU_TESTS_DRY_RUN_GPUS`` pretend GPUs,
default 1): a self-check of the test code on a machine without a GPU; it proves nothing about
the CUDA engine.
"""

from __future__ import annotations

import os

import pytest

DRY_RUN = os.environ.get("HYBRID_EP_GPU_TESTS_DRY_RUN", "") == "1"

# Placements of the ranks: all on GPU 0 ("shared", MPS lets them run at once), or rank r on
# GPU r ("per_gpu", needs at least W GPUs).
PLACEMENTS = ("shared", "per_gpu")


def _probe() -> tuple[int, str | None]:
    try:
        import torch
    except Exception as error:  # noqa: BLE001 - any import failure means: skip
        return 0, f"torch is not importable ({error})"
    if DRY_RUN:
        return int(os.environ.get("HYBRID_EP_GPU_TESTS_DRY_RUN_GPUS", "1")), None
    if not torch.cuda.is_available():
        return 0, "no CUDA GPU (torch.cuda.is_available() is False)"
    try:
        import hybrid_ep

        hybrid_ep.build_info()  # every build of the compiled core holds the CUDA engine
    except Exception as error:  # noqa: BLE001 - any failure means: skip
        return 0, f"hybrid_ep's compiled core is not available ({error})"
    return torch.cuda.device_count(), None


GPU_COUNT, SKIP_REASON = _probe()
AVAILABLE = SKIP_REASON is None

# Every test module of this folder sets ``pytestmark = gpu_marks``.
gpu_marks = [pytest.mark.gpu, pytest.mark.skipif(not AVAILABLE, reason=SKIP_REASON or "")]


def transport_build_marks(transport: str) -> list:
    """``gpu_marks`` for a module that tests one transport build's own paths: skipped in a dry
    run (it drives the CUDA runtime directly) and unless the installed build is ``transport``."""
    from hybrid_ep import native

    core = native.load()
    return [
        *gpu_marks,
        pytest.mark.skipif(DRY_RUN, reason="drives the CUDA runtime directly"),
        pytest.mark.skipif(isinstance(core, ImportError)
                           or core.build_info()["transport"] != transport,
                           reason=f"the installed hybrid_ep is not the {transport} build"),
    ]


def mps_running() -> bool:
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    return os.path.exists(os.path.join(pipe, "control"))


def placement_param(W: int, placement: str, *values, id_extra: str = ""):
    """A pytest.param of (W, placement, *values), skipped when the placement needs more GPUs
    than there are."""
    marks = []
    if placement == "per_gpu" and GPU_COUNT < W:
        marks.append(pytest.mark.skip(reason=f"per_gpu placement of {W} ranks needs {W} GPUs; "
                                      f"{GPU_COUNT} present"))
    ident = f"W{W}-{placement}" + (f"-{id_extra}" if id_extra else "")
    return pytest.param(W, placement, *values, id=ident, marks=marks)


def placements(worlds, kinds=PLACEMENTS):
    """(W, placement) params: every world size shared on GPU 0, and one rank per GPU."""
    out = []
    for W in worlds:
        for kind in kinds:
            if kind == "per_gpu" and W == 1:
                continue  # the same as shared
            out.append(placement_param(W, kind))
    return out
