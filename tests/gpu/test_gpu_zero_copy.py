"""Zero-copy on the CUDA engine (docs/zero-copy.md): dispatch outputs in the registered pool
that the peers store into, combine inputs there read in place. Nothing copied in the steady
state, outputs that keep their values across later calls, another stream, a second buffer
and growth; a pool too small (or zero-copy off) copies, with the same results. With several
domains and puts that read only registered memory (forced on p2p by HYBRID_EP_FAULT), the
matrix passes with its sources staged, and a hidden from the pool is read in place. The rest of
the GPU suite runs with zero-copy on (the default); HYBRID_EP_ZERO_COPY=0 runs it copying."""

from __future__ import annotations

import gpu_env
import pytest
from gpu_env import gpu_marks, placement_param
from gpu_specs import domain_matrix_spec, growth_specs, make_spec, matrix_under_env, report
from test_gpu_multi_domain import matrix_params

pytestmark = gpu_marks
MODULE = "gpu_zero_copy_cases"

CASES = [
    (1, {"H": 7168, "form": "topk", "k": 8, "E": 8, "tokens": [512]}),
    (2, {"H": 2064, "form": "map", "k": 2, "max_tok": 300}),
    (4, {"H": 4096, "form": "topk", "k": 2, "routing": "skew", "max_tok": 128}),
    (8, {"H": 7168, "form": "topk", "k": 8, "E": 8, "tokens": "equal", "max_tok": 128}),
]


@pytest.mark.parametrize("W,placement,case", [placement_param(W, "shared", case)
                                              for W, case in CASES])
def test_zero_copy_steady(gpu_pools, record_property, W, placement, case):
    spec = make_spec(W, tag="zero-copy", **case)
    results = gpu_pools.run(W, placement, "steady", module=MODULE, spec=spec)
    report(record_property, results, label=f"zero-copy steady W={W}", dispatches=8,
           combines=5)
    if not gpu_env.DRY_RUN:  # the reference engine copies nothing and counts nothing
        assert sum(r["dispatch_zero_copy"] for r in results) > 0, results
        for rank, r in enumerate(results):
            assert r["dispatch_bytes_copied"] == 0 and r["combine_bytes_staged"] == 0, (rank, r)


@pytest.mark.parametrize("pool_mb,zero_copy", [("1", "1"), ("64", "0")],
                         ids=["pool-too-small", "zero-copy-off"])
@pytest.mark.parametrize("W,placement", [placement_param(2, "shared"),
                                         placement_param(4, "shared")])
def test_zero_copy_fallback(gpu_pools, record_property, W, placement, pool_mb, zero_copy):
    spec = make_spec(W, H=7168, form="topk", k=2, tokens="equal", max_tok=256,
                     tag="zero-copy-fallback")
    results = gpu_pools.run(W, placement, "fallback", module=MODULE, spec=spec,
                            pool_mb=pool_mb, zero_copy=zero_copy)
    report(record_property, results, label=f"zero-copy fallback W={W}", dispatches=4,
           combines=2)
    if not gpu_env.DRY_RUN and zero_copy == "1":  # every rank has tokens (tokens="equal")
        for rank, r in enumerate(results):
            assert r["fallbacks"] > 0 and r["warned"] == 1, (rank, r)


@pytest.mark.parametrize("W,placement", [placement_param(2, "shared"),
                                         placement_param(4, "shared")])
def test_zero_copy_two_buffers_and_growth(gpu_pools, record_property, W, placement):
    spec_a = make_spec(W, H=2048, form="map", k=2, max_tok=96, tag="zero-copy-a")
    spec_small, spec_big, _ = growth_specs(W, 64, 300, tag="zero-copy")
    results = gpu_pools.run(W, placement, "two_buffers_and_growth", module=MODULE,
                            spec_a=spec_a, spec_small=spec_small, spec_big=spec_big)
    report(record_property, results, label=f"zero-copy buffers W={W}", dispatches=7,
           combines=3)


STAGED_SOURCES = {"HYBRID_EP_FAULT": "stage_network_sources"}


@pytest.mark.parametrize("W,placement,R,case", matrix_params("-staged-sources", most_ranks=4))
def test_domains_with_staged_network_sources(gpu_pools, record_property, W, placement, R,
                                             case):
    """The multi-domain matrix (up to 4 ranks) with every dispatch's network sources staged
    into the registered buffer first, as for doca's puts."""
    matrix_under_env(gpu_pools, record_property, W, placement, R, case, STAGED_SOURCES,
                     "staged sources")


@pytest.mark.parametrize("W,placement,R", [placement_param(4, "shared", 2, id_extra="2x2"),
                                           placement_param(2, "shared", 1, id_extra="2x1")])
def test_network_sources_from_the_pool(gpu_pools, record_property, W, placement, R):
    spec = domain_matrix_spec(W, R, {"H": 4096, "form": "topk", "k": 2, "tokens": "equal",
                                     "max_tok": 128})
    results = gpu_pools.run(W, placement, "network_sources", module=MODULE, spec=spec)
    report(record_property, results, label=f"network sources {W // R}x{R}", dispatches=2,
           combines=0)
    if not gpu_env.DRY_RUN:  # the reference engine stages nothing and counts nothing
        for rank, r in enumerate(results):
            assert r["tokens"] > 0 and r["staged"] > 0 and r["pooled_staged"] == 0, (rank, r)
