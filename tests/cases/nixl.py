"""Jobs run on every rank: the nixl control plane with real NIXL agents on DRAM (CPU only)."""

from __future__ import annotations

import torch

from hybrid_ep.backends.nixl_control import NixlControlPlane, NixlPeerTimeout, Region

from .common import job_group, rank, world


def _fill(buffer: torch.Tensor, who: int) -> None:
    buffer.copy_((torch.arange(buffer.numel()) * 7 + who * 31).to(torch.uint8))


def host_transfer(run_id: str, size: int = 4096, piece: int = 256) -> dict:
    """Every rank is its own domain: it writes one piece of its buffer into a slot of every
    peer's buffer through NIXL (UCX), then checks what its peers wrote into its slots."""
    me, n = rank(), world()
    buffer = torch.empty(size, dtype=torch.uint8)
    _fill(buffer, me)
    expected = buffer.clone()
    region = Region(buffer.data_ptr(), size, 0)
    plane = NixlControlPlane(job_group(), me, list(range(n)), region, channels=2, run_id=run_id,
                             use_etcd=False, timeout_s=30, mem_type="DRAM", views=False)
    try:
        names = dict(plane.remote_names)
        channels = plane.agent.backend_options["UCX"].get("ucx_num_device_channels")
        for peer in range(n):
            if peer != me:
                plane.write(peer, 0, size // 2 + me * piece, piece)
        torch.distributed.barrier(job_group())
        bad = 0
        for peer in range(n):
            if peer == me:
                continue
            mine = torch.empty(size, dtype=torch.uint8)
            _fill(mine, peer)
            slot = slice(size // 2 + peer * piece, size // 2 + (peer + 1) * piece)
            bad += int((buffer[slot] != mine[:piece]).sum())
            expected[slot] = mine[:piece]
        untouched = int((buffer != expected).sum())
        torch.distributed.barrier(job_group())
    finally:
        plane.close()
    return {"bad": bad, "untouched_changed": untouched, "names": names, "channels": channels,
            "closed": plane.agent is None}


def dram_views_fail_naming_the_step() -> str:
    """UCX makes memory views of VRAM only: on DRAM the local view step must give up in time
    and say which step failed; the agent is released on the way out."""
    buffer = torch.zeros(1024, dtype=torch.uint8)
    try:
        NixlControlPlane(job_group(), rank(), list(range(world())),
                         Region(buffer.data_ptr(), 1024, 0), channels=1,
                         run_id=None,
                         use_etcd=False, timeout_s=0.5, mem_type="DRAM", views=True)
    except NixlPeerTimeout as error:
        return str(error)
    return "no error"
