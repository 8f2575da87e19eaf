"""The network transport's settings for this build, handed to the C++ backend as
``RuntimeConfig.transport_options`` (strings): the one place that picks the backend's module
(``hybrid_ep.backends``) and asks it. Only with several NVLink domains.
"""

from __future__ import annotations

import os
import warnings

import torch

from . import native
from .backends import doca


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


# Builds whose dispatch and combine have the eager form between domains (HYBRID_EP_EAGER). p2p
# stores into mapped peers, each tile's signal a release store after its data. The RDMA builds
# write a chunk's tiles into a local staging slot and put it as one RDMA write, so a receiver
# sees a tile's signal after its data only where the NIC writes in order: Hopper or newer, the
# memory registered without relaxed ordering (doca registers it so, backends/doca/nic.cpp; for
# nvshmem and nixl the library's variable below must not turn it on) and the buffer's
# CU_POINTER_ATTRIBUTE_SYNC_MEMOPS (set by the runtime). Where a precondition fails the build
# signals each chunk as before and warns.
EAGER_BUILDS = ("p2p", "nvshmem", "nixl", "doca")
RELAXED_ORDERING = {"nvshmem": ("NVSHMEM_IB_ENABLE_RELAXED_ORDERING", "0"),
                    "nixl": ("UCX_IB_PCI_RELAXED_ORDERING", "off")}
_OFF = ("0", "off", "no", "n", "false")

_warned_eager: set[str] = set()


def build_transport() -> str:
    """This build's transport; without the compiled core (the reference engine alone) the
    default build's, p2p, whose counters the reference engine then models."""
    C = native.load()
    return "p2p" if isinstance(C, ImportError) else C.build_info()["transport"]


def eager_preconditions(transport: str) -> list[str]:
    """Why this process cannot use ``transport``'s eager form (empty: it can): a GPU older than
    Hopper, or the library's relaxed-ordering variable turned on. p2p has none."""
    if transport not in EAGER_BUILDS:
        return [f"the {transport} build has no eager form"]
    if transport == "p2p":
        return []
    failed = []
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        if major < 9:
            failed.append(f"compute capability {major}.{minor} (Hopper, 9.0, or newer orders a "
                          "NIC's writes as the tiles need)")
    name, _ = RELAXED_ORDERING.get(transport, (None, None))
    value = None if name is None else os.environ.get(name)
    if value is not None and value.strip().lower() not in _OFF:
        failed.append(f"{name}={value!r} lets the NIC reorder a write's bytes (expected it unset "
                      "or off)")
    return failed


def eager_in_effect(transport: str, nodes: int, eager: bool, warn: bool = True,
                    failures: dict[int, list[str]] | None = None) -> bool:
    """Whether a buffer's dispatch and combine between domains use the eager form: ``eager``
    (HYBRID_EP_EAGER=1), several domains and a build whose preconditions hold on every rank
    (``failures``: rank -> eager_preconditions there, every rank's; None: this process's).
    Otherwise the buffer signals each chunk as before and (``warn``) says why, once."""
    if not eager or nodes == 1:
        return False
    if failures is None:
        failures = {-1: eager_preconditions(transport)}
    failed = {rank: why for rank, why in failures.items() if why}
    if not failed:
        return True
    if warn and transport not in _warned_eager:
        _warned_eager.add(transport)
        where = "; ".join(("here" if rank < 0 else f"rank {rank}") + ": " + ", ".join(why)
                          for rank, why in sorted(failed.items()))
        warnings.warn(f"HYBRID_EP_EAGER=1 on the {transport} build: {where}; it signals each "
                      "chunk as before", RuntimeWarning, stacklevel=3)
    return False


def prepare_eager(transport: str) -> None:
    """Before the first runtime of a buffer in the eager form: the library's relaxed ordering
    off unless the user set it (eager_preconditions refused a value that turns it on)."""
    name, off = RELAXED_ORDERING.get(transport, (None, None))
    if name is not None:
        os.environ.setdefault(name, off)


def check_fault(transport: str, fault: str) -> None:
    """HYBRID_EP_FAULT=unmapped_peers is the p2p build's test of the RDMA builds' path; raises
    ValueError in another build."""
    if fault == "unmapped_peers" and transport != "p2p":
        raise ValueError(f"environment variable HYBRID_EP_FAULT='unmapped_peers': the p2p "
                         f"build's test of the RDMA builds' path; this build's transport is "
                         f"{transport}, whose peers are unmapped where they are; unset it")


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
    return doca.doca_options(env, config, device.index, bus_id)
