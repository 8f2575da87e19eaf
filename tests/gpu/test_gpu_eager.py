"""The eager form between domains (HYBRID_EP_EAGER=1, p2p build: dispatch and combine) on one
GPU: the multi-domain matrix and permute pairs pass with it; also with rings of 2 slots (a slot
reused within a call, whose earlier chunk's tile signals must not pass for the later chunk's),
with the combine's partials in fp32, and under the emulated wire (a tile becomes visible only at
its emulated delivery, which a slow wire's dispatch times show); a captured pair replayed (the
device epochs keep every replay's signals new); and the counters of dispatch and combine are
the reference's eager model: one put per (chunk, domain) with tokens, its tiles, no signal.
Under HYBRID_EP_FAULT=unmapped_peers the kernels see no peer of another domain as mapped and
take the RDMA builds' path: tiles written into staging slots, one put_eager per chunk."""

from __future__ import annotations

import gpu_env
import pytest
from gpu_env import gpu_marks, placement_param
from gpu_specs import make_spec, matrix_under_env, permute_under_env, report
from test_gpu_multi_domain import CHUNK, FP32_WIRE, matrix_params, permute_params

pytestmark = gpu_marks

EAGER = {"HYBRID_EP_EAGER": "1"}
SHALLOW = {**EAGER, "HYBRID_EP_NET_RING_CHUNKS": "2"}
UNDER_WIRE = {**EAGER, "HYBRID_EP_P2P_WIRE": "gbps=50,latency_us=3,op_ns=400,rails=2",
              "HYBRID_EP_NUM_CHANNELS": "2"}
UNMAPPED = {**EAGER, "HYBRID_EP_FAULT": "unmapped_peers"}


@pytest.mark.parametrize("W,placement,R,case", matrix_params("-eager"))
def test_dispatch_combine_domains_eager(gpu_pools, record_property, W, placement, R, case):
    matrix_under_env(gpu_pools, record_property, W, placement, R, case, EAGER, "eager")


@pytest.mark.parametrize("W,placement,R,case", matrix_params("-eager-ring2"))
def test_dispatch_combine_domains_eager_shallow_rings(gpu_pools, record_property, W, placement,
                                                      R, case):
    matrix_under_env(gpu_pools, record_property, W, placement, R, case, SHALLOW, "eager ring2")


@pytest.mark.parametrize("W,placement,R,case", matrix_params("-eager-wire", most_ranks=4))
def test_dispatch_combine_domains_eager_under_wire(gpu_pools, record_property, W, placement, R,
                                                   case):
    matrix_under_env(gpu_pools, record_property, W, placement, R, case, UNDER_WIRE,
                     "eager wire")


@pytest.mark.parametrize("W,placement,R,case", matrix_params("-eager-fp32wire", most_ranks=4))
def test_dispatch_combine_domains_eager_fp32_wire(gpu_pools, record_property, W, placement, R,
                                                  case):
    """The combine's records hold fp32 partials: a row's 32-byte vectors straddle tile ends."""
    matrix_under_env(gpu_pools, record_property, W, placement, R, case, {**EAGER, **FP32_WIRE},
                     "eager fp32 wire")


@pytest.mark.parametrize("W,placement,R,case", matrix_params("-eager-unmapped"))
def test_dispatch_combine_domains_eager_unmapped(gpu_pools, record_property, W, placement, R,
                                                 case):
    """The staged path of the RDMA builds (put_eager from this rank's staging slots)."""
    matrix_under_env(gpu_pools, record_property, W, placement, R, case, UNMAPPED,
                     "eager unmapped")


@pytest.mark.parametrize("W,placement,R,case", matrix_params("-eager-unmapped-wire-ring2",
                                                             most_ranks=4))
def test_dispatch_combine_domains_eager_unmapped_wire_shallow(gpu_pools, record_property, W,
                                                              placement, R, case):
    """Staging slots reused within a call (2 of them) while the wire delays each put."""
    env = {**UNMAPPED, **UNDER_WIRE, "HYBRID_EP_NET_RING_CHUNKS": "2"}
    matrix_under_env(gpu_pools, record_property, W, placement, R, case, env,
                     "eager unmapped wire ring2")


@pytest.mark.parametrize("W,placement,R,extra", permute_params("-eager"))
def test_permute_domains_eager(gpu_pools, record_property, W, placement, R, extra):
    permute_under_env(gpu_pools, record_property, W, placement, R, extra, EAGER, "eager")


@pytest.mark.parametrize("environment", [EAGER, UNMAPPED], ids=["mapped", "unmapped"])
@pytest.mark.parametrize("dtype,pattern", [("bf16", "dense"), ("fp8", "dense"), ("bf16", "runs")])
def test_eager_counters(gpu_pools, dtype, pattern, environment):
    """2x2, 150 tokens: the CUDA counters equal the reference's eager model (the case asserts it
    per rank); dense routing is one put per chunk to the one other domain, no signal, its
    tiles counted, in the dispatch and in the combine."""
    W, R, tokens = 4, 2, 150
    results = gpu_pools.run(W, "shared", "under_env", module="gpu_multi_domain_cases",
                            environment=environment, case="counters", R=R, pattern=pattern,
                            dtype=dtype, with_probs=True, channels=1, tokens=tokens)
    chunks = -(-tokens // CHUNK)
    assert len(results) == W, results
    for r in results:
        for leg in ("cuda_dispatch", "cuda_combine"):
            sent = r[leg]
            assert sent["signals"] == 0 and sent["eager_tiles"] > 0, (leg, sent)
            if pattern == "dense":
                assert sent["puts"] == chunks, (leg, sent)


def test_tiles_wait_for_their_emulated_delivery(gpu_pools):
    """2x1, dense routing, 1 GB/s wire: every rank's eager payload (~3.7 MB a call) takes the
    emulated rail at least bytes / rate, so a dispatch that is correct and no faster than that
    has waited for each tile's delivery instant, not only for its signal's value (which its
    sender writes at once)."""
    gbps = 1.0
    results = gpu_pools.run(2, "shared", "slow_wire_dispatch", module="gpu_eager_cases", R=1,
                            tokens=256, H=7168, spec=f"gbps={gbps:g},latency_us=3,op_ns=400",
                            calls=3)
    assert len(results) == 2 and all(r["checked"] == 3 for r in results), results
    if results[0]["dry_run"]:  # a dry run times the reference engine
        return
    for r in results:
        for seconds, sent in zip(r["seconds"], r["bytes"], strict=True):
            assert sent > 3e6 and seconds >= sent / (gbps * 1e9), r


@pytest.mark.skipif(gpu_env.DRY_RUN, reason="CUDA graphs need a GPU (dry run on the CPU)")
@pytest.mark.parametrize("W,placement,R", [placement_param(4, "shared", 2, id_extra="2x2")])
def test_graph_replay_domains_eager(gpu_pools, record_property, W, placement, R):
    """The eager form's signal values come from device epochs that every dispatch and every
    combine kernel advance: a captured non-blocking pair replayed 50 times with fresh inputs (the same
    kernels, so the same parameters) stays equal to the reference every replay."""
    spec = make_spec(W, H=1024, form="map", k=2, E=4, tokens="equal", max_tok=64,
                     tag="graph-eager")
    spec.update(pad=16, R=R)
    results = gpu_pools.run(W, placement, "under_env", module="gpu_multi_domain_cases",
                            timeout_s=240, environment=EAGER, case="graph_replay",
                            cases_module="gpu_permute_cases", spec=spec, replays=50)
    assert all(r["replays"] == 50 for r in results), results
    report(record_property, results, label=f"graph replay eager {W // R}x{R}", dispatches=0)
