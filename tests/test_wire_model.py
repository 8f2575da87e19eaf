"""The network emulation's settings (HYBRID_EP_P2P_WIRE) and the per-token prob puts' count
model (HYBRID_EP_PROB_PUTS), on the CPU; the domain bench's bound: test_gpubench_domains.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hybrid_ep import config, transport_options
from hybrid_ep.backends import doca, p2p_wire
from hybrid_ep.reference import network


def test_a_full_spec_parses_and_round_trips():
    spec = p2p_wire.parse("gbps=50,latency_us=3,op_ns=400,rails=2")
    assert spec == p2p_wire.WireSpec(gbps=50, latency_us=3, op_ns=400, rails=2)
    assert p2p_wire.parse(spec.text()) == spec


def test_missing_keys_take_the_defaults_and_off_is_none():
    assert p2p_wire.parse("gbps=25") == p2p_wire.WireSpec(gbps=25)
    for text in (None, "", "off", "0"):
        assert p2p_wire.parse(text) is None


@pytest.mark.parametrize("text", ["gbps", "gbps=fast", "bandwidth=50", "gbps=0", "gbps=-1",
                                  "rails=0", "rails=65", "rails=1.5", "latency_us=-1",
                                  "op_ns=-3", "gbps=50;rails=1", "atomic_rtt=2",
                                  "atomic_rtt=yes"])
def test_bad_specs_raise_naming_the_variable(text, monkeypatch):
    with pytest.raises(ValueError, match="HYBRID_EP_P2P_WIRE"):
        p2p_wire.parse(text)
    monkeypatch.setenv("HYBRID_EP_P2P_WIRE", text)
    with pytest.raises(ValueError, match="HYBRID_EP_P2P_WIRE"):
        config.EnvSettings.read()


def test_transport_options_are_integer_femtoseconds_and_nanoseconds():
    spec = p2p_wire.WireSpec(gbps=50, latency_us=3, op_ns=400, rails=4)
    assert spec.transport_options() == {"wire_fs_per_byte": "20000", "wire_op_ns": "400",
                                        "wire_latency_ns": "3000", "wire_rails": "4",
                                        "wire_fence_ns": "6000"}
    assert p2p_wire.WireSpec(gbps=400).transport_options()["wire_fs_per_byte"] == "2500"


def test_the_atomic_round_trip_is_a_fence_of_two_latencies_unless_turned_off():
    """A signal after puts waits for their completion and one round trip (2 x latency) more, as
    a multi-path NIC fences an atomic after writes; atomic_rtt=0 leaves the fence out."""
    assert p2p_wire.parse("latency_us=5").transport_options()["wire_fence_ns"] == "10000"
    off = p2p_wire.parse("latency_us=5,atomic_rtt=0")
    assert off.atomic_rtt == 0 and off.transport_options()["wire_fence_ns"] == "0"
    assert p2p_wire.parse(off.text()) == off


def test_lower_bound_spreads_bytes_and_operations_over_the_rails_used():
    spec = p2p_wire.WireSpec(gbps=50, latency_us=3, op_ns=400, rails=2)
    one = (50e6 / 50e9 + 100 * 400e-9) + 3e-6
    assert spec.lower_bound_s(50e6, 100, rails_used=1) == pytest.approx(one)
    assert spec.lower_bound_s(50e6, 100) == pytest.approx((one - 3e-6) / 2 + 3e-6)
    assert spec.lower_bound_s(50e6, 100, rails_used=8) == spec.lower_bound_s(50e6, 100)


def test_env_reads_the_wire_and_the_prob_puts(monkeypatch):
    monkeypatch.setenv("HYBRID_EP_P2P_WIRE", "gbps=10")
    monkeypatch.setenv("HYBRID_EP_PROB_PUTS", "token")
    env = config.EnvSettings.read()
    assert env.p2p_wire == p2p_wire.WireSpec(gbps=10) and env.prob_puts == "token"
    monkeypatch.setenv("HYBRID_EP_PROB_PUTS", "each")
    with pytest.raises(ValueError, match="HYBRID_EP_PROB_PUTS"):
        config.EnvSettings.read()


def test_only_the_p2p_build_with_several_domains_gets_the_wire():
    env = SimpleNamespace(p2p_wire=p2p_wire.WireSpec(gbps=50), nixl_direct=True,
                          nvshmem_direct=True)
    assert transport_options.runtime_options("p2p", 2, env, None, None)["wire_rails"] == "1"
    assert transport_options.runtime_options("p2p", 1, env, None, None) == {}
    for other in ("nvshmem", "nixl", "doca"):
        with pytest.raises(ValueError, match="HYBRID_EP_P2P_WIRE.*p2p build only"):
            transport_options.runtime_options(other, 2, env, None, None)
    off = SimpleNamespace(p2p_wire=None)
    assert transport_options.runtime_options("p2p", 2, off, None, None) == {}


def test_per_token_probs_cost_one_put_per_token_in_the_model():
    # One other domain, 150 tokens in runs of 4 every 10, chunks of 64 on one channel.
    goes = torch.tensor([t % 10 < 4 for t in range(150)]).unsqueeze(1)
    widths = network.RowWidths(row=512, probs=64, scales=0)
    runs = network.TransportStats.with_channels(1)
    tokens = network.TransportStats.with_channels(1)
    network.count_dispatch_sends(runs, goes, 150, 64, 4, widths)
    network.count_dispatch_sends(tokens, goes, 150, 64, 4, widths, per_token_probs=True)
    sent = int(goes.sum())
    run_count = runs.channels[0].puts // 2
    assert tokens.channels[0].puts == run_count + sent
    assert tokens.channels[0].bytes == runs.channels[0].bytes
    assert tokens.channels[0].signals == runs.channels[0].signals == 3


def test_doca_queue_depth_counts_per_token_prob_puts():
    runs = doca.worst_case_wqes(64, 16, 1)
    tokens = doca.worst_case_wqes(64, 16, 1, per_token_probs=True)
    assert tokens - runs == (64 - 32) * 8 * 16
