"""Which RDMA NICs serve a GPU, read from sysfs: the doca build's NIC selection.

Automatic selection takes the mlx5 (ConnectX) NICs with an active port that are nearest to the
GPU on the PCIe tree -- the hops from each device up to their deepest common bridge -- and every
NIC at that distance becomes a channel's NIC. ``HYBRID_EP_NIC_MAPPING`` overrides it. The sysfs
root is a parameter so that the tests can lay out a fake one.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

SYSFS = Path("/sys")


def _components(path: Path) -> list[str]:
    return [p for p in os.path.realpath(path).split(os.sep) if p]


def pcie_distance(a: list[str], b: list[str]) -> int:
    """Hops between two devices given their sysfs paths (lists of components): from each up to
    the deepest common ancestor. Devices under different host bridges share only the root."""
    common = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common += 1
    return (len(a) - common) + (len(b) - common)


def rdma_nics(sysfs: Path = SYSFS) -> list[str]:
    """Names of the RDMA devices whose PCI function is driven by mlx5_core, sorted."""
    root = sysfs / "class" / "infiniband"
    if not root.is_dir():
        return []
    names = []
    for nic in sorted(os.listdir(root)):
        driver = root / nic / "device" / "driver"
        if os.path.basename(os.path.realpath(driver)) == "mlx5_core":
            names.append(nic)
    return names


def active_ports(nic: str, sysfs: Path = SYSFS) -> list[int]:
    ports = sysfs / "class" / "infiniband" / nic / "ports"
    if not ports.is_dir():
        return []
    found = []
    for port in sorted(os.listdir(ports), key=int):
        state = (ports / port / "state").read_text() if (ports / port / "state").exists() else ""
        if "ACTIVE" in state:
            found.append(int(port))
    return found


def nearest_nics(gpu_bus_id: str, sysfs: Path = SYSFS) -> list[tuple[str, int]]:
    """(nic, first active port) of every mlx5 NIC at the smallest PCIe distance from the GPU."""
    gpu = _components(sysfs / "bus" / "pci" / "devices" / gpu_bus_id.lower())
    candidates = []
    for nic in rdma_nics(sysfs):
        ports = active_ports(nic, sysfs)
        if ports:
            device = _components(sysfs / "class" / "infiniband" / nic / "device")
            candidates.append((pcie_distance(gpu, device), nic, ports[0]))
    if not candidates:
        raise ValueError(
            f"no mlx5 RDMA NIC with an active port under {sysfs}/class/infiniband; "
            "the doca transport needs a ConnectX NIC (set HYBRID_EP_NIC_MAPPING to "
            "name one)"
        )
    best = min(distance for distance, _, _ in candidates)
    return [(nic, port) for distance, nic, port in candidates if distance == best]


def nics_for_gpu(
    mapping: dict[int, list[tuple[str, int]]] | None,
    gpu_index: int,
    gpu_bus_id: str,
    sysfs: Path = SYSFS,
) -> list[tuple[str, int]]:
    """The NICs of CUDA device ``gpu_index``: from HYBRID_EP_NIC_MAPPING (already parsed, see
    backends/doca.py parse_nic_mapping), checked against the NICs present, or by PCIe distance."""
    if mapping is None:
        return nearest_nics(gpu_bus_id, sysfs)
    if gpu_index not in mapping:
        raise ValueError(
            f"environment variable HYBRID_EP_NIC_MAPPING names no NIC for CUDA "
            f"device {gpu_index} (it maps devices {sorted(mapping)})"
        )
    present = rdma_nics(sysfs)
    for nic, port in mapping[gpu_index]:
        if nic not in present:
            raise ValueError(
                f"environment variable HYBRID_EP_NIC_MAPPING: NIC {nic} of CUDA "
                f"device {gpu_index} is not an mlx5 RDMA device here "
                f"(present: {', '.join(present) or 'none'})"
            )
        if port not in active_ports(nic, sysfs):
            raise ValueError(
                f"environment variable HYBRID_EP_NIC_MAPPING: {nic} port {port} "
                "is not an active port"
            )
    return list(mapping[gpu_index])


def auto_gid_index(nic: str, port: int, sysfs: Path = SYSFS) -> int:
    """0 on InfiniBand; on RoCE the first RoCE v2 GID holding an IPv4 address, else the first
    RoCE v2 GID, else 0 (RoCE v1)."""
    base = sysfs / "class" / "infiniband" / nic / "ports" / str(port)
    link = base / "link_layer"
    if not link.exists() or link.read_text().strip() != "Ethernet":
        return 0
    types = base / "gid_attrs" / "types"
    v2 = []
    for index in sorted((int(i) for i in os.listdir(types)) if types.is_dir() else []):
        try:
            kind = (types / str(index)).read_text().strip()
        except OSError:  # unpopulated GID slots cannot be read
            continue
        if kind.lower() == "roce v2":
            v2.append(index)
    for index in v2:
        gid = ipaddress.IPv6Address((base / "gids" / str(index)).read_text().strip())
        if gid.ipv4_mapped is not None:
            return index
    return v2[0] if v2 else 0
