"""Bounded host exchanges between the ranks of a group, through the group's key-value store.

A collective of the process group that a peer never joins blocks until the group's own timeout
(30 minutes by default) and does not say who is missing; gloo even aborts the process when the
ranks' sizes disagree. The exchanges here go through the store the group was built on instead:
each rank writes its value under a key of its own, then waits for every rank's key for at most
``HYBRID_EP_TIMEOUT_S`` seconds, so a wait that fails names the ranks that did not arrive and
leaves the group's own collectives untouched. A rank that raises on its input before the
exchange leaves a note in its place (``note_failure``), so its peers raise at once with its
message instead of waiting.
"""

from __future__ import annotations

import datetime
import pickle
import warnings

import torch.distributed as dist

from .errors import HybridEPMismatchError, HybridEPTimeoutError

_OK, _FAILED = "ok", "failed"


def group_store(group):
    """The store ``group`` was built on, or None where torch does not say."""
    try:
        from torch.distributed import distributed_c10d as c10d

        return c10d._world.pg_map[group][1]
    except (AttributeError, KeyError, IndexError, TypeError):
        return None


class Rendezvous:
    """A sequence of exchanges among every rank of ``group``; every rank makes the same ones in
    the same order (like the calls they belong to). ``name`` separates the sequences of
    different users of one group (every rank must pass the same)."""

    def __init__(self, group, name: str, timeout_s: float):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.timeout_s = timeout_s
        self._prefix = f"hybrid_ep/{name}"
        self._store = group_store(group)
        self._seq = 0
        self._broken: str | None = None
        if self._store is None:
            warnings.warn("hybrid_ep: the process group's store is not reachable; host "
                          "exchanges are the group's own collectives, which HYBRID_EP_TIMEOUT_S "
                          "does not bound", RuntimeWarning, stacklevel=3)

    def _key(self, seq: int, rank: int) -> str:
        return f"{self._prefix}/{seq}/{rank}"

    def _next(self) -> int:
        if self._broken is not None:
            raise HybridEPTimeoutError(f"rank {self.rank}: {self._broken}; the ranks are out of "
                                       "step and this buffer cannot be used any more")
        seq = self._seq
        self._seq += 1
        return seq

    def gather(self, op: str, value) -> list:
        """Every rank's ``value`` (any picklable object), in rank order. Raises
        HybridEPTimeoutError naming the ranks that did not arrive within the timeout, and
        HybridEPMismatchError when a rank left a failure note instead."""
        seq = self._next()
        if self._store is None:
            out = [None] * self.world
            dist.all_gather_object(out, (_OK, value), group=self.group)
            return self._values(op, out)
        self._store.set(self._key(seq, self.rank), pickle.dumps((_OK, value)))
        keys = [self._key(seq, r) for r in range(self.world)]
        try:
            self._store.wait(keys, datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError:  # DistStoreError is one; the FileStore raises a plain one
            missing = [r for r, key in enumerate(keys) if not self._store.check([key])]
            if missing:
                self._broken = f"{op}: ranks {missing} did not arrive"
                raise HybridEPTimeoutError(
                    f"rank {self.rank}: {op}: ranks {missing} did not arrive within "
                    f"{self.timeout_s:g} s (HYBRID_EP_TIMEOUT_S): they died, hang, or make a "
                    "different call; every rank must make the same calls in the same "
                    "order") from None
        raw = (self._store.multi_get(keys) if hasattr(self._store, "multi_get")
               else [self._store.get(key) for key in keys])
        if seq >= 2:  # every rank has read the keys of two exchanges ago
            self._store.delete_key(self._key(seq - 2, self.rank))
        return self._values(op, [pickle.loads(item) for item in raw])

    def _values(self, op: str, entries: list) -> list:
        failed = {r: value for r, (kind, value) in enumerate(entries) if kind == _FAILED}
        if failed:
            raise HybridEPMismatchError(
                f"rank {self.rank}: {op}: " + "; ".join(
                    f"rank {r} raised on its input ({message})" for r, message in
                    sorted(failed.items())) + "; no data moved, the buffer is still usable")
        return [value for _, value in entries]

    def note_failure(self, op: str, error: BaseException) -> None:
        """Takes this rank's part of the next exchange without waiting: its peers raise
        HybridEPMismatchError with ``error``'s message there."""
        if self._store is None or self._broken is not None:
            return
        seq = self._next()
        message = f"{type(error).__name__}: {error}"
        self._store.set(self._key(seq, self.rank), pickle.dumps((_FAILED, message)))

    def barrier(self, op: str) -> None:
        self.gather(op, None)
