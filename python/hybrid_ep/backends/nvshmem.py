"""The nvshmem build's NVSHMEM settings. NVSHMEM reads its variables once per process, at its
first call, so they are applied before the unique id is made (transport_bootstrap.py); a
value the user set always wins (os.environ.setdefault).
"""

from __future__ import annotations

import logging
import os

NVSHMEM_HEAP_SLACK = 256 << 20  # room in a static heap beside the registered buffer
NVSHMEM_HEAP_ALIGN = 2 << 20


def nvshmem_environment(hostnames: list[str], env, layout_bytes: int) -> dict[str, str]:
    """NVSHMEM_* defaults for a group whose ranks run on ``hostnames`` (one per rank), with
    ``env`` (EnvSettings: channels, GID index, traffic class) and a registered buffer of
    ``layout_bytes``. Pure: applying them is apply_environment's job."""
    heap = -(-(layout_bytes + NVSHMEM_HEAP_SLACK) // NVSHMEM_HEAP_ALIGN) * NVSHMEM_HEAP_ALIGN
    out = {
        # A static heap (NVSHMEM_DISABLE_CUDA_VMM=1) must hold the buffer; a VMM heap grows.
        "NVSHMEM_SYMMETRIC_SIZE": str(heap),
        # No NVSHMEM collectives are used: no NVLS, no NCCL (which also warns under MPS).
        "NVSHMEM_DISABLE_NVLS": "1",
        "NVSHMEM_DISABLE_NCCL": "1",
    }
    if len(set(hostnames)) == 1:
        # One host: every PE pair is P2P, the other domains included; the unique-id bootstrap
        # connects over loopback.
        out["NVSHMEM_REMOTE_TRANSPORT"] = "none"
        out["NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME"] = "lo"
    else:
        # GPU-initiated RDMA; block b of a kernel uses queue pair b % channels, as our channels.
        out["NVSHMEM_IB_ENABLE_IBGDA"] = "1"
        out["NVSHMEM_IBGDA_NUM_RC_PER_PE"] = str(env.num_channels)
        out["NVSHMEM_IBGDA_RC_MAP_BY"] = "cta"
        if env.ib_gid_index is not None:
            out["NVSHMEM_IB_GID_INDEX"] = str(env.ib_gid_index)
        if env.ib_traffic_class:
            out["NVSHMEM_IB_TRAFFIC_CLASS"] = str(env.ib_traffic_class)
    return out


_logged_environment: dict[str, str] | None = None


def apply_environment(defaults: dict[str, str], environ=None) -> dict[str, str]:
    """Sets each of ``defaults`` the environment does not set already (never over a user's
    value); returns those it set. The first call that sets any logs them."""
    global _logged_environment
    environ = os.environ if environ is None else environ
    applied = {}
    for name, value in defaults.items():
        if name not in environ:
            applied[name] = value
        environ.setdefault(name, value)
    if applied and _logged_environment is None and environ is os.environ:
        _logged_environment = applied
        logging.getLogger(__name__).info("NVSHMEM defaults applied: %s", " ".join(
            f"{k}={v}" for k, v in sorted(applied.items())))
    return applied
