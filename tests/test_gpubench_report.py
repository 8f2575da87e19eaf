"""The GPU benchmark's tables from rank results (no GPU): the API floors (an empty kernel, and
the runtime's barrier alone) go into every regime's header, next to the roofline."""

from __future__ import annotations

from dataclasses import asdict

from hybrid_ep_bench.gpubench.config import GpuBenchConfig, RankResult, RunSpec
from hybrid_ep_bench.gpubench.report import format_regime
from hybrid_ep_bench.gpubench.summary import summarize


def _rank(rank: int, floor_s: float | None, barrier_s: float | None = None) -> dict:
    r = RankResult(rank=rank, device=0, gpu="test GPU", sm_count=132, roofline_gbps=4000.0)
    r.api_s = {"dispatch_bf16": [300e-6, 310e-6], "combine_bf16": [280e-6, 290e-6]}
    r.kernel_s = {"dispatch_bf16": [200e-6, 210e-6], "combine_bf16": [190e-6, 200e-6]}
    r.api_rows, r.api_copies = [4096, 4096], [4096, 4096]
    r.api_floor_s = floor_s
    r.api_floor_barrier_s = barrier_s
    return asdict(r)


def test_api_floor_is_reported_per_run():
    cfg = GpuBenchConfig(tokens=4096, fp8=False, permute=False)
    env = {"mps": "running", "date": "today", "commit": "abc", "host": "host", "torch": "x"}
    runs = [summarize(cfg, RunSpec("hbm", 2, 16), [_rank(0, 40e-6, 70e-6), _rank(1, 60e-6, 90e-6)]),
            summarize(cfg, RunSpec("hbm", 4, 16), [_rank(r, None) for r in range(4)])]
    assert runs[0]["api_floor_us"] == 50.0
    text = format_regime(cfg, env, "hbm", runs)
    floor = next(line for line in text.splitlines() if line.startswith("API floor"))
    assert floor.endswith("2 rank(s): 50 us, 4 rank(s): n/a")
    meets = next(line for line in text.splitlines() if line.startswith("API floor of a call"))
    assert runs[0]["api_floor_barrier_us"] == 80.0
    assert meets.endswith("2 rank(s): 80 us, 4 rank(s): n/a")
