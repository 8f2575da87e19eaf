"""What a build's transport needs from the whole group before any rank builds its runtime, as
extra ``RuntimeConfig.transport_options``. Collective: every rank calls it with the same group.

The nvshmem build starts NVSHMEM inside the runtime's constructor (its registered buffer is an
NVSHMEM symmetric allocation), from a unique id that the group's rank 0 makes. Here: NVSHMEM's
environment defaults are applied (before NVSHMEM reads them, at its first call), every rank
checks what NVSHMEM will load (preflight) and rank 0 makes the id; one all-gather carries the
results, so a failure on any rank raises on every rank instead of leaving the others waiting
in NVSHMEM's bootstrap.
"""

from __future__ import annotations

import socket

from .backends import nvshmem
from .config import EnvSettings
from .topology import gather_objects


class TransportBootstrapError(RuntimeError):
    """A rank could not prepare the transport; raised on every rank of the group."""


def group_options(C, group, rank: int, rc, env: EnvSettings | None = None) -> dict[str, str]:
    """Options to add to ``rc.transport_options`` (``rc``: this rank's filled RuntimeConfig;
    ``rank``: this rank's index in ``group``). Empty for builds and groups that need none."""
    if C.build_info()["transport"] != "nvshmem" or rc.nodes == 1:
        return {}
    env = EnvSettings.read() if env is None else env
    hostnames = gather_objects(socket.gethostname(), group)
    nvshmem.apply_environment(
        nvshmem.nvshmem_environment(hostnames, env, C.Runtime.bytes_for(rc)))
    entries = gather_objects(_local_entry(C, rank), group)
    failed = [(r, error) for r, (error, _) in enumerate(entries) if error is not None]
    if failed:
        detail = "; ".join(f"rank {r}: {error}" for r, error in failed)
        raise TransportBootstrapError(
            f"rank {rank}: the nvshmem transport cannot start ({len(failed)} of "
            f"{len(entries)} ranks failed to prepare it): {detail}")
    return {"unique_id": entries[0][1].hex()}


def _local_entry(C, rank: int) -> tuple[str | None, bytes]:
    """(error or None, rank 0's unique id or empty bytes)."""
    try:
        C.transport_preflight()
        unique_id = bytes(C.transport_unique_id()) if rank == 0 else b""
    except RuntimeError as error:  # TransportUnavailableError, CudaError: raised on every rank
        return f"{type(error).__name__}: {error}", b""
    return None, unique_id
