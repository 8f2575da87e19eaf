"""The nixl transport's control plane (hybrid_ep/backends/nixl_control.py): with real NIXL agents over
UCX on DRAM between worker processes when the nixl-cu13 wheel is installed (metadata through the
gloo group, registration, connection, a host-side transfer, teardown), and with a fake agent
for the paths a CPU cannot produce (memory views, etcd, a peer that never answers)."""

from __future__ import annotations

import importlib.util
import struct
import uuid

import pytest

from hybrid_ep.backends import nixl_control
from hybrid_ep.backends.nixl_control import (
    NixlControlPlane,
    NixlPeerTimeout,
    NixlUnavailableError,
    Region,
)

needs_nixl = pytest.mark.skipif(importlib.util.find_spec("nixl_cu13") is None,
                                reason="nixl-cu13 is not installed (pip install nixl-cu13==1.5.1)")


@needs_nixl
@pytest.mark.parametrize("W", [2, 3])
def test_real_agents_exchange_metadata_and_write_over_ucx(pools, W):
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    results = pools.run(W, "cases.nixl", "host_transfer", run_id=run_id)
    for me, got in enumerate(results):
        assert got["bad"] == 0 and got["untouched_changed"] == 0, got
        assert got["channels"] == "2"
        assert got["closed"]
        assert sorted(got["names"]) == [n for n in range(W) if n != me]
        for n, name in got["names"].items():
            assert name == nixl_control.agent_name(run_id, n)


@needs_nixl
def test_real_agents_dram_views_fail_naming_the_step(pools):
    for message in pools.run(2, "cases.nixl", "dram_views_fail_naming_the_step"):
        assert "local memory view" in message and "within 0.5 s" in message, message


class FakeAgent:
    """The methods of nixl_agent the control plane calls; `refuse` names the ones that fail."""

    def __init__(self, name: str, channels: int, refuse=(), metadata_ready=True):
        self.name, self.channels, self.refuse = name, channels, set(refuse)
        self.metadata_ready = metadata_ready
        self.calls: list[tuple] = []
        self.next_view = 0x7000

    def _call(self, what, *args):
        self.calls.append((what, *args))
        if what in self.refuse:
            raise RuntimeError(f"{what} refused")

    def register_memory(self, descs, mem_type):
        self._call("register_memory", tuple(descs), mem_type)
        return ("reg", tuple(descs))

    def deregister_memory(self, reg):
        self._call("deregister_memory", reg)

    def get_agent_metadata(self):
        return f"md:{self.name}".encode()

    def add_remote_agent(self, metadata):
        self._call("add_remote_agent", metadata)
        return metadata.decode().removeprefix("md:").encode()

    def send_local_metadata(self):
        self._call("send_local_metadata")

    def fetch_remote_metadata(self, name):
        self._call("fetch_remote_metadata", name)

    def check_remote_metadata(self, name):
        return self.metadata_ready

    def make_connection(self, name):
        self._call("make_connection", name)

    def get_xfer_descs(self, descs, mem_type):
        return ("local", tuple(descs), mem_type)

    def get_remote_descs(self, descs, mem_type):
        return ("remote", tuple(descs), mem_type)

    def prep_mem_view(self, descs):
        self._call("prep_mem_view", descs)
        self.next_view += 0x100
        return self.next_view

    def release_mem_view(self, handle):
        self._call("release_mem_view", handle)

    def remove_remote_agent(self, name):
        self._call("remove_remote_agent", name)

    def invalidate_local_metadata(self):
        self._call("invalidate_local_metadata")


def _plane(monkeypatch, rank=1, peers=(1, 3, 5), use_etcd=False, timeout_s=5.0, **agent_kw):
    """Rank `rank` of 6 (R = 2, 3 domains); the group's all-gathers are answered locally."""
    regions = {r: Region(0x1000 * (r + 1), 4096, r % 2) for r in range(6)}

    def gather(obj, group):
        if isinstance(obj, tuple):  # (agent name, region)
            return [(nixl_control.agent_name("run", r), regions[r]) for r in range(6)]
        if isinstance(obj, bytes):  # agent metadata
            return [f"md:{nixl_control.agent_name('run', r)}".encode() for r in range(6)]
        return [obj] * 6

    monkeypatch.setattr(nixl_control, "gather_objects", gather)
    made = []

    def factory(name, channels):
        made.append(FakeAgent(name, channels, **agent_kw))
        return made[-1]

    plane = NixlControlPlane(None, rank, list(peers), regions[rank], channels=4, run_id="run",
                             use_etcd=use_etcd, timeout_s=timeout_s, agent_factory=factory)
    return plane, made[0]


def test_views_become_one_blob_per_domain_and_are_released(monkeypatch):
    plane, agent = _plane(monkeypatch)
    assert agent.name == "hybrid-ep-run-rank1" and agent.channels == 4
    assert plane.remote_names == {1: "hybrid-ep-run-rank3", 2: "hybrid-ep-run-rank5"}
    views = [c for c in agent.calls if c[0] == "prep_mem_view"]
    assert views[0][1] == ("local", ((0x2000, 4096, 1),), "VRAM")
    assert views[1][1] == ("remote", ((0x4000, 4096, 1, "hybrid-ep-run-rank3"),), "VRAM")
    assert views[2][1] == ("remote", ((0x6000, 4096, 1, "hybrid-ep-run-rank5"),), "VRAM")
    # Our domain (0) gets the local view; the others their peer's remote view.
    assert [struct.unpack("<Q", b)[0] for b in plane.blobs] == [0x7100, 0x7200, 0x7300]
    plane.close()
    released = [c[1] for c in agent.calls if c[0] == "release_mem_view"]
    assert released == [0x7100, 0x7200, 0x7300]
    assert [c[0] for c in agent.calls[-4:]] == ["release_mem_view", "remove_remote_agent",
                                                "remove_remote_agent", "deregister_memory"]
    plane.close()  # idempotent


def test_a_peer_that_never_connects_times_out_naming_peer_and_step(monkeypatch):
    with pytest.raises(NixlPeerTimeout) as error:
        _plane(monkeypatch, timeout_s=0.2, refuse={"make_connection"})
    text = str(error.value)
    assert "connection with the peer of domain 1 (rank 3" in text
    assert "within 0.2 s" in text and "make_connection refused" in text


def test_etcd_metadata_that_never_arrives_times_out_and_cleans_up(monkeypatch):
    made = []
    real = FakeAgent

    class Recording(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(__import__(__name__), "FakeAgent", Recording)
    with pytest.raises(NixlPeerTimeout, match=r"metadata fetch \(etcd\) with the peer of domain 1"):
        _plane(monkeypatch, use_etcd=True, timeout_s=0.2, metadata_ready=False)
    calls = [c[0] for c in made[0].calls]
    assert calls[:2] == ["register_memory", "send_local_metadata"]
    assert "fetch_remote_metadata" in calls
    assert calls[-2:] == ["deregister_memory", "invalidate_local_metadata"]


def test_etcd_path_fetches_each_peer_by_name(monkeypatch):
    plane, agent = _plane(monkeypatch, use_etcd=True)
    fetched = [c[1] for c in agent.calls if c[0] == "fetch_remote_metadata"]
    assert fetched == ["hybrid-ep-run-rank3", "hybrid-ep-run-rank5"]
    assert not any(c[0] == "add_remote_agent" for c in agent.calls)
    plane.close()


def test_retry_returns_the_first_success():
    answers = iter([None, False, RuntimeError("busy"), 42])

    def attempt():
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    assert nixl_control.retry("step", "peer", attempt, timeout_s=5, interval_s=0) == 42


def test_region_parses_the_transport_bootstrap():
    assert Region.parse(b"140000000 4096 3") == Region(140000000, 4096, 3)


def test_missing_nixl_runtime_names_the_wheel(monkeypatch):
    monkeypatch.setattr(nixl_control, "_NIXL_MODULES", ("hybrid_ep_no_such_module._api",))
    with pytest.raises(NixlUnavailableError, match=r"pip install nixl-cu13==1\.5\.1"):
        nixl_control.load_nixl_api()


class FakeRuntime:
    def __init__(self, fail=False):
        self.connected, self.fail = None, fail

    def transport_bootstrap(self):
        return b"4096 1024 0"

    def connect_transport(self, blobs):
        if self.fail:
            raise RuntimeError("bad view header")
        self.connected = blobs


def test_transport_connect_runs_the_control_plane_on_the_nixl_build(monkeypatch):
    from types import SimpleNamespace

    from hybrid_ep import transport_connect

    made = []

    class Plane:
        def __init__(self, group, rank, peers, region, **kw):
            self.region, self.kw, self.closed = region, kw, False
            self.blobs = [struct.pack("<Q", 0x100 + n) for n in range(len(peers))]
            made.append(self)

        def close(self):
            self.closed = True

    monkeypatch.setattr(transport_connect.nixl_control, "NixlControlPlane", Plane)
    env = SimpleNamespace(num_channels=3, run_id=None, etcd_endpoints=("http://e:2379",),
                          timeout_s=7.0, nixl_progress_thread=False)
    runtime = FakeRuntime()
    connection = transport_connect.connect(runtime, "nixl", None, 2, [0, 2], env)
    assert runtime.connected == made[0].blobs
    assert made[0].region == Region(4096, 1024, 0)
    assert made[0].kw == {"channels": 3, "run_id": None, "use_etcd": True, "timeout_s": 7.0,
                          "progress_thread": False}
    connection.close()
    assert made[0].closed
    with pytest.raises(RuntimeError, match="bad view header"):
        transport_connect.connect(FakeRuntime(fail=True), "nixl", None, 2, [0, 2], env)
    assert made[1].closed  # a failed connect leaves no registration behind
