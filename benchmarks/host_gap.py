"""How the host time of a combine depends on what the host did just before it: nothing (the
previous call's synchronisation), a 5 ms spin (what the benchmark's ranks do to start a call at
one agreed instant), a 5 ms sleep, a 5 ms spin with the GPU kept busy (so the GPU is not idle
before the call), and a gloo all-reduce then the spin (the benchmark's whole agreement). Each
process owns a one-rank buffer, so with ``--procs 2`` two processes run the same schedule at
once without waiting for each other: what sharing the host costs, apart from any collective.

    python3 benchmarks/host_gap.py --out OUT.md [--procs 1 2] [--iters 40] [--sms 8]

Columns: until the call returns, until the GPU is done (synchronised), the Python before the
call into the compiled runtime, and that call (its launches and copies). Medians over the
calls and processes. Ranks sharing a GPU need MPS (started by the caller).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import statistics
import time

import torch
import torch.distributed as dist
from host_time import TimedRuntime
from one_rank import add_problem_args, commit, start, write_report

GAP_S = 5e-3
GAPS = ("none", "spin", "sleep", "spin, GPU busy", "all-reduce + spin")
START_DELAY_S = 15.0  # the processes' set-up (import, buffer, first calls) before the agreed start


def _gap(kind: str) -> None:
    if kind == "none":
        return
    if kind == "sleep":
        time.sleep(GAP_S)
        return
    if kind == "spin, GPU busy":
        torch.cuda._sleep(20_000_000)  # more GPU cycles than the spin lasts
    if kind == "all-reduce + spin":
        dist.all_reduce(torch.zeros(1))
    until = time.perf_counter() + GAP_S
    while time.perf_counter() < until:
        pass


def _process(args, index: int, start_at: float, queue) -> None:
    rank = start(args, 29640 + index)
    buf = rank.buffer
    rows, probs, _, handle = buf.dispatch(rank.hidden, probs=rank.probs,
                                          routing_map=rank.routing_map)
    engine = buf._cuda_engine
    timed = TimedRuntime(engine.runtime)
    engine.runtime = timed
    while time.time() < start_at:
        pass
    out = {}
    for kind in GAPS:
        got = {"returns": [], "synchronised": [], "python before": [], "runtime call": []}
        for call in range(args.iters + 5):
            torch.cuda.synchronize()
            timed.first_launch = None
            _gap(kind)
            begin = time.perf_counter()
            combined = buf.combine(rows, probs=probs, handle=handle)
            returned = time.perf_counter()
            torch.cuda.synchronize()
            done = time.perf_counter()
            del combined
            if call < 5:  # warm-up of this gap kind
                continue
            got["returns"].append(returned - begin)
            got["synchronised"].append(done - begin if kind != "spin, GPU busy" else float("nan"))
            got["python before"].append(timed.first_launch - begin)  # the combine's entry
            got["runtime call"].append(timed.seconds["combine"][-1])
        out[kind] = got
    engine.runtime = timed.inner
    rank.close()
    queue.put(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_problem_args(ap, iters=40)
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    lines = [
        "## Host time of a combine after different gaps (hybrid-ep benchmarks/host_gap.py)", "",
        (f"{time.strftime('%Y-%m-%d')}, commit {commit()}, GPU {torch.cuda.get_device_name(0)}, "
         f"torch {torch.__version__}; hidden {args.hidden}, {args.tokens} tokens, top-"
         f"{args.topk} of {args.experts} experts, {args.sms} SMs, one-rank buffers; medians of "
         f"{args.iters} calls per process"),
        (f"Command: `python3 benchmarks/host_gap.py --out OUT.md --procs "
         f"{' '.join(map(str, args.procs))} --iters {args.iters} --sms {args.sms}`"), "",
        ("| processes | gap before the call | returns (us) | synchronised (us) | "
         "Python before the runtime call (us) | runtime call (us) |"),
        "|---|---|---|---|---|---|",
    ]
    ctx = mp.get_context("spawn")
    for procs in args.procs:
        queue = ctx.Queue()
        start_at = time.time() + START_DELAY_S
        workers = [ctx.Process(target=_process, args=(args, i, start_at, queue))
                   for i in range(procs)]
        for w in workers:
            w.start()
        results = [queue.get() for _ in workers]
        for w in workers:
            w.join()
        for kind in GAPS:
            cells = []
            for column in ("returns", "synchronised", "python before", "runtime call"):
                values = [v for r in results for v in r[kind][column]]
                cells.append("n/a" if any(math.isnan(v) for v in values)
                             else f"{1e6 * statistics.median(values):.1f}")
            lines.append(f"| {procs} | {kind} | " + " | ".join(cells) + " |")
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
