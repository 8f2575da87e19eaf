"""benchmarks/scaling_model.py: its traffic arithmetic against enumeration and sampled routing,
its fit on synthetic bench JSON made by the model itself, and its CLI (no matplotlib needed)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "scaling_model.py"
_spec = importlib.util.spec_from_file_location("scaling_model", _PATH)
sm = importlib.util.module_from_spec(_spec)
sys.modules["scaling_model"] = sm  # dataclasses look their module up while being built
_spec.loader.exec_module(sm)

WIRE = "gbps=50,latency_us=3,op_ns=400,rails=1"
# Known parameters per operation: (fixed s, B_gpu bytes/s, eta_nic). The GPU is fast enough
# that the NIC bounds every wired point, so eta_nic is identified.
TRUTH = {"dispatch bf16 + preprocess": (400e-6, 3.0e12, 0.8),
         "dispatch bf16": (150e-6, 3.5e12, 0.9),
         "dispatch fp8": (120e-6, 3.0e12, 0.85),
         "combine bf16": (300e-6, 2.5e12, 0.7)}


def test_reach_matches_enumeration():
    shape = sm.Shape(ranks=4, per_domain=2, experts=2, topk=3)  # 8 experts, 2 domains
    picks = list(itertools.combinations(range(8), 3))
    rank0 = sum(any(e < 2 for e in c) for c in picks) / len(picks)  # rank 0 owns 0, 1
    dom0 = sum(any(e < 4 for e in c) for c in picks) / len(picks)  # domain 0 owns 0..3
    assert sm.reach(shape) == pytest.approx((rank0, dom0), rel=1e-12)


@pytest.mark.parametrize("length", [1, 2, 5, 8])
def test_expected_runs_matches_enumeration(length):
    p = 0.3
    want = 0.0
    for bits in itertools.product((0, 1), repeat=length):
        runs = sum(b and (i == 0 or not bits[i - 1]) for i, b in enumerate(bits))
        want += runs * p ** sum(bits) * (1 - p) ** (length - sum(bits))
    assert sm.expected_runs(p, length) == pytest.approx(want, rel=1e-12)


def test_dense_routing_counts():
    """k = every expert: each token goes everywhere, one run per (chunk, domain)."""
    shape = sm.Shape(ranks=6, per_domain=2, tokens=160, hidden=256, experts=1, topk=6,
                     chunk=64)  # 3 domains, chunks of 64, 64 and 32 tokens
    pairs = 3 * 2  # (chunk, other domain)
    bf16 = sm.traffic(shape, sm.BY_LABEL["dispatch bf16"])
    assert bf16["rows"] == pytest.approx(6 * 160)
    assert bf16["sent"] == pytest.approx(160 * 2)
    assert bf16["ops"] == pytest.approx(pairs * (2 + 1))
    assert bf16["net_bytes"] == pytest.approx(320 * (2 * 256 + 4 * 2))
    fp8 = sm.traffic(shape, sm.BY_LABEL["dispatch fp8"])
    assert fp8["ops"] == pytest.approx(pairs * (3 + 1))
    assert fp8["net_bytes"] == pytest.approx(320 * (256 + 4 * 256 / 128 + 4 * 2))
    token = sm.traffic(shape, sm.BY_LABEL["dispatch bf16"], per_token=True)
    assert token["ops"] == pytest.approx(pairs * (1 + 1) + 320)
    combine = sm.traffic(shape, sm.BY_LABEL["combine bf16"], per_token=True)
    assert combine == bf16  # per-token probs are the dispatch's only


def test_traffic_matches_sampled_routing():
    """Uniform top-k routing drawn like the bench's: rows, bytes and operations of rank 0."""
    shape = sm.Shape(ranks=8, per_domain=2, tokens=4096, hidden=128, experts=8, topk=8)
    rng = np.random.default_rng(0)
    total = shape.ranks * shape.experts
    rows, sent, runs = 0, 0, 0
    sources = 8
    for _ in range(sources):  # tokens of several source ranks, all in domain 0
        chosen = np.argpartition(rng.random((shape.tokens, total)), shape.topk, axis=1)
        chosen = chosen[:, :shape.topk]
        rows += (chosen < shape.experts).any(axis=1).sum()  # to rank 0
        for m in range(1, shape.domains):
            owned = (chosen // (shape.experts * shape.per_domain) == m).any(axis=1)
            sent += owned.sum()
            edges = np.diff(owned.reshape(-1, shape.chunk).astype(int), axis=1, prepend=0)
            runs += (edges == 1).sum()
    t = sm.traffic(shape, sm.BY_LABEL["dispatch bf16"])
    chunks_pairs = shape.tokens // shape.chunk * (shape.domains - 1)
    assert t["rows"] / shape.ranks == pytest.approx(rows / sources, rel=0.02)
    assert t["sent"] == pytest.approx(sent / sources, rel=0.01)
    assert t["ops"] == pytest.approx(2 * runs / sources + chunks_pairs, rel=0.01)


def _synthetic(tmp_path, domains=(2, 4, 8), truth=TRUTH, forms=("no wire", "wire, run probs",
               "wire, token probs")) -> list[str]:
    """Bench JSON files whose times and counters are the model's own, one per domain count."""
    paths = []
    wire = sm.parse(WIRE)
    for n in domains:
        shape = sm.Shape(ranks=2 * n, per_domain=2)
        runs = []
        for form in forms:
            rows = []
            for op in sm.OPS:
                fixed, b_gpu, eta = truth[op.label]
                point = sm.Point("", shape, None if form == "no wire" else wire, 1, form, op,
                                 0.0, {}, False)
                t = point.traffic()
                signals = math.ceil(shape.tokens / shape.chunk) * (n - 1)
                rows.append({"op": op.label, "channels": 1, "form": form,
                             "api_us": sm.Fit(fixed, b_gpu, eta).emulated_s(point) * 1e6,
                             "algbw_gbps": 0.0, "puts": t["ops"] - signals, "signals": signals,
                             "net_mb": t["net_bytes"] / 1e6})
            runs.append({"channels": 1, "form": form, "rows": rows, "ranks": []})
        config = {"ranks": 2 * n, "nodes": n, "channels": [1], "sms": 8, "hidden": 7168,
                  "tokens": 4096, "experts_per_rank": 8, "topk": 8, "iters": 10, "wire": WIRE,
                  "prob_puts": ["run", "token"]}
        path = tmp_path / f"wire-{n}.json"
        path.write_text(json.dumps({"config": config, "device": "synthetic", "runs": runs}))
        paths.append(str(path))
    return paths


def test_fit_recovers_known_parameters(tmp_path):
    points = sm.load(_synthetic(tmp_path), {2, 4}, 64)
    assert {p.fitted for p in points if p.form == "wire, token probs"} == {False}
    assert {p.shape.domains for p in points if p.fitted} == {2, 4}
    for op in sm.OPS:
        fit = sm.fit_op(op, [p for p in points if p.op is op])
        fixed, b_gpu, eta = TRUTH[op.label]
        assert fit.fixed == pytest.approx(fixed, rel=0.01)
        assert fit.b_gpu == pytest.approx(b_gpu, rel=0.01)
        assert fit.eta_nic == pytest.approx(eta, rel=0.01)
        assert fit.identified
        for p in points:
            if p.op is op:
                assert abs(sm.rel_error(fit, p)) < 1e-3, (p.shape.domains, p.form)


def test_flat_eta_is_flagged(tmp_path):
    """A GPU so slow that the NIC never bounds: eta_nic cannot be fitted, 1 is taken."""
    slow = {op: (fixed, 1e10, 0.5) for op, (fixed, _, _) in TRUTH.items()}
    points = sm.load(_synthetic(tmp_path, truth=slow), {2, 4}, 64)
    fit = sm.fit_op(sm.OPS[1], [p for p in points if p.op is sm.OPS[1]])
    assert not fit.identified and fit.eta_nic == 1.0


def test_cli_writes_markdown_without_matplotlib(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    out = tmp_path / "out"
    assert sm.main([*_synthetic(tmp_path), "--out-dir", str(out)]) == 0
    text = (out / "scaling-model.md").read_text()
    assert "Plots skipped" in text and not list(out.glob("*.png"))
    assert "Held-out points within 15%: 20 of 20" in text
    for n in (2, 4, 8, 16, 32, 64):
        assert f"\n| {n} | {8 * n} |" in text
    assert "| extrapolation |" in text
    assert "plots skipped" in capsys.readouterr().out


def test_cli_plots_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    sm.main([*_synthetic(tmp_path), "--out-dir", str(out), "--domains", "2,8,64"])
    assert {p.name for p in out.glob("*.png")} == {"scaling-model-time.png",
                                                    "scaling-model-memory.png"}


def test_bad_inputs_raise_systemexit(tmp_path):
    out = ["--out-dir", str(tmp_path / "out")]
    with pytest.raises(SystemExit):
        sm.main(out)  # no JSON
    with pytest.raises(SystemExit, match="not the JSON"):
        sm.main([str(tmp_path / "missing.json"), *out])
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{")
    with pytest.raises(SystemExit, match="not the JSON"):
        sm.main([str(garbage), *out])
    plain = _synthetic(tmp_path, domains=(2,), forms=("no wire",))
    with pytest.raises(SystemExit, match="no wired forms"):
        sm.main([*plain, *out])
    with pytest.raises(SystemExit, match="2 domain counts"):
        sm.main([*_synthetic(tmp_path, domains=(2, 8)), *out])
