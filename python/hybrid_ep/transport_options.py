"""The network transport's settings, resolved once here and handed to the C++ backend as
``RuntimeConfig.transport_options`` (strings): the one place that parses, checks and computes
them. Only the doca, nixl and nvshmem builds use any, and only when the group spans several
NVLink domains.

Queue depth (doca): a warp's puts to a peer stay unrung on the queue pair until that chunk's
signal rings one doorbell, so every warp sharing a queue pair may hold a whole chunk's work
requests there at once; the queue must hold all of them, or posting would wait on itself.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from . import nic_topology

# Tensors a chunk's network send puts per run: rows, probs, FP8 scales
# (csrc/hybrid_ep/kernels/network_send.cuh, kMaxNetTensors).
MAX_NET_TENSORS = 3
# Warps of one block that send, each holding at most one chunk's work requests unrung: at
# least the dispatch's 4 network warps (kernels/dispatch.cu, kNetworkWarps) and the combine's 2
# (kernels/combine_ring.cuh). Kept at 8, the count of the combine's old network kernel, so that the
# default queue depths (and the channels they need) stay those tested until a NIC run shows
# the tighter bound suffices.
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


def direct_options(transport: str, nodes: int, env) -> dict[str, str]:
    """Whether the nixl or nvshmem build stores directly into the peers its library maps into
    the process (HYBRID_EP_NIXL_DIRECT, HYBRID_EP_NVSHMEM_DIRECT); none for other builds or a
    single domain. Also what the transport GPU tests pass, which build runtimes directly."""
    if nodes == 1:
        return {}
    if transport == "nixl":
        return {"nixl_direct": "1" if env.nixl_direct else "0"}
    if transport == "nvshmem":
        return {"nvshmem_direct": "1" if env.nvshmem_direct else "0"}
    return {}


def wire_options(transport: str, nodes: int, env) -> dict[str, str]:
    """The p2p build's emulated network (HYBRID_EP_P2P_WIRE), with several domains; raises
    ValueError when another build is asked for it (its network is real)."""
    if env.p2p_wire is None or nodes == 1:
        return {}
    if transport != "p2p":
        raise ValueError(f"environment variable HYBRID_EP_P2P_WIRE={env.p2p_wire.text()!r}: the "
                         f"network emulation exists in the p2p build only, this build's transport "
                         f"is {transport}; unset it")
    return env.p2p_wire.transport_options()


def runtime_options(transport: str, nodes: int, env, config, device) -> dict[str, str]:
    """Options for this build's transport: none for a single domain; for p2p only the network
    emulation's. The nvshmem build's unique id is added by transport_bootstrap.group_options
    (collective)."""
    if nodes == 1:
        return {}
    wire = wire_options(transport, nodes, env)  # raises for a build other than p2p
    if transport == "p2p":
        return wire
    if transport in ("nixl", "nvshmem"):
        return direct_options(transport, nodes, env)
    if transport != "doca":
        return {}
    props = torch.cuda.get_device_properties(device)
    bus_id = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    return doca_options(env, config, device.index, bus_id)


# The nvshmem build's NVSHMEM settings. NVSHMEM reads its variables once per process, at its
# first call, so they are applied before the unique id is made; a value the user set always
# wins (os.environ.setdefault).
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
