"""Rank code of the transport tests (imported by the pool workers, never by pytest itself).

The transport between NVLink domains is driven through ``hybrid_ep._C.Runtime`` directly: the
ranks split into ``nodes`` domains, every rank connects to the peer (same local rank) of every
other domain, and the transport self-test puts a pattern to each of them and checks what its
peers put into it.
"""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist
from gpu_cases import job

from hybrid_ep import native
from hybrid_ep.topology import gather_objects


@job
def transport_check(ctx, nodes: int, channels: int, nbytes: int, rounds: int) -> dict:
    C = native.module()
    W, rank = ctx.W, ctx.rank
    R = W // nodes
    node, local = rank // R, rank % R
    rc = C.RuntimeConfig()
    rc.world, rc.ranks, rc.nodes, rc.node_rank, rc.local_rank = W, R, nodes, node, local
    rc.experts_per_rank, rc.max_tokens, rc.hidden = 2, 64, 1024
    rc.sms_dispatch = rc.sms_combine = rc.sms_preprocessing = ctx.sms
    rc.channels = channels
    rc.timeout_s = 30.0
    runtime = C.Runtime(rc)
    group = dist.group.WORLD
    handles = gather_objects(runtime.export_handle(), group)
    runtime.open_peers(handles[node * R:(node + 1) * R])
    blobs = gather_objects(runtime.transport_bootstrap(), group)
    runtime.connect_transport([blobs[n * R + local] for n in range(nodes)])
    stream = torch.cuda.current_stream().cuda_stream
    wrong = []
    for n in range(rounds):  # every channel, and every flag advanced more than once
        dist.barrier()
        wrong.append(runtime.transport_check(nbytes, n % channels, stream))
        status = runtime.status()
        assert status["code"] == 0, f"{ctx.where()} round {n}: transport wait failed: {status}"
    counters = runtime.transport_counters()
    dist.barrier()
    torch.cuda.synchronize()
    dist.barrier()  # no peer writes into this buffer any more
    del runtime
    gc.collect()
    assert all(w == 0 for w in wrong), f"{ctx.where()} wrong bytes per round: {wrong}"
    for channel, c in enumerate(counters):
        uses = len(range(channel, rounds, channels))
        want = {"puts": uses * (nodes - 1), "signals": uses * (nodes - 1),
                "bytes": uses * (nodes - 1) * nbytes}
        assert c == want, f"{ctx.where()} channel {channel} counters {c}, expected {want}"
    return {"rank": rank, "counters": counters}
