"""``hybrid-ep bench --device cuda``: the CUDA engine on GPUs, verified, timed, and compared with
ceilings measured in the same run.

Two regimes (DESIGN.md section 8; defaults of ``--device cuda``):

- ``hbm``: 8 ranks sharing one GPU (MPS), 16 SMs per rank. The kernels together can saturate
  HBM: each is compared with the HBM roofline, a device-to-device copy measured in the run.
- ``sm``: 1 rank and 2 ranks, 8 SMs per rank. HBM is far from busy: each kernel is compared with
  the per-SM TMA ceiling of its traffic pattern, measured in the run by ``_C.copy_ceiling``
  (fan-out: 1 load to k stores, like dispatch; fan-in: k loads to 1 store, like combine; k the
  measured average copies per token).

Every configuration runs in its own set of spawned processes (one per rank, rank r on GPU
r % device_count, gloo group). Per rank and operation it records:

- API time: the whole Python call, from after a host barrier to ``torch.cuda.synchronize()``;
- kernel-only time: the device time of the operation's core kernel (``dispatch_kernel`` or
  ``combine_kernel``) from ``torch.profiler``, in a separate pass (the profiler is off while API
  times are taken);
- bytes: rows received (``D``) and copies sent (``S``) per call, from the handle.

Operations, each call with fresh random routing (top-k of uniform scores):
``dispatch bf16 + preprocess`` (no handle: the routing all-gather and metadata run in the call),
``dispatch bf16`` and ``dispatch fp8`` (handle of that dispatch), ``combine bf16`` (of the
dispatched BF16 rows). The first warm-up call of each is checked bit for bit against an
independent oracle (:mod:`hybrid_ep.oracle`, on the GPU: every rank regenerates every rank's
inputs from their seeds and gathers their routing), so no number of a wrong kernel is reported.

Numbers (per configuration and operation; "ranks on a GPU" share its HBM):

- algbw per rank = D x hidden x 2 / time (FP8: x (1 + 4/128) / 2; combine: as BF16 dispatch),
  mean over ranks, for kernel and API time;
- HBM bytes a kernel must move once, per rank: dispatch reads its T rows (+ probs, + scales) and
  writes S copies of them (+ probs, + scales each); combine reads the S copies of its tokens
  (+ their probs) and writes T rows (+ T x E_total probs);
- HBM traffic per SM = sum over the ranks on a GPU of bytes / kernel time, / (SMs per rank x
  ranks on it); roofline fraction = the same sum / the measured copy bandwidth (read + write);
- ceiling fraction (sm regime) = traffic per SM / the copy kernel's traffic per SM at the same
  k (interpolated between the integer neighbours of the measured k): the best of a few variants
  (store lanes, in-flight store groups), same rows and SMs, the deepest ring shared memory
  holds, event-timed with the GPU kept busy before the start event (no launch overhead), its
  output checked;
- API allowance = kernel time + one pass over the output (read + write, summed over the ranks on
  the GPU) at the roofline + 30 us.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field, replace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from . import oracle

ALLOWANCE_S = 30e-6
ROOFLINE_BYTES = 2 << 30  # bytes copied per roofline measurement (4 GiB read + written)

# op key -> (label, kernel name, row dtype)
OPS = {
    "dispatch_pre": ("dispatch bf16 + preprocess", "dispatch_kernel", "bf16"),
    "dispatch_bf16": ("dispatch bf16", "dispatch_kernel", "bf16"),
    "dispatch_fp8": ("dispatch fp8", "dispatch_kernel", "fp8"),
    "combine_bf16": ("combine bf16", "combine_kernel", "bf16"),
}
PREPROCESS_KERNELS = ("allgather_kernel", "dest_mask_kernel", "scan_kernel")


@dataclass(frozen=True)
class GpuBenchConfig:
    regimes: tuple[str, ...] = ("hbm", "sm")
    hbm_ranks: int = 8
    hbm_sms: int = 16
    sm_ranks: tuple[int, ...] = (1, 2)
    sm_sms: int = 8
    hidden: int = 7168
    tokens: int = 4096
    experts_per_rank: int = 8
    topk: int = 8
    iters: int = 20
    warmup: int = 3
    fp8: bool = True
    seed: int = 0
    label: str = ""
    # Ranks sharing a GPU get an MPS share of SMs slightly above their SMs per rank, so that
    # one rank's copy kernels (copy-out, staging) cannot occupy the SMs another rank's
    # persistent kernel needs, as separate GPUs would not either.
    mps_partition: bool = True
    out_dir: str | None = None
    # Copy-kernel variants tried per pattern and k, (in_flight, store_lanes, release_every);
    # the best is the ceiling. One store lane stalls per group (~50 GB/s per SM with 14 KB
    # rows, measured on an H200), two or four reach ~100.
    ceiling_variants: tuple[tuple[int, int, int], ...] = (
        (0, 1, 1), (1, 2, 1), (2, 2, 2), (0, 2, 1), (1, 4, 1), (0, 4, 1))
    ceiling_stages: int = 64  # clamped to what shared memory holds


@dataclass(frozen=True)
class RunSpec:
    regime: str
    ranks: int
    sms: int
    # Measured by the parent before the ranks start when they run SM-partitioned.
    roofline_gbps: float | None = None
    sm_percentage: int | None = None
    gpu_sm_count: int | None = None


@dataclass
class RankResult:
    rank: int
    device: int
    gpu: str
    sm_count: int
    roofline_gbps: float | None = None
    verified: list[str] = field(default_factory=list)
    api_s: dict = field(default_factory=dict)
    api_rows: list[int] = field(default_factory=list)      # D per timed API step
    api_copies: list[int] = field(default_factory=list)    # S per timed API step
    kernel_s: dict = field(default_factory=dict)
    kernel_rows: list[int] = field(default_factory=list)
    kernel_copies: list[int] = field(default_factory=list)
    preprocess_kernels_s: float | None = None  # mean per call, all preprocessing kernels
    profiler_note: str | None = None
    ceilings: list[dict] = field(default_factory=list)


# ---- inputs -------------------------------------------------------------------------------------
def _seed(*parts: int) -> int:
    value = 0x9E3779B9
    for part in parts:
        value = (value * 1000003 + part + 1) % (1 << 62)
    return value


def make_tokens(cfg: GpuBenchConfig, source: int, device) -> dict:
    """Rank `source`'s token rows: the same on every rank that regenerates them."""
    g = torch.Generator(device=device).manual_seed(_seed(cfg.seed, 1, source))
    hidden = torch.randn(cfg.tokens, cfg.hidden, generator=g, device=device).to(torch.bfloat16)
    out = {"hidden": hidden}
    if cfg.fp8:
        out["fp8"] = torch.randint(0, 256, (cfg.tokens, cfg.hidden), generator=g,
                                   dtype=torch.uint8, device=device)
        out["scales"] = torch.rand(cfg.tokens, cfg.hidden // 128, generator=g, device=device)
    return out


def make_routing(cfg: GpuBenchConfig, experts_total: int, step: int, rank: int, device):
    """Top-k of uniform scores, fresh per step and rank; probs nonzero on the chosen experts."""
    g = torch.Generator(device=device).manual_seed(_seed(cfg.seed, 2, step, rank))
    scores = torch.rand(cfg.tokens, experts_total, generator=g, device=device)
    routing_map = torch.zeros(cfg.tokens, experts_total, dtype=torch.bool, device=device)
    routing_map.scatter_(1, scores.topk(cfg.topk, dim=1).indices, True)
    values = torch.rand(cfg.tokens, experts_total, generator=g, device=device)
    probs = torch.where(routing_map, values, torch.zeros_like(values))
    return routing_map, probs


# ---- measurement helpers ------------------------------------------------------------------------
def _timed(fn, group):
    torch.cuda.synchronize()
    dist.barrier(group)
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, time.perf_counter() - start


def _event_median(fn, warmup: int, iters: int, busy_before: bool = False) -> float:
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
        return _event_median(lambda: dst.copy_(src), 3, 10)

    seconds = measure()
    torch.cuda.empty_cache()
    return 2 * ROOFLINE_BYTES / seconds


def measure_ceilings(cfg: GpuBenchConfig, sms: int, k_mean: float) -> list[dict]:
    """The copy kernel on `sms` SMs for every pattern the kernels have, at the integer
    neighbours of `k_mean`; each at a few in-flight depths (all kept)."""
    ks = sorted({max(1, math.floor(k_mean)), max(1, math.ceil(k_mean))})
    rows = cfg.tokens
    big = max(ks) * rows * 2 * cfg.hidden
    src = torch.randint(0, 256, (big,), dtype=torch.uint8, device="cuda")
    dst = torch.empty(big, dtype=torch.uint8, device="cuda")
    out = _ceilings(cfg, sms, ks, src, dst)
    src = dst = None
    torch.cuda.empty_cache()
    return out


def _ceilings(cfg: GpuBenchConfig, sms: int, ks: list[int], src, dst) -> list[dict]:
    from . import native

    C = native.module()
    patterns = [("fan-out", 2 * cfg.hidden), ("fan-in", 2 * cfg.hidden)]
    if cfg.fp8:
        patterns.insert(1, ("fan-out", cfg.hidden))
    rows = cfg.tokens
    stream = torch.cuda.current_stream().cuda_stream
    out = []
    for pattern, row_bytes in patterns:
        fan_in = pattern == "fan-in"
        for k in ks:
            for in_flight, lanes, every in cfg.ceiling_variants:
                used = {}

                def launch(row_bytes=row_bytes, k=k, fan_in=fan_in, in_flight=in_flight,
                           lanes=lanes, every=every, used=used):
                    used["stages"], used["in_flight"] = C.copy_ceiling(
                        src.data_ptr(), dst.data_ptr(), rows, row_bytes, k, fan_in, sms,
                        cfg.ceiling_stages, stream, in_flight, lanes, every)

                try:
                    launch()
                except ValueError:  # the ring cannot hold this variant for this k: skip it
                    continue
                seconds = _event_median(launch, 2, 7, busy_before=True)
                _check_copy(launch, src, dst, rows, row_bytes, k, fan_in)
                moved = rows * row_bytes * (k + 1)
                out.append({"pattern": pattern, "row_bytes": row_bytes, "k": k,
                            "stages": used["stages"], "in_flight": used["in_flight"],
                            "store_lanes": lanes, "release_every": every, "blocks": sms,
                            "rows": rows, "seconds": seconds, "bytes": moved,
                            "per_sm_gbps": moved / seconds / sms / 1e9})
    if not out:
        raise RuntimeError("copy ceiling: no variant could run")
    return out


def _check_copy(launch, src, dst, rows: int, row_bytes: int, k: int, fan_in: bool):
    """One more launch into a poisoned destination; its rows must be the sources'."""
    dst.fill_(0xA5)
    launch()
    source = src[: (k if fan_in else 1) * rows * row_bytes].view(-1, row_bytes)
    copied = dst[: (1 if fan_in else k) * rows * row_bytes].view(-1, row_bytes)
    if fan_in:
        ok = torch.equal(copied, source[:rows])
    else:
        ok = all(torch.equal(copied[j * rows:(j + 1) * rows], source) for j in range(k))
    if not ok:
        raise AssertionError(f"copy ceiling ({'fan-in' if fan_in else 'fan-out'}, k={k}, "
                             f"{row_bytes} B rows): wrong destination rows; no ceiling is "
                             "reported for a wrong kernel")


def _kernel_events(trace_path: str) -> list[tuple[float, float, str]]:
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


def _ours(name: str, kernel: str) -> bool:
    return kernel in name and "hybrid_ep" in name


# ---- one rank -----------------------------------------------------------------------------------
class _Rank:
    def __init__(self, cfg: GpuBenchConfig, spec: RunSpec, rank: int):
        from .buffer import HybridEPBuffer

        self.cfg, self.spec, self.rank = cfg, spec, rank
        self.group = dist.group.WORLD
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.experts_total = cfg.experts_per_rank * spec.ranks
        self.tokens = make_tokens(cfg, rank, self.device)
        self.buffer = HybridEPBuffer(
            self.group, cfg.hidden, cfg.tokens, cfg.experts_per_rank, use_fp8=cfg.fp8,
            num_sms_dispatch_api=spec.sms, num_sms_combine_api=spec.sms,
            num_sms_preprocessing_api=min(spec.sms, 16),
            num_of_hybrid_ep_ranks_per_nvlink_domain=spec.ranks)

    def step(self, step: int, timer):
        """One call of every operation, each through `timer(op, fn)`. Returns the outputs."""
        cfg, buf, tok = self.cfg, self.buffer, self.tokens
        routing_map, probs = make_routing(cfg, self.experts_total, step, self.rank, self.device)
        x = tok["hidden"]
        out = {"routing_map": routing_map, "probs": probs}
        out["pre"] = timer("dispatch_pre",
                           lambda: buf.dispatch(x, probs=probs, routing_map=routing_map))
        handle = out["pre"][3]
        out["bf16"] = timer("dispatch_bf16", lambda: buf.dispatch(x, probs=probs, handle=handle))
        if cfg.fp8:
            out["fp8"] = timer("dispatch_fp8", lambda: buf.dispatch(
                tok["fp8"], scaling_factor=tok["scales"], probs=probs, handle=handle))
        rows, rows_probs = out["bf16"][0], out["bf16"][1]
        out["combine"] = timer("combine_bf16",
                               lambda: buf.combine(rows, probs=rows_probs, handle=handle))
        out["rows"] = int(rows.shape[0])
        out["copies"] = int((handle[0][: cfg.tokens] >= 0).sum())
        return out

    # -- verification against the oracle, on the GPU --
    def verify(self, out) -> list[str]:
        cfg, spec, dev = self.cfg, self.spec, self.device
        maps = [torch.empty(cfg.tokens, self.experts_total, dtype=torch.uint8)
                for _ in range(spec.ranks)]
        dist.all_gather(maps, out["routing_map"].to(torch.uint8).cpu(), group=self.group)
        probs = [torch.empty(cfg.tokens, self.experts_total) for _ in range(spec.ranks)]
        dist.all_gather(probs, out["probs"].cpu(), group=self.group)
        everyone = []
        for source in range(spec.ranks):
            tokens = self.tokens if source == self.rank else make_tokens(cfg, source, dev)
            everyone.append(tokens | {"routing_map": maps[source].to(dev).bool(),
                                      "probs": probs[source].to(dev)})
        checked = []
        want = oracle.expected_dispatch(everyone, self.rank, cfg.experts_per_rank, spec.ranks)
        for op in ("pre", "bf16"):
            _same(f"{op}: dispatched rows", out[op][0], want[0])
            _same(f"{op}: dispatched probs", out[op][1], want[1])
            checked.append(OPS["dispatch_pre" if op == "pre" else "dispatch_bf16"][0])
        if cfg.fp8:
            want8 = oracle.expected_dispatch(
                [{"hidden": e["fp8"], "routing_map": e["routing_map"],
                  "scaling_factor": e["scales"]} for e in everyone],
                self.rank, cfg.experts_per_rank, spec.ranks)
            _same("fp8: dispatched rows", out["fp8"][0], want8[0])
            _same("fp8: dispatched probs", out["fp8"][1], want[1])
            _same("fp8: dispatched scaling factors", out["fp8"][2], want8[2])
            checked.append(OPS["dispatch_fp8"][0])
        combined, combined_probs = out["combine"]
        _same("combine: rows", combined, oracle.expected_combine_of_dispatch(
            self.tokens["hidden"], out["routing_map"], cfg.experts_per_rank))
        _same("combine: probs", combined_probs, out["probs"])
        checked.append(OPS["combine_bf16"][0])
        del everyone, want
        torch.cuda.empty_cache()
        return checked


def _same(name: str, got, want):
    if got is None or want is None:
        assert got is None and want is None, f"{name}: one of result and oracle is None"
        return
    ok = got.shape == want.shape and torch.equal(got.contiguous().view(torch.uint8),
                                                 want.contiguous().view(torch.uint8))
    if not ok:
        raise AssertionError(f"{name}: differs from the oracle (shape {tuple(got.shape)} vs "
                             f"{tuple(want.shape)}); no numbers are reported for a wrong kernel")


def _measure(cfg: GpuBenchConfig, spec: RunSpec, rank: int) -> RankResult:
    group = dist.group.WORLD
    device = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(device)
    gpus = torch.cuda.device_count()
    sharing = sum(1 for r in range(spec.ranks) if r % gpus == device)
    # Under an MPS share the device reports the share; the parent saw the whole GPU.
    sm_count = spec.gpu_sm_count or props.multi_processor_count
    if sharing * spec.sms > sm_count or spec.sms > props.multi_processor_count:
        raise ValueError(f"{sharing} ranks x {spec.sms} SMs do not fit on {props.name} "
                         f"({sm_count} SMs, {props.multi_processor_count} for this rank): "
                         "persistent kernels of all ranks must be resident at once")
    result = RankResult(rank=rank, device=device, gpu=props.name, sm_count=sm_count)

    # HBM roofline, one rank per GPU, the others idle (measured by the unpartitioned parent
    # when the ranks run with an MPS share of SMs).
    dist.barrier(group)
    if rank < gpus:
        result.roofline_gbps = spec.roofline_gbps or measure_roofline() / 1e9
    dist.barrier(group)

    bench = _Rank(cfg, spec, rank)
    ops = [op for op in OPS if cfg.fp8 or op != "dispatch_fp8"]

    # Pass 1: API times (no profiler), the first warm-up verified.
    result.api_s = {op: [] for op in ops}
    for step in range(cfg.warmup + cfg.iters):
        timed = step >= cfg.warmup

        def timer(op, fn, timed=timed):
            value, seconds = _timed(fn, group)
            if timed:
                result.api_s[op].append(seconds)
            return value

        out = bench.step(step, timer)
        if step == 0:
            result.verified = bench.verify(out)
        if timed:
            result.api_rows.append(out["rows"])
            result.api_copies.append(out["copies"])
        del out

    # Pass 2: kernel times from the profiler (2 more warm-up steps inside the session).
    result.kernel_s = {op: [] for op in ops}
    base = cfg.warmup + cfg.iters
    extra = 2
    steps = extra + cfg.iters
    try:
        from torch.profiler import ProfilerActivity, profile

        warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for step in range(steps):
                out = bench.step(base + step, lambda op, fn: _timed(fn, group)[0])
                if step >= extra:
                    result.kernel_rows.append(out["rows"])
                    result.kernel_copies.append(out["copies"])
                del out
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            kernels = _kernel_events(path)
        _assign_kernels(result, kernels, ops, steps, cfg.iters)
    except Exception as error:  # noqa: BLE001 - report API numbers even without a profiler
        result.profiler_note = f"profiler failed: {type(error).__name__}: {error}"

    # Per-SM TMA ceiling (sm regime), one rank with this configuration's SMs, the others idle.
    if spec.regime == "sm":
        copies = [None] * spec.ranks
        dist.all_gather_object(copies, (sum(result.api_copies), len(result.api_copies)),
                               group=group)
        k_mean = sum(c[0] for c in copies) / (cfg.tokens * sum(c[1] for c in copies))
        dist.barrier(group)
        if rank == 0:
            result.ceilings = measure_ceilings(cfg, spec.sms, k_mean)
        dist.barrier(group)
    del bench
    dist.barrier(group)
    return result


def _assign_kernels(result: RankResult, kernels, ops, steps: int, iters: int):
    """Per step the stream runs dispatch_kernel for dispatch_pre, dispatch_bf16, dispatch_fp8
    (in that order) and then combine_kernel; events are matched from the end of the session (the
    profiler may miss a few at its start) and the last `iters` of each kept."""
    dispatch_ops = [op for op in ops if OPS[op][1] == "dispatch_kernel"]
    dispatch = [k for k in kernels if _ours(k[2], "dispatch_kernel")]
    combine = [k for k in kernels if _ours(k[2], "combine_kernel")]
    per_op = {op: [] for op in ops}
    n = len(dispatch_ops)
    for i, event in enumerate(reversed(dispatch)):
        per_op[dispatch_ops[n - 1 - i % n]].append(event[1] * 1e-6)
    per_op["combine_bf16"] = [k[1] * 1e-6 for k in reversed(combine)]
    for op in ops:
        result.kernel_s[op] = list(reversed(per_op[op][:iters]))
    preprocess = [k for k in kernels if any(_ours(k[2], p) for p in PREPROCESS_KERNELS)]
    if preprocess:
        result.preprocess_kernels_s = sum(k[1] for k in preprocess) * 1e-6 / steps
    if len(dispatch) < n * iters or len(combine) < iters:
        result.profiler_note = (f"profiler saw {len(dispatch)} dispatch and {len(combine)} combine "
                                f"kernels, expected >= {n * iters} and {iters}")


def _worker(rank: int, cfg: GpuBenchConfig, spec: RunSpec, port: int, out_path: str,
            sm_percentage: int | None = None):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    if sm_percentage is not None:  # read by MPS when this process creates its CUDA context
        os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(sm_percentage)
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", rank=rank, world_size=spec.ranks,
                            timeout=datetime.timedelta(seconds=300))
    try:
        mine = _measure(cfg, spec, rank)
        everyone = [None] * spec.ranks
        dist.all_gather_object(everyone, asdict(mine))
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(everyone, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_spec(cfg: GpuBenchConfig, spec: RunSpec) -> tuple[RunSpec, list[dict]]:
    """Runs the ranks of ``spec``; returns the spec as run (MPS share, roofline) and their
    results."""
    from .bench import free_port

    percentage = roofline = None
    gpus = torch.cuda.device_count()
    if cfg.mps_partition and spec.ranks > gpus:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        percentage = min(100, math.ceil(100 * (spec.sms + 1) / sms))
        roofline = measure_roofline() / 1e9
        spec = replace(spec, sm_percentage=percentage, roofline_gbps=roofline,
                       gpu_sm_count=sms)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ranks.json")
        mp.start_processes(_worker, args=(cfg, spec, free_port(), path, percentage),
                           nprocs=spec.ranks, start_method="spawn")
        with open(path) as f:
            return spec, json.load(f)


def specs(cfg: GpuBenchConfig) -> list[RunSpec]:
    out = []
    if "hbm" in cfg.regimes:
        out.append(RunSpec("hbm", cfg.hbm_ranks, cfg.hbm_sms))
    if "sm" in cfg.regimes:
        out.extend(RunSpec("sm", ranks, cfg.sm_sms) for ranks in cfg.sm_ranks)
    return out


# ---- numbers ------------------------------------------------------------------------------------
def _median(values):
    return statistics.median(values) if values else float("nan")


def _mean(values):
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(values) if values else float("nan")


def _bytes(cfg: GpuBenchConfig, ranks: int, op: str, rows: float, copies: float) -> dict:
    """HBM bytes one rank's kernel must move once, and the bytes of its output."""
    H, T, E = cfg.hidden, cfg.tokens, cfg.experts_per_rank
    prob_cols = E * ranks  # one domain's columns
    if op == "combine_bf16":
        moved = copies * (2 * H + 4 * E) + T * (2 * H + 4 * E * ranks)
        return {"moved": moved, "output": T * (2 * H + 4 * E * ranks)}
    row = H if op == "dispatch_fp8" else 2 * H
    side = 4 * prob_cols + (4 * (H // 128) if op == "dispatch_fp8" else 0)
    return {"moved": T * (row + side) + copies * (row + side), "output": rows * (row + side)}


def _ceiling_at(ceilings: list[dict], pattern: str, row_bytes: int, k: float):
    """Best per-SM traffic of the copy kernel for the pattern, interpolated in k."""
    best = {}
    for c in ceilings:
        if c["pattern"] == pattern and c["row_bytes"] == row_bytes:
            best[c["k"]] = max(best.get(c["k"], 0.0), c["per_sm_gbps"])
    if not best:
        return None
    ks = sorted(best)
    lo = max([x for x in ks if x <= k], default=ks[0])
    hi = min([x for x in ks if x >= k], default=ks[-1])
    if hi == lo:
        return best[lo]
    return best[lo] + (k - lo) / (hi - lo) * (best[hi] - best[lo])


def summarize(cfg: GpuBenchConfig, spec: RunSpec, ranks: list[dict]) -> dict:
    gpus_of = {r["rank"]: r["device"] for r in ranks}
    roofline = {r["device"]: r["roofline_gbps"] for r in ranks if r["roofline_gbps"]}
    on_gpu = {}
    for r, d in gpus_of.items():
        on_gpu.setdefault(d, []).append(r)
    k_mean = (sum(sum(r["api_copies"]) for r in ranks)
              / (cfg.tokens * sum(len(r["api_copies"]) for r in ranks)))
    ceilings = [c for r in ranks for c in r["ceilings"]]
    rows = []
    for op, (label, _kernel, dtype) in OPS.items():
        if op not in ranks[0]["api_s"]:
            continue
        width = (1 + 4 / 128) / 2 if dtype == "fp8" else 1.0
        per_rank = []
        for r in ranks:
            api = _median(r["api_s"][op])
            kern = _median(r["kernel_s"].get(op, []))
            rows_api, copies_api = _mean(r["api_rows"]), _mean(r["api_copies"])
            rows_k = _mean(r["kernel_rows"]) if r["kernel_rows"] else rows_api
            copies_k = _mean(r["kernel_copies"]) if r["kernel_copies"] else copies_api
            b_k = _bytes(cfg, spec.ranks, op, rows_k, copies_k)
            b_api = _bytes(cfg, spec.ranks, op, rows_api, copies_api)
            extra = (r["preprocess_kernels_s"] or 0.0) if op == "dispatch_pre" else 0.0
            per_rank.append({
                "rank": r["rank"], "device": r["device"], "api_s": api, "kernel_s": kern,
                "kernels_in_call_s": kern + extra, "rows": rows_api,
                "copies": copies_api, "bytes": b_k["moved"], "output_bytes": b_api["output"],
                "algbw_kernel_gbps": rows_k * cfg.hidden * 2 * width / kern / 1e9,
                "algbw_api_gbps": rows_api * cfg.hidden * 2 * width / api / 1e9,
            })
        per_gpu_rate, per_sm, fraction, pass_s = [], [], [], {}
        for d, members in on_gpu.items():
            mine = [p for p in per_rank if p["rank"] in members]
            rate = sum(p["bytes"] / p["kernel_s"] for p in mine)  # bytes/s on this GPU
            per_gpu_rate.append(rate)
            per_sm.append(rate / (spec.sms * len(members)) / 1e9)
            if d in roofline:
                fraction.append(rate / (roofline[d] * 1e9))
                pass_s[d] = 2 * sum(p["output_bytes"] for p in mine) / (roofline[d] * 1e9)
        for p in per_rank:
            p["allowance_s"] = (p["kernels_in_call_s"] + pass_s.get(p["device"], float("nan"))
                                + ALLOWANCE_S)
        ceiling = None
        if ceilings:
            pattern = "fan-in" if op == "combine_bf16" else "fan-out"
            row_bytes = cfg.hidden if dtype == "fp8" else 2 * cfg.hidden
            ceiling = _ceiling_at(ceilings, pattern, row_bytes, k_mean)
        traffic = _mean(per_sm)
        rows.append({
            "op": op, "label": label,
            "rows_per_rank": _mean([p["rows"] for p in per_rank]),
            "copies_per_token": k_mean,
            "kernel_us": 1e6 * _mean([p["kernel_s"] for p in per_rank]),
            "kernel_us_max": 1e6 * max((p["kernel_s"] for p in per_rank), default=float("nan")),
            "kernels_in_call_us": 1e6 * _mean([p["kernels_in_call_s"] for p in per_rank]),
            "api_us": 1e6 * _mean([p["api_s"] for p in per_rank]),
            "algbw_kernel_gbps": _mean([p["algbw_kernel_gbps"] for p in per_rank]),
            "algbw_api_gbps": _mean([p["algbw_api_gbps"] for p in per_rank]),
            "hbm_traffic_per_sm_gbps": traffic,
            "roofline_fraction": _mean(fraction),
            "ceiling_per_sm_gbps": ceiling,
            "ceiling_fraction": traffic / ceiling if ceiling else None,
            "api_overhead_us": 1e6 * _mean([p["api_s"] - p["kernels_in_call_s"]
                                            for p in per_rank]),
            "allowance_us": 1e6 * _mean([p["allowance_s"] for p in per_rank]),
            "within_allowance": (None if any(math.isnan(p["allowance_s"]) for p in per_rank)
                                 else all(p["api_s"] <= p["allowance_s"] for p in per_rank)),
            "per_rank": per_rank,
        })
    notes = sorted({r["profiler_note"] for r in ranks if r["profiler_note"]})
    if spec.sm_percentage is not None:
        notes.append(f"ranks ran with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={spec.sm_percentage} "
                     "(an MPS share of SMs just above their SMs per rank, as separate GPUs would "
                     "have); the roofline was measured before, without that limit")
    return {"regime": spec.regime, "ranks": spec.ranks, "sms_per_rank": spec.sms,
            "gpus": len(on_gpu), "gpu": ranks[0]["gpu"], "sm_count": ranks[0]["sm_count"],
            "roofline_gbps": _mean(list(roofline.values())),
            "preprocess_kernels_us": 1e6 * _mean([r["preprocess_kernels_s"] for r in ranks]),
            "verified": ranks[0]["verified"], "notes": notes, "ops": rows,
            "ceilings": ceilings, "raw": ranks}


# ---- report -------------------------------------------------------------------------------------
def environment() -> dict:
    from .bench import environment as base

    env = base()
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    env["mps"] = "running" if os.path.exists(os.path.join(pipe, "control")) else "not seen"
    env["time"] = datetime.datetime.now().isoformat(timespec="seconds")
    env["python"] = platform.python_version()
    return env


def _f(value, digits=1, scale=1.0):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value * scale:.{digits}f}"


def format_regime(cfg: GpuBenchConfig, env: dict, regime: str, runs: list[dict]) -> str:
    title = {"hbm": "HBM-bound: ranks sharing one GPU, kernels vs the HBM roofline",
             "sm": "SM-bound: few SMs, kernels vs the per-SM TMA copy ceiling"}[regime]
    label = f" [{cfg.label}]" if cfg.label else ""
    lines = [
        f"## hybrid-ep bench, {title}{label}",
        "",
        (f"{env['date']}, commit {env['commit']}, GPU {runs[0]['gpu']} ({runs[0]['sm_count']} "
         f"SMs), {env['host']}, torch {env['torch']}, MPS {env['mps']}"),
        (f"hidden {cfg.hidden}, {cfg.tokens} tokens/rank, top-{cfg.topk} uniform over "
         f"{cfg.experts_per_rank} experts/rank, fresh routing per call, {cfg.iters} timed calls "
         f"(+{cfg.warmup} warm-up; median per rank, mean over ranks); verified against the "
         f"oracle: {', '.join(runs[0]['verified'])}"),
        ("HBM roofline (device-to-device copy, read + write, same run): "
         + ", ".join(f"{r['ranks']} rank(s): {_f(r['roofline_gbps'], 0)} GB/s" for r in runs)),
        "",
    ]
    ceiling_cols = regime == "sm"
    head = ("| ranks | SMs/rank | op | rows/rank | copies/token | kernel (us) | API (us) | "
            "algbw kernel (GB/s/rank) | algbw API (GB/s/rank) | HBM traffic/SM (GB/s) | "
            "roofline fraction | ")
    sep = "|---|---|---|---|---|---|---|---|---|---|---|"
    if ceiling_cols:
        head += "TMA ceiling/SM (GB/s) | ceiling fraction | "
        sep += "---|---|"
    head += "API - kernels (us) | allowance - kernels (us) | within |"
    sep += "---|---|---|"
    lines += [head, sep]
    for run in runs:
        for op in run["ops"]:
            cells = [str(run["ranks"]), str(run["sms_per_rank"]), op["label"],
                     _f(op["rows_per_rank"], 0), _f(op["copies_per_token"], 2),
                     _f(op["kernel_us"]), _f(op["api_us"]), _f(op["algbw_kernel_gbps"]),
                     _f(op["algbw_api_gbps"]), _f(op["hbm_traffic_per_sm_gbps"]),
                     _f(op["roofline_fraction"], 3)]
            if ceiling_cols:
                cells += [_f(op["ceiling_per_sm_gbps"]), _f(op["ceiling_fraction"], 3)]
            cells += [_f(op["api_overhead_us"]),
                      _f(op["allowance_us"] - op["kernels_in_call_us"]),
                      {True: "yes", False: "no", None: "n/a"}[op["within_allowance"]]]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Notes:"]
    for run in runs:
        lines.append(f"- {run['ranks']} rank(s) on {run['gpus']} GPU(s): preprocessing kernels "
                     f"(all-gather + metadata) {_f(run['preprocess_kernels_us'])} us per call, "
                     "counted as kernels of 'dispatch bf16 + preprocess'.")
        lines += [f"- {run['ranks']} rank(s): {note}" for note in run["notes"]]
    lines += [
        ("- kernel: device time of dispatch_kernel / combine_kernel (torch.profiler, separate "
         "pass); API: whole Python call after a host barrier, to torch.cuda.synchronize()."),
        ("- HBM traffic/SM: bytes the kernels must read and write once (rows, probs, FP8 "
         "scales) / kernel time, summed over the ranks on a GPU, / (SMs per rank x ranks on "
         "it); roofline fraction: that sum / the HBM roofline."),
        ("- allowance: kernel time + one pass over the output (read + write, all ranks on the "
         "GPU) at the roofline + 30 us; 'dispatch bf16 + preprocess' also counts its "
         "preprocessing kernels as kernel time."),
    ]
    if ceiling_cols:
        lines += ["",
                  ("TMA copy ceiling (one rank alone, SMs of its configuration, verified copy; "
                   "per k the best of the variants tried (all in the JSON), interpolated at the "
                   "measured copies/token):"),
                  "",
                  ("| ranks | SMs | pattern | row bytes | k | stages | store lanes | in flight | "
                   "release every | time (us) | traffic/SM (GB/s) |"),
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for run in runs:
            best = {}
            for c in run["ceilings"]:
                key = (c["pattern"], c["row_bytes"], c["k"])
                if key not in best or c["per_sm_gbps"] > best[key]["per_sm_gbps"]:
                    best[key] = c
            for c in best.values():
                lines.append(f"| {run['ranks']} | {c['blocks']} | {c['pattern']} | "
                             f"{c['row_bytes']} | {c['k']} | {c['stages']} | "
                             f"{c['store_lanes']} | {c['in_flight']} | {c['release_every']} | "
                             f"{_f(c['seconds'], 1, 1e6)} | {_f(c['per_sm_gbps'])} |")
    return "\n".join(lines) + "\n"


def run(cfg: GpuBenchConfig, json_path: str | None = None) -> dict:
    """Every configuration of the selected regimes; prints and writes the tables."""
    if not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device is visible")
    gpus = torch.cuda.device_count()
    env = environment()
    if any(s.ranks > gpus for s in specs(cfg)) and env["mps"] != "running":
        print("hybrid-ep bench: WARNING: ranks share a GPU but no MPS control pipe was found "
              f"(CUDA_MPS_PIPE_DIRECTORY={os.environ.get('CUDA_MPS_PIPE_DIRECTORY', 'unset')}); "
              "without MPS cross-process waits crawl", flush=True)
    results = {"config": asdict(cfg), "env": env, "regimes": {}}
    for spec in specs(cfg):
        start = time.perf_counter()
        print(f"hybrid-ep bench: {spec.regime}: {spec.ranks} rank(s) x {spec.sms} SMs ...",
              flush=True)
        spec, ranks = run_spec(cfg, spec)
        summary = summarize(cfg, spec, ranks)
        summary["wall_s"] = time.perf_counter() - start
        results["regimes"].setdefault(spec.regime, []).append(summary)
        print(f"hybrid-ep bench: {spec.regime}: {spec.ranks} rank(s) done in "
              f"{summary['wall_s']:.0f} s", flush=True)
    suffix = f"-{cfg.label}" if cfg.label else ""
    if cfg.out_dir:
        os.makedirs(cfg.out_dir, exist_ok=True)
    for regime, runs in results["regimes"].items():
        text = format_regime(cfg, env, regime, runs)
        print(text)
        if cfg.out_dir:
            with open(os.path.join(cfg.out_dir, f"bench-{regime}{suffix}.md"), "w") as f:
                f.write(text)
    # One JSON with every raw number of every regime (few files: device runs return few).
    paths = [os.path.join(cfg.out_dir, f"bench{suffix}.json")] if cfg.out_dir else []
    paths += [json_path] if json_path else []
    for path in paths:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
    return results
