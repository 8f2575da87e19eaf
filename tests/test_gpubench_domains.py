"""The multi-domain bench (hybrid_ep_bench.gpubench.domains) on the CPU: its bound under the
emulated wire is the larger of the wire's time and the domains' own, and its efficiency the
bound over the measured time."""

from __future__ import annotations

import pytest

from hybrid_ep_bench.gpubench import domains


def _rank(form: str, api_s: float, sent: dict) -> dict:
    return {"form": form, "channels": 1, "rows": [100],
            "api_s": {op: [api_s] for op in domains.DOMAIN_OPS},
            "sent": {op: [sent] for op in domains.DOMAIN_OPS},
            "per_token_prob_puts": [10]}


def test_domain_bench_bound_is_the_larger_of_the_wire_and_the_domains():
    cfg = domains.DomainBenchConfig(ranks=4, nodes=2, wire="gbps=50,latency_us=3,op_ns=400")
    assert [name for name, _ in cfg.forms()] == ["no wire", "wire, run probs", "wire, token probs"]
    base = domains.summarize(cfg, [_rank("no wire", 1e-3, {"puts": 0, "signals": 0,
                                                            "bytes": 0})] * 4)
    # 100 MB through a 50 GB/s rail: 2 ms + 1000 x 400 ns + 3 us, above the 1 ms without it.
    heavy = {"puts": 900, "signals": 100, "bytes": 100e6}
    rows = domains.summarize(cfg, [_rank("wire, run probs", 3e-3, heavy)] * 4, base)
    wire_s = 100e6 / 50e9 + 1000 * 400e-9 + 3e-6
    for row in rows:
        assert row["wire_us"] == pytest.approx(wire_s * 1e6)
        assert row["bound_us"] == pytest.approx(wire_s * 1e6)
        assert row["efficiency"] == pytest.approx(wire_s / 3e-3)
    light = {"puts": 9, "signals": 1, "bytes": 1e3}
    rows = domains.summarize(cfg, [_rank("wire, run probs", 2e-3, light)] * 4, base)
    assert all(r["bound_us"] == pytest.approx(1000) and r["efficiency"] == pytest.approx(0.5)
               for r in rows)
    table = domains.format_table(cfg, rows, "cpu")
    assert "| 1 | wire, run probs | dispatch bf16 |" in table and "efficiency" in table
