"""The receive cap (max_num_of_tokens_for_experts) below the rows routed to a rank, on the CUDA
engine against the reference engine: a blocking dispatch grows it and loses nothing; a
non-blocking dispatch_with_permute (standalone and fused) drops the rows past it on the device,
exactly the reference's, flags them in dropped_rows(), and its combine matches. One domain of
2 and 4 ranks, and two domains of 2."""

from __future__ import annotations

import pytest
from gpu_env import gpu_marks, placement_param
from gpu_specs import make_spec, report

pytestmark = gpu_marks
MODULE = "gpu_receive_cap_cases"

# (W, R or None for one domain); a cap of half a rank's tokens is below what top-4 routing
# sends any rank.
TOPOLOGIES = ((2, None), (4, None), (4, 2))


def _spec(W: int, R, **extra) -> dict:
    spec = make_spec(W, H=2048, form="topk", k=4, E=4, max_tok=64, tokens=[64] * W,
                     tag="receive-cap")
    spec["cap"] = 32
    if R is not None:
        spec["R"] = R
    spec.update(extra)
    return spec


def _id(W: int, R) -> str:
    return f"W{W}" + (f"R{R}" if R else "")


@pytest.mark.parametrize("W,placement,R", [placement_param(W, "shared", R, id_extra=_id(W, R))
                                           for W, R in TOPOLOGIES])
def test_blocking_grows_the_cap(gpu_pools, record_property, W, placement, R):
    results = gpu_pools.run(W, placement, "blocking_grows", module=MODULE, spec=_spec(W, R))
    report(record_property, results, label=f"receive cap blocking {_id(W, R)}")


@pytest.mark.parametrize("fused", (False, True), ids=("standalone", "fused"))
@pytest.mark.parametrize("W,placement,R", [placement_param(W, "shared", R, id_extra=_id(W, R))
                                           for W, R in TOPOLOGIES])
def test_non_blocking_drops_past_the_cap(gpu_pools, record_property, W, placement, R, fused):
    spec = _spec(W, R, pad=16, fused=fused)
    results = gpu_pools.run(W, placement, "non_blocking_drops", module=MODULE, spec=spec)
    report(record_property, results, label=f"receive cap non-blocking {_id(W, R)}")
