"""Timers: CUDA-event medians, the HBM roofline, and kernel times from profiler traces."""

from __future__ import annotations

import json
import statistics
import time

import torch
import torch.distributed as dist

from .config import ROOFLINE_BYTES

# ---- measurement helpers ------------------------------------------------------------------------
# Margin between the ranks agreeing on a start instant and that instant: more than the spread
# of their exits from the agreeing all-reduce (gloo exits were up to ~200 us apart on the H200
# host, benchmarks/results/2026-11-30-side-lanes.md).
START_MARGIN_S = 5e-3


def common_start(group) -> float:
    """An instant, on this host's monotonic clock, at which every rank of ``group`` starts:
    each rank spins until it. The bench's ranks are local processes, whose ``perf_counter``
    (CLOCK_MONOTONIC on Linux) is one clock; a barrier alone let each rank's timer start when
    it left the barrier, and a rank leaving first counted its wait for the last one's launch
    in its call's time."""
    now = torch.tensor([time.perf_counter()], dtype=torch.float64, device="cpu")
    dist.all_reduce(now, op=dist.ReduceOp.MAX, group=group)
    start = float(now.item()) + START_MARGIN_S
    while time.perf_counter() < start:
        pass
    return start


def time_call(fn, group):
    """Wall time of ``fn`` from an idle GPU until its work is done. Several ranks start at one
    instant (common_start); a lone rank needs no agreement, and skips it: a barrier before
    its call had cost ~10 us of the next call's host time on the H200 host
    (benchmarks/results/2026-11-30-own-rows.md), a wake-up that no caller of the API pays."""
    torch.cuda.synchronize()
    if dist.get_world_size(group) > 1:
        start = common_start(group)
    else:
        start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, time.perf_counter() - start


def gated_call(fn, group, one_gpu: bool):
    """``fn`` for the kernel-only pass. Ranks sharing one GPU start its work together on the
    GPU: a start gate holds each stream until an instant of the GPU's global timer that they
    agree on (``_C.start_gate``), so that a kernel's time leaves out how late each host launched
    it, which the API pass measures (a dispatch with a handle starts with no domain barrier, so
    its kernel on an early rank would otherwise count the wait for a late one). Ranks on several
    GPUs, whose timers are not one clock, start at one host instant (time_call)."""
    if dist.get_world_size(group) == 1 or not one_gpu:
        return time_call(fn, group)[0]
    from .. import native

    C = native.module()
    stream = torch.cuda.current_stream().cuda_stream
    now = torch.tensor([C.gpu_time_ns(stream)], dtype=torch.int64, device="cpu")  # after the stream's work
    dist.all_reduce(now, op=dist.ReduceOp.MAX, group=group)
    C.start_gate(int(now.item()) + int(START_MARGIN_S * 1e9), stream)
    result = fn()
    torch.cuda.synchronize()
    return result


def event_median(fn, warmup: int, iters: int, busy_before: bool = False) -> float:
    """Median event time of `fn`. busy_before: keep the GPU busy (~50 us) before the start
    event, so that the host's launch overhead stays out of a short kernel's time."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if busy_before:
            torch.cuda._sleep(100_000)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def measure_roofline() -> float:
    """Device-to-device copy bandwidth of this GPU, bytes read + written per second."""

    def measure():
        src = torch.randint(0, 256, (ROOFLINE_BYTES,), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        return event_median(lambda: dst.copy_(src), 3, 10)

    seconds = measure()
    torch.cuda.empty_cache()
    return 2 * ROOFLINE_BYTES / seconds


def kernel_events(trace_path: str) -> list[tuple[float, float, str]]:
    """(start us, duration us, name) of every GPU kernel in a chrome trace, by start time."""
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    kernels = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or "dur" not in e:
            continue
        if e.get("cat", "kernel") != "kernel":
            continue
        kernels.append((float(e["ts"]), float(e["dur"]), str(e.get("name", ""))))
    kernels.sort()
    return kernels


def is_our_kernel(name: str, kernel: str) -> bool:
    return kernel in name and "hybrid_ep" in name


def short_kernel_name(name: str) -> str:
    """A GPU item's name without its namespaces (anonymous ones included), template arguments
    and parameters: ``hybrid_ep::(anonymous namespace)::dispatch_kernel(...)`` ->
    ``dispatch_kernel``."""
    name = name.replace("(anonymous namespace)::", "").removeprefix("void ")
    return name.split("<")[0].split("(")[0].split("::")[-1].strip()
