"""Running one measurement on every rank: spawned processes (rank r on GPU r % device_count),
a gloo group, and every rank's result record gathered into a list of dicts."""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from dataclasses import asdict

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank_process(rank: int, world: int, port: int, out_path: str, env: dict, measure, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    os.environ.update(env)  # before the CUDA context: MPS reads its share from it
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        mine = measure(*args, rank)
        everyone = [None] * world
        dist.all_gather_object(everyone, asdict(mine))
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(everyone, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, measure, args: tuple, env: dict | None = None) -> list[dict]:
    """``measure(*args, rank)`` (a module-level function returning a dataclass) on ``world``
    spawned ranks with ``env`` set in each; returns their results, rank order."""
    from ..cpu import free_port

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ranks.json")
        mp.start_processes(_rank_process,
                           args=(world, free_port(), path, dict(env or {}), measure, args),
                           nprocs=world, start_method="spawn")
        with open(path) as f:
            return json.load(f)
