"""Sequences of calls on the CUDA engine: a long run with fresh routing each call, two buffers
used alternately, growth of the buffer by a blocking dispatch, and bursts of dispatches with one
handle."""

from __future__ import annotations

import pytest
from gpu_env import gpu_marks, placement_param
from gpu_specs import growth_specs, make_spec, report

pytestmark = gpu_marks

LONG_RUN_CALLS = 200
LONG_RUN_CHECK_EVERY = 20
HANDLE_BURST_CALLS = 8


@pytest.mark.parametrize("W,placement", [placement_param(2, "shared"),
                                         placement_param(8, "shared"),
                                         placement_param(2, "per_gpu"),
                                         placement_param(8, "per_gpu")])
def test_long_run(gpu_pools, record_property, W, placement):
    """200 dispatch/combine pairs: no drift, no hang; combine(dispatch(x)) == x * copies on
    every call, the reference compared every 20th."""
    results = gpu_pools.run(W, placement, "long_run", timeout_s=240, seed=1234 + W, H=2064,
                            E=4, max_tokens=128, iters=LONG_RUN_CALLS,
                            check_every=LONG_RUN_CHECK_EVERY)
    assert all(r["iterations"] == LONG_RUN_CALLS for r in results), results
    seconds = max(r["seconds"] for r in results)
    record_property("seconds_per_call_pair", seconds / LONG_RUN_CALLS)
    report(record_property, results, label=f"long run W={W} {placement}: {seconds:.1f} s")


@pytest.mark.parametrize("W,placement", [placement_param(4, "shared"),
                                         placement_param(4, "per_gpu")])
def test_two_buffers(gpu_pools, record_property, W, placement):
    spec_a = make_spec(W, H=4096, form="topk", k=2, E=4, max_tok=256, tag="A")
    spec_b = make_spec(W, H=7168, dtype="e4m3", form="map", k=2, E=2, max_tok=128, tag="B")
    results = gpu_pools.run(W, placement, "two_buffers", spec_a=spec_a, spec_b=spec_b)
    report(record_property, results, label=f"two buffers W={W} {placement}")


@pytest.mark.parametrize("W,placement", [placement_param(2, "shared"),
                                         placement_param(8, "shared"),
                                         placement_param(8, "per_gpu")])
def test_growth(gpu_pools, record_property, W, placement):
    """The buffer holds 64 tokens per rank; the last rank then dispatches 300."""
    small, big = 64, 300
    spec_small, spec_big, spec_after = growth_specs(W, small, big)
    results = gpu_pools.run(W, placement, "growth", spec_small=spec_small, spec_big=spec_big,
                            spec_after=spec_after)
    assert all(r["before"] == small and r["after"] == big for r in results), results
    report(record_property, results, label=f"growth W={W} {placement}")


@pytest.mark.parametrize("op", ["dispatch", "permute", "fused permute"])
@pytest.mark.parametrize("W,placement", [placement_param(2, "shared"),
                                         placement_param(4, "shared"),
                                         placement_param(4, "per_gpu")])
def test_handle_burst(gpu_pools, record_property, W, placement, op):
    """Dispatches with one handle back to back, every token to the last rank: no rank's rows
    overwrite a peer's before it has read the previous call's out (gpu_reuse_cases)."""
    spec = make_spec(W, H=7168, form="topk", k=2, routing="skew", tokens="equal", max_tok=1024,
                     tag="burst")
    spec["op"] = op
    results = gpu_pools.run(W, placement, "handle_burst", module="gpu_reuse_cases", spec=spec,
                            calls=HANDLE_BURST_CALLS)
    assert [r["rows"] > 0 for r in results] == [r == W - 1 for r in range(W)], results
    report(record_property, results, label=f"handle burst W={W} {placement} {op}",
           combines=0)
