"""Scaling model of dispatch and combine across NVLink domains (issue 33, item 4): time per
call and registered memory per rank for N domains x R ranks from a few parameters, fitted on
the emulated runs of ``hybrid-ep bench --device cuda --nodes N --wire SPEC --json PATH`` (all
ranks on one GPU under MPS, :mod:`hybrid_ep_bench.gpubench.domains`), then extrapolated to a cluster
where every rank has its own GPU and NIC.

    python benchmarks/scaling_model.py wire-2.json wire-4.json wire-8.json --out-dir DIR

Traffic per rank (uniform top-k without replacement over W*E experts, tokens independent):
    p_rank = 1 - C(W*E - E, k) / C(W*E, k)       a token reaches one given rank
    p_dom  = 1 - C(W*E - E*R, k) / C(W*E, k)     ... one given domain
    D = W*T*p_rank rows received; S = T*(N-1)*p_dom tokens sent to other domains
    network bytes = S * (row bytes + 4*E*R)       row: BF16 2H, FP8 H + 4H/128 (scales)
    operations = chunks*(N-1) signals + tensors * runs puts (tensors: rows, probs[, scales]);
    runs per (chunk, domain) = p + (c-1)*p*(1-p): a run starts where a token goes and the
    one before it does not. Per-token probs: the probs' runs become S puts (dispatch only).
    Combine sends the BF16 dispatch's traffic back (BF16 partials + fp32 probs).
Time of one call: t = fixed + max(t_net, t_dom)
    t_net = (bytes / (eta_nic*gbps) + operations*op_ns) / rails + latency  (WireSpec's bound)
    t_dom: emulation, W*(D+S)*row bytes / B_gpu (every rank's rows, the network leg too,
           through the one GPU's memory); cluster, D*row bytes / (eta_dom*min(nvlink, sms*per_sm)).
Fitted per operation: (fixed, B_gpu) on the "no wire" points and eta_nic on the "wire, run
probs" points of the fitting domain counts (--fit-domains). Every other point is held out,
"wire, token probs" always: it tests op_ns, which is never fitted.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shlex
import sys
from dataclasses import dataclass, fields

import numpy as np

from hybrid_ep.backends.p2p_wire import WireSpec, parse

NO_WIRE, RUN, TOKEN = "no wire", "wire, run probs", "wire, token probs"
TOLERANCE = 0.15  # the target for held-out points
ETA_GRID = np.round(np.arange(0.2, 1.5 + 1e-9, 0.0005), 4)  # 1-D search of eta_nic


@dataclass(frozen=True)
class Op:
    label: str
    fp8: bool = False
    dispatch: bool = True


OPS = (Op("dispatch bf16 + preprocess"), Op("dispatch bf16"), Op("dispatch fp8", fp8=True),
       Op("combine bf16", dispatch=False))
BY_LABEL = {op.label: op for op in OPS}


@dataclass(frozen=True)
class Shape:
    ranks: int  # W
    per_domain: int  # R
    tokens: int = 4096  # T per rank
    hidden: int = 7168
    experts: int = 8  # E per rank
    topk: int = 8
    chunk: int = 64  # the dispatch chunk: one signal per (chunk, other domain)

    @property
    def domains(self) -> int:
        return self.ranks // self.per_domain


@functools.cache
def reach(shape: Shape) -> tuple[float, float]:
    """(p_rank, p_dom): a token's chance to pick an expert of one given rank, of one domain."""
    total = shape.ranks * shape.experts
    def miss(owned):
        return math.comb(total - owned, shape.topk) / math.comb(total, shape.topk)
    return 1 - miss(shape.experts), 1 - miss(shape.experts * shape.per_domain)


def expected_runs(p: float, length: int) -> float:
    """Expected maximal runs of successes in ``length`` independent trials of probability p."""
    return p + (length - 1) * p * (1 - p) if length > 0 else 0.0


def traffic(shape: Shape, op: Op, per_token: bool = False) -> dict:
    """Expected rows received, tokens sent out of the domain, network bytes and operations
    (puts + signals) of one call of one rank."""
    p_rank, p_dom = reach(shape)
    row = shape.hidden * (1 + 4 / 128) if op.fp8 else 2 * shape.hidden
    others = shape.domains - 1
    sent = shape.tokens * others * p_dom
    full, rest = divmod(shape.tokens, shape.chunk)  # a short last chunk has fewer runs
    chunks = full + (rest > 0)
    runs = others * (full * expected_runs(p_dom, shape.chunk) + expected_runs(p_dom, rest))
    tensors = 3 if op.fp8 else 2
    puts = tensors * runs
    if per_token and op.dispatch:
        puts += sent - runs  # the probs: one put per (token, domain) instead of per run
    return {"rows": shape.ranks * shape.tokens * p_rank, "sent": sent, "row_bytes": row,
            "net_bytes": sent * (row + 4 * shape.experts * shape.per_domain),
            "ops": puts + chunks * others}


def net_s(wire: WireSpec | None, t: dict, eta_nic: float, rails_used: int) -> float:
    """The NIC's time: its bytes at eta_nic of the rail rate (op_ns and latency as given)."""
    return 0.0 if wire is None else wire.lower_bound_s(t["net_bytes"] / eta_nic, t["ops"],
                                                       rails_used)


@dataclass
class Point:
    source: str
    shape: Shape
    wire: WireSpec | None  # None: the "no wire" form
    channels: int
    form: str
    op: Op
    measured_s: float
    row: dict
    fitted: bool

    def traffic(self) -> dict:
        return traffic(self.shape, self.op, self.form == TOKEN)

    def gpu_bytes(self) -> float:
        """What the shared GPU moves for all ranks: W x (D + S) rows (the network leg too)."""
        t = self.traffic()
        return self.shape.ranks * (t["rows"] + t["sent"]) * t["row_bytes"]


@dataclass
class Fit:
    fixed: float  # s
    b_gpu: float  # bytes/s of the whole emulating GPU
    eta_nic: float = 1.0
    identified: bool = True  # False: eta_nic flat over a wide range (NIC never the bound)

    def emulated_s(self, p: Point) -> float:
        return self.fixed + max(p.gpu_bytes() / self.b_gpu,
                                net_s(p.wire, p.traffic(), self.eta_nic, p.channels))


def load(paths: list[str], fit_domains: set[int], chunk: int) -> list[Point]:
    points = []
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
            cfg, runs = data["config"], data["runs"]
            shape = Shape(cfg["ranks"], cfg["ranks"] // cfg["nodes"], cfg["tokens"],
                          cfg["hidden"], cfg["experts_per_rank"], cfg["topk"], chunk)
            wire = parse(cfg.get("wire"), "--wire")
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as e:
            raise SystemExit(f"{path}: not the JSON of `hybrid-ep bench --device cuda --nodes N "
                             f"--wire SPEC --json PATH` ({type(e).__name__}: {e})") from None
        if wire is None or not any(r.get("form") in (RUN, TOKEN) for r in runs):
            raise SystemExit(f"{path}: no wired forms; run the bench with --wire SPEC")
        for run in runs:
            form = run.get("form")
            for row in run["rows"]:
                if form in (NO_WIRE, RUN, TOKEN) and row["op"] in BY_LABEL:
                    points.append(Point(path, shape, None if form == NO_WIRE else wire,
                                        run["channels"], form, BY_LABEL[row["op"]],
                                        row["api_us"] * 1e-6, row,
                                        shape.domains in fit_domains and form != TOKEN))
    return points


def rel_error(fit: Fit, p: Point) -> float:
    return fit.emulated_s(p) / p.measured_s - 1


def fit_op(op: Op, points: list[Point]) -> Fit:
    """(fixed, B_gpu) by least squares in relative error on the fitting "no wire" points, then
    eta_nic by a grid search on the fitting "wire, run probs" points."""
    plain = [p for p in points if p.fitted and p.form == NO_WIRE]
    if len(plain) < 2 or len({p.shape for p in plain}) < 2:
        raise SystemExit(f"{op.label}: {len(plain)} 'no wire' fitting point(s) of "
                         f"{len({p.shape for p in plain})} shape(s); the fit needs 2 domain "
                         "counts at least (--fit-domains)")
    y = np.array([p.measured_s for p in plain])
    a = np.array([[1.0, p.gpu_bytes()] for p in plain]) / y[:, None]  # rows / y: relative
    (fixed, per_byte), *_ = np.linalg.lstsq(a, np.ones(len(plain)), rcond=None)
    if per_byte <= 0:
        raise SystemExit(f"{op.label}: the 'no wire' times do not grow with the bytes moved; "
                         "no GPU bandwidth fits")
    wired = [p for p in points if p.fitted and p.form == RUN]
    if not wired:
        raise SystemExit(f"{op.label}: no 'wire, run probs' fitting point")
    cost = np.array([sum(rel_error(Fit(fixed, 1 / per_byte, eta), p) ** 2 for p in wired)
                     for eta in ETA_GRID])
    # Where the NIC never bounds a point the cost is flat in eta: take the value closest to
    # the emulator's nominal rate (1) among the best, and say it was not identified.
    best = ETA_GRID[cost <= cost.min() * (1 + 1e-9) + 1e-18]
    eta = float(best[np.argmin(abs(best - 1))])
    return Fit(float(fixed), float(1 / per_byte), eta, float(best.max() - best.min()) < 0.01)


@dataclass(frozen=True)
class Cluster:
    """The extrapolated machine: one GPU and NIC per rank. In-domain rate: an assumption."""
    per_domain: int = 8
    nvlink_gbps: float = 450.0  # per rank and direction
    # The single-domain bench's fraction of the HBM roofline at 8 ranks x 16 SMs (docs/engine.md,
    # after the IPC page rounding), assumed to carry over to NVLink between GPUs.
    eta_dom: float = 0.85
    sms: int = 16
    # Dispatch bf16 kernel, 1 rank x 8 SMs: 356 GB/s / 8 (2026-11-29-cuda-intra-domain.md).
    per_sm_gbps: float = 44.0
    nic_gbps: float = 50.0
    op_ns: float = 400.0
    latency_us: float = 3.0

    def domain_bps(self) -> float:
        # Below nvlink_gbps / per_sm_gbps SMs (about 10) the SMs bound the rate, NVLink above.
        return self.eta_dom * min(self.nvlink_gbps, self.sms * self.per_sm_gbps) * 1e9

    def call_s(self, fit: Fit, shape: Shape, op: Op, per_token: bool, rails: int):
        """(time, bound) of one call: its rows received over NVLink (the network leg is the
        NIC's here), its sends over the NIC at the fitted eta_nic."""
        t = traffic(shape, op, per_token)
        dom = t["rows"] * t["row_bytes"] / self.domain_bps()
        wire = WireSpec(gbps=self.nic_gbps, latency_us=self.latency_us, op_ns=self.op_ns,
                        rails=rails)
        net = net_s(wire, t, fit.eta_nic, rails)
        return fit.fixed + max(dom, net), "NIC" if net > dom else "NVLink"


def registered_gib(shape: Shape) -> tuple[float, float]:
    from hybrid_ep import memory_plan  # the built _C extension's layout code

    plan = memory_plan(shape.ranks, shape.per_domain, shape.hidden, shape.tokens, shape.experts,
                       combine_wire="bf16", num_of_tokens_per_chunk_dispatch_api=shape.chunk)
    return plan["total"] / 2**30, plan["network"] / 2**30


def extrapolate(fits: dict, cl: Cluster, shape0: Shape, domains: list[int], rails: list[int],
                emulated: int) -> list[dict]:
    rows = []
    for n in domains:
        shape = Shape(n * cl.per_domain, cl.per_domain, shape0.tokens, shape0.hidden,
                      shape0.experts, shape0.topk, shape0.chunk)
        t = traffic(shape, BY_LABEL["dispatch bf16"])
        row = {"domains": n, "ranks": shape.ranks, "rows": t["rows"], "sent": t["sent"],
               "net_mb": t["net_bytes"] / 1e6, "range": "extrapolation" if n > emulated
               else "extrapolation (N emulated)"}
        for r in rails:
            run, bound = cl.call_s(fits["dispatch bf16"], shape, BY_LABEL["dispatch bf16"],
                                   False, r)
            token, _ = cl.call_s(fits["dispatch bf16"], shape, BY_LABEL["dispatch bf16"],
                                 True, r)
            combine, _ = cl.call_s(fits["combine bf16"], shape, BY_LABEL["combine bf16"],
                                   False, r)
            row[r] = {"run": run, "token": token, "gain": token / run - 1, "combine": combine,
                      "bound": bound}
        row["total_gib"], row["network_gib"] = registered_gib(shape)
        rows.append(row)
    return rows


def plot(rows: list[dict], rails: list[int], emulated: int, out_dir: str) -> list[str] | None:
    """The two PNGs, or None without matplotlib (imported here only: the rest needs none)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return None
    n = [r["domains"] for r in rows]
    paths = [os.path.join(out_dir, f"scaling-model-{name}.png") for name in ("time", "memory")]
    for path in paths:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        if path == paths[0]:
            for i, r in enumerate(rails):
                for key, style, name in (("run", "-", "dispatch, run probs"),
                                         ("token", "--", "dispatch, token probs"),
                                         ("combine", ":", "combine")):
                    ax.plot(n, [row[r][key] * 1e3 for row in rows], style, color=f"C{i}",
                            marker="o", label=f"{name}, {r} rail{'s' if r > 1 else ''}")
            ax.axvspan(min(n), emulated, color="0.92", label="N emulated (2 ranks per domain)")
            ax.set(yscale="log", ylabel="ms per call",
                   title="Scaling model: every point an extrapolation, in-domain rate assumed")
            for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
                axis(FuncFormatter(lambda v, _: f"{v:g}"))
        else:
            ax.plot(n, [r["total_gib"] for r in rows], "-o", label="registered, total")
            ax.plot(n, [r["network_gib"] for r in rows], "--o", label="of it for the network")
            ax.set(ylabel="GiB per rank", title="Registered memory per rank (memory_plan)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"domains ({rows[0]['ranks'] // rows[0]['domains']} ranks each)")
        ax.legend(fontsize=7)
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
    return paths


def table(head: list[str], body: list[list]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(str(c) for c in line) + " |" for line in body), ""]


def ratio(model: float, measured: float) -> str:
    return f"{model / measured:.3f}" if measured else "-"


def traffic_check(points: list[Point]) -> list[tuple]:
    """(point, model network MB, model operations, measured operations) of every wired point,
    against what its transport counters saw."""
    return [(p, p.traffic()["net_bytes"] / 1e6, p.traffic()["ops"],
             p.row["puts"] + p.row["signals"]) for p in points if p.wire is not None]


def summary_line(points: list[Point], fits: dict) -> str:
    held = [(abs(rel_error(fits[p.op.label], p)), p) for p in points if not p.fitted]
    text = (f"Held-out points within {TOLERANCE:.0%}: "
            f"{sum(e <= TOLERANCE for e, _ in held)} of {len(held)}")
    if held:
        e, p = max(held, key=lambda h: h[0])
        text += f"; largest error {e:.1%} ({p.shape.domains} domains, {p.form}, {p.op.label})"
    return text + "."


def report(args, points: list[Point], fits: dict, rows: list[dict], rails: list[int],
           plots: list[str] | None, cl: Cluster) -> str:
    wired = [p for p in points if p.wire is not None]
    check = [[p.shape.domains, p.form, p.op.label, p.channels, f"{mb:.2f}",
              f"{p.row['net_mb']:.2f}", ratio(mb, p.row["net_mb"]), f"{ops:.0f}",
              f"{ops_measured:.0f}", ratio(ops, ops_measured)]
             for p, mb, ops, ops_measured in traffic_check(points)]
    fit_rows = [[op, f"{f.fixed * 1e6:.0f}", f"{f.b_gpu / 1e9:.0f}", f"{f.eta_nic:.3f}",
                 "" if f.identified else "eta_nic not identified (NIC never the bound): "
                 "the best value nearest 1"] for op, f in fits.items()]
    pts = []
    for p in points:
        err = rel_error(fits[p.op.label], p)
        pts.append([p.shape.domains, p.form, p.op.label, p.channels, f"{p.measured_s * 1e6:.0f}",
                    f"{fits[p.op.label].emulated_s(p) * 1e6:.0f}", f"{err:+.1%}",
                    "fitted" if p.fitted else "held out",
                    "yes" if abs(err) <= TOLERANCE else "**no**"])
    head = ["domains", "ranks", "rows received", "tokens sent out", "network MB"]
    for r in rails:
        head += [f"dispatch run probs us, {r} rail(s)", f"token probs us, {r}",
                 f"restripe gain, {r}", f"combine us, {r}", f"dispatch bound, {r}"]
    ext = []
    for row in rows:
        line = [row["domains"], row["ranks"], f"{row['rows']:.0f}", f"{row['sent']:.0f}",
                f"{row['net_mb']:.1f}"]
        for r in rails:
            x = row[r]
            line += [f"{x['run'] * 1e6:.0f}", f"{x['token'] * 1e6:.0f}", f"{x['gain']:+.1%}",
                     f"{x['combine'] * 1e6:.0f}", x["bound"]]
        ext.append(line + [f"{row['total_gib']:.2f}", f"{row['network_gib']:.2f}", row["range"]])
    emulated = sorted({(p.shape.domains, p.shape.per_domain) for p in points})
    inputs = (f"- **Inputs**: {', '.join(sorted({f'`{p.source}`' for p in points}))}: "
              f"{', '.join(f'{n} x {r}' for n, r in emulated)} domains x ranks on one GPU "
              f"(MPS), emulated NIC {', '.join(sorted({f'`{p.wire.text()}`' for p in wired}))}.")
    command = shlex.join(["python", "benchmarks/scaling_model.py", *args.argv])
    model = ("- **Model** (the script's docstring): traffic per rank from uniform top-k routing; "
             "t = fixed + max(t_net, t_dom); fixed and B_gpu fitted per operation on the 'no "
             f"wire' points of {sorted(args.fit_domains)} domains, eta_nic on their 'wire, run "
             "probs' points; op_ns and latency are never fitted.")
    assumptions = (
        "**Every row is an extrapolation**: the emulation had 2 ranks per domain sharing one "
        f"GPU; rows past {emulated[-1][0]} domains extrapolate N as well. The in-domain rate "
        "is not fitted: it is the assumed eta_dom x min(NVLink, SMs x per-SM rate) = "
        f"{cl.eta_dom:g} x min({cl.nvlink_gbps:g}, {cl.sms} x {cl.per_sm_gbps:g}) = "
        f"{cl.domain_bps() / 1e9:.0f} GB/s per rank for the rows received (eta_dom: the "
        "single-domain bench's fraction of the HBM roofline at 8 ranks x 16 SMs; per-SM rate: "
        "dispatch bf16 at 1 rank x 8 SMs). Fitted: fixed and eta_nic of dispatch bf16 and "
        f"combine bf16. NIC: {cl.nic_gbps:g} GB/s per rail, {cl.op_ns:g} ns per operation, "
        f"{cl.latency_us:g} us latency, every rail used (channels >= rails). T = {args.tokens}"
        f", H = {args.hidden}, E = {args.experts}, top-{args.topk}, chunk {args.chunk}, "
        "uniform routing. Restripe gain: token / run - 1. Registered memory per rank: "
        "`hybrid_ep.memory_plan` (BF16 combine wire).")
    lines = [
        "# Scaling model: dispatch and combine across NVLink domains", "", inputs,
        f"- **Command**: `{command}`", model, "",
        "## Traffic: model / measured (transport_stats, per call and rank)", "",
        *table(["domains", "form", "operation", "channels", "network MB model", "measured",
                "ratio", "puts + signals model", "measured", "ratio"], check),
        "## Fit per operation", "",
        "B_gpu: the whole emulating GPU's rate for every rank's rows (the network leg too).", "",
        *table(["operation", "fixed us", "B_gpu GB/s", "eta_nic", "note"], fit_rows),
        "## Emulated points: measured and predicted", "", summary_line(points, fits), "",
        *table(["domains", "form", "operation", "channels", "measured us", "predicted us",
                "error", "role", f"within {TOLERANCE:.0%}"], pts),
        f"## Extrapolation: N domains x {cl.per_domain} ranks, one GPU and NIC per rank", "",
        assumptions, "", *table(head + ["registered GiB", "of it network GiB", "range"], ext),
        "## Plots", "",
        *([f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots] if plots else
          ["Plots skipped: matplotlib is not installed (`pip install matplotlib`)."]), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="bench JSON files (hybrid-ep bench ... --wire --json)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--fit-domains", default="2,4", help="domain counts fitted on (the rest: "
                    "held out)")
    ap.add_argument("--domains", default="2,4,8,16,32,64", help="extrapolated domain counts")
    ap.add_argument("--rails", type=int, default=1, help="NIC rails per rank (2 also shown)")
    # The cluster's parameters and the extrapolated problem, defaults from the dataclasses.
    knobs = list(fields(Cluster)) + [f for f in fields(Shape)
                                     if f.name not in ("ranks", "per_domain")]
    for f in knobs:
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                        help=f"default {f.default}")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    args.argv = argv  # for the report's command line
    try:
        args.fit_domains = {int(n) for n in args.fit_domains.split(",")}
        domains = sorted({int(n) for n in args.domains.split(",")})
    except ValueError:
        raise SystemExit("--fit-domains and --domains: comma-separated integers") from None
    points = load(args.json, args.fit_domains, args.chunk)
    fits = {op.label: fit_op(op, [p for p in points if p.op is op])
            for op in OPS if any(p.op is op for p in points)}
    if "dispatch bf16" not in fits or "combine bf16" not in fits:
        raise SystemExit("the JSON files hold no 'dispatch bf16' or no 'combine bf16' rows")
    cl = Cluster(**{f.name: getattr(args, f.name) for f in fields(Cluster)})
    rails = sorted({args.rails, 2})
    shape = Shape(cl.per_domain, cl.per_domain, args.tokens, args.hidden, args.experts,
                  args.topk, args.chunk)
    emulated = max(p.shape.domains for p in points)
    rows = extrapolate(fits, cl, shape, domains, rails, emulated)
    os.makedirs(args.out_dir, exist_ok=True)
    plots = plot(rows, rails, emulated, args.out_dir)
    text = report(args, points, fits, rows, rails, plots, cl)
    path = os.path.join(args.out_dir, "scaling-model.md")
    with open(path, "w") as f:
        f.write(text)
    checked = traffic_check(points)
    for name, pairs in (("network bytes", [(mb, p.row["net_mb"]) for p, mb, _, _ in checked]),
                        ("puts + signals", [(ops, m) for _, _, ops, m in checked])):
        ratios = [model / measured for model, measured in pairs if measured]
        print(f"traffic model / measured, {name}: {min(ratios):.3f} .. {max(ratios):.3f}")
    for op, fit in fits.items():
        print(f"{op}: fixed {fit.fixed * 1e6:.0f} us, B_gpu {fit.b_gpu / 1e9:.0f} GB/s, "
              f"eta_nic {fit.eta_nic:.3f}{'' if fit.identified else ' (not identified)'}")
    print(summary_line(points, fits))
    print(f"wrote {path}" + ("" if plots else " (plots skipped: no matplotlib)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
