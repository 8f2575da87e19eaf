"""Write bandwidth of the registered buffers against torch-allocated memory, with the
benchmark's TMA copy kernel, W ranks sharing one GPU (the HBM regime: 8 x 16 SMs).

Every rank copies its own rows (T rows of 2H bytes, the bench's configuration) with 1 load and W
stores per row, all ranks at once, into
- ``torch``: copy j into rank (rank + j)'s torch allocation, at region j (process_share.py's
  spread case);
- ``registered dispatch`` / ``registered combine``: copy j into local rank (rank + j)'s
  registered buffer (the HybridEPBuffer's, opened by the runtime), at this rank's region of
  its dispatch rows / combine rows: where a dispatch writes a token routed to every rank;
- ``torch, registered size``: a zeroed torch allocation of the registered buffer's size,
  opened through torch's CUDA IPC, at the dispatch case's offsets.
Same kernel, same rows, same pattern: only the memory differs.

    python3 benchmarks/registered_memory.py --out OUT.md [--ranks 8] [--sms 16] [--iters 200]

Ranks sharing a GPU need MPS (started by the caller, as for the benchmark). Bandwidth is the
bytes all ranks move (T x 2H x (W + 1) each per copy) over the wall time of `--iters` copies
back to back, between barriers after a warm-up copy (process_share.py's timing and copy
kernel variant).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from one_rank import commit, write_report
from process_share import IN_FLIGHT, RELEASE_EVERY, STORE_LANES, concurrent_seconds
from torch.multiprocessing.reductions import reduce_tensor

from hybrid_ep import native
from hybrid_ep.gpubench.config import GpuBenchConfig, RunSpec
from hybrid_ep.gpubench.ranks import _Rank
from hybrid_ep.gpubench.spawn import run_ranks


@dataclass
class Bandwidths:
    rank: int
    cases: dict = field(default_factory=dict)  # case -> bytes per second, all ranks together


def opened(tensor: torch.Tensor, world: int, rank: int) -> list[torch.Tensor]:
    """Every rank's `tensor`, opened here through torch's CUDA IPC (this rank's: itself)."""
    handles = [None] * world
    dist.all_gather_object(handles, reduce_tensor(tensor))
    return [tensor if p == rank else handles[p][0](*handles[p][1]) for p in range(world)]


def measure(cfg: GpuBenchConfig, spec: RunSpec, iters: int, rank: int) -> Bandwidths:
    world, result = spec.ranks, Bandwidths(rank)
    bench = _Rank(cfg, spec, rank)
    runtime = bench.buffer._cuda().runtime  # the CUDA engine, built (collectively) on first use
    offsets, peers = runtime.layout_offsets(), runtime.peer_bases()
    row = cfg.hidden * 2
    region = cfg.tokens * row  # one copy of this rank's rows
    moved = world * region * (world + 1)
    src = torch.randint(0, 256, (region,), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream

    def run(case: str, destinations: list[int]) -> None:
        def copy():
            # dst (the second address) is not used when the destinations are given
            native.module().copy_ceiling(src.data_ptr(), src.data_ptr(), cfg.tokens, row, world,
                                         False, spec.sms, GpuBenchConfig.ceiling_stages, stream,
                                         IN_FLIGHT, STORE_LANES, RELEASE_EVERY, destinations)

        result.cases[case] = moved * iters / concurrent_seconds(copy, iters)

    dst = torch.empty(world * region, dtype=torch.uint8, device="cuda")
    bases = opened(dst, world, rank)
    run("torch", [bases[(rank + j) % world].data_ptr() + j * region for j in range(world)])
    for name in ("dispatch", "combine"):
        at = offsets[f"{name}_rows"] + rank * region
        run(f"registered {name}", [peers[(rank + j) % world] + at for j in range(world)])
    big = torch.zeros(offsets["total"], dtype=torch.uint8, device="cuda")
    bigs = opened(big, world, rank)
    at = offsets["dispatch_rows"] + rank * region
    run("torch, registered size", [bigs[(rank + j) % world].data_ptr() + at for j in range(world)])
    del bases, bigs  # the peers' mappings close before their owners free the memory
    torch.cuda.synchronize()
    dist.barrier()
    del bench, runtime
    dist.barrier()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--sms", type=int, default=16, help="copy kernel blocks per rank")
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    if args.ranks > 8:
        raise SystemExit(f"--ranks {args.ranks}: the copy kernel stores a row at most 8 times")
    cfg = GpuBenchConfig(regimes=("hbm",), fp8=False, permute=False)
    spec = RunSpec("hbm", args.ranks, args.sms)
    cases = run_ranks(args.ranks, measure, (cfg, spec, args.iters))[0]["cases"]
    base = cases["torch"]
    title = (f"registered_memory, commit {commit()}, GPU {torch.cuda.get_device_name(0)}: "
             f"{args.ranks} ranks x {args.sms} blocks, {cfg.tokens} rows of {cfg.hidden * 2} B "
             f"per rank, 1 load : {args.ranks} stores per row, {args.iters} copies back to back")
    lines = [title, "", "| destination memory | GB/s (all ranks) | of the torch case |",
             "|---|---|---|"]
    lines += [f"| {case} | {bw / 1e9:.0f} | {bw / base:.2f} |" for case, bw in cases.items()]
    write_report(args.out, lines)


if __name__ == "__main__":
    main()
