"""Which builds take the eager form between domains (HYBRID_EP_EAGER=1): the ordering
preconditions of the RDMA builds, their agreement across ranks and the fallback's warning; the
p2p build's test fault that sends it down the RDMA builds' path."""

import warnings

import pytest
import torch

from hybrid_ep import transport_options as t
from hybrid_ep.config import EnvSettings


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(t, "_warned_eager", set())
    for name, _ in t.RELAXED_ORDERING.values():
        monkeypatch.delenv(name, raising=False)


def test_p2p_has_no_precondition():
    assert t.eager_preconditions("p2p") == []
    assert t.eager_in_effect("p2p", 2, True)
    assert not t.eager_in_effect("p2p", 1, True)
    assert not t.eager_in_effect("p2p", 2, False)


@pytest.mark.parametrize("transport", ["nvshmem", "nixl", "doca"])
def test_rdma_builds_take_it_where_the_preconditions_hold(transport):
    assert t.eager_preconditions(transport) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert t.eager_in_effect(transport, 2, True, failures={0: [], 1: []})


@pytest.mark.parametrize("transport", ["nvshmem", "nixl"])
@pytest.mark.parametrize("value,refused", [("1", True), ("on", True), ("try", True),
                                           ("auto", True), ("0", False), ("off", False),
                                           ("No", False)])
def test_relaxed_ordering_turned_on_refuses_it(monkeypatch, transport, value, refused):
    name, _ = t.RELAXED_ORDERING[transport]
    monkeypatch.setenv(name, value)
    why = t.eager_preconditions(transport)
    assert bool(why) == refused
    if refused:
        assert name in why[0] and repr(value) in why[0]


def test_a_gpu_older_than_hopper_refuses_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    (why,) = t.eager_preconditions("doca")
    assert "compute capability 8.0" in why
    assert t.eager_preconditions("p2p") == []


def test_one_rank_that_cannot_makes_every_rank_signal_and_warns_once_naming_it():
    failures = {0: [], 1: ["compute capability 8.0"], 2: []}
    with pytest.warns(RuntimeWarning, match=r"rank 1: compute capability 8\.0.*signals"):
        assert not t.eager_in_effect("nvshmem", 2, True, failures=failures)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per build
        assert not t.eager_in_effect("nvshmem", 2, True, failures=failures)


def test_prepare_eager_turns_relaxed_ordering_off_unless_the_user_set_it(monkeypatch):
    import os

    t.prepare_eager("nixl")
    assert os.environ["UCX_IB_PCI_RELAXED_ORDERING"] == "off"
    monkeypatch.setenv("NVSHMEM_IB_ENABLE_RELAXED_ORDERING", "false")
    t.prepare_eager("nvshmem")
    assert os.environ["NVSHMEM_IB_ENABLE_RELAXED_ORDERING"] == "false"
    t.prepare_eager("p2p")  # nothing to set
    monkeypatch.delenv("UCX_IB_PCI_RELAXED_ORDERING")


def test_the_unmapped_peers_fault_belongs_to_the_p2p_build(monkeypatch):
    monkeypatch.setenv("HYBRID_EP_FAULT", "unmapped_peers")
    assert EnvSettings.read().fault == "unmapped_peers"
    t.check_fault("p2p", "unmapped_peers")
    t.check_fault("nvshmem", "off")
    with pytest.raises(ValueError, match="HYBRID_EP_FAULT='unmapped_peers'.*nvshmem"):
        t.check_fault("nvshmem", "unmapped_peers")
