"""The doca build's host side: which NICs a GPU uses, how deep its queue pairs must be, and
the options handed to backends/doca (``RuntimeConfig.transport_options``).

Queue depth: a warp's puts to a peer stay unrung on the queue pair until that chunk's signal
rings one doorbell, so every warp sharing a queue pair may hold a whole chunk's work requests
there at once; the queue must hold all of them, or posting would wait on itself.
"""

from __future__ import annotations

import re
from pathlib import Path

from . import nic_topology

# Tensors a chunk's network send puts per run: rows, probs, FP8 scales
# (csrc/hybrid_ep/kernels/network_send.cuh, kMaxNetTensors).
MAX_NET_TENSORS = 3
# Warps of one block that send, each holding at most one chunk's work requests unrung: at
# least the dispatch's 4 network warps (kernels/dispatch_block.cuh, kNetworkWarps) and the
# combine's 2 (kernels/combine_ring.cuh). Kept at 8, the count of the combine's old network
# kernel, so that the default queue depths (and the channels they need) stay those tested until
# a NIC run shows the tighter bound suffices.
SENDING_WARPS_PER_BLOCK = 8
# DOCA GPUNetIO indexes the send queue with 16 bits: the largest power-of-two depth.
MAX_QP_DEPTH = 32768


def worst_case_wqes(chunk_tokens: int, blocks: int, channels: int,
                    per_token_probs: bool = False) -> int:
    """Work requests one queue pair may hold before their doorbell: per warp a chunk's
    runs (at most every other token) times the tensors, plus its signal; with per-token prob
    puts (HYBRID_EP_PROB_PUTS=token) one tensor's puts are one per token instead. Block b uses
    channel b % channels, so the sending warps of ceil(blocks / channels) blocks share a queue
    pair."""
    runs = (chunk_tokens + 1) // 2
    per_warp = runs * MAX_NET_TENSORS + 1
    if per_token_probs:
        per_warp += chunk_tokens - runs
    return per_warp * SENDING_WARPS_PER_BLOCK * -(-blocks // channels)


def resolve_qp_depth(requested: int | None, chunk_tokens: int, blocks: int, channels: int,
                     per_token_probs: bool = False) -> int:
    """HYBRID_EP_DOCA_QP_DEPTH, or the worst case rounded up to a power of two when unset;
    raises ValueError naming the limit to raise when the queue cannot hold the worst case."""
    def wqes(channels: int) -> int:
        return worst_case_wqes(chunk_tokens, blocks, channels, per_token_probs)

    need = wqes(channels)
    detail = (
        f"up to {-(-blocks // channels)} blocks x {SENDING_WARPS_PER_BLOCK} sending warps share "
        f"each of the {channels} channels' queue pairs, each warp with up to "
        f"{(chunk_tokens + 1) // 2} runs x "
        f"{MAX_NET_TENSORS} tensors + 1 signal per chunk of {chunk_tokens} tokens: "
        f"{need} work requests"
    )
    if need > MAX_QP_DEPTH:
        if wqes(blocks) > MAX_QP_DEPTH:
            raise ValueError(
                f"doca transport: {detail}, more than a queue pair holds ({MAX_QP_DEPTH}) even "
                "with one block per channel; lower the chunk size "
                "(NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API / _COMBINE_API)"
            )
        channels_needed = channels
        while wqes(channels_needed) > MAX_QP_DEPTH:
            channels_needed += 1
        raise ValueError(
            f"doca transport: {detail}, more than a queue pair holds "
            f"({MAX_QP_DEPTH}); raise HYBRID_EP_NUM_CHANNELS to at least "
            f"{channels_needed}, or lower the chunk size "
            "(NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API / _COMBINE_API) or the SMs"
        )
    if requested is None:
        return max(64, 1 << (need - 1).bit_length())
    if requested < need:
        raise ValueError(
            f"environment variable HYBRID_EP_DOCA_QP_DEPTH={requested} is too "
            f"small: {detail}; raise HYBRID_EP_DOCA_QP_DEPTH to at least "
            f"{1 << (need - 1).bit_length()} (or unset it), or raise "
            "HYBRID_EP_NUM_CHANNELS so fewer blocks share a queue pair"
        )
    return requested


def doca_options(
    env, config, gpu_index: int, gpu_bus_id: str, sysfs: Path = nic_topology.SYSFS
) -> dict[str, str]:
    """The doca backend's options (backends/doca/options.h) for this rank's GPU."""
    nics = nic_topology.nics_for_gpu(env.nic_mapping, gpu_index, gpu_bus_id, sysfs)
    entries = []
    for nic, port in nics:
        gid = env.ib_gid_index
        if gid is None:
            gid = nic_topology.auto_gid_index(nic, port, sysfs)
        entries.append(f"{nic}:{port}:{gid}")
    blocks = max(
        config.num_sms_dispatch_api, config.num_sms_combine_api, config.num_sms_preprocessing_api
    )
    chunk = max(
        config.num_of_tokens_per_chunk_dispatch_api, config.num_of_tokens_per_chunk_combine_api
    )
    depth = resolve_qp_depth(env.doca_qp_depth, chunk, blocks, env.num_channels,
                             env.prob_puts == "token")
    return {
        "nics": ",".join(entries),
        "traffic_class": str(env.ib_traffic_class),
        "qp_depth": str(depth),
    }


_NIC_ENTRY = re.compile(r"^(\d+):([A-Za-z0-9_.\-]+)(?::(\d+))?$")


def parse_nic_mapping(text: str | None) -> dict[int, list[tuple[str, int]]] | None:
    """``gpu:nic[:port],...`` -> {gpu: [(nic, port), ...]} in the order given; several NICs per
    GPU allowed (each becomes a channel's NIC), the same (gpu, nic, port) twice is not."""
    if text is None or text == "auto":
        return None
    mapping: dict[int, list[tuple[str, int]]] = {}
    for entry in text.split(","):
        match = _NIC_ENTRY.match(entry.strip())
        if match is None:
            raise ValueError(f"environment variable HYBRID_EP_NIC_MAPPING={text!r}: entry {entry!r} "
                             "is not gpu:nic[:port] (e.g. 0:mlx5_0:1,1:mlx5_1)")
        gpu, nic, port = int(match[1]), match[2], int(match[3] or 1)
        if not 1 <= port <= 255:
            raise ValueError(f"environment variable HYBRID_EP_NIC_MAPPING={text!r}: port of "
                             f"{entry!r} must be in 1..255")
        if (nic, port) in mapping.get(gpu, []):
            raise ValueError(f"environment variable HYBRID_EP_NIC_MAPPING={text!r}: {nic} port "
                             f"{port} is listed twice for GPU {gpu}")
        mapping.setdefault(gpu, []).append((nic, port))
    return mapping


def parse_qp_depth(text: str | None) -> int | None:
    """HYBRID_EP_DOCA_QP_DEPTH: a power of two up to 32768, or auto/unset (None)."""
    if (text or "auto") == "auto":
        return None
    try:
        depth = int(text)
    except ValueError:
        depth = 0
    if not 1 <= depth <= MAX_QP_DEPTH or depth & (depth - 1):
        raise ValueError(f"environment variable HYBRID_EP_DOCA_QP_DEPTH={text!r}: expected a "
                         f"power of two (up to {MAX_QP_DEPTH}) or auto")
    return depth
