"""Where a call's time goes beyond its kernel when several ranks share the GPU (SM-bound
configuration of the intra-domain benchmark): the benchmark's own ranks, operations and
timer (ranks start each call at one agreed instant), under the profiler. Per operation, the
median over calls and ranks of when each GPU item (kernel, copy, memset) starts and ends,
counted from the call's start, and of when the host returns and when the call is synchronised.

    python3 benchmarks/api_ranks.py --out OUT.md [--ranks 2] [--sms 8] [--iters 10]

Ranks sharing a GPU need MPS (started by the caller, as for the benchmark); they run with the
benchmark's MPS share of SMs. Writes a markdown report (command, commit, GPU) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from one_rank import commit, write_report

from hybrid_ep.gpubench.config import OPS, GpuBenchConfig, RunSpec
from hybrid_ep.gpubench.ranks import _Rank, plan_sharing
from hybrid_ep.gpubench.spawn import run_ranks
from hybrid_ep.gpubench.timing import common_start, short_kernel_name

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cuda_runtime", "cuda_driver", "cpu_op")
LISTED_HOST_CALLS = 10  # host calls before the first launch, the ones taking longest
TIMED = ("dispatch_bf16", "dispatch_fp8", "combine_bf16", "combine_registered")


@dataclass
class Timeline:
    rank: int
    # op -> per call: {"returned", "synced", "items": [[name, start, end], ...]} (us from start)
    calls: dict = field(default_factory=dict)


def measure(cfg: GpuBenchConfig, spec: RunSpec, rank: int) -> Timeline:
    bench = _Rank(cfg, spec, rank)
    group = dist.group.WORLD
    marks = {}  # annotation -> (host returned, synchronised) seconds after it opened

    def timer(op, fn, record=False, step=0):
        torch.cuda.synchronize()
        common_start(group)
        label = f"{op}#{step}"
        with torch.profiler.record_function(label):
            start = time.perf_counter()
            result = fn()
            returned = time.perf_counter()
            torch.cuda.synchronize()
        if record:
            marks[label] = (returned - start, time.perf_counter() - start)
        return result

    for step in range(cfg.warmup):
        bench.step(step, timer)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for step in range(cfg.warmup, cfg.warmup + cfg.iters):
            bench.step(step, lambda op, fn, step=step: timer(op, fn, op in TIMED, step))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    spans = {e["name"]: e["ts"] for e in events
             if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"] in marks}
    gpu = sorted((e["ts"], e["dur"], short_kernel_name(str(e.get("name", "")))) for e in events
                 if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES)
    host = sorted((e["ts"], e["dur"], str(e.get("name", ""))) for e in events
                  if e.get("ph") == "X" and e.get("cat") in HOST_CATEGORIES)
    result = Timeline(rank=rank)
    for label, at in sorted(spans.items(), key=lambda kv: kv[1]):
        returned, synced = marks[label]
        end = at + 1e6 * synced
        items = [[name, ts - at, ts + dur - at] for ts, dur, name in gpu if at <= ts < end]
        calls = [(ts - at, dur, name) for ts, dur, name in host if at <= ts < end]
        launches = [t for t, _, name in calls if "Launch" in name or "Memcpy" in name]
        first = launches[0] if launches else float("inf")
        before = {}  # name -> [count, us] of the host calls that start before the first launch
        for t, dur, name in calls:
            if t < first:
                seen = before.setdefault(name, [0, 0.0])
                seen[0] += 1
                seen[1] += dur
        result.calls.setdefault(label.split("#")[0], []).append(
            {"returned": 1e6 * returned, "synced": 1e6 * synced, "items": items,
             "first_launch": first if launches else float("nan"), "before": before})
    del bench
    torch.cuda.synchronize()
    dist.barrier(group)
    return result


def summarize(results: list[dict], op: str) -> list[str]:
    calls = [c for r in results for c in r["calls"].get(op, [])]
    if not calls:
        return [f"| {OPS[op][0]} | no calls recorded | | | |"]
    names = [tuple(i[0] for i in c["items"]) for c in calls]
    common = statistics.mode(names)
    same = [c for c, n in zip(calls, names, strict=True) if n == common]
    med = statistics.median
    lines = [(f"| {OPS[op][0]} | host: first launch or copy | "
             f"{med(c['first_launch'] for c in calls):.1f} | | |"),
             f"| | host returns | | {med(c['returned'] for c in calls):.1f} | |"]
    totals = {}
    for c in calls:
        for name, (count, us) in c["before"].items():
            totals.setdefault(name, []).append((count, us))
    ranked = sorted(totals.items(), key=lambda kv: -sum(us for _, us in kv[1]))
    for name, seen in ranked[:LISTED_HOST_CALLS]:
        missing = [(0, 0.0)] * (len(calls) - len(seen))  # calls without it count as 0
        lines.append(f"| | before it, host {name}: calls, us (median per call) | "
                     f"{med(n for n, _ in seen + missing):g} | | "
                     f"{med(us for _, us in seen + missing):.1f} |")
    for k, name in enumerate(common):
        lines.append(f"| | {name or '(unnamed)'} | {med(c['items'][k][1] for c in same):.1f} | "
                     f"{med(c['items'][k][2] for c in same):.1f} | "
                     f"{med(c['items'][k][2] - c['items'][k][1] for c in same):.1f} |")
    lines.append(f"| | synchronised | | {med(c['synced'] for c in calls):.1f} | |")
    lines.append(f"| | ({len(same)} of {len(calls)} calls had these items) | | | |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sms", type=int, default=8)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    cfg = GpuBenchConfig(regimes=("sm",), sm_ranks=(args.ranks,), sm_sms=args.sms,
                         iters=args.iters, permute=False)
    spec = plan_sharing(cfg, RunSpec("sm", args.ranks, args.sms), torch.cuda.device_count(),
                        torch.cuda.get_device_properties(0).multi_processor_count)
    env = ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(spec.sm_percentage)}
           if spec.sm_percentage is not None else {})
    results = run_ranks(args.ranks, measure, (cfg, spec), env)
    lines = [
        f"## API timeline, {args.ranks} ranks (hybrid-ep benchmarks/api_ranks.py)", "",
        (f"{time.strftime('%Y-%m-%d')}, commit {commit()}, GPU {torch.cuda.get_device_name(0)}, "
         f"torch {torch.__version__}; MPS share {spec.sm_percentage}%"),
        (f"hidden {cfg.hidden}, {cfg.tokens} tokens/rank, top-{cfg.topk} of "
         f"{cfg.experts_per_rank} experts/rank, {args.sms} SMs, {args.iters} profiled calls per "
         "op and rank (the profiler adds its own host cost); us from the call's start "
         "(the ranks start each call at one agreed instant)"),
        (f"Command: `python3 benchmarks/api_ranks.py --out OUT.md --ranks {args.ranks} "
         f"--sms {args.sms} --iters {args.iters}`"), "",
        "| op | item | starts | ends | lasts |",
        "|---|---|---|---|---|",
    ]
    for op in TIMED:
        lines += summarize(results, op)
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
