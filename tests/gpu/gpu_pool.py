"""Worker pools of the GPU tests: one pool per (world size, placement, tag), one alive at a time.

The pools are the CPU suite's (``tests/_pool.py``: persistent spawned workers joined by gloo);
the rank code in ``gpu_cases`` puts every worker on its GPU at the start of each job. Only one
pool lives at a time (the GPU holds the CUDA contexts of its ranks), and the conftest orders the
GPU tests by pool key, so each pool starts once per session.
"""

from __future__ import annotations

from _pool import WorkerPool

CASES_MODULE = "gpu_cases"
DEFAULT_TIMEOUT_S = 120


class GpuPools:
    def __init__(self):
        self._key = None
        self._pool: WorkerPool | None = None
        self.started = []  # keys in start order (a report of how many start-ups happened)

    def get(self, W: int, placement: str, tag: str = "") -> WorkerPool:
        key = (W, placement, tag)
        if self._pool is None or self._pool.broken or self._key != key:
            self.close()
            self._pool = WorkerPool(W)
            self._key = key
            self.started.append(key)
        return self._pool

    def run(self, W: int, placement: str, function: str, /, tag: str = "",
            timeout_s: float = DEFAULT_TIMEOUT_S, module: str = CASES_MODULE, **kwargs) -> list:
        """Run ``module.function(placement=..., **kwargs)`` on every rank (``gpu_cases`` unless
        told); per-rank results."""
        __tracebackhide__ = True
        pool = self.get(W, placement, tag)
        return pool.run(module, function, timeout_s=timeout_s, placement=placement, **kwargs)

    def close(self) -> None:
        if self._pool is not None and not self._pool.broken:
            self._pool.close()
        self._pool = None
        self._key = None
