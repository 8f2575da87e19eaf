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
