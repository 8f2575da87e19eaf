"""The network transport's settings for this build, handed to the C++ backend as
``RuntimeConfig.transport_options`` (strings): the one place that picks the backend's module
(``hybrid_ep.backends``) and asks it. Only with several NVLink domains.
"""

from __future__ import annotations

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


# Builds whose dispatch and combine have the eager form between domains (HYBRID_EP_EAGER): the
# p2p build, whose per-tile signal is a release store after the tile's data. The RDMA builds put
# the same layout only once they check the ordering their NICs need (issue 35's next step);
# until then they keep signalling each chunk.
EAGER_BUILDS = ("p2p",)

_warned_eager: set[str] = set()


def build_transport() -> str:
    """This build's transport; without the compiled core (the reference engine alone) the
    default build's, p2p, whose counters the reference engine then models."""
    C = native.load()
    return "p2p" if isinstance(C, ImportError) else C.build_info()["transport"]


def eager_in_effect(transport: str, nodes: int, eager: bool, warn: bool = True) -> bool:
    """Whether a buffer's dispatch and combine between domains use the eager form: ``eager``
    (HYBRID_EP_EAGER=1), several domains and a build that has it; another build signals as
    before and (``warn``) says so once."""
    if not eager or nodes == 1:
        return False
    if transport in EAGER_BUILDS:
        return True
    if warn and transport not in _warned_eager:
        _warned_eager.add(transport)
        warnings.warn(f"HYBRID_EP_EAGER=1: the {transport} build has no eager form yet (only "
                      f"{', '.join(EAGER_BUILDS)}); it signals each chunk as before",
                      RuntimeWarning, stacklevel=3)
    return False


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
