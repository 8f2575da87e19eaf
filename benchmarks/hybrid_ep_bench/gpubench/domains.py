"""``hybrid-ep bench --nodes N`` on GPUs: several NVLink domains (the transport between them),
verified, timed, and with the network traffic read from the transport's counters.

All ranks share the GPUs (rank r on GPU r % device_count; one H200 under MPS here), split into
N domains of ranks / N. For each channel count asked for (``HYBRID_EP_NUM_CHANNELS``) the ranks
run, per step with fresh top-k routing: ``dispatch bf16 + preprocess``, ``dispatch bf16`` and
``dispatch fp8`` with its handle, and ``combine bf16`` of the dispatched rows. The first warm-up
step is checked bit for bit against :mod:`hybrid_ep_bench.oracle`; numbers of a wrong kernel are
never reported.

Per operation: API time (host barrier to ``torch.cuda.synchronize()``, median over ranks and
steps), algorithm bandwidth per rank (rows received x row bytes / time; combine: as BF16
dispatch), and per call from ``transport_stats()``: puts, signals and bytes this rank sent over
the network. Beside the dispatch's puts, the count a per-token probability put would need: one
put per (token, destination domain) instead of one per run.

With ``--wire SPEC`` (the p2p build's emulated NIC, :mod:`hybrid_ep.backends.p2p_wire`) each channel
count runs three forms in the same processes: without the wire (what the domains alone take),
under the wire with the probs put per run (restriped, the default) and per token
(``HYBRID_EP_PROB_PUTS=token``); with ``--eager both`` every form runs signalled and in the
eager form (``HYBRID_EP_EAGER``), each bounded by its own time without the wire. Per operation
under the wire: the lower bound, the larger of
the NIC's time for this rank's bytes and operations (transport_stats) and the time without the
wire, and the efficiency, bound / measured.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

from hybrid_ep.backends import p2p_wire
from hybrid_ep.config import EnvSettings

from .. import oracle
from . import mps
from .config import GpuBenchConfig, make_routing, make_tokens
from .spawn import run_ranks
from .timing import time_call

DOMAIN_OPS = ("dispatch_pre", "dispatch_bf16", "dispatch_fp8", "combine_bf16")
LABELS = {"dispatch_pre": "dispatch bf16 + preprocess", "dispatch_bf16": "dispatch bf16",
          "dispatch_fp8": "dispatch fp8", "combine_bf16": "combine bf16"}


@dataclass(frozen=True)
class DomainBenchConfig:
    ranks: int = 4
    nodes: int = 2
    channels: tuple[int, ...] = (1, 2, 4)
    sms: int = 8
    hidden: int = 7168
    tokens: int = 4096
    experts_per_rank: int = 8
    topk: int = 8
    iters: int = 10
    warmup: int = 2
    seed: int = 0
    out_dir: str = "hybrid-ep-bench"
    label: str = ""
    mps: bool = True  # as GpuBenchConfig.mps
    wire: str | None = None  # HYBRID_EP_P2P_WIRE for the emulated-network forms; None: none
    prob_puts: tuple[str, ...] = ("run", "token")  # the wired forms' HYBRID_EP_PROB_PUTS
    # HYBRID_EP_EAGER of each form, every form once per value ("signalled", "eager"); empty:
    # the environment's, one form each.
    eager: tuple[bool, ...] = ()

    def forms(self) -> list[tuple[str, dict]]:
        """(name, environment) of each form a channel count runs."""
        if self.wire is None:
            base = [("", {})]
        else:
            no_wire = ("no wire", {"HYBRID_EP_P2P_WIRE": "off", "HYBRID_EP_PROB_PUTS": "run"})
            base = [no_wire] + [(f"wire, {mode} probs", {"HYBRID_EP_P2P_WIRE": self.wire,
                                                        "HYBRID_EP_PROB_PUTS": mode})
                                for mode in self.prob_puts]
        if not self.eager:
            return base
        return [(", ".join(x for x in (name, "eager" if eager else "signalled") if x),
                 {**env, "HYBRID_EP_EAGER": "1" if eager else "0"})
                for eager in self.eager for name, env in base]

    def baseline_form(self, form: int) -> int:
        """The form whose time without the wire bounds form ``form``'s: the first of its group
        (with ``eager``, the signalled and the eager forms each have their own)."""
        group = len(self.forms()) // max(1, len(self.eager))
        return form - form % group

    def inputs(self) -> GpuBenchConfig:
        """The single-domain bench's input generator, with this configuration's sizes."""
        return GpuBenchConfig(hidden=self.hidden, tokens=self.tokens,
                              experts_per_rank=self.experts_per_rank, topk=self.topk,
                              seed=self.seed, fp8=True)


@dataclass
class DomainRankResult:
    rank: int
    channels: int
    api_s: dict = field(default_factory=dict)     # op -> [seconds per timed step]
    rows: list = field(default_factory=list)      # D per timed step
    sent: dict = field(default_factory=dict)      # op -> [transport_stats per timed step]
    per_token_prob_puts: list = field(default_factory=list)  # (token, other domain) pairs
    verified: list = field(default_factory=list)
    form: str = ""


@dataclass
class FormsResult:
    forms: list = field(default_factory=list)  # DomainRankResult per form, cfg.forms() order


def _measure_forms(cfg: DomainBenchConfig, channels: int, rank: int) -> FormsResult:
    """Every form in these processes: its environment is read when its buffer is built."""
    out = FormsResult()
    for name, env in cfg.forms():
        os.environ.update(env)
        result = _measure(cfg, channels, rank)
        result.form = name
        out.forms.append(result)
    return out


def _step(cfg: DomainBenchConfig, buf, tokens: dict, step: int, rank: int, timer) -> dict:
    experts_total = cfg.experts_per_rank * cfg.ranks
    routing_map, probs = make_routing(cfg.inputs(), experts_total, step, rank, tokens["device"])
    x = tokens["hidden"]
    out = {"routing_map": routing_map, "probs": probs}
    out["dispatch_pre"] = timer("dispatch_pre",
                                lambda: buf.dispatch(x, probs=probs, routing_map=routing_map))
    handle = out["dispatch_pre"][3]
    out["dispatch_bf16"] = timer("dispatch_bf16",
                                 lambda: buf.dispatch(x, probs=probs, handle=handle))
    out["dispatch_fp8"] = timer("dispatch_fp8", lambda: buf.dispatch(
        tokens["fp8"], scaling_factor=tokens["scales"], probs=probs, handle=handle))
    rows, rows_probs = out["dispatch_bf16"][0], out["dispatch_bf16"][1]
    out["combine_bf16"] = timer("combine_bf16",
                                lambda: buf.combine(rows, probs=rows_probs, handle=handle))
    out["rows"] = int(rows.shape[0])
    out["remote_pairs"] = int(handle[2].sum())  # attn_to_rdma_map: (token, other domain)
    return out


def _verify(cfg: DomainBenchConfig, out: dict, tokens: dict, rank: int, group) -> list[str]:
    dev = tokens["device"]
    everyone = []
    maps = [torch.empty(cfg.tokens, cfg.experts_per_rank * cfg.ranks, dtype=torch.uint8,
                        device="cpu")
            for _ in range(cfg.ranks)]
    dist.all_gather(maps, out["routing_map"].to(torch.uint8).cpu(), group=group)
    probs = [torch.empty(cfg.tokens, cfg.experts_per_rank * cfg.ranks, device="cpu") for _ in range(cfg.ranks)]
    dist.all_gather(probs, out["probs"].cpu(), group=group)
    for source in range(cfg.ranks):
        inputs = tokens if source == rank else make_tokens(cfg.inputs(), source, dev)
        everyone.append({"hidden": inputs["hidden"], "fp8": inputs["fp8"],
                         "scales": inputs["scales"], "routing_map": maps[source].to(dev).bool(),
                         "probs": probs[source].to(dev)})
    per_domain = cfg.ranks // cfg.nodes
    want = oracle.expected_dispatch(everyone, rank, cfg.experts_per_rank, per_domain)
    for op in ("dispatch_pre", "dispatch_bf16"):
        oracle.assert_same(f"{op} rows", out[op][0], want[0])
        oracle.assert_same(f"{op} probs", out[op][1], want[1])
    want8 = oracle.expected_dispatch(
        [{"hidden": e["fp8"], "routing_map": e["routing_map"], "scaling_factor": e["scales"]}
         for e in everyone], rank, cfg.experts_per_rank, per_domain)
    oracle.assert_same("dispatch_fp8 rows", out["dispatch_fp8"][0], want8[0])
    oracle.assert_same("dispatch_fp8 scales", out["dispatch_fp8"][2], want8[2])
    combined, combined_probs = out["combine_bf16"]
    oracle.assert_same("combine rows", combined, oracle.expected_combine_of_dispatch(
        tokens["hidden"], out["routing_map"], cfg.experts_per_rank, cfg.ranks // cfg.nodes,
        EnvSettings.read().combine_wire))
    oracle.assert_same("combine probs", combined_probs, out["probs"])
    return list(DOMAIN_OPS)


def _measure(cfg: DomainBenchConfig, channels: int, rank: int) -> DomainRankResult:
    from hybrid_ep import HybridEPBuffer

    group = dist.group.WORLD
    device = torch.device("cuda", torch.cuda.current_device())
    tokens = make_tokens(cfg.inputs(), rank, device) | {"device": device}
    buf = HybridEPBuffer(group, cfg.hidden, cfg.tokens, cfg.experts_per_rank, use_fp8=True,
                         num_sms_dispatch_api=cfg.sms, num_sms_combine_api=cfg.sms,
                         num_sms_preprocessing_api=min(cfg.sms, 16),
                         num_of_hybrid_ep_ranks_per_nvlink_domain=cfg.ranks // cfg.nodes)
    result = DomainRankResult(rank=rank, channels=channels,
                              api_s={op: [] for op in DOMAIN_OPS},
                              sent={op: [] for op in DOMAIN_OPS})
    for step in range(cfg.warmup + cfg.iters):
        timed = step >= cfg.warmup
        buf.transport_stats(reset=True)

        def timer(op, fn, timed=timed, buf=buf):
            value, seconds = time_call(fn, group)
            stats = buf.transport_stats(reset=True)  # a device read, outside the timed call
            if timed:
                result.api_s[op].append(seconds)
                result.sent[op].append({k: stats[k] for k in ("puts", "signals", "bytes")})
            return value

        out = _step(cfg, buf, tokens, step, rank, timer)
        if step == 0:
            result.verified = _verify(cfg, out, tokens, rank, group)
        if timed:
            result.rows.append(out["rows"])
            result.per_token_prob_puts.append(out["remote_pairs"])
        del out
    torch.cuda.synchronize()
    dist.barrier(group)
    del buf
    return result


def _row_bytes(cfg: DomainBenchConfig, op: str) -> float:
    return cfg.hidden * (1 + 4 / 128) if op == "dispatch_fp8" else 2 * cfg.hidden


def summarize(cfg: DomainBenchConfig, results: list[dict], baseline: list[dict] | None = None
              ) -> list[dict]:
    """One row per operation of one form of one channel count: medians over ranks and timed
    steps. Under the wire, ``baseline`` holds the rows of the form without it."""
    rows = []
    spec = p2p_wire.parse(cfg.wire, "--wire") if results[0].get("form", "").startswith("wire") \
        else None
    for i, op in enumerate(DOMAIN_OPS):
        seconds = statistics.median(s for r in results for s in r["api_s"][op])
        received = statistics.mean(d for r in results for d in r["rows"])
        sent = [s for r in results for s in r["sent"][op]]
        row = {"op": LABELS[op], "channels": results[0]["channels"],
               "api_us": seconds * 1e6,
               "algbw_gbps": received * _row_bytes(cfg, op) / seconds / 1e9,
               "puts": statistics.mean(s["puts"] for s in sent),
               "signals": statistics.mean(s["signals"] for s in sent),
               "net_mb": statistics.mean(s["bytes"] for s in sent) / 1e6}
        if op.startswith("dispatch"):
            # A per-token probability put: one per (token, destination domain) on top of the
            # other tensors' puts, instead of one per run.
            pairs = statistics.mean(p for r in results for p in r["per_token_prob_puts"])
            runs_per_tensor = row["puts"] / (3 if op == "dispatch_fp8" else 2)
            row["puts_per_token_probs"] = row["puts"] - runs_per_tensor + pairs
        row["form"] = results[0].get("form", "")
        if spec is not None:
            # The NIC's least time: the largest rank's sends (the op ends with its last rank).
            wire_s = max(spec.lower_bound_s(statistics.mean(s["bytes"] for s in r["sent"][op]),
                                            statistics.mean(s["puts"] + s["signals"]
                                                            for s in r["sent"][op]),
                                            row["channels"])
                         for r in results)
            bound_s = max(wire_s, baseline[i]["api_us"] * 1e-6)
            row |= {"wire_us": wire_s * 1e6, "bound_us": bound_s * 1e6,
                    "efficiency": bound_s / seconds}
        rows.append(row)
    return rows


def format_table(cfg: DomainBenchConfig, rows: list[dict], device: str,
                 mps_state: str = mps.RUNNING) -> str:
    lines = [(f"## {cfg.nodes} domains x {cfg.ranks // cfg.nodes} ranks on {device}"
             f"{' (' + cfg.label + ')' if cfg.label else ''}, MPS {mps_state}"), "",
             *([f"**NOT VALID: several ranks share a GPU and MPS {mps_state}.**", ""]
               if not mps.valid(mps_state) else []),
             (f"hidden {cfg.hidden}, {cfg.tokens} tokens per rank, top-{cfg.topk} of "
             f"{cfg.experts_per_rank} experts per rank, {cfg.sms} SMs per rank, "
             f"{cfg.iters} timed steps (median over ranks and steps); network columns are per "
             "call and rank, from transport_stats()."), "",
             ("| channels | operation | API us | algbw GB/s per rank | puts | signals | network MB "
             "| puts with per-token probs |"),
             "|---|---|---|---|---|---|---|---|"]
    wired = [r for r in rows if r.get("form")]
    if wired:
        lines[-2:] = [(f"Emulated NIC (HYBRID_EP_P2P_WIRE): {cfg.wire}. Bound: the larger of "
                       "the NIC's time for the busiest rank's bytes and operations and the time "
                       "without the wire; efficiency = bound / API time."), "",
                      ("| channels | form | operation | API us | wire us | bound us | efficiency "
                       "| algbw GB/s per rank | puts | signals | network MB |"),
                      "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in wired:
            bound = (f"{r['wire_us']:.0f} | {r['bound_us']:.0f} | {r['efficiency']:.2f}"
                     if "bound_us" in r else "- | - | -")
            lines.append(f"| {r['channels']} | {r['form']} | {r['op']} | {r['api_us']:.0f} | "
                         f"{bound} | {r['algbw_gbps']:.1f} | {r['puts']:.0f} | "
                         f"{r['signals']:.0f} | {r['net_mb']:.2f} |")
        return "\n".join(lines)
    for r in rows:
        per_token = f"{r['puts_per_token_probs']:.0f}" if "puts_per_token_probs" in r else "-"
        lines.append(f"| {r['channels']} | {r['op']} | {r['api_us']:.0f} | {r['algbw_gbps']:.1f} "
                     f"| {r['puts']:.0f} | {r['signals']:.0f} | {r['net_mb']:.2f} | {per_token} |")
    return "\n".join(lines)


def run(cfg: DomainBenchConfig, json_path: str | None = None) -> str:
    if cfg.ranks % cfg.nodes != 0 or cfg.nodes < 2:
        raise ValueError(f"--nodes {cfg.nodes} must be >= 2 and divide --ranks {cfg.ranks}")
    shared = cfg.ranks > torch.cuda.device_count()
    with mps.mps_for_ranks(shared, cfg.mps) as state:
        return _run(cfg, json_path, state)


def _run(cfg: DomainBenchConfig, json_path: str | None, mps_state: str) -> str:
    device = torch.cuda.get_device_name(0)
    print(f"hybrid-ep bench: MPS {mps_state}", flush=True)
    everything, tables = [], []
    for channels in cfg.channels:
        ranks = run_ranks(cfg.ranks, _measure_forms, (cfg, channels),
                          {"HYBRID_EP_NUM_CHANNELS": str(channels)})
        baselines = {}
        for f in range(len(cfg.forms())):
            results = [r["forms"][f] for r in ranks]
            rows = summarize(cfg, results, baselines.get(cfg.baseline_form(f)))
            baselines.setdefault(f, rows)
            everything.append({"channels": channels, "form": results[0]["form"], "rows": rows,
                               "ranks": results})
            tables.extend(rows)
    text = format_table(cfg, tables, device, mps_state)
    os.makedirs(cfg.out_dir, exist_ok=True)
    suffix = f"-{cfg.label}" if cfg.label else ""
    with open(os.path.join(cfg.out_dir, f"bench-domains-{cfg.nodes}x{cfg.ranks // cfg.nodes}"
                           f"{suffix}.md"), "w") as f:
        f.write(text + "\n")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"config": asdict(cfg), "device": device, "runs": everything}, f, indent=2)
    return text
