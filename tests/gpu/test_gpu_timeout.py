"""A GPU wait that times out raises HybridEPTimeoutError instead of hanging.

Runs last, in its own pool: afterwards the buffer (and the flag counters of its peers) is
unusable, so the pool is closed.
"""

from __future__ import annotations

import pytest
from gpu_env import DRY_RUN, gpu_marks, placement_param
from gpu_specs import make_spec

pytestmark = gpu_marks + [pytest.mark.gpu_last]

LIMIT_S = 2.0


@pytest.mark.skipif(DRY_RUN, reason="the reference engine has no GPU timeout")
@pytest.mark.parametrize("W,placement", [placement_param(2, "shared")])
def test_timeout(gpu_pools, record_property, W, placement):
    spec = make_spec(W, H=2064, form="topk", k=2, tokens="equal", max_tok=64, tag="timeout")
    try:
        results = gpu_pools.run(W, placement, "timeout", tag="timeout", timeout_s=120,
                                spec=spec, limit_s=LIMIT_S)
    finally:
        gpu_pools.close()
    rank0 = results[0]
    record_property("timeout_seconds", rank0.get("first_seconds"))
    print(f"rank 0: {rank0}")
    assert rank0["first"] == "timeout", \
        f"rank 0's dispatch without its peer: expected HybridEPTimeoutError, got {rank0}"
    assert LIMIT_S * 0.5 <= rank0["first_seconds"] <= LIMIT_S + 8, \
        f"HybridEPTimeoutError after {rank0['first_seconds']:.2f} s; the limit was {LIMIT_S} s"
    assert rank0["again"] == "timeout", \
        f"the next call on the timed-out buffer: expected HybridEPTimeoutError, got {rank0}"
    assert rank0["again_seconds"] < 1.0, \
        f"the next call took {rank0['again_seconds']:.2f} s to raise; expected at once"
    assert "HYBRID_EP_TIMEOUT_S" in rank0["first_message"], rank0["first_message"]
