"""dispatch / combine on 2, 4 and 8 ranks in 1, 2 and 4 domains, against the oracle."""

from __future__ import annotations

import pytest

from _params import seed, topologies
from cases.inputs import make_spec

ROUTINGS = [("map", True), ("map", False), ("topk", True), ("topk", False), ("skew", True)]


@topologies
@pytest.mark.parametrize("routing,with_probs", ROUTINGS,
                         ids=[f"{r}-{'probs' if p else 'noprobs'}" for r, p in ROUTINGS])
@pytest.mark.parametrize("dtype", ["bf16", "u8", "e4m3"])
def test_dispatch_combine(pools, topo, routing, with_probs, dtype):
    W, R = topo
    spec = make_spec(seed=seed("dc", W, R, routing, with_probs, dtype), W=W, R=R,
                     E=1 + (W + R) % 3, routing=routing, dtype=dtype, with_probs=with_probs)
    Ts = pools.run(W, "cases.dispatch", "dispatch_combine", spec=spec)
    assert Ts == [max(spec["max_tokens"])] * W, f"handle T per rank: {Ts}"
