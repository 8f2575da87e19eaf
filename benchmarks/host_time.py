"""Host time of each API call on one rank, without a profiler: how long the call takes to
return with the GPU idle before it, when it enters its first launching runtime call (what the
host spends before the GPU can start), when the GPU is done (synchronised), and how much the
calls into the compiled runtime (launches, copies) take. Host speed differs between machines,
so it also times two torch primitives for reference.

    python3 benchmarks/host_time.py --out OUT.md [--sms 8] [--iters 30]

Writes a markdown table (command, commit, GPU) to --out and prints it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch
from api_breakdown import PAD, operations
from one_rank import add_problem_args, commit, start, write_report


def median_us(fn, calls: int = 200) -> float:
    times = []
    for _ in range(calls):
        start_s = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start_s)
    return statistics.median(times) * 1e6


# Runtime calls that enqueue GPU work (status and summary reads do not).
LAUNCHING = {"preprocess", "dispatch", "dispatch_permute", "combine", "permute_layout",
             "permute"}


class TimedRuntime:
    """Stands in for the engine's runtime and times every call into it; ``first_launch`` is
    when the current API call entered its first launching one."""

    def __init__(self, inner):
        self.inner = inner
        self.seconds = defaultdict(list)
        self.first_launch = None

    def __getattr__(self, name):
        target = getattr(self.inner, name)
        if not callable(target):
            return target

        def timed(*args, **kwargs):
            start_s = time.perf_counter()
            if name in LAUNCHING and self.first_launch is None:
                self.first_launch = start_s
            result = target(*args, **kwargs)
            self.seconds[name].append(time.perf_counter() - start_s)
            return result

        return timed


def main() -> None:
    ap = argparse.ArgumentParser()
    add_problem_args(ap, iters=30)
    args = ap.parse_args()
    run = start(args, port=29577)
    H, T, E = args.hidden, args.tokens, args.experts
    fp8 = torch.randn(T, H, device="cuda").to(torch.float8_e4m3fn)
    scales = torch.rand(T, H // 128, device="cuda")
    ops = operations(run.buffer, run.hidden, run.routing_map, run.probs, fp8, scales,
                     E * -(-T // PAD) * PAD)
    speed = {"torch.cuda.current_stream()": lambda: torch.cuda.current_stream().cuda_stream,
             "torch.empty 1 MB (cuda)": lambda: torch.empty(1 << 20, device="cuda")}
    lines = [
        "## Host time per call, one rank (hybrid-ep benchmarks/host_time.py)", "",
        (f"{time.strftime('%Y-%m-%d')}, commit {commit()}, GPU {torch.cuda.get_device_name(0)}, "
         f"torch {torch.__version__}; median of {args.iters} calls, GPU idle before each"),
        f"Command: `python3 benchmarks/host_time.py --out OUT.md --sms {args.sms}`", "",
        "Host speed: " + ", ".join(f"{name} {median_us(fn):.2f} us" for name, fn in speed.items()),
        "", ("| operation | first launch (us) | host returns (us) | synchronised (us) | "
             "runtime calls (median us each) |"), "|---|---|---|---|---|",
    ]
    engine = run.buffer._cuda_engine
    for name, fn in ops:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        timed = TimedRuntime(engine.runtime)
        engine.runtime = timed
        launch, host, synced = [], [], []
        for _ in range(args.iters):
            torch.cuda.synchronize()
            timed.first_launch = None
            start_s = time.perf_counter()
            fn()
            host.append(time.perf_counter() - start_s)
            torch.cuda.synchronize()
            synced.append(time.perf_counter() - start_s)
            launch.append(timed.first_launch - start_s)
        engine.runtime = timed.inner
        parts = ", ".join(f"{call} {statistics.median(s) * 1e6:.1f}"
                          for call, s in timed.seconds.items())
        lines.append(f"| {name} | {statistics.median(launch) * 1e6:.1f} | "
                     f"{statistics.median(host) * 1e6:.1f} | "
                     f"{statistics.median(synced) * 1e6:.1f} | {parts} |")
    write_report(args.out, lines)
    run.close()


if __name__ == "__main__":
    main()
