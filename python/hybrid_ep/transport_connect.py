"""Connecting a runtime's transport to the peer of every other NVLink domain: the one place
that knows how each build's transport is bootstrapped (the CUDA engine and the GPU transport
tests both connect through it).

Most builds exchange ``transport_bootstrap()`` blobs through the process group. The nixl build
runs its control plane here instead (``backends/nixl_control.py``): NIXL agents exchange metadata and
prepare memory views, whose addresses become the blobs. The returned handle must be closed
after the GPU is done with the transport and before the runtime (its buffer) is dropped.
"""

from __future__ import annotations

from .backends import nixl_control
from .topology import gather_objects


class Connection:
    """What keeps a connected transport alive besides the runtime (the nixl control plane)."""

    def __init__(self, plane: nixl_control.NixlControlPlane | None = None):
        self.plane = plane

    def close(self) -> None:
        plane, self.plane = self.plane, None
        if plane is not None:
            plane.close()


def connect(runtime, transport: str, group, rank: int, peers: list[int], env) -> Connection:
    """``peers[n]``: the global rank of this rank's peer in domain n (``rank`` itself for its
    own domain). ``env``: an EnvSettings (channels, run id, etcd endpoints, timeout)."""
    if transport == "nixl" and len(peers) > 1:
        plane = nixl_control.NixlControlPlane(
            group, rank, peers, nixl_control.Region.parse(runtime.transport_bootstrap()),
            channels=env.num_channels, run_id=env.run_id, use_etcd=bool(env.etcd_endpoints),
            timeout_s=env.timeout_s, progress_thread=env.nixl_progress_thread)
        try:
            runtime.connect_transport(plane.blobs)
        except BaseException:
            plane.close()
            raise
        return Connection(plane)
    blobs = gather_objects(runtime.transport_bootstrap(), group)
    runtime.connect_transport([blobs[p] for p in peers])
    return Connection()
