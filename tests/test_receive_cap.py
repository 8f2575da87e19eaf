"""max_num_of_tokens_for_experts on the reference engine (cases/receive_cap.py)."""

from __future__ import annotations

import pytest

from _params import seed, topo_id
from cases.inputs import make_spec

TOPOLOGIES = [(2, 2), (4, 2), (4, 1)]


@pytest.mark.parametrize("topo", TOPOLOGIES, ids=[topo_id(t) for t in TOPOLOGIES])
def test_non_blocking_drops_and_blocking_grows(pools, topo):
    W, R = topo
    spec = make_spec(seed=seed("cap", W, R), W=W, R=R, E=2, tokens=[24] * W, routing="topk",
                     k=3)
    results = pools.run(W, "cases.receive_cap", "capped_layouts", spec=spec, cap=10)
    assert sum(r["dropped"] for r in results) > 0, results
