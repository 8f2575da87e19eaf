"""Helpers for code running inside a worker rank."""

from __future__ import annotations

import contextlib
import datetime
import os

import torch
import torch.distributed as dist

from .inputs import FP8_KINDS


def job_group():
    """The process group of the running job (a fresh one per job, see ``_pool.py``)."""
    import _pool

    group = _pool.job_group()
    return group if group is not None else dist.group.WORLD


def rank() -> int:
    return dist.get_rank()


def world() -> int:
    return dist.get_world_size()


@contextlib.contextmanager
def env(**values):
    """Set environment variables (None: unset) for the duration of the block."""
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def short_group(seconds: float = 10):
    """A fresh group over all ranks whose collectives time out after ``seconds`` (collective:
    every rank must enter it)."""
    group = dist.new_group(list(range(world())), timeout=datetime.timedelta(seconds=seconds))
    dist.barrier(group=group)  # connected on every rank before anyone may destroy it
    try:
        yield group
    finally:
        dist.destroy_process_group(group)


def make_buffer(spec: dict, group=None, **overrides):
    from hybrid_ep import HybridEPBuffer

    kwargs = {
        "group": group if group is not None else job_group(),
        "hidden_dim": spec["H"],
        "max_num_of_tokens_per_rank": spec["max_tokens"][rank()],
        "num_local_experts": spec["E"],
        "use_fp8": spec["dtype"] in FP8_KINDS,
        "num_of_hybrid_ep_ranks_per_nvlink_domain": spec["R"],
    }
    kwargs.update(overrides)
    return HybridEPBuffer(**kwargs)


def check_buffer_attributes(buf, spec: dict) -> None:
    r, W, R = rank(), spec["W"], spec["R"]
    expected = {"rank": r, "group_size": W, "num_of_hybrid_ep_ranks_per_nvlink_domain": R,
                "local_rank": r % R, "node_rank": r // R, "num_of_nodes": W // R}
    for name, value in expected.items():
        got = getattr(buf, name)
        assert got == value, f"[rank {r}] buffer.{name} = {got!r}, expected {value!r}"


class ExpectedError(AssertionError):
    pass


@contextlib.contextmanager
def raises(*names: str):
    """Expect ValueError or TypeError whose message names one of ``names``; yields a list
    that receives the message."""
    caught = []
    try:
        yield caught
    except (ValueError, TypeError) as exc:
        msg = str(exc)
        if not any(n in msg for n in names):
            raise ExpectedError(f"[rank {rank()}] {type(exc).__name__} does not name any of "
                                f"{names}: {msg!r}") from exc
        caught.append(f"{type(exc).__name__}: {msg}")
        return
    raise ExpectedError(f"[rank {rank()}] no ValueError/TypeError naming {names} was raised")


def as_tensor_count(value: int) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.int64)


def profiled(module: str, function: str, kwargs: dict, top: int = 25) -> str:
    """Debugging aid: run a case under cProfile; rank 0 returns the top of the profile."""
    import cProfile
    import importlib
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    getattr(importlib.import_module(module), function)(**kwargs)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue() if rank() == 0 else ""

