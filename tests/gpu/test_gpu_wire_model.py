"""The p2p build's network emulation (HYBRID_EP_P2P_WIRE) and the per-token prob puts
(HYBRID_EP_PROB_PUTS=token) on one GPU: the multi-domain matrix and permute pairs pass under
the wire (the combine's stored partials then wait on the emulated rail like puts);
a signal is never seen before the emulated delivery of the put before it; the counters stay
those of the reference engine's model under the wire and with per-token prob puts."""

from __future__ import annotations

import gpu_env
import pytest
from gpu_env import gpu_marks
from gpu_specs import matrix_under_env, permute_under_env
from test_gpu_multi_domain import CHUNK, matrix_params, permute_params

pytestmark = gpu_marks

WIRE = "gbps=50,latency_us=3,op_ns=400,rails=2"
UNDER_WIRE = {"HYBRID_EP_P2P_WIRE": WIRE, "HYBRID_EP_NUM_CHANNELS": "2"}


@pytest.mark.parametrize("W,placement,R,case", matrix_params("-wire"))
def test_dispatch_combine_domains_under_wire(gpu_pools, record_property, W, placement, R, case):
    matrix_under_env(gpu_pools, record_property, W, placement, R, case, UNDER_WIRE, "wire")


@pytest.mark.parametrize("W,placement,R,extra", permute_params("-wire"))
def test_permute_domains_under_wire(gpu_pools, record_property, W, placement, R, extra):
    permute_under_env(gpu_pools, record_property, W, placement, R, extra, UNDER_WIRE, "wire")


@pytest.mark.skipif(gpu_env.DRY_RUN, reason="drives the CUDA runtime directly")
@pytest.mark.parametrize("W,nodes,nbytes", [(2, 2, 65536), (4, 4, 4101), (8, 4, 1 << 18)])
def test_signal_never_seen_before_the_emulated_delivery(gpu_pools, W, nodes, nbytes):
    results = gpu_pools.run(W, "shared", "wire_delivery", module="gpu_transport_cases",
                            nodes=nodes, nbytes=nbytes, spec="gbps=5,latency_us=20,op_ns=1000",
                            rounds=3)
    margins = [m for r in results for m in r["margins_ns"]]
    assert len(margins) == 3 * W * (nodes - 1) and min(margins) >= -2, margins


@pytest.mark.parametrize("environment", [UNDER_WIRE, {"HYBRID_EP_PROB_PUTS": "token"},
                                         {**UNDER_WIRE, "HYBRID_EP_PROB_PUTS": "token"}],
                         ids=["wire", "token-probs", "wire-token-probs"])
def test_dense_counters_under_wire_and_per_token_probs(gpu_pools, environment):
    """Dense routing, 2x2, 150 tokens: the CUDA counters equal the reference's model (the
    case asserts it per rank); with per-token probs a chunk costs one row put plus one prob put
    per token, and the wire changes no count."""
    W, R, tokens = 4, 2, 150
    results = gpu_pools.run(W, "shared", "under_env", module="gpu_multi_domain_cases",
                            environment=environment, case="counters", R=R, pattern="dense",
                            dtype="bf16", with_probs=True, channels=1, tokens=tokens)
    chunks = -(-tokens // CHUNK)
    per_token = environment.get("HYBRID_EP_PROB_PUTS") == "token"
    assert len(results) == W, results
    for r in results:
        sent = r["cuda_dispatch"]
        want = chunks + tokens if per_token else 2 * chunks
        assert sent["signals"] == chunks and sent["puts"] == want, sent
