"""HBM bandwidth of W processes sharing one GPU, with the benchmark's TMA copy kernel
(``_C.copy_ceiling``) and no hybrid-ep buffers: does the HBM regime's shortfall come from the
number of processes, from writing through CUDA IPC mappings, or from the footprint?

Each process copies its own rows (1 load, k stores per row, like a dispatch with k copies per
token) on its share of the SMs, all processes at once, into
- ``local``: its own memory;
- ``peer``: the next rank's memory, opened through CUDA IPC;
- ``spread``: copy j into rank (rank + j)'s memory, as the dispatch writes a token's copies
  into several ranks' buffers (k <= 8), at region j there;
- ``by_source`` (k = ranks): the same destinations, at region ``rank`` in each, as the dispatch's
  receive buffers order rows by source: a row's copies land at one offset of every buffer;
and, for comparison, one process does the work of all W with all their SMs (``one process``).

    python3 benchmarks/process_share.py --out OUT.md [--ranks 1 4 8] [--sms 128] [--k 5]

Ranks sharing the GPU need MPS (started by the caller, as for rank_sweep.py). Bandwidth is the
bytes all processes move (rows x row bytes x (k + 1) each) over the wall time from a common
start to the last one's finish, `--iters` copies back to back, against the 1:1 copy roofline
measured first by one process alone. With ``--per-call`` every copy is timed on its own instead,
as the benchmark times a dispatch: all ranks start it at one instant, and the slowest rank's
time counts (median over the copies).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from functools import partial

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from one_rank import commit, write_report
from torch.multiprocessing.reductions import reduce_tensor

from hybrid_ep import native
from hybrid_ep.gpubench.config import GpuBenchConfig
from hybrid_ep.gpubench.timing import measure_roofline, time_call

# One variant of the copy kernel that reaches the per-SM ceiling with 14 KB rows (config.py).
IN_FLIGHT, STORE_LANES, RELEASE_EVERY = 1, 2, 1


def copy_rows(src: torch.Tensor, dst: torch.Tensor, rows: int, args, blocks: int,
              copy_dst: list[int] | None = None) -> None:
    native.module().copy_ceiling(src.data_ptr(), dst.data_ptr(), rows, args.row_bytes, args.k,
                                 False, blocks, GpuBenchConfig.ceiling_stages,
                                 torch.cuda.current_stream().cuda_stream, *args.variant,
                                 copy_dst or [])


def opened(tensor: torch.Tensor, world: int, rank: int) -> list[torch.Tensor]:
    """Every rank's `tensor`, opened here through torch's CUDA IPC (this rank's: itself)."""
    handles = [None] * world
    dist.all_gather_object(handles, reduce_tensor(tensor))
    return [tensor if p == rank else handles[p][0](*handles[p][1]) for p in range(world)]


def concurrent_seconds(fn, iters: int) -> float:
    """Seconds per call: the wall time of `iters` calls of fn on every rank at once, common
    start to last finish, over `iters` (per_call_seconds's unit)."""
    fn()
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    return (time.perf_counter() - start) / iters


def per_call_seconds(fn, iters: int) -> float:
    """Median over `iters` calls of the slowest rank's time from a common start to its finish
    (the benchmark's timing of one collective call)."""
    fn()
    times = []
    for _ in range(iters):
        seconds = torch.tensor([time_call(fn, dist.group.WORLD)[1]])
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        times.append(float(seconds))
    return statistics.median(times)


def rank_main(rank: int, world: int, args, port: int, results) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.set_device(0)
    blocks, rows, k = args.sms // world, args.rows, args.k
    region = rows * args.row_bytes  # one copy of this rank's rows
    src = torch.randint(0, 256, (region,), dtype=torch.uint8, device="cuda")
    # --spare-gb: memory allocated (and mapped by every peer) beside the copies, never touched
    spare = int(args.spare_gb * 2**30)
    dst = torch.empty(k * region + spare, dtype=torch.uint8, device="cuda")
    bases = opened(dst, world, rank)
    # spread: copy j into rank (rank + j)'s region j, as a dispatch writes each token's copies
    # into several ranks' buffers; no two ranks write the same region.
    spread = [bases[(rank + j) % world].data_ptr() + j * region for j in range(k)]
    # by-source: the same destinations, but every rank writes its own region, `rank`, in each
    # of them, as the dispatch's receive buffers hold the sources' rows in source order: a
    # row's copies then land at the same offset of every destination buffer.
    by_source = [bases[(rank + j) % world].data_ptr() + rank * region for j in range(k)]
    cases = {
        "local": partial(copy_rows, src, dst, rows, args, blocks),
        "peer": partial(copy_rows, src, bases[(rank + 1) % world], rows, args, blocks),
    }
    if k == world:
        cases["by_source"] = partial(copy_rows, src, dst, rows, args, blocks, by_source)
    cases["spread"] = partial(copy_rows, src, dst, rows, args, blocks, spread)  # last: checked
    seconds = per_call_seconds if args.per_call else concurrent_seconds
    moved = world * region * (k + 1)  # per call, all ranks
    out = {name: moved / seconds(fn, args.iters) for name, fn in cases.items()}
    # After the last (spread) copies, region j of this rank holds rank (rank - j)'s rows:
    # compare every 97th row.
    firsts = [None] * world
    dist.all_gather_object(firsts, src.view(rows, -1)[::97].cpu())
    torch.cuda.synchronize()
    dist.barrier()
    ok = all(torch.equal(dst[j * region:(j + 1) * region].view(rows, -1)[::97].cpu(),
                         firsts[(rank - j) % world]) for j in range(k))
    oks = [None] * world
    dist.all_gather_object(oks, ok)
    if rank == 0:
        results.put((world, blocks, out, all(oks)))
    del cases, bases  # the peers' mappings close before their owners exit
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()


def one_process(world: int, args) -> float:
    """The work of `world` processes done by one, with all their SMs: bytes per second."""
    rows = world * args.rows
    src = torch.randint(0, 256, (rows * args.row_bytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty(args.k * rows * args.row_bytes, dtype=torch.uint8, device="cuda")
    copy_rows(src, dst, rows, args, args.sms)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.iters):
        copy_rows(src, dst, rows, args, args.sms)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    del src, dst
    torch.cuda.empty_cache()
    return rows * args.row_bytes * (args.k + 1) * args.iters / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--sms", type=int, default=128, help="SMs of all processes together")
    ap.add_argument("--rows", type=int, default=4096, help="rows per process")
    ap.add_argument("--row-bytes", type=int, default=14336)
    ap.add_argument("--k", type=int, default=5, help="stores per row")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--spare-gb", type=float, default=0.0,
                    help="untouched memory in each process's shared allocation (mapped by all)")
    ap.add_argument("--variant", type=int, nargs=3,
                    default=[IN_FLIGHT, STORE_LANES, RELEASE_EVERY],
                    metavar=("IN_FLIGHT", "STORE_LANES", "RELEASE_EVERY"),
                    help="the copy kernel's store pipeline (copy_ceiling's arguments)")
    ap.add_argument("--per-call", action="store_true",
                    help="time each copy alone from a common start (slowest rank, median)")
    args = ap.parse_args()
    torch.cuda.set_device(0)
    roofline = measure_roofline()
    singles = {w: one_process(w, args) for w in args.ranks}
    torch.cuda.empty_cache()
    results = mp.get_context("spawn").SimpleQueue()
    for w in args.ranks:
        mp.start_processes(rank_main, args=(w, args, 29700 + w, results), nprocs=w,
                           start_method="spawn")
    title = (f"process_share, commit {commit()}, GPU {torch.cuda.get_device_name(0)}: "
             f"{args.sms} SMs shared by the processes, {args.rows} rows of {args.row_bytes} B "
             f"per process, 1 load : {args.k} stores per row, variant (in flight, store lanes, "
             f"release every) {tuple(args.variant)}, {args.iters} copies "
             f"({'each timed alone' if args.per_call else 'back to back'}), "
             f"{args.spare_gb} GiB spare per allocation; 1:1 copy "
             f"roofline {roofline / 1e9:.0f} GB/s")
    head = ("| processes x blocks | one process, all the work (GB/s, of roofline) | "
            "each its own memory | each into the next rank's (CUDA IPC) | "
            "the same, each rank's copies at its own region (source order; k = ranks only) | "
            f"copy j into rank + j's region j, j < {args.k} | copied rows right |")
    lines = [title, "", head, "|---|---|---|---|---|---|---|"]
    while not results.empty():
        world, blocks, out, ok = results.get()
        cells = [f"{b / 1e9:.0f} ({b / roofline:.2f})"
                 for b in (singles[world], out["local"], out["peer"],
                           out.get("by_source", float("nan")), out["spread"])]
        lines.append(f"| {world} x {blocks} | " + " | ".join(cells) + f" | {ok} |")
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
