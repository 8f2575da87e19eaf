"""The nvshmem build's start-up in Python, without NVSHMEM: the NVSHMEM_* defaults (computed
from the group's hosts, applied without overriding a user's value), the unique-id exchange,
where a failure on any rank raises on every rank, and the direct-store option
(HYBRID_EP_NVSHMEM_DIRECT)."""

from __future__ import annotations

import dataclasses

import pytest

from hybrid_ep import transport_bootstrap, transport_options
from hybrid_ep.backends import nvshmem
from hybrid_ep.config import EnvSettings

MIB = 1 << 20


def _env(**fields) -> EnvSettings:
    return dataclasses.replace(EnvSettings.read(), **fields)


def test_single_host_defaults(monkeypatch):
    for name in ("HYBRID_EP_NUM_CHANNELS", "HYBRID_EP_IB_GID_INDEX"):
        monkeypatch.delenv(name, raising=False)
    out = nvshmem.nvshmem_environment(["a", "a", "a", "a"], _env(), 100 * MIB + 1)
    assert out == {
        "NVSHMEM_SYMMETRIC_SIZE": str(358 * MIB),  # 100 MiB + 1 + 256 MiB, up to 2 MiB
        "NVSHMEM_DISABLE_NVLS": "1",
        "NVSHMEM_DISABLE_NCCL": "1",
        "NVSHMEM_REMOTE_TRANSPORT": "none",
        "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": "lo",
    }


def test_several_hosts_use_ibgda_with_a_queue_pair_per_channel():
    env = _env(num_channels=4, ib_gid_index=3, ib_traffic_class=106)
    out = nvshmem.nvshmem_environment(["a", "a", "b", "b"], env, 2 * MIB)
    assert out["NVSHMEM_IB_ENABLE_IBGDA"] == "1"
    assert out["NVSHMEM_IBGDA_NUM_RC_PER_PE"] == "4"
    assert out["NVSHMEM_IBGDA_RC_MAP_BY"] == "cta"
    assert out["NVSHMEM_IB_GID_INDEX"] == "3"
    assert out["NVSHMEM_IB_TRAFFIC_CLASS"] == "106"
    assert out["NVSHMEM_SYMMETRIC_SIZE"] == str(258 * MIB)
    assert "NVSHMEM_REMOTE_TRANSPORT" not in out
    assert "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME" not in out
    auto = nvshmem.nvshmem_environment(["a", "b"], _env(ib_gid_index=None,
                                                                  ib_traffic_class=0), 0)
    assert "NVSHMEM_IB_GID_INDEX" not in auto and "NVSHMEM_IB_TRAFFIC_CLASS" not in auto


def test_apply_never_overrides_a_user_value():
    environ = {"NVSHMEM_REMOTE_TRANSPORT": "ibrc", "NVSHMEM_DISABLE_NCCL": ""}
    defaults = {"NVSHMEM_REMOTE_TRANSPORT": "none", "NVSHMEM_DISABLE_NCCL": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
    applied = nvshmem.apply_environment(defaults, environ)
    assert applied == {"NVSHMEM_DISABLE_NVLS": "1"}
    assert environ == {"NVSHMEM_REMOTE_TRANSPORT": "ibrc", "NVSHMEM_DISABLE_NCCL": "",
                       "NVSHMEM_DISABLE_NVLS": "1"}
    assert nvshmem.apply_environment(defaults, environ) == {}


class _FakeRuntime:
    @staticmethod
    def bytes_for(rc):
        return 64 * MIB


class _FakeC:
    """The compiled module as transport_bootstrap sees it: preflight, unique id, build info."""

    Runtime = _FakeRuntime

    def __init__(self, transport="nvshmem", preflight_error=None, id_error=None):
        self.transport = transport
        self.preflight_error = preflight_error
        self.id_error = id_error

    def build_info(self):
        return {"transport": self.transport}

    def transport_preflight(self):
        if self.preflight_error:
            raise RuntimeError(self.preflight_error)
        return "ok"

    def transport_unique_id(self):
        if self.id_error:
            raise RuntimeError(self.id_error)
        return bytes(range(128))


class _Rc:
    nodes = 2
    channels = 1


def _run_group(monkeypatch, modules, hosts):
    """group_options on every rank of a fake group: all-gathers answer from the other ranks'
    local entries (computed with their own fake module) as a real process group would."""
    world = len(modules)
    monkeypatch.setattr(nvshmem, "apply_environment", lambda defaults: {})
    results = []
    for rank in range(world):
        calls = iter([hosts, [transport_bootstrap._local_entry(modules[r], r)
                              for r in range(world)]])
        monkeypatch.setattr(transport_bootstrap, "gather_objects",
                            lambda obj, group, calls=calls: next(calls))
        try:
            results.append(transport_bootstrap.group_options(modules[rank], None, rank, _Rc()))
        except transport_bootstrap.TransportBootstrapError as error:
            results.append(error)
    return results


def test_every_rank_gets_rank_0s_unique_id(monkeypatch):
    out = _run_group(monkeypatch, [_FakeC()] * 4, ["h"] * 4)
    assert out == [{"unique_id": bytes(range(128)).hex()}] * 4


def test_a_failure_on_one_rank_raises_on_every_rank(monkeypatch):
    modules = [_FakeC(id_error="nvshmemx_get_uniqueid failed with status 7"), _FakeC(),
               _FakeC(preflight_error="libnvshmem_host.so.3 is 3.4.5"), _FakeC()]
    out = _run_group(monkeypatch, modules, ["h"] * 4)
    for rank, error in enumerate(out):
        assert isinstance(error, transport_bootstrap.TransportBootstrapError), error
        text = str(error)
        assert text.startswith(f"rank {rank}:") and "2 of 4 ranks" in text, text
        assert "rank 0: RuntimeError: nvshmemx_get_uniqueid failed with status 7" in text
        assert "rank 2: RuntimeError: libnvshmem_host.so.3 is 3.4.5" in text


@pytest.mark.parametrize("transport,nodes", [("p2p", 2), ("doca", 2), ("nvshmem", 1)])
def test_other_builds_and_single_domains_exchange_nothing(monkeypatch, transport, nodes):
    def no_gather(obj, group):
        raise AssertionError("no exchange expected")

    monkeypatch.setattr(transport_bootstrap, "gather_objects", no_gather)
    rc = _Rc()
    rc.nodes = nodes
    assert transport_bootstrap.group_options(_FakeC(transport), None, 0, rc) == {}


# The direct-store option (backends/nvshmem: option nvshmem_direct): from
# HYBRID_EP_NVSHMEM_DIRECT, default on, only with several domains; the CUDA engine merges it with
# group_options' unique id, so the two must not share a key.
@pytest.mark.parametrize("value,want", [(None, "1"), ("1", "1"), ("0", "0")])
def test_runtime_options_carry_nvshmem_direct_from_the_env(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv("HYBRID_EP_NVSHMEM_DIRECT", raising=False)
    else:
        monkeypatch.setenv("HYBRID_EP_NVSHMEM_DIRECT", value)
    env = EnvSettings.read()
    assert transport_options.runtime_options("nvshmem", 2, env, None, None) == {
        "nvshmem_direct": want}
    assert transport_options.runtime_options("nvshmem", 1, env, None, None) == {}
    assert transport_options.direct_options("nvshmem", 1, env) == {}
    assert transport_options.direct_options("p2p", 2, env) == {}


def test_a_bad_nvshmem_direct_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("HYBRID_EP_NVSHMEM_DIRECT", "yes please")
    with pytest.raises(ValueError, match="HYBRID_EP_NVSHMEM_DIRECT"):
        EnvSettings.read()


def test_the_engine_keeps_both_the_direct_option_and_the_unique_id(monkeypatch):
    monkeypatch.setenv("HYBRID_EP_NVSHMEM_DIRECT", "0")
    direct = transport_options.runtime_options("nvshmem", 2, EnvSettings.read(), None, None)
    unique = _run_group(monkeypatch, [_FakeC()] * 2, ["h"] * 2)[0]
    assert not direct.keys() & unique.keys()
    assert {**direct, **unique} == {"nvshmem_direct": "0", "unique_id": bytes(range(128)).hex()}
