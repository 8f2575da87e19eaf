"""Where an API call's time goes beyond its kernel, on one rank (SM-bound configuration of the
intra-domain benchmark). For each operation: the host time until the call returns, the time to
the device synchronisation, the GPU's busy time (kernels, copies, memsets) inside that window,
the idle gap before the first GPU work, and the host calls that took the most time.

    python3 benchmarks/api_breakdown.py --out OUT.md [--sms 8] [--tokens 4096] [--trace-dir D]

Writes a markdown report (command, commit, GPU) to --out and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
from one_rank import add_problem_args, commit, start, write_report

from hybrid_ep.gpubench.timing import short_kernel_name

PAD = 16
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def operations(buf, x, rmap, probs, fp8, scales, budget):
    """(name, fn) per operation; handles come from one preparatory call each."""
    handle = buf.dispatch(x, probs=probs, routing_map=rmap)[3]
    rows, rows_probs = buf.dispatch(x, probs=probs, handle=handle)[:2]
    fused = buf.dispatch_with_permute(hidden=x, probs=probs, routing_map=rmap, pad_multiple=PAD,
                                      fuse_permute_dispatch=True)
    return [
        ("dispatch + preprocess", lambda: buf.dispatch(x, probs=probs, routing_map=rmap)),
        ("dispatch (handle)", lambda: buf.dispatch(x, probs=probs, handle=handle)),
        ("dispatch fp8 (handle)", lambda: buf.dispatch(fp8, probs=probs, scaling_factor=scales,
                                                       handle=handle)),
        ("combine", lambda: buf.combine(rows, probs=rows_probs, handle=handle)),
        ("fused dispatch+permute, blocking", lambda: buf.dispatch_with_permute(
            hidden=x, probs=probs, routing_map=rmap, pad_multiple=PAD,
            fuse_permute_dispatch=True)),
        ("fused dispatch+permute, non-blocking", lambda: buf.dispatch_with_permute(
            hidden=x, probs=probs, routing_map=rmap, pad_multiple=PAD,
            fuse_permute_dispatch=True, non_blocking=True, num_permuted_tokens=budget)),
        ("fused unpermute+combine", lambda: buf.combine_with_unpermute(
            hidden=fused[0], probs=fused[1], handle=fused[4], pad_multiple=PAD,
            fuse_unpermute_combine=True)),
    ]


def profile(fn, iters: int, trace: str):
    """Runs fn iters times under the profiler; returns per-call (host return, to sync) seconds
    and the profiler."""
    marks = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            torch.cuda.synchronize()
            with torch.profiler.record_function(f"call{i}"):
                start = time.perf_counter()
                fn()
                returned = time.perf_counter()
                torch.cuda.synchronize()
                marks.append((returned - start, time.perf_counter() - start))
    prof.export_chrome_trace(trace)
    return marks, prof


def windows(trace: str, iters: int):
    """Per call: (GPU busy us, gap from call start to first GPU work us, GPU items)."""
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    calls = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("ph") == "X" and str(e.get("name", "")).startswith("call")
             and e.get("cat") == "user_annotation"}
    gpu = sorted((e["ts"], e["dur"], e["name"]) for e in events
                 if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES)
    out = []
    for i in range(iters):
        if f"call{i}" not in calls:
            continue
        lo, hi = calls[f"call{i}"]
        inside = [(ts, dur, name) for ts, dur, name in gpu if lo <= ts < hi]
        busy = sum(dur for _, dur, _ in inside)
        first = (inside[0][0] - lo) if inside else float("nan")
        out.append((busy, first, [short_kernel_name(name) for _, _, name in inside]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    add_problem_args(ap, iters=10)
    ap.add_argument("--trace-dir", default=None, help="keep the chrome traces here")
    args = ap.parse_args()
    run = start(args, port=29563)
    buf, x, rmap, probs = run.buffer, run.hidden, run.routing_map, run.probs
    H, T, E, k = args.hidden, args.tokens, args.experts, args.topk
    fp8 = torch.randn(T, H, device="cuda").to(torch.float8_e4m3fn)
    scales = torch.rand(T, H // 128, device="cuda")
    budget = E * -(-T // PAD) * PAD
    ops = operations(buf, x, rmap, probs, fp8, scales, budget)
    trace_dir = args.trace_dir or tempfile.mkdtemp()
    os.makedirs(trace_dir, exist_ok=True)

    lines = [
        "## API time breakdown, one rank (hybrid-ep benchmarks/api_breakdown.py)", "",
        (f"{time.strftime('%Y-%m-%d')}, commit {commit()}, GPU {torch.cuda.get_device_name(0)}, "
        f"torch {torch.__version__}"),
        (f"hidden {H}, {T} tokens, top-{k} of {E} experts, pad_multiple {PAD}, {args.sms} SMs, "
        f"{args.iters} profiled calls per median (the profiler adds its own host cost)"),
        f"Command: `python3 benchmarks/api_breakdown.py --out OUT.md --sms {args.sms}`", "",
        ("| operation | host returns (us) | to sync (us) | GPU busy (us) | first GPU work at (us) "
        "| GPU items per call |"),
        "|---|---|---|---|---|---|",
    ]
    details = []
    for name, fn in ops:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        slug = name.split(",")[0].replace(" ", "_").replace("+", "_").replace("(", "")
        slug += "_nb" if "non-blocking" in name else ""
        trace = os.path.join(trace_dir, slug.replace(")", "") + ".json")
        marks, prof = profile(fn, args.iters, trace)
        win = windows(trace, args.iters)
        med = statistics.median
        returned, synced = med(m[0] for m in marks) * 1e6, med(m[1] for m in marks) * 1e6
        lines.append(
            f"| {name} | {returned:.1f} | {synced:.1f}"
            f" | {med(w[0] for w in win):.1f} | {med(w[1] for w in win):.1f} | "
            f"{', '.join(win[-1][2]) if win else ''} |")
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14)
        details += ["", f"### {name}: host calls by self time ({args.iters} calls)", "", "```",
                    table, "```"]
    write_report(args.out, lines + details, shown=lines)
    run.close()


if __name__ == "__main__":
    main()
