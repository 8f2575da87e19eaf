"""The CUDA engine's dispatch releases this rank's receive rows when it fails after its launch.

Inside one NVLink domain the peers' next dispatch waits for that release (docs/engine.md,
"release of the receive region"); the copy-out or permute kernel releases on the normal path, so
a call that fails between the launch and them must release from Python, once. Checked here on
the CPU with a stand-in for the native runtime that records its calls.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hybrid_ep.cuda_engine import CudaEngine
from hybrid_ep.engines import NeedsGrowth
from hybrid_ep.layouts import DispatchLayout


class RecordingRuntime:
    def __init__(self, fail_copy: bool):
        self.calls = []
        self.fail_copy = fail_copy

    def status(self):
        return {"code": 0}

    def dispatch(self, *args):
        self.calls.append("dispatch")

    def copy_dispatched(self, *args):
        self.calls.append("copy_dispatched")  # releases itself when it succeeds
        if self.fail_copy:
            raise RuntimeError("copy_dispatched failed")

    def release_received_rows(self, stream):
        self.calls.append("release")


def _engine(runtime, fresh: bool = False) -> CudaEngine:
    """A CudaEngine's dispatch state on the CPU, without connecting a runtime."""
    engine = object.__new__(CudaEngine)
    engine.runtime = runtime
    engine.device = torch.device("cpu")
    engine.config = SimpleNamespace(hidden_dim=64)
    engine.topo = SimpleNamespace(num_of_nodes=1, ranks_per_domain=2, rank=0)
    engine.experts = 2
    engine._preprocessed = False
    engine._fresh_layout = fresh
    engine._stream = lambda: 0
    return engine


def _layout(rows: int = 4) -> DispatchLayout:
    return DispatchLayout(
        sparse_to_dense_map=torch.zeros(4, 2, dtype=torch.int32),
        rdma_to_attn_map=torch.zeros(16, 1, dtype=torch.bool),
        attn_to_rdma_map=torch.zeros(4, 0, dtype=torch.bool),
        num_dispatched_tokens_tensor=torch.zeros(1, dtype=torch.int32),
        local_expert_routing_map=torch.zeros(8, 2, dtype=torch.bool),
        num_dispatched_tokens=rows, own_rows=(0, 2))


def _hidden() -> torch.Tensor:
    return torch.zeros(4, 64, dtype=torch.bfloat16)


def test_dispatch_that_succeeds_leaves_the_release_to_the_copy_out():
    runtime = RecordingRuntime(fail_copy=False)
    _engine(runtime).move_rows(_hidden(), None, None, _layout(), tokens=4)
    assert runtime.calls == ["dispatch", "copy_dispatched"]


def test_dispatch_whose_copy_out_fails_releases_once():
    runtime = RecordingRuntime(fail_copy=True)
    with pytest.raises(RuntimeError, match="copy_dispatched failed"):
        _engine(runtime).move_rows(_hidden(), None, None, _layout(), tokens=4)
    assert runtime.calls == ["dispatch", "copy_dispatched", "release"]


@pytest.mark.parametrize("keep_in_buffer", [False, True])
def test_dispatch_that_must_grow_releases_before_the_growth(keep_in_buffer):
    runtime = RecordingRuntime(fail_copy=False)
    engine = _engine(runtime, fresh=True)

    def needs_growth(layout):
        raise NeedsGrowth(8)

    engine._read_summary = needs_growth
    with pytest.raises(NeedsGrowth):
        engine.move_rows(_hidden(), None, None, _layout(), tokens=4,
                        keep_in_buffer=keep_in_buffer)
    assert runtime.calls == ["dispatch", "release"]
