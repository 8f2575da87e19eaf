"""get_combine_input_buffer on the CUDA engine: expert outputs written into the registered
buffer are combined where they are (no staging copy), equal to the plain combine bitwise; one
claim serves one combine; growth and destroy keep a live tensor's memory; the claim and its
combine replay in a CUDA graph."""

from __future__ import annotations

import gpu_env
import pytest
from gpu_env import gpu_marks, placement_param
from gpu_specs import growth_specs, make_spec, report, spec_id

pytestmark = gpu_marks
MODULE = "gpu_combine_input_cases"

# (W, ranks per NVLink domain, make_spec keyword arguments)
CASES = [
    (1, 1, {"H": 7168, "form": "topk", "k": 8, "E": 8, "tokens": [512]}),
    (2, 2, {"H": 2064, "form": "map", "k": 2, "probs": False, "max_tok": 300}),
    (4, 4, {"H": 4096, "form": "topk", "k": 2, "routing": "skew", "tokens": "equal",
            "max_tok": 128}),
    (4, 2, {"H": 4096, "form": "topk", "k": 2, "max_tok": 200}),
    (8, 8, {"H": 7168, "form": "topk", "k": 8, "E": 8, "tokens": "equal", "max_tok": 128}),
]


@pytest.mark.parametrize("W,placement,R,case", [
    placement_param(W, "shared", R, case, id_extra=f"R{R}-{spec_id(case)}")
    for W, R, case in CASES])
def test_combine_input(gpu_pools, record_property, W, placement, R, case):
    spec = make_spec(W, tag="claimed", **case)
    spec["R"] = R
    results = gpu_pools.run(W, placement, "combine_input", module=MODULE, spec=spec)
    report(record_property, results, label=f"combine input W={W} {placement}")


@pytest.mark.parametrize("W,placement", [placement_param(2, "shared"),
                                         placement_param(4, "shared")])
def test_combine_input_lifetime(gpu_pools, record_property, W, placement):
    spec_small, spec_big, _ = growth_specs(W, 64, 300, tag="claimed")
    results = gpu_pools.run(W, placement, "combine_input_lifetime", module=MODULE,
                            spec_small=spec_small, spec_big=spec_big)
    report(record_property, results, label=f"combine input lifetime W={W} {placement}")


@pytest.mark.skipif(gpu_env.DRY_RUN, reason="CUDA graphs need a GPU (dry run on the CPU)")
@pytest.mark.parametrize("W,placement", [placement_param(2, "shared"),
                                         placement_param(4, "shared")])
def test_combine_input_graph_replay(gpu_pools, record_property, W, placement):
    spec = make_spec(W, H=1024, form="map", k=2, E=4, tokens="equal", max_tok=64,
                     probs=False, tag="claimed-graph")
    results = gpu_pools.run(W, placement, "combine_input_graph", module=MODULE, timeout_s=240,
                            spec=spec, replays=20)
    assert all(r["replays"] == 20 for r in results), results
    report(record_property, results, label=f"combine input graph replay W={W} {placement}")
