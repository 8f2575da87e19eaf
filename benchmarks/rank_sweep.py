"""Kernel times of dispatch (BF16, FP8) and combine for W ranks on GPU 0, across variants of the
environment the buffer reads at creation (NUM_OF_STAGES_DISPATCH_API, the token chunk sizes,
HYBRID_EP_COMBINE_PIECES, ...). Each variant's outputs must equal the first variant's.

    python3 benchmarks/rank_sweep.py --ranks 2 --sms 8 --out OUT.md \\
        --variant base: --variant ch128:NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API=128

Ranks sharing the GPU need MPS (tools/gpu_run.sh starts it: BENCH_RANKS=W BENCH_CMD="...").
Each op is timed with and without probs ("-np"): the side data's cost per row. Kernel times
are torch.profiler medians per rank (every call's work starting at one instant of the GPU's
timer on all ranks), mean over ranks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from one_rank import commit, write_report

from hybrid_ep import HybridEPBuffer
from hybrid_ep.gpubench.timing import gated_call, is_our_kernel, kernel_events

OPS = ("dispatch bf16", "dispatch fp8", "combine", "dispatch bf16-np", "dispatch fp8-np",
       "combine-np")


def kernel_us(fn, kernel: str, iters: int) -> float:
    """Median device time of `kernel` over `iters` calls of fn, all ranks' work starting
    together on the GPU (gated_call)."""
    for _ in range(3):
        gated_call(fn, dist.group.WORLD, one_gpu=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            gated_call(fn, dist.group.WORLD, one_gpu=True)
        torch.cuda.synchronize()
    path = tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(path)
    times = [d for _, d, name in kernel_events(path) if is_our_kernel(name, kernel)]
    os.unlink(path)
    return statistics.median(times) if times else float("nan")


def run_variant(args, env: dict, inputs: dict, reference: list | None):
    """(kernel us per op, outputs) of one variant. `env` stays set until the buffer's first
    call has created its CUDA engine: whatever the engine reads from the environment when it
    is made must see the variant too (benchmarks/results/2026-12-01-issue3-close.md, section 3:
    variants read there once silently fell back to the defaults)."""
    x, x8, scales = inputs["hidden"], inputs["fp8"], inputs["scales"]
    probs, routing_map = inputs["probs"], inputs["routing_map"]
    for key, value in env.items():
        os.environ[key] = value
    try:
        buf = HybridEPBuffer(dist.group.WORLD, args.hidden, args.tokens, args.experts,
                             use_fp8=True, num_sms_dispatch_api=args.sms,
                             num_sms_combine_api=args.sms,
                             num_sms_preprocessing_api=min(args.sms, 16),
                             num_of_hybrid_ep_ranks_per_nvlink_domain=args.ranks)
        handle = buf.dispatch(x, probs=probs, routing_map=routing_map)[3]
    finally:
        for key in env:
            del os.environ[key]
    rows, rows_probs = buf.dispatch(x, probs=probs, handle=handle)[:2]
    fp8 = buf.dispatch(x8, probs=probs, scaling_factor=scales, handle=handle)
    combined = buf.combine(rows, probs=rows_probs, handle=handle)
    outputs = [rows, rows_probs, fp8[0].view(torch.uint8), fp8[2], combined[0], combined[1]]
    same = reference is None or all(torch.equal(a, b) for a, b in zip(outputs, reference))
    calls = {
        "dispatch bf16": (lambda: buf.dispatch(x, probs=probs, handle=handle), "dispatch_kernel"),
        "dispatch fp8": (lambda: buf.dispatch(x8, probs=probs, scaling_factor=scales,
                                              handle=handle), "dispatch_kernel"),
        "combine": (lambda: buf.combine(rows, probs=rows_probs, handle=handle), "combine_kernel"),
        "dispatch bf16-np": (lambda: buf.dispatch(x, handle=handle), "dispatch_kernel"),
        "dispatch fp8-np": (lambda: buf.dispatch(x8, scaling_factor=scales, handle=handle),
                            "dispatch_kernel"),
        "combine-np": (lambda: buf.combine(rows, handle=handle), "combine_kernel"),
    }
    times = {op: kernel_us(fn, kernel, args.iters) for op, (fn, kernel) in calls.items()}
    buf.destroy()
    return times, [o.clone() for o in outputs], same


def rank_main(rank: int, args, port: int, results) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.cuda.set_device(0)
    g = torch.Generator(device="cuda").manual_seed(rank)
    T, E = args.tokens, args.experts * args.ranks
    routing_map = torch.zeros(T, E, dtype=torch.bool, device="cuda")
    scores = torch.rand(T, E, device="cuda", generator=g)
    routing_map.scatter_(1, scores.topk(args.topk, dim=1).indices, True)
    inputs = {
        "hidden": torch.randn(T, args.hidden, device="cuda", generator=g).bfloat16(),
        "fp8": torch.randint(0, 256, (T, args.hidden), dtype=torch.uint8, device="cuda",
                             generator=g).view(torch.float8_e4m3fn),
        "scales": torch.rand(T, args.hidden // 128, device="cuda", generator=g),
        "probs": torch.rand(T, E, device="cuda", generator=g) * routing_map,
        "routing_map": routing_map,
    }
    reference = None
    for name, env in args.variants:
        times, outputs, same = run_variant(args, env, inputs, reference)
        reference = reference or outputs
        everyone = [None] * args.ranks
        dist.all_gather_object(everyone, (times, same))
        if rank == 0:
            mean = {op: statistics.fmean(t[op] for t, _ in everyone) for op in OPS}
            results.put((name, env, mean, all(s for _, s in everyone)))
    dist.destroy_process_group()


def parse_variant(spec: str) -> tuple[str, dict]:
    name, _, pairs = spec.partition(":")
    env = {}
    for pair in filter(None, pairs.split(",")):
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--variant {spec!r}: expected NAME:VAR=VALUE,... ({pair!r})")
        env[key] = value
    return name or "base", env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--sms", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--experts", type=int, default=8, help="experts per rank")
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:VAR=VALUE,... (repeatable; default one variant 'base:')")
    args = ap.parse_args()
    args.variants = [parse_variant(s) for s in args.variant or ["base:"]]
    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(rank_main, args=(args, 29600 + args.ranks, results), nprocs=args.ranks,
                       start_method="spawn")
    title = (f"rank_sweep, commit {commit()}, GPU {torch.cuda.get_device_name(0)}: "
             f"{args.ranks} rank(s) on GPU 0 x {args.sms} SMs, hidden {args.hidden}, "
             f"{args.tokens} tokens, top-{args.topk} of {args.experts} experts per rank, "
             f"{args.iters} calls per median (kernel us, mean over ranks; -np: without probs)")
    lines = [title, "", "| variant | environment | " + " | ".join(OPS) + " | outputs |",
             "|---|---|" + "---|" * len(OPS) + "---|"]
    while not results.empty():
        name, env, mean, same = results.get()
        settings = ", ".join(f"{k}={v}" for k, v in env.items()) or "(defaults)"
        cells = " | ".join(f"{mean[op]:.1f}" for op in OPS)
        lines.append(f"| {name} | {settings} | {cells} | "
                     f"{'as the first' if same else 'DIFFERENT'} |")
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
