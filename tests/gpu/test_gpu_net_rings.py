"""The rings between domains (HYBRID_EP_NET_RING_CHUNKS, docs/multi-domain.md "Rings") on one
GPU: the multi-domain matrix and permute pairs pass with rings of one and two chunk slots per
other domain (every chunk past the first K waits for a credit, every slot wraps around), also
under the emulated wire; a domain whose ranks lag behind (a GPU sleep before each call) neither
deadlocks the credits nor has a slot overwritten before it was consumed (the results equal the
reference's)."""

from __future__ import annotations

import pytest
from gpu_env import gpu_marks, placement_param
from gpu_specs import matrix_under_env, permute_under_env, report
from test_gpu_multi_domain import matrix_params, permute_params
from test_gpu_wire_model import UNDER_WIRE

pytestmark = gpu_marks

RING_2 = {"HYBRID_EP_NET_RING_CHUNKS": "2"}
RING_1 = {"HYBRID_EP_NET_RING_CHUNKS": "1"}


@pytest.mark.parametrize("W,placement,R,case", matrix_params("-ring2"))
def test_dispatch_combine_domains_ring2(gpu_pools, record_property, W, placement, R, case):
    matrix_under_env(gpu_pools, record_property, W, placement, R, case, RING_2, "ring 2")


@pytest.mark.parametrize("W,placement,R,case", matrix_params("-ring1"))
def test_dispatch_combine_domains_ring1(gpu_pools, record_property, W, placement, R, case):
    matrix_under_env(gpu_pools, record_property, W, placement, R, case, RING_1, "ring 1")


@pytest.mark.parametrize("W,placement,R,case", matrix_params("-ring2-wire", most_ranks=8))
def test_dispatch_combine_domains_ring2_under_wire(gpu_pools, record_property, W, placement, R,
                                                   case):
    matrix_under_env(gpu_pools, record_property, W, placement, R, case, RING_2 | UNDER_WIRE,
                     "ring 2 wire")


@pytest.mark.parametrize("W,placement,R,extra", permute_params("-ring1"))
def test_permute_domains_ring1(gpu_pools, record_property, W, placement, R, extra):
    permute_under_env(gpu_pools, record_property, W, placement, R, extra, RING_1, "ring 1")


@pytest.mark.parametrize("W,placement,R,K", [
    placement_param(4, "shared", 2, "1", id_extra="2x2-ring1"),
    placement_param(8, "shared", 2, "2", id_extra="4x2-ring2"),
    placement_param(8, "shared", 1, "1", id_extra="8x1-ring1")])
def test_slow_domain_with_rings(gpu_pools, record_property, W, placement, R, K):
    """Domain 0's ranks sleep ~1 ms on the GPU before every dispatch and combine; 40 pairs of
    fresh routing with 300 tokens (5 chunks) a rank: every round trip exact, every 8th call
    equal to the reference."""
    results = gpu_pools.run(W, placement, "under_env", module="gpu_multi_domain_cases",
                            environment={"HYBRID_EP_NET_RING_CHUNKS": K}, case="long_run",
                            timeout_s=300, seed=91 + W, H=2064, E=4, max_tokens=300, iters=40,
                            check_every=8, R=R, slow_domain=0, sleep_cycles=2_000_000)
    assert all(r["iterations"] == 40 for r in results), results
    report(record_property, results, label=f"slow domain {W // R}x{R} ring {K}")
