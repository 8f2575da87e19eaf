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


def test_eager_both_runs_every_form_signalled_and_eager_each_with_its_own_baseline():
    cfg = domains.DomainBenchConfig(ranks=4, nodes=2, wire="gbps=50", prob_puts=("run",),
                                    eager=(False, True))
    forms = cfg.forms()
    assert [name for name, _ in forms] == ["no wire, signalled", "wire, run probs, signalled",
                                           "no wire, eager", "wire, run probs, eager"]
    assert [env["HYBRID_EP_EAGER"] for _, env in forms] == ["0", "0", "1", "1"]
    assert [cfg.baseline_form(f) for f in range(4)] == [0, 0, 2, 2]
    plain = domains.DomainBenchConfig(ranks=4, nodes=2)
    assert plain.forms() == [("", {})] and plain.baseline_form(0) == 0
    only = domains.DomainBenchConfig(ranks=4, nodes=2, eager=(True,))
    assert only.forms() == [("eager", {"HYBRID_EP_EAGER": "1"})]


@pytest.mark.parametrize("flag,eager", [(None, ()), ("off", (False,)), ("on", (True,)),
                                        ("both", (False, True))])
def test_the_cli_hands_eager_to_the_domain_bench(monkeypatch, flag, eager):
    from hybrid_ep_bench import cli

    seen = []
    monkeypatch.setattr(domains, "run", lambda cfg, json_path=None: seen.append(cfg) or "table")
    argv = ["--device", "cuda", "--nodes", "2", "--channels", "1"]
    assert cli.main(argv + (["--eager", flag] if flag else [])) == 0
    assert seen[0].eager == eager
