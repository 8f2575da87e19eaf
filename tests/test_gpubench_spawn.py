"""The benchmark's rank launcher (gpubench/spawn.py) on the CPU: every rank runs the
measurement with the environment given, and the results come back in rank order."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist

from hybrid_ep.gpubench.spawn import run_ranks


@dataclass
class Seen:
    rank: int
    world: int
    value: str
    label: str


def measure(label: str, rank: int) -> Seen:
    return Seen(rank=rank, world=dist.get_world_size(), value=os.environ["SPAWN_TEST_VALUE"],
                label=label)


def test_every_rank_measures_with_the_environment():
    results = run_ranks(3, measure, ("x",), {"SPAWN_TEST_VALUE": "42"})
    assert results == [{"rank": r, "world": 3, "value": "42", "label": "x"} for r in range(3)]


@dataclass
class Started:
    rank: int
    start: float
    late_s: float  # how far past the agreed instant the rank's clock was when it returned


def start_together(rank: int) -> Started:
    import time

    from hybrid_ep.gpubench.timing import common_start

    if rank == 1:
        time.sleep(0.05)  # a rank arriving late: the others must not start before it
    start = common_start(dist.group.WORLD)
    return Started(rank=rank, start=start, late_s=time.perf_counter() - start)


def test_ranks_start_timed_calls_at_one_instant():
    results = run_ranks(3, start_together, (), {})
    assert len({r["start"] for r in results}) == 1
    assert all(0 <= r["late_s"] < 2e-3 for r in results), results
