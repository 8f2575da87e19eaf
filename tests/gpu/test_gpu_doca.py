"""The doca build's missing-library path on a real GPU: a runtime spanning two domains asks the
transport for its queue pairs, which must fail before any RDMA call with
TransportUnavailableError naming the library and HYBRID_EP_DOCA_LIB_DIR (build/doca, see
tests/doca_build.py; the data path itself needs ConnectX NICs and is untested)."""

from __future__ import annotations

import gpu_env
import pytest
from gpu_env import gpu_marks

import doca_build

pytestmark = [
    *gpu_marks,
    pytest.mark.skipif(gpu_env.DRY_RUN, reason="drives the CUDA runtime directly"),
]


def test_runtime_on_a_gpu_raises_naming_the_missing_library(tmp_path):
    doca_build.stub_libraries(tmp_path, ["libibverbs.so.1", "libmlx5.so.1"])
    out = doca_build.run("runtime", lib_dir=str(tmp_path))
    assert out["devices"] >= 1, out
    assert out.get("error") == "TransportUnavailableError", out
    for fragment in (
        "DOCA GPUNetIO host library",
        "libdoca_gpunetio_host.so",
        f"HYBRID_EP_DOCA_LIB_DIR={tmp_path}",
    ):
        assert fragment in out["message"], (fragment, out["message"])


def test_runtime_on_a_gpu_without_any_library_dir(tmp_path):
    out = doca_build.run("runtime", lib_dir=str(tmp_path), library_path=str(tmp_path))
    assert out["devices"] >= 1, out
    assert out.get("error") == "TransportUnavailableError", out
    assert "HYBRID_EP_DOCA_LIB_DIR" in out["message"], out
