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

from hybrid_ep import native, transport_bootstrap, transport_connect, transport_options
from hybrid_ep.backends import p2p_wire
from hybrid_ep.config import EnvSettings
from hybrid_ep.topology import gather_objects


def _connected_runtime(ctx, nodes: int, channels: int, max_tokens: int, chunk: int | None = None,
                       options: dict | None = None):
    """A runtime of this rank with its domain's peers opened and the transport connected to
    the peer of every other domain (the CUDA engine's steps, without the engine); ``options``
    adds transport options (e.g. the p2p build's network emulation)."""
    C = native.module()
    W, rank = ctx.W, ctx.rank
    R = W // nodes
    node, local = rank // R, rank % R
    rc = C.RuntimeConfig()
    rc.world, rc.ranks, rc.nodes, rc.node_rank, rc.local_rank = W, R, nodes, node, local
    rc.experts_per_rank, rc.max_tokens, rc.hidden = 2, max_tokens, 1024
    if chunk is not None:
        rc.dispatch_chunk = chunk
    rc.sms_dispatch = rc.sms_combine = rc.sms_preprocessing = ctx.sms
    rc.channels = channels
    rc.timeout_s = 30.0
    group = dist.group.WORLD
    env = EnvSettings.read()
    # As the CUDA engine: the env's direct-store choice (nixl, nvshmem builds; default on, so
    # HYBRID_EP_NIXL_DIRECT / HYBRID_EP_NVSHMEM_DIRECT=0 reaches the library's own puts), plus the
    # group's bootstrap options (the nvshmem build's unique id).
    rc.transport_options = {
        **transport_options.direct_options(C.build_info()["transport"], nodes, env),
        **transport_bootstrap.group_options(C, group, rank, rc, env), **(options or {})}
    runtime = C.Runtime(rc)
    handles = gather_objects(runtime.export_handle(), group)
    runtime.open_peers(handles[node * R:(node + 1) * R])
    connection = transport_connect.connect(
        runtime, C.build_info()["transport"], group, rank, [n * R + local for n in range(nodes)],
        env)
    return runtime, connection


@job
def transport_check(ctx, nodes: int, channels: int, nbytes: int, rounds: int) -> dict:
    rank = ctx.rank
    runtime, connection = _connected_runtime(ctx, nodes, channels, max_tokens=64)
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
    connection.close()
    runtime.release()  # collective: the nvshmem build frees its buffer on every rank together
    gc.collect()
    assert all(w == 0 for w in wrong), f"{ctx.where()} wrong bytes per round: {wrong}"
    for channel, c in enumerate(counters):
        uses = len(range(channel, rounds, channels))
        want = {"puts": uses * (nodes - 1), "signals": uses * (nodes - 1),
                "bytes": uses * (nodes - 1) * nbytes}
        assert c == want, f"{ctx.where()} channel {channel} counters {c}, expected {want}"
    return {"rank": rank, "counters": counters}


def _network_inputs(seed: int, rank: int, tokens: int, nodes: int, row_bytes: int,
                    pattern: str):
    """Rank ``rank``'s goes [T, N-1] and rows [T, row_bytes] (CPU), regenerable anywhere."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    if pattern == "dense":
        goes = torch.ones(tokens, nodes - 1, dtype=torch.bool)
    elif pattern == "runs":  # runs of 5 tokens, gaps of 3, shifted per domain
        t = torch.arange(tokens).unsqueeze(1) + torch.arange(nodes - 1).unsqueeze(0)
        goes = (t % 8) < 5
    else:  # random, with the first domain left out of one chunk-sized stretch
        goes = torch.rand(tokens, nodes - 1, generator=g) < 0.5
        goes[: tokens // 3, 0] = False
    rows = torch.randint(0, 256, (tokens, row_bytes), generator=g, dtype=torch.uint8)
    return goes, rows


@job
def network_send(ctx, nodes: int, chunk: int, pattern: str, channels: int, rounds: int) -> dict:
    """The network leg's runs, puts and signals: every peer's rows land in this rank's receive
    tiles where its routing says so, and the counters equal the reference's count."""
    from hybrid_ep.reference.network import RowWidths, TransportStats, count_dispatch_sends

    W, rank = ctx.W, ctx.rank
    R = W // nodes
    node, local = rank // R, rank % R
    T, row_bytes, blocks = 200, 1040, 3
    runtime, connection = _connected_runtime(ctx, nodes, channels, max_tokens=T, chunk=chunk)
    stream = torch.cuda.current_stream().cuda_stream
    want = TransportStats.with_channels(channels)
    offsets = runtime.layout_offsets()
    for n in range(rounds):
        goes, rows = _network_inputs(n, rank, T, nodes, row_bytes, pattern)
        goes_d, rows_d = goes.to(ctx.dev), rows.to(ctx.dev)
        dist.barrier()
        runtime.network_send_check(goes_d.data_ptr(), rows_d.data_ptr(), T, row_bytes, blocks,
                                   stream)
        status = runtime.status()
        assert status["code"] == 0, f"{ctx.where()} round {n}: network wait failed: {status}"
        # The rings [N-1, K, chunk, row_bytes]: with every chunk in the ring (the check's
        # condition), token t of the domain at index k among the others is row t of ring k.
        ring_rows = offsets["net_ring_chunks"] * chunk
        tiles = torch.empty((nodes - 1) * ring_rows * row_bytes, dtype=torch.uint8,
                            device=ctx.dev)
        runtime.copy_registered(offsets["net_rows"], tiles.numel(), tiles.data_ptr(), stream)
        tiles = tiles.view(nodes - 1, ring_rows, row_bytes)[:, :T].cpu()
        for source_node in range(nodes):
            if source_node == node:
                continue
            src_goes, src_rows = _network_inputs(n, source_node * R + local, T, nodes, row_bytes,
                                                 pattern)
            mine = src_goes[:, node if node < source_node else node - 1]
            ring = source_node if source_node < node else source_node - 1
            assert torch.equal(tiles[ring][mine], src_rows[mine]), \
                f"{ctx.where()} round {n}: rows from domain {source_node} differ"
        count_dispatch_sends(want, goes, T, chunk, blocks, RowWidths(row_bytes, 0, 0))
        dist.barrier()  # every peer read its tiles before the next round overwrites them
    got = runtime.transport_counters()
    expected = want.as_dict()["channels"]
    dist.barrier()
    torch.cuda.synchronize()
    dist.barrier()
    connection.close()
    runtime.release()  # collective: the nvshmem build frees its buffer on every rank together
    gc.collect()
    assert got == expected, f"{ctx.where()} counters {got}, the reference counts {expected}"
    return {"rank": rank, "counters": got}


@job
def wire_delivery(ctx, nodes: int, nbytes: int, spec: str, rounds: int) -> dict:
    """The p2p build's network emulation: every peer's signal is seen no earlier than the
    emulated delivery of the put before it (two operations, the bytes and the latency after
    the put was posted), measured on the GPU's global timer, which every rank of one GPU
    shares."""
    wire = p2p_wire.parse(spec)
    rank, R = ctx.rank, ctx.W // nodes
    runtime, connection = _connected_runtime(ctx, nodes, 1, max_tokens=64,
                                             options=wire.transport_options())
    stream = torch.cuda.current_stream().cuda_stream
    least_ns = 2 * wire.op_ns + (nbytes + 8) / wire.gbps + wire.latency_us * 1e3
    margins = []
    for _ in range(rounds):
        dist.barrier()
        wrong, posted, seen = runtime.transport_check_timed(nbytes, 0, stream)
        assert wrong == 0, f"{ctx.where()}: {wrong} bytes arrived wrong under the wire"
        everyone = gather_objects(posted, dist.group.WORLD)
        node = rank // R
        for n in range(nodes):
            if n == node:
                continue
            sender = everyone[n * R + rank % R]  # the peer of domain n, which put to us
            margins.append(seen[n] - sender[node] - least_ns)
    dist.barrier()
    torch.cuda.synchronize()
    dist.barrier()
    connection.close()
    runtime.release()
    gc.collect()
    # 2 ns of slack: the model floors each operation's cost to whole nanoseconds.
    assert min(margins) >= -2, (f"{ctx.where()}: a signal was seen {-min(margins):.0f} ns "
                                f"before its put's emulated delivery ({least_ns:.0f} ns)")
    return {"rank": rank, "margins_ns": margins}
