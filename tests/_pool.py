"""A pool of persistent worker processes, one per rank, joined by a gloo process group.

Spawning processes and importing torch costs seconds, so each world size gets one pool for the
whole test session. A test sends one job -- ``(module, function, kwargs)`` -- to every rank;
each worker imports the module, calls the function and sends back its return value or the
formatted traceback. A job that does not finish in time fails the test and the pool is torn
down (the next test that needs that world size gets a fresh one), and so is a pool whose job
failed on any rank: ranks that went different ways through a job would meet the next one out
of step. Each job runs on a fresh process group (``job_group()``).

This module must not import torch at the top: the workers set their thread environment first.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import queue
import sys
import time
import traceback

# Seconds a gloo collective may wait before it raises (a hang inside one job becomes an error
# with a traceback, before the pool's own job timeout fires).
GLOO_TIMEOUT_S = 60
START_TIMEOUT_S = 180
DEFAULT_JOB_TIMEOUT_S = 150
FAILURE_GRACE_S = 3


_JOB_GROUP = None


def job_group():
    """Inside a worker: the process group of the running job (all ranks of the pool)."""
    return _JOB_GROUP


def _worker(rank: int, world_size: int, init_method: str, job_q, result_q,
            parent_pid: int) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    try:
        import datetime

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S),
        )
    except BaseException:  # noqa: BLE001 - reported to the test session
        result_q.put(("start", rank, False, traceback.format_exc()))
        return
    result_q.put(("start", rank, True, None))
    while True:
        try:
            job = job_q.get(timeout=5)
        except queue.Empty:
            if os.getppid() != parent_pid:  # the test session died: do not linger
                return
            continue
        if job is None:
            break
        job_id, module_name, function_name, kwargs = job
        global _JOB_GROUP
        try:
            # A fresh group per job: a job that fails half-way through a collective leaves
            # nothing behind that could pair up with the next job's collectives.
            _JOB_GROUP = dist.new_group(list(range(world_size)),
                                        timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
            # Connect every pair now: a group destroyed by one rank while a peer is still
            # connecting fails that peer ("connectFullMesh ... closed by peer").
            dist.barrier(group=_JOB_GROUP)
            function = getattr(importlib.import_module(module_name), function_name)
            result = function(**kwargs)
            result_q.put((job_id, rank, True, result))
        except BaseException:  # noqa: BLE001 - everything goes back to the test
            result_q.put((job_id, rank, False, traceback.format_exc()))
        finally:
            if _JOB_GROUP is not None:
                with contextlib.suppress(Exception):
                    dist.destroy_process_group(_JOB_GROUP)
            _JOB_GROUP = None
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


class JobError(AssertionError):
    pass


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkerPool:
    def __init__(self, world_size: int):
        import torch.multiprocessing as mp

        self.world_size = world_size
        self.broken = False
        self._next_job = 0
        ctx = mp.get_context("spawn")
        # A TCP store: the library's host exchanges go through the group's store
        # (hybrid_ep/rendezvous.py), and a FileStore's waits poll every 10 ms.
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        self._result_q = ctx.Queue()
        self._job_qs = [ctx.Queue() for _ in range(world_size)]
        self._procs = []
        for rank in range(world_size):
            proc = ctx.Process(
                target=_worker,
                args=(rank, world_size, init_method, self._job_qs[rank], self._result_q,
                      os.getpid()),
                daemon=True,
                name=f"hybrid-ep-test-rank{rank}of{world_size}",
            )
            proc.start()
            self._procs.append(proc)
        results = self._collect("start", START_TIMEOUT_S)
        failed = {r: tb for r, (ok, tb) in results.items() if not ok}
        if failed:
            self.close()
            raise JobError(f"worker pool of {world_size} ranks failed to start:\n"
                           + "\n".join(f"rank {r}:\n{tb}" for r, tb in sorted(failed.items())))

    def _collect(self, job_id, timeout_s: float) -> dict:
        results = {}
        deadline = time.monotonic() + timeout_s
        while len(results) < self.world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(self.world_size)) - set(results))
                self.close()
                if any(not ok for ok, _ in results.values()):
                    return results
                raise JobError(
                    f"job {job_id!r} timed out after {timeout_s:.0f}s on {self.world_size} "
                    f"ranks; no answer from ranks {missing}; answers so far: "
                    + "".join(f"\nrank {r}: {'ok' if ok else tb}"
                              for r, (ok, tb) in sorted(results.items())))
            try:
                got_id, rank, ok, payload = self._result_q.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs)
                        if not p.is_alive() and r not in results]
                if dead:
                    codes = {r: self._procs[r].exitcode for r in dead}
                    self.close()
                    raise JobError(f"job {job_id!r}: worker processes died: {codes}")
                continue
            if got_id != job_id:  # a late answer of an earlier job: ignore
                continue
            results[rank] = (ok, payload)
            if not ok and job_id != "start":
                # The other ranks are probably stuck in a collective with the failed one:
                # give them a moment to fail too, then report without waiting for the timeout.
                deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
        return results

    def run(self, module: str, function: str, /, timeout_s: float = DEFAULT_JOB_TIMEOUT_S,
            **kwargs) -> list:
        """Run ``module.function(**kwargs)`` on every rank; the list of per-rank results."""
        __tracebackhide__ = True
        if self.broken:
            raise JobError("pool is broken")
        self._next_job += 1
        job_id = self._next_job
        for q in self._job_qs:
            q.put((job_id, module, function, kwargs))
        results = self._collect(job_id, timeout_s)
        failed = {r: tb for r, (ok, tb) in results.items() if not ok}
        silent = sorted(set(range(self.world_size)) - set(results))
        if failed:
            # Start afresh: ranks stuck in a collective with the failed ones, or ranks that
            # went different ways through the job, would meet the next job out of step (the
            # library numbers each group's buffers per process, rendezvous.py).
            self.close()
            first = min(failed)
            others = [r for r in sorted(failed) if failed[r] != failed[first]]
            msg = (f"{module}.{function} failed on ranks {sorted(failed)} of "
                   f"{self.world_size}"
                   + (f" (ranks {silent} still running, killed)" if silent else "")
                   + f":\n--- rank {first} ---\n{failed[first]}")
            for r in others[:3]:
                msg += f"\n--- rank {r} ---\n{failed[r]}"
            raise JobError(msg)
        return [results[r][1] for r in range(self.world_size)]

    def close(self) -> None:
        self.broken = True
        for q in self._job_qs:
            with contextlib.suppress(Exception):
                q.put(None)
        deadline = time.monotonic() + 5
        for p in self._procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


class PoolManager:
    """One live pool per world size, created on first use and again after a failure."""

    def __init__(self):
        self._pools: dict[int, WorkerPool] = {}

    def get(self, world_size: int) -> WorkerPool:
        pool = self._pools.get(world_size)
        if pool is None or pool.broken:
            pool = WorkerPool(world_size)
            self._pools[world_size] = pool
        return pool

    def run(self, world_size: int, module: str, function: str, /, **kwargs) -> list:
        __tracebackhide__ = True
        return self.get(world_size).run(module, function, **kwargs)

    def close(self) -> None:
        for pool in self._pools.values():
            if not pool.broken:
                pool.close()
        self._pools.clear()


def tests_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))


if tests_dir() not in sys.path:  # the workers import the case modules from here
    sys.path.insert(0, tests_dir())
