"""The CUDA engine's zero-copy decisions (docs/zero-copy.md), on the CPU with a stand-in for
the native runtime that records its calls: a dispatch whose outputs the pool holds launches
once into them and copies nothing; a pool without room falls back to the copy-out, counted and
warned once; a blocking call with a fresh layout sizes its outputs before the launch, and one
that must grow launches nothing. Plus the pool's size and the environment's parsing.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from hybrid_ep.config import EnvSettings
from hybrid_ep.cuda_engine import CudaEngine
from hybrid_ep.engines import NeedsGrowth
from hybrid_ep.layouts import DispatchLayout
from hybrid_ep.zero_copy import DEFAULT_POOL_OUTPUTS, ZeroCopyPool, pool_bytes


class RecordingRuntime:
    """Records dispatch (with its zero-copy outputs) and copy-out calls; pool blocks are CPU
    tensors handed over by DLPack like the native ones."""

    def __init__(self, pool: int, network_staged: int = 0):
        self.calls = []
        self.pool = pool
        self.blocks = []
        self.network_staged = network_staged  # what dispatch returns: bytes staged for puts

    def status_code(self):
        return 0

    def pool_stats(self):
        return {"bytes": self.pool, "in_use": 0, "largest_free": self.pool, "blocks": 0}

    def pool_block(self, size, device):
        if size > self.pool:
            return None
        block = torch.zeros(size, dtype=torch.uint8)
        self.blocks.append(block)
        return torch.utils.dlpack.to_dlpack(block)

    def pool_outputs(self, rows, row_bytes, bf16, prob_cols, scale_cols, device):
        """One block, the parts on 512-byte boundaries, each handed over as its own capsule."""
        sizes = [-(-n // 512) * 512 for n in (rows * row_bytes, rows * 4 * prob_cols,
                                              rows * 4 * scale_cols)]
        if sum(sizes) > self.pool:
            return None
        block = torch.zeros(sum(sizes), dtype=torch.uint8)
        self.blocks.append(block)
        out = block[:rows * row_bytes].view(rows, row_bytes)
        parts = [out.view(torch.bfloat16) if bf16 else out]
        start = sizes[0]
        for cols, size in ((prob_cols, sizes[1]), (scale_cols, sizes[2])):
            part = block[start:start + rows * 4 * cols].view(torch.float32).view(rows, cols)
            parts.append(part if cols else None)
            start += size
        return tuple(torch.utils.dlpack.to_dlpack(p) if p is not None else None for p in parts)

    def dispatch(self, *args):
        zc_rows, zc_probs, zc_scales, capacity = args[-5:-1]
        self.calls.append(("dispatch", bool(zc_rows), bool(zc_probs), bool(zc_scales), capacity))
        return self.network_staged

    def copy_dispatched(self, *args):
        self.calls.append(("copy_dispatched",))


def _engine(runtime, fresh: bool = False, zero_copy: bool = True, nodes: int = 1) -> CudaEngine:
    """A CudaEngine's dispatch state on the CPU, without connecting a runtime."""
    engine = object.__new__(CudaEngine)
    engine.runtime = runtime
    engine.device = torch.device("cpu")
    engine.config = SimpleNamespace(hidden_dim=64)
    engine.topo = SimpleNamespace(num_of_nodes=nodes, ranks_per_domain=2, rank=0)
    engine.experts = 2
    engine._preprocessed = False
    engine._fresh_layout = fresh
    engine._stream = lambda: 0
    engine.zero_copy = ZeroCopyPool(zero_copy)
    engine.zero_copy.attach(runtime)
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


def test_outputs_in_the_pool_are_stored_into_and_not_copied():
    runtime = RecordingRuntime(pool=1 << 20)
    engine = _engine(runtime)
    probs = torch.zeros(4, 4)
    rows, out_probs, scales = engine.move_rows(_hidden(), probs, None, _layout(6), tokens=4)
    assert runtime.calls == [("dispatch", True, True, False, 6)]
    assert rows.shape == (6, 64) and rows.dtype == torch.bfloat16
    assert out_probs.shape == (6, 4) and out_probs.dtype == torch.float32 and scales is None
    # One block holds both, the probs right past the rows on their own 512-byte boundary.
    assert out_probs.data_ptr() - rows.data_ptr() == 1024
    stats = engine.zero_copy.stats.as_dict()
    assert stats["dispatch_zero_copy"] == 1 and stats["dispatch_copied"] == 0


def test_a_pool_without_room_copies_counts_and_warns_once():
    runtime = RecordingRuntime(pool=1024)  # smaller than 6 rows of 128 bytes + probs
    engine = _engine(runtime)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            engine.move_rows(_hidden(), torch.zeros(4, 4), None, _layout(6), tokens=4)
    assert runtime.calls == [("dispatch", False, False, False, 0), ("copy_dispatched",)] * 2
    assert [str(w.message).count("zero-copy pool") for w in caught] == [1]
    stats = engine.zero_copy.stats.as_dict()
    assert stats["pool_fallbacks"] == 2 and stats["dispatch_copied"] == 2
    # 6 rows, less the 2 this rank stored into the output itself (own_rows), of 128 + 16 bytes.
    assert stats["dispatch_bytes_copied"] == 2 * 4 * (128 + 16)


def test_zero_copy_off_copies_without_counting_fallbacks():
    runtime = RecordingRuntime(pool=1 << 20)
    engine = _engine(runtime, zero_copy=False)
    engine.move_rows(_hidden(), None, None, _layout(6), tokens=4)
    assert runtime.calls == [("dispatch", False, False, False, 0), ("copy_dispatched",)]
    assert engine.zero_copy.stats.pool_fallbacks == 0


def test_several_domains_copy_out_and_count_staged_network_sources():
    """With several domains a pool holds only network sources: the outputs are copied out, and
    the bytes the runtime staged for the network's puts are counted (none: nothing counted)."""
    runtime = RecordingRuntime(pool=1 << 20, network_staged=4 * 128)
    engine = _engine(runtime, nodes=2)
    layout = _layout(6)
    layout.own_rows = None  # several domains: no own rows straight into the output
    engine.move_rows(_hidden(), None, None, layout, tokens=4)
    assert runtime.calls == [("dispatch", False, False, False, 0), ("copy_dispatched",)]
    stats = engine.zero_copy.stats.as_dict()
    assert stats["dispatch_zero_copy"] == 0 and stats["pool_fallbacks"] == 0
    assert (stats["network_staged"], stats["network_bytes_staged"]) == (1, 4 * 128)
    runtime.network_staged = 0  # the rows came from the pool
    engine.move_rows(_hidden(), None, None, layout, tokens=4)
    assert engine.zero_copy.stats.network_staged == 1


def test_the_permute_path_keeps_rows_in_the_receive_region():
    runtime = RecordingRuntime(pool=1 << 20)
    _engine(runtime).move_rows(_hidden(), None, None, _layout(6), tokens=4, keep_in_buffer=True)
    assert runtime.calls == [("dispatch", False, False, False, 0)]


def test_a_fresh_layout_is_read_before_the_launch():
    runtime = RecordingRuntime(pool=1 << 20)
    engine = _engine(runtime, fresh=True)
    order = []

    def read_summary(layout):
        order.append(("summary", len(runtime.calls)))
        layout.num_dispatched_tokens = 3

    engine._read_summary = read_summary
    rows, _, _ = engine.move_rows(_hidden(), None, None, _layout(0), tokens=4)
    assert order == [("summary", 0)] and rows.shape == (3, 64)
    assert runtime.calls == [("dispatch", True, False, False, 3)]


def test_a_call_that_must_grow_launches_nothing():
    runtime = RecordingRuntime(pool=1 << 20)
    engine = _engine(runtime, fresh=True)

    def needs_growth(layout):
        raise NeedsGrowth(8)

    engine._read_summary = needs_growth
    with pytest.raises(NeedsGrowth):
        engine.move_rows(_hidden(), None, None, _layout(), tokens=4)
    assert runtime.calls == []


def test_no_rows_take_the_plain_path():
    runtime = RecordingRuntime(pool=1 << 20)
    rows, _, _ = _engine(runtime).move_rows(_hidden(), None, None, _layout(0), tokens=4)
    assert rows.shape == (0, 64)
    assert runtime.calls[0] == ("dispatch", False, False, False, 0)


def test_pool_size():
    per_row = 2 * 7168 + 4 * 8 * 8 + 4 * 56
    assert pool_bytes(True, 1, None, 32768, 7168, 8, 8) == \
        DEFAULT_POOL_OUTPUTS * (32768 * per_row + 3 * 512)
    assert pool_bytes(True, 1, 100, 32768, 7168, 8, 8) == 100 << 20
    assert pool_bytes(False, 1, 100, 32768, 7168, 8, 8) == 0
    assert pool_bytes(True, 2, None, 32768, 7168, 8, 8) == 0  # several domains: none by default
    assert pool_bytes(True, 2, 64, 32768, 7168, 8, 8) == 64 << 20  # asked for: network sources


@pytest.mark.parametrize("name,value,expected", [
    ("HYBRID_EP_ZERO_COPY", "maybe", "HYBRID_EP_ZERO_COPY='maybe': expected 0/1"),
    ("HYBRID_EP_ZERO_COPY_POOL_MB", "0", "HYBRID_EP_ZERO_COPY_POOL_MB='0': expected an integer"),
    ("HYBRID_EP_ZERO_COPY_POOL_MB", "lots", "HYBRID_EP_ZERO_COPY_POOL_MB='lots'"),
])
def test_bad_environment_names_the_variable(monkeypatch, name, value, expected):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=expected):
        EnvSettings.read()


def test_environment_defaults(monkeypatch):
    monkeypatch.delenv("HYBRID_EP_ZERO_COPY", raising=False)
    monkeypatch.delenv("HYBRID_EP_ZERO_COPY_POOL_MB", raising=False)
    env = EnvSettings.read()
    assert env.zero_copy is True and env.zero_copy_pool_mb is None
    monkeypatch.setenv("HYBRID_EP_ZERO_COPY", "0")
    monkeypatch.setenv("HYBRID_EP_ZERO_COPY_POOL_MB", "256")
    env = EnvSettings.read()
    assert env.zero_copy is False and env.zero_copy_pool_mb == 256
