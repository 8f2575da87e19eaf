"""The permute path on one rank (SM-bound regime of the intra-domain benchmark): kernel times of
dispatch, permute, unpermute and combine from a profiler trace, API times of the eager calls
(blocking and non-blocking), and the replay time of the captured non-blocking pair.

    python3 benchmarks/permute_one_rank.py --out OUT.md [--sms 8] [--tokens 4096] [--fused]

--fused runs the pair with fuse_permute_dispatch / fuse_unpermute_combine (one dispatch grid
and one combine grid) instead of the standalone permute and unpermute kernels.

Writes a markdown table (command, commit, GPU) to --out and prints it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
from one_rank import add_problem_args, commit, start, write_report

from hybrid_ep.gpubench.timing import is_our_kernel, kernel_events

KERNELS = ("dispatch_kernel", "permute_kernel", "unpermute_kernel", "combine_kernel")


def wall(fn, iters: int) -> float:
    """Median host wall time of fn() to a device synchronisation."""
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    add_problem_args(ap, iters=20)
    ap.add_argument("--pad", type=int, default=16)
    ap.add_argument("--fused", action="store_true",
                    help="fuse_permute_dispatch / fuse_unpermute_combine")
    args = ap.parse_args()
    run = start(args, port=29561)
    buf, x, rmap, probs = run.buffer, run.hidden, run.routing_map, run.probs
    H, T, E, k = args.hidden, args.tokens, args.experts, args.topk
    P = E * -(-T // args.pad) * args.pad

    def plain():
        out, p, _, h = buf.dispatch(x, routing_map=rmap, probs=probs)
        buf.combine(out, p, handle=h)

    def permuted(non_blocking: bool):
        extra = {"num_permuted_tokens": P} if non_blocking else {}
        out = buf.dispatch_with_permute(hidden=x, routing_map=rmap, probs=probs,
                                        pad_multiple=args.pad, non_blocking=non_blocking,
                                        fuse_permute_dispatch=args.fused, **extra)
        return buf.combine_with_unpermute(hidden=out[0], probs=out[1], handle=out[4],
                                          pad_multiple=args.pad,
                                          fuse_unpermute_combine=args.fused)

    for _ in range(3):
        plain()
        permuted(False)
        permuted(True)
    torch.cuda.synchronize()

    # Kernel times: one profiled pass of each path.
    kernel_us = {name: [] for name in KERNELS}
    plain_dispatch_us = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, fn in (("plain", plain), ("permute", lambda: permuted(True))):
            trace = os.path.join(tmp, f"{label}.json")
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(args.iters):
                    fn()
                torch.cuda.synchronize()
            prof.export_chrome_trace(trace)
            for _, dur, name in kernel_events(trace):
                for kernel in KERNELS:
                    if is_our_kernel(name, kernel) and not (kernel == "permute_kernel"
                                                            and "unpermute" in name):
                        if label == "plain" and kernel == "dispatch_kernel":
                            plain_dispatch_us.append(dur)
                        elif label == "permute":
                            kernel_us[kernel].append(dur)
    med = {name: statistics.median(v) if v else float("nan") for name, v in kernel_us.items()}
    plain_dispatch = statistics.median(plain_dispatch_us)

    api = {"eager pair, blocking": wall(lambda: permuted(False), args.iters),
           "eager pair, non-blocking": wall(lambda: permuted(True), args.iters),
           "eager plain dispatch + combine": wall(plain, args.iters)}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        permuted(True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        permuted(True)
    graph.replay()
    api["graph replay of the non-blocking pair"] = wall(graph.replay, args.iters)

    gpu = torch.cuda.get_device_name(0)
    # The fused dispatch grid permutes too: no permute_kernel then.
    permute_us = 0.0 if args.fused else med["permute_kernel"]
    fused_ratio = (med["dispatch_kernel"] + permute_us) / plain_dispatch
    mode = "fused" if args.fused else "standalone"
    lines = [
        "## Permute path, one rank (hybrid-ep benchmarks/permute_one_rank.py)",
        "",
        f"{time.strftime('%Y-%m-%d')}, commit {commit()}, GPU {gpu}, torch {torch.__version__}",
        (f"hidden {H}, {T} tokens, top-{k} of {E} experts, pad_multiple {args.pad}, "
        f"{args.sms} SMs per kernel family, {args.iters} calls per median"),
        (f"Command: `python3 benchmarks/permute_one_rank.py --out OUT.md --sms {args.sms}"
         f"{' --fused' if args.fused else ''}` ({mode} permute and unpermute)"),
        "",
        "| kernel | median (us) |",
        "|---|---|",
        f"| dispatch_kernel (plain dispatch) | {plain_dispatch:.1f} |",
    ]
    lines += [f"| {name} ({mode} permute path) | {med[name]:.1f} |" for name in KERNELS
              if kernel_us[name]]
    what = ("fused dispatch+permute kernel" if args.fused
            else "dispatch + standalone permute kernels")
    lines += ["", (f"{what} / plain dispatch kernel: "
              f"{fused_ratio:.3f} (target for the fused variant: <= 1.10)"), "",
              "| call sequence | median wall time (us) |", "|---|---|"]
    lines += [f"| {name} | {seconds * 1e6:.1f} |" for name, seconds in api.items()]
    write_report(args.out, lines)
    run.close()


if __name__ == "__main__":
    main()
