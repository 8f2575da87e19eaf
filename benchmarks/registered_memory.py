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
  opened through torch's CUDA IPC, at the dispatch case's offsets;
- ``cudaMalloc, layout size`` / ``cudaMalloc, whole 2 MiB pages``: memory allocated with
  ``cudaMalloc`` (torch's CUDA runtime, through ctypes) of the buffer layout's exact size, and of
  that size rounded up to 2 MiB, opened with ``cudaIpcOpenMemHandle``, at the same offsets.
  torch's allocator rounds large sizes up to 2 MiB; so does the registered buffer since
  bd1bceb: writes through the IPC mappings of the exact size ran at half speed.
Same kernel, same rows, same pattern: only the memory differs.

    python3 benchmarks/registered_memory.py --out OUT.md [--ranks 8] [--sms 16] [--iters 200]

Ranks sharing a GPU need MPS (started by the caller, as for the benchmark). Bandwidth is the
bytes all ranks move (T x 2H x (W + 1) each per copy) over the wall time of `--iters` copies
back to back, between barriers after a warm-up copy (process_share.py's timing and copy
kernel variant).
"""

from __future__ import annotations

import argparse
import ctypes
from dataclasses import dataclass, field

import libcudart
import torch
import torch.distributed as dist
from one_rank import commit, write_report
from process_share import IN_FLIGHT, RELEASE_EVERY, STORE_LANES, concurrent_seconds, opened

from hybrid_ep import native
from hybrid_ep.gpubench.config import GpuBenchConfig, RunSpec
from hybrid_ep.gpubench.ranks import _Rank
from hybrid_ep.gpubench.spawn import run_ranks


@dataclass
class Bandwidths:
    rank: int
    cases: dict = field(default_factory=dict)  # case -> bytes per second, all ranks together


class RawIpcMemory:
    """`size` bytes from cudaMalloc on every rank (torch's CUDA runtime, called through ctypes,
    so that no allocator rounds the size), zeroed, and every rank's opened here by CUDA IPC."""

    class Handle(ctypes.Structure):
        _fields_ = [("reserved", ctypes.c_char * 64)]  # cudaIpcMemHandle_t

    def __init__(self, size: int, world: int, rank: int):
        libcudart.runtime().cudaIpcOpenMemHandle.argtypes = [
            ctypes.POINTER(ctypes.c_void_p), self.Handle, ctypes.c_uint]
        self.rank, self.base = rank, ctypes.c_void_p()
        libcudart.call("cudaMalloc", ctypes.byref(self.base), ctypes.c_size_t(size))
        libcudart.call("cudaMemset", self.base, 0, ctypes.c_size_t(size))
        libcudart.call("cudaDeviceSynchronize")
        mine = self.Handle()
        libcudart.call("cudaIpcGetMemHandle", ctypes.byref(mine), self.base)
        handles = [None] * world
        # (not `mine.reserved`: a c_char array reads back only up to its first zero byte)
        dist.all_gather_object(handles, bytes(mine))
        self.bases = []
        try:
            for p, raw in enumerate(handles):
                if p == rank:
                    self.bases.append(self.base.value)
                    continue
                opened_at = ctypes.c_void_p()
                lazy_peer_access = 1  # cudaIpcMemLazyEnablePeerAccess
                libcudart.call("cudaIpcOpenMemHandle", ctypes.byref(opened_at),
                               self.Handle.from_buffer_copy(raw), lazy_peer_access)
                self.bases.append(opened_at.value)
        except RuntimeError:
            # Unmap what this rank opened, best effort (the failed open is the error to
            # report). Its own allocation stays: peers may map it, and freeing exported memory
            # under them is undefined; the process is failing anyway.
            for p, base in enumerate(self.bases):
                if p != rank:
                    libcudart.runtime().cudaIpcCloseMemHandle(ctypes.c_void_p(base))
            raise

    def close(self) -> None:
        """Collective: unmaps the peers', then frees this rank's once no peer maps it."""
        torch.cuda.synchronize()
        for p, base in enumerate(self.bases):
            if p != self.rank:
                libcudart.call("cudaIpcCloseMemHandle", ctypes.c_void_p(base))
        dist.barrier()
        libcudart.call("cudaFree", self.base)


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

        result.cases[case] = moved / concurrent_seconds(copy, iters)

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
    page = 2 << 20
    for case, size in (("cudaMalloc, layout size", offsets["total"]),
                       ("cudaMalloc, whole 2 MiB pages", -(-offsets["total"] // page) * page)):
        raw = RawIpcMemory(size, world, rank)
        run(f"{case} ({size % page} B past a 2 MiB page)",
            [raw.bases[(rank + j) % world] + at for j in range(world)])
        raw.close()
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
