"""The doca build's settings, resolved in Python (hybrid_ep.backends.doca is their one
source): HYBRID_EP_NIC_MAPPING parsing and validation, NIC selection by PCIe distance and the
RoCE GID on a fake sysfs, and the queue-depth arithmetic with its errors."""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from hybrid_ep import config, transport_options
from hybrid_ep.backends import doca, nic_topology

ROOT = Path(__file__).resolve().parent.parent


# -- HYBRID_EP_NIC_MAPPING -------------------------------------------------------------------


def test_nic_mapping_keeps_order_and_several_nics_per_gpu():
    mapping = doca.parse_nic_mapping("0:mlx5_0:1, 0:mlx5_1 ,1:mlx5_2:2")
    assert mapping == {0: [("mlx5_0", 1), ("mlx5_1", 1)], 1: [("mlx5_2", 2)]}
    assert doca.parse_nic_mapping("auto") is None
    assert doca.parse_nic_mapping(None) is None


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("mlx5_0", "is not gpu:nic[:port]"),
        ("0:", "is not gpu:nic[:port]"),
        ("-1:mlx5_0", "is not gpu:nic[:port]"),
        ("0:mlx5_0:1:3", "is not gpu:nic[:port]"),
        ("0:mlx5 0", "is not gpu:nic[:port]"),
        ("0:mlx5_0:0", "must be in 1..255"),
        ("0:mlx5_0:256", "must be in 1..255"),
        ("0:mlx5_0,0:mlx5_0:1", "listed twice for GPU 0"),
        ("0:mlx5_0,,1:mlx5_1", "is not gpu:nic[:port]"),
    ],
)
def test_nic_mapping_rejects_malformed_values(text, fragment):
    with pytest.raises(ValueError, match="HYBRID_EP_NIC_MAPPING") as error:
        doca.parse_nic_mapping(text)
    assert fragment in str(error.value)


def test_doca_variables_are_read_and_checked(monkeypatch):
    for name in ("HYBRID_EP_IB_GID_INDEX", "HYBRID_EP_IB_TRAFFIC_CLASS", "HYBRID_EP_DOCA_QP_DEPTH"):
        monkeypatch.delenv(name, raising=False)
    env = config.EnvSettings.read()
    assert (env.ib_gid_index, env.ib_traffic_class, env.doca_qp_depth) == (None, 0, None)
    monkeypatch.setenv("HYBRID_EP_IB_GID_INDEX", "3")
    monkeypatch.setenv("HYBRID_EP_IB_TRAFFIC_CLASS", "106")
    monkeypatch.setenv("HYBRID_EP_DOCA_QP_DEPTH", "4096")
    env = config.EnvSettings.read()
    assert (env.ib_gid_index, env.ib_traffic_class, env.doca_qp_depth) == (3, 106, 4096)
    for name, value in [
        ("HYBRID_EP_IB_GID_INDEX", "256"),
        ("HYBRID_EP_IB_TRAFFIC_CLASS", "-1"),
        ("HYBRID_EP_DOCA_QP_DEPTH", "1000"),
        ("HYBRID_EP_DOCA_QP_DEPTH", "65536"),
    ]:
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=name):
            config.EnvSettings.read()
        monkeypatch.delenv(name)


# -- NIC selection on a fake sysfs -------------------------------------------------------------


class FakeSysfs:
    """/sys as the selection reads it: PCI devices in a tree, RDMA devices linked to them."""

    def __init__(self, root: Path):
        self.root = root
        (root / "bus" / "pci" / "drivers" / "mlx5_core").mkdir(parents=True)
        (root / "bus" / "pci" / "drivers" / "other").mkdir(parents=True)
        (root / "bus" / "pci" / "devices").mkdir(parents=True)

    def pci(self, *path: str) -> Path:
        device = self.root.joinpath("devices", *path)
        device.mkdir(parents=True, exist_ok=True)
        os.symlink(device, self.root / "bus" / "pci" / "devices" / path[-1])
        return device

    def nic(self, name, device, *, driver="mlx5_core", ports=None, link="Ethernet", gids=()):
        os.symlink(self.root / "bus" / "pci" / "drivers" / driver, device / "driver")
        nic = self.root / "class" / "infiniband" / name
        nic.mkdir(parents=True)
        os.symlink(device, nic / "device")
        for port, state in (ports or {1: "4: ACTIVE"}).items():
            base = nic / "ports" / str(port)
            (base / "gid_attrs" / "types").mkdir(parents=True)
            (base / "gids").mkdir()
            (base / "state").write_text(state + "\n")
            (base / "link_layer").write_text(link + "\n")
            for index, (kind, gid) in enumerate(gids):
                if kind is not None:
                    (base / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
                (base / "gids" / str(index)).write_text(gid + "\n")


GPU = "0000:02:00.0"


@pytest.fixture
def sysfs(tmp_path):
    fake = FakeSysfs(tmp_path / "sys")
    switch = ("pci0000:00", "0000:00:01.0", "0000:01:00.0")
    fake.pci(*switch, GPU)
    fake.nic("mlx5_0", fake.pci(*switch, "0000:02:01.0"))  # same PCIe switch as the GPU
    fake.nic("mlx5_1", fake.pci("pci0000:80", "0000:80:01.0", "0000:81:00.0"))  # other socket
    return fake


def test_pcie_distance_counts_hops_to_the_common_bridge():
    gpu = ["sys", "devices", "pci0000:00", "a", "b", "gpu"]
    assert nic_topology.pcie_distance(gpu, gpu) == 0
    assert nic_topology.pcie_distance(gpu, gpu[:-1] + ["nic"]) == 2
    assert nic_topology.pcie_distance(gpu, ["sys", "devices", "pci0000:80", "x", "nic"]) == 7


def test_nearest_nic_by_pcie_distance(sysfs):
    assert nic_topology.nearest_nics(GPU, sysfs.root) == [("mlx5_0", 1)]
    assert nic_topology.nearest_nics(GPU.upper(), sysfs.root) == [("mlx5_0", 1)]


def test_nics_at_the_same_distance_become_separate_channels(sysfs):
    switch = ("pci0000:00", "0000:00:01.0", "0000:01:00.0")
    sysfs.nic("mlx5_2", sysfs.pci(*switch, "0000:02:02.0"), ports={1: "1: DOWN", 2: "4: ACTIVE"})
    assert nic_topology.nearest_nics(GPU, sysfs.root) == [("mlx5_0", 1), ("mlx5_2", 2)]


def test_selection_skips_inactive_and_non_mlx5_devices(sysfs):
    switch = ("pci0000:00", "0000:00:01.0", "0000:01:00.0")
    sysfs.nic("mlx5_3", sysfs.pci(*switch, "0000:02:03.0"), ports={1: "1: DOWN"})
    sysfs.nic("rxe0", sysfs.pci(*switch, "0000:02:04.0"), driver="other")
    assert nic_topology.rdma_nics(sysfs.root) == ["mlx5_0", "mlx5_1", "mlx5_3"]
    assert nic_topology.nearest_nics(GPU, sysfs.root) == [("mlx5_0", 1)]


def test_no_nic_is_an_error_naming_the_variable(tmp_path):
    fake = FakeSysfs(tmp_path / "sys")
    fake.pci("pci0000:00", GPU)
    with pytest.raises(ValueError, match="HYBRID_EP_NIC_MAPPING"):
        nic_topology.nearest_nics(GPU, fake.root)


def test_mapping_overrides_distance_and_is_checked_against_the_nics(sysfs):
    mapping = doca.parse_nic_mapping("0:mlx5_1,1:mlx5_0:1,1:mlx5_1")
    assert nic_topology.nics_for_gpu(mapping, 0, GPU, sysfs.root) == [("mlx5_1", 1)]
    assert nic_topology.nics_for_gpu(mapping, 1, GPU, sysfs.root) == [("mlx5_0", 1), ("mlx5_1", 1)]
    assert nic_topology.nics_for_gpu(None, 0, GPU, sysfs.root) == [("mlx5_0", 1)]
    with pytest.raises(ValueError, match="names no NIC for CUDA device 2"):
        nic_topology.nics_for_gpu(mapping, 2, GPU, sysfs.root)
    with pytest.raises(ValueError, match="mlx5_9 of CUDA device 0 is not an mlx5 RDMA device"):
        nic_topology.nics_for_gpu({0: [("mlx5_9", 1)]}, 0, GPU, sysfs.root)
    with pytest.raises(ValueError, match="mlx5_0 port 2 is not an active port"):
        nic_topology.nics_for_gpu({0: [("mlx5_0", 2)]}, 0, GPU, sysfs.root)


def test_auto_gid_index_prefers_roce_v2_ipv4(tmp_path):
    fake = FakeSysfs(tmp_path / "sys")
    fe80 = "fe80:0000:0000:0000:0a00:00ff:fe00:0001"
    mapped = "0000:0000:0000:0000:0000:ffff:0a00:0001"
    gids = [("IB/RoCE v1", fe80), ("RoCE v2", fe80), ("IB/RoCE v1", mapped), ("RoCE v2", mapped)]
    fake.nic("mlx5_0", fake.pci("pci0000:00", "0000:00:01.0"), gids=gids)
    assert nic_topology.auto_gid_index("mlx5_0", 1, fake.root) == 3
    fake.nic("mlx5_1", fake.pci("pci0000:00", "0000:00:02.0"), gids=gids[:2] + [(None, fe80)])
    assert nic_topology.auto_gid_index("mlx5_1", 1, fake.root) == 1  # no IPv4: first v2
    fake.nic("mlx5_2", fake.pci("pci0000:00", "0000:00:03.0"), link="InfiniBand", gids=gids)
    assert nic_topology.auto_gid_index("mlx5_2", 1, fake.root) == 0


# -- queue depth --------------------------------------------------------------------------------


def test_max_net_tensors_matches_the_kernels():
    header = (ROOT / "csrc" / "hybrid_ep" / "kernels" / "network_send.cuh").read_text()
    assert f"kMaxNetTensors = {doca.MAX_NET_TENSORS};" in header


def test_sending_warps_match_the_kernels():
    kernels = ROOT / "csrc" / "hybrid_ep" / "kernels"
    dispatch = re.search(r"kNetworkWarps = (\d+);", (kernels / "dispatch_block.cuh").read_text())
    combine = re.search(r"kNetworkWarps = (\d+);", (kernels / "combine_ring.cuh").read_text())
    most = max(int(dispatch[1]), int(combine[1]))
    assert doca.SENDING_WARPS_PER_BLOCK >= most


@pytest.mark.parametrize(
    "chunk,blocks,channels,wqes",
    [
        (64, 16, 1, 8 * 16 * (32 * 3 + 1)),
        (64, 16, 4, 8 * 4 * 97),
        (63, 17, 4, 8 * 5 * (32 * 3 + 1)),
        (1, 1, 1, 8 * 4),
        (128, 32, 2, 8 * 16 * (64 * 3 + 1)),
    ],
)
def test_worst_case_work_requests(chunk, blocks, channels, wqes):
    assert doca.worst_case_wqes(chunk, blocks, channels) == wqes


def test_auto_depth_is_the_next_power_of_two():
    assert doca.resolve_qp_depth(None, 64, 16, 1) == 16384
    assert doca.resolve_qp_depth(None, 64, 16, 16) == 1024
    assert doca.resolve_qp_depth(None, 1, 1, 1) == 64  # a floor, not 32
    assert doca.resolve_qp_depth(16384, 64, 16, 1) == 16384
    assert doca.resolve_qp_depth(13000, 64, 16, 1) == 13000


def test_too_small_a_depth_names_the_limit_to_raise():
    with pytest.raises(ValueError) as error:
        doca.resolve_qp_depth(8192, 64, 16, 1)
    message = str(error.value)
    assert "HYBRID_EP_DOCA_QP_DEPTH=8192" in message
    assert "at least 16384" in message and "12416 work requests" in message
    assert "HYBRID_EP_NUM_CHANNELS" in message


def test_a_config_no_queue_holds_asks_for_more_channels():
    with pytest.raises(ValueError, match="raise HYBRID_EP_NUM_CHANNELS to at least") as error:
        doca.resolve_qp_depth(None, 1024, 132, 1)
    channels = int(re.search(r"at least (\d+)", str(error.value))[1])
    assert doca.worst_case_wqes(1024, 132, channels) <= doca.MAX_QP_DEPTH
    assert doca.worst_case_wqes(1024, 132, channels - 1) > 32768
    assert doca.resolve_qp_depth(None, 1024, 132, channels) <= 32768


def test_a_chunk_no_queue_holds_asks_for_a_smaller_chunk():
    with pytest.raises(ValueError, match="even with one block per channel; lower the chunk"):
        doca.resolve_qp_depth(None, 4096, 132, 1)


def test_doca_options_end_to_end(sysfs):
    fe80 = "fe80:0000:0000:0000:0a00:00ff:fe00:0001"
    switch = ("pci0000:00", "0000:00:01.0", "0000:01:00.0")
    sysfs.nic("mlx5_4", sysfs.pci(*switch, "0000:02:05.0"), gids=[("IB/RoCE v1", fe80)] * 2)
    env = SimpleNamespace(
        nic_mapping=None,
        ib_gid_index=None,
        ib_traffic_class=106,
        doca_qp_depth=None,
        num_channels=2,
        prob_puts="run",
    )
    cfg = SimpleNamespace(
        num_sms_dispatch_api=16,
        num_sms_combine_api=24,
        num_sms_preprocessing_api=8,
        num_of_tokens_per_chunk_dispatch_api=64,
        num_of_tokens_per_chunk_combine_api=32,
    )
    options = doca.doca_options(env, cfg, 0, GPU, sysfs.root)
    assert options == {
        "nics": "mlx5_0:1:0,mlx5_4:1:0",
        "traffic_class": "106",
        "qp_depth": str(doca.resolve_qp_depth(None, 64, 24, 2)),
    }
    env.ib_gid_index = 5
    assert doca.doca_options(env, cfg, 0, GPU, sysfs.root)["nics"] == (
        "mlx5_0:1:5,mlx5_4:1:5"
    )


def test_other_builds_and_single_domains_get_no_options():
    assert transport_options.runtime_options("p2p", 4, SimpleNamespace(p2p_wire=None), None,
                                             None) == {}
    assert transport_options.runtime_options("doca", 1, None, None, None) == {}
