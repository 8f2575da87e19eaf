"""What each rank process measures, and how a configuration's ranks are spawned."""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import warnings
from dataclasses import replace

import torch
import torch.distributed as dist

from .. import oracle
from .ceiling import measure_ceilings
from .config import (
    FUSED_OPS,
    OPS,
    PAD_MULTIPLE,
    PAIRED_KERNELS,
    PERMUTE_OPS,
    PREPROCESS_KERNELS,
    GpuBenchConfig,
    RankResult,
    RunSpec,
    make_routing,
    make_tokens,
)
from .spawn import run_ranks
from .timing import gated_call, is_our_kernel, kernel_events, measure_roofline, time_call


# ---- one rank -----------------------------------------------------------------------------------
class _Rank:
    def __init__(self, cfg: GpuBenchConfig, spec: RunSpec, rank: int):
        from hybrid_ep import HybridEPBuffer

        self.cfg, self.spec, self.rank = cfg, spec, rank
        self.group = dist.group.WORLD
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.experts_total = cfg.experts_per_rank * spec.ranks
        self.tokens = make_tokens(cfg, rank, self.device)
        self.buffer = HybridEPBuffer(
            self.group, cfg.hidden, cfg.tokens, cfg.experts_per_rank, use_fp8=cfg.fp8,
            num_sms_dispatch_api=spec.sms, num_sms_combine_api=spec.sms,
            num_sms_preprocessing_api=min(spec.sms, 16),
            num_blocks_permute=spec.permute_blocks or None,
            num_blocks_unpermute=spec.permute_blocks or None,
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
        # The experts' outputs written into the registered buffer (their own work: untimed).
        in_place = buf.get_combine_input_buffer(handle)
        in_place.copy_(rows)
        out["in_place"] = timer("combine_registered",
                                lambda: buf.combine(in_place, probs=rows_probs, handle=handle))
        out["rows"] = int(rows.shape[0])
        out["copies"] = int((handle[0][: cfg.tokens] >= 0).sum())
        if cfg.permute:  # fresh routing: preprocessing runs in the call, as in training
            out["perm"] = timer("dispatch_permute", lambda: buf.dispatch_with_permute(
                hidden=x, probs=probs, routing_map=routing_map, pad_multiple=PAD_MULTIPLE))
            perm = out["perm"]
            if self.spec.permute_blocks:
                out["fused"] = timer("dispatch_fused", lambda: buf.dispatch_with_permute(
                    hidden=x, probs=probs, routing_map=routing_map, pad_multiple=PAD_MULTIPLE,
                    fuse_permute_dispatch=True))
            out["unperm"] = timer("combine_unpermute", lambda: buf.combine_with_unpermute(
                hidden=perm[0], probs=perm[1], handle=perm[4], pad_multiple=PAD_MULTIPLE))
            if self.spec.permute_blocks:
                fused = out["fused"]
                out["unfused"] = timer("combine_fused", lambda: buf.combine_with_unpermute(
                    hidden=fused[0], probs=fused[1], handle=fused[4], pad_multiple=PAD_MULTIPLE,
                    fuse_unpermute_combine=True))
            out["permuted"] = int(perm[0].shape[0])
        return out

    # -- verification against the oracle, on the GPU --
    def verify(self, out) -> list[str]:
        cfg, spec, dev = self.cfg, self.spec, self.device
        maps = [torch.empty(cfg.tokens, self.experts_total, dtype=torch.uint8, device="cpu")
                for _ in range(spec.ranks)]
        dist.all_gather(maps, out["routing_map"].to(torch.uint8).cpu(), group=self.group)
        probs = [torch.empty(cfg.tokens, self.experts_total, device="cpu") for _ in range(spec.ranks)]
        dist.all_gather(probs, out["probs"].cpu(), group=self.group)
        everyone = []
        for source in range(spec.ranks):
            tokens = self.tokens if source == self.rank else make_tokens(cfg, source, dev)
            everyone.append(tokens | {"routing_map": maps[source].to(dev).bool(),
                                      "probs": probs[source].to(dev)})
        checked = []
        want = oracle.expected_dispatch(everyone, self.rank, cfg.experts_per_rank, spec.ranks)
        for op in ("pre", "bf16"):
            oracle.assert_same(f"{op}: dispatched rows", out[op][0], want[0])
            oracle.assert_same(f"{op}: dispatched probs", out[op][1], want[1])
            checked.append(OPS["dispatch_pre" if op == "pre" else "dispatch_bf16"][0])
        if cfg.fp8:
            want8 = oracle.expected_dispatch(
                [{"hidden": e["fp8"], "routing_map": e["routing_map"],
                  "scaling_factor": e["scales"]} for e in everyone],
                self.rank, cfg.experts_per_rank, spec.ranks)
            oracle.assert_same("fp8: dispatched rows", out["fp8"][0], want8[0])
            oracle.assert_same("fp8: dispatched probs", out["fp8"][1], want[1])
            oracle.assert_same("fp8: dispatched scaling factors", out["fp8"][2], want8[2])
            checked.append(OPS["dispatch_fp8"][0])
        combined, combined_probs = out["combine"]
        oracle.assert_same("combine: rows", combined, oracle.expected_combine_of_dispatch(
            self.tokens["hidden"], out["routing_map"], cfg.experts_per_rank))
        oracle.assert_same("combine: probs", combined_probs, out["probs"])
        checked.append(OPS["combine_bf16"][0])
        for i, what in ((0, "rows"), (1, "probs")):
            oracle.assert_same(f"combine, input in place: {what}", out["in_place"][i],
                               out["combine"][i])
        checked.append(OPS["combine_registered"][0])
        if cfg.permute:
            # Round trip through the identity expert: every token comes back as the BF16 of
            # its row times the experts it selected (an exact fp32 sum of equal rows), and its
            # probs as they were.
            selected = out["routing_map"].sum(1, dtype=torch.float32).unsqueeze(1)
            want_rows = (self.tokens["hidden"].float() * selected).to(torch.bfloat16)
            got_rows, got_probs = out["unperm"]
            oracle.assert_same("permute round trip: rows", got_rows, want_rows)
            oracle.assert_same("permute round trip: probs", got_probs, out["probs"])
            checked += [OPS[op][0] for op in PAIRED_KERNELS]
            if "fused" in out:  # the fused grids' outputs are the standalone kernels'
                for i, what in ((0, "rows"), (1, "probs"), (3, "tokens_per_expert")):
                    oracle.assert_same(f"fused permute: {what}", out["fused"][i].cpu(),
                                       out["perm"][i].cpu())
                for i, what in ((0, "rows"), (1, "probs")):
                    oracle.assert_same(f"fused unpermute + combine: {what}", out["unfused"][i],
                                       out["unperm"][i])
                checked += [OPS[op][0] for op in FUSED_OPS]
        del everyone, want
        torch.cuda.empty_cache()
        return checked


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
    ops = [op for op in OPS
           if (cfg.fp8 or op != "dispatch_fp8") and (cfg.permute or op not in PERMUTE_OPS)
           and (spec.permute_blocks or op not in FUSED_OPS)]

    # Pass 1: API times (no profiler), the first warm-up verified.
    result.api_s = {op: [] for op in ops}
    for step in range(cfg.warmup + cfg.iters):
        timed = step >= cfg.warmup

        def timer(op, fn, timed=timed):
            value, seconds = time_call(fn, group)
            if timed:
                result.api_s[op].append(seconds)
            return value

        out = bench.step(step, timer)
        if step == 0:
            result.verified = bench.verify(out)
        if timed:
            result.api_rows.append(out["rows"])
            result.api_copies.append(out["copies"])
            result.api_permuted.append(out.get("permuted", 0))
        del out
    # The floor under every API time: one empty kernel, launched and synchronised, timed the
    # same way (the ranks starting at one instant). With several ranks sharing a GPU under MPS
    # it holds the clients' launch and wake-up latency, which no library call can avoid.
    floors = [time_call(lambda: torch.cuda._sleep(0), group)[1] for _ in range(cfg.iters)]
    result.api_floor_s = statistics.median(floors)
    # And the floor of a call that must meet every rank: the runtime's barrier alone (one
    # kernel whose ranks wait for each other through flags in IPC memory), which every
    # dispatch and combine of several ranks contains one way or another.
    runtime = getattr(getattr(bench.buffer, "_cuda_engine", None), "runtime", None)
    if runtime is not None and spec.ranks > 1:
        stream = torch.cuda.current_stream().cuda_stream
        meets = [time_call(lambda: runtime.barrier(stream), group)[1] for _ in range(cfg.iters)]
        result.api_floor_barrier_s = statistics.median(meets)

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
                out = bench.step(base + step,
                                 lambda op, fn: gated_call(fn, group, one_gpu=gpus == 1))
                if step >= extra:
                    result.kernel_rows.append(out["rows"])
                    result.kernel_copies.append(out["copies"])
                    result.kernel_permuted.append(out.get("permuted", 0))
                del out
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            kernels = kernel_events(path)
        if cfg.kernel_traces and cfg.out_dir:
            _write_kernels(cfg, spec, rank, kernels, ops)
        _assign_kernels(result, kernels, ops, steps, cfg.iters,
                        preprocess_per_step=(1 + ("dispatch_fused" in ops)
                                             + ("dispatch_permute" in ops)))
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


def _write_kernels(cfg: GpuBenchConfig, spec: RunSpec, rank: int, kernels, ops) -> None:
    """The profiler's kernels, and which op each launch of a dispatch or combine kernel in a
    step belongs to (the order _assign_kernels matches them in)."""
    os.makedirs(cfg.out_dir, exist_ok=True)
    per_step = {kernel: ops_launching(ops, kernel)
                for kernel in ("dispatch_kernel", "combine_kernel")}
    name = f"kernels-{spec.regime}-{spec.ranks}r-rank{rank}.json"
    with open(os.path.join(cfg.out_dir, name), "w") as f:
        json.dump({"rank": rank, "ranks": spec.ranks, "regime": spec.regime,
                   "ops_per_step": per_step,
                   "kernels": [{"start_us": s, "dur_us": d, "name": n} for s, d, n in kernels]},
                  f)


def ops_launching(ops, kernel: str) -> list[str]:
    """The ops of a step that launch ``kernel`` (dispatch_kernel or combine_kernel), in order."""
    return [op for op in ops if OPS[op][1] == kernel]


def launches_by_op(launches: list, step_ops: list[str]) -> dict[str, list]:
    """One kernel's launches split among the ops of a step that launch it, matched from the end
    of the session (the profiler may miss a few at its start); each op's in launch order."""
    by_op = {op: [] for op in step_ops}
    for k, launch in enumerate(reversed(launches)):
        by_op[step_ops[len(step_ops) - 1 - k % len(step_ops)]].append(launch)
    return {op: got[::-1] for op, got in by_op.items()}


def _assign_kernels(result: RankResult, kernels, ops, steps: int, iters: int,
                    preprocess_per_step: int = 1):
    """Per step the stream runs dispatch_kernel for each dispatch op and combine_kernel for each
    combine op, in the order of OPS; the permute ops add their paired kernel (permute_kernel,
    unpermute_kernel) to their time. Events are matched from the end of the session (the
    profiler may miss a few at its start) and the last `iters` of each kept."""
    per_op = {op: [] for op in ops}
    seen = {}
    for kernel in ("dispatch_kernel", "combine_kernel"):
        mine = ops_launching(ops, kernel)
        events = [k for k in kernels if is_our_kernel(k[2], kernel)]
        seen[kernel] = (len(events), len(mine))
        if mine:
            for op, launches in launches_by_op(events, mine).items():
                per_op[op] = [event[1] * 1e-6 for event in reversed(launches)]  # newest first
    for op, paired in PAIRED_KERNELS.items():
        if op in per_op:
            events = [k for k in kernels if is_our_kernel(k[2], paired)
                      and not (paired == "permute_kernel" and "unpermute" in k[2])]
            for i, event in enumerate(reversed(events[-len(per_op[op]):])):
                per_op[op][i] += event[1] * 1e-6
    for op in ops:
        result.kernel_s[op] = list(reversed(per_op[op][:iters]))
    preprocess = [k for k in kernels if any(is_our_kernel(k[2], p) for p in PREPROCESS_KERNELS)]
    if preprocess:
        result.preprocess_kernels_s = (sum(k[1] for k in preprocess) * 1e-6
                                       / (steps * preprocess_per_step))
    short = [f"{count} {kernel}s (expected >= {per_step * iters})"
             for kernel, (count, per_step) in seen.items() if count < per_step * iters]
    if short:
        result.profiler_note = "profiler saw only " + ", ".join(short)


def plan_sharing(cfg: GpuBenchConfig, spec: RunSpec, gpus: int, sms: int) -> RunSpec:
    """The fused grids' permute blocks per rank and, for ranks sharing a GPU, their MPS share
    of its SMs: room for the kernel's SMs and the permute blocks (by default an even split of
    the GPU), whether or not the permute ops run. A share of just the kernel's SMs (7% for two
    ranks) ran the two-rank dispatch ~12% slower than the even split with the same kernels
    (benchmarks/results/2026-11-30-side-lanes.md), so the op list must not set it."""
    sharing = -(-spec.ranks // gpus)
    blocks = cfg.permute_blocks
    if blocks is None:  # an even split of the GPU, less the dispatch SMs and MPS's spare one
        blocks = max(0, sms // sharing - spec.sms - (1 if sharing > 1 else 0))
    spec = replace(spec, permute_blocks=blocks if cfg.permute else 0)
    if cfg.mps_partition and spec.ranks > gpus:
        percentage = min(100, math.ceil(100 * (spec.sms + blocks + 1) / sms))
        spec = replace(spec, sm_percentage=percentage, gpu_sm_count=sms)
    return spec


def run_spec(cfg: GpuBenchConfig, spec: RunSpec) -> tuple[RunSpec, list[dict]]:
    """Runs the ranks of ``spec``; returns the spec as run (MPS share, roofline) and their
    results."""
    spec = plan_sharing(cfg, spec, torch.cuda.device_count(),
                        torch.cuda.get_device_properties(0).multi_processor_count)
    if spec.sm_percentage is not None:
        spec = replace(spec, roofline_gbps=measure_roofline() / 1e9)
    # Read by MPS when a rank creates its CUDA context.
    env = ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(spec.sm_percentage)}
           if spec.sm_percentage is not None else {})
    return spec, run_ranks(spec.ranks, _measure, (cfg, spec), env)


def specs(cfg: GpuBenchConfig) -> list[RunSpec]:
    out = []
    if "hbm" in cfg.regimes:
        out.extend(RunSpec("hbm", ranks, cfg.hbm_sms) for ranks in cfg.hbm_ranks)
    if "sm" in cfg.regimes:
        out.extend(RunSpec("sm", ranks, cfg.sm_sms) for ranks in cfg.sm_ranks)
    return out
