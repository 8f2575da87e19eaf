"""``hybrid-ep bench`` on the CPU: the reference engine over gloo on N local ranks, verified,
timed, tabulated.

Timing (benchmarks/README.md): median over iterations with fresh random routing, algorithm
bandwidth per rank = dispatched rows x hidden x 2 bytes / time (FP8 counts (1 + 4/128) / 2 of
that), averaged over ranks.
"""

from __future__ import annotations

import datetime
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hybrid_ep.config import EnvSettings

from . import oracle


@dataclass(frozen=True)
class BenchConfig:
    ranks: int = 4
    nodes: int = 1
    hidden: int = 2048
    tokens: int = 512
    experts_per_rank: int = 4
    topk: int = 4
    iters: int = 5
    warmup: int = 1
    fp8: bool = True
    device: str = "auto"
    seed: int = 0


@dataclass
class Row:
    op: str
    median_ms: float
    algbw_gbps: float
    rows_per_rank: float


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_device(requested: str) -> str:
    if requested != "auto":
        return requested
    from hybrid_ep import native

    if torch.cuda.is_available() and native.cuda_engine_built():
        return "cuda"
    return "cpu"


def random_routing(tokens: int, experts_total: int, topk: int, generator: torch.Generator):
    scores = torch.rand(tokens, experts_total, generator=generator, device="cpu")
    topk_idx = scores.topk(topk, dim=1).indices
    routing_map = torch.zeros(tokens, experts_total, dtype=torch.bool, device="cpu")
    routing_map.scatter_(1, topk_idx, True)
    probs = torch.where(routing_map, torch.rand(tokens, experts_total, generator=generator, device="cpu"), 0.0)
    return routing_map, probs


def _time(fn, device: str, group):
    dist.barrier(group)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def _check(name: str, got, want):
    if want is None:
        assert got is None, f"{name}: expected None"
        return
    got = got.cpu()
    same = torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8))
    assert same, f"{name}: differs from the oracle (shape {tuple(got.shape)} vs {tuple(want.shape)})"


def _worker(rank: int, cfg: BenchConfig, port: int, device: str, results):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", rank=rank, world_size=cfg.ranks)
    try:
        rows = _run_rank(rank, cfg, device)
        if rank == 0:
            results.put(rows)
    finally:
        dist.destroy_process_group()


def _run_rank(rank: int, cfg: BenchConfig, device: str) -> list[Row]:
    from hybrid_ep import HybridEPBuffer

    group = dist.group.WORLD
    per_domain = cfg.ranks // cfg.nodes
    buffer = HybridEPBuffer(group, cfg.hidden, cfg.tokens, cfg.experts_per_rank,
                            use_fp8=cfg.fp8, num_of_hybrid_ep_ranks_per_nvlink_domain=per_domain)
    experts_total = cfg.experts_per_rank * cfg.ranks
    generator = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    ops = ["dispatch-bf16"] + (["dispatch-fp8"] if cfg.fp8 else []) + ["combine-bf16"]
    times = {op: [] for op in ops}
    rows_seen = []
    # A line per step on a terminal: a long run shows it is alive (nothing in logs).
    progress = rank == 0 and sys.stderr.isatty()
    for step in range(cfg.warmup + cfg.iters):
        if progress:
            kind = "warm-up" if step < cfg.warmup else "timed"
            print(f"hybrid-ep bench: step {step + 1}/{cfg.warmup + cfg.iters} ({kind})",
                  file=sys.stderr, flush=True)
        routing_map, probs = random_routing(cfg.tokens, experts_total, cfg.topk, generator)
        hidden = torch.randn(cfg.tokens, cfg.hidden, generator=generator, device="cpu").to(torch.bfloat16)
        everyone = oracle.gather_inputs(group, hidden=hidden, routing_map=routing_map,
                                        probs=probs)
        want = oracle.expected_dispatch(everyone, rank, cfg.experts_per_rank, per_domain)
        args = {"routing_map": routing_map.to(device), "probs": probs.to(device)}
        x = hidden.to(device)
        (out, out_probs, _, handle), t = _time(
            lambda x=x, args=args: buffer.dispatch(x, **args), device, group)
        _check("dispatched_token", out, want[0])
        _check("dispatched_probs", out_probs, want[1])
        record = step >= cfg.warmup
        if record:
            times["dispatch-bf16"].append(t)
            rows_seen.append(out.shape[0])
        if cfg.fp8:
            fp8 = torch.randint(0, 256, (cfg.tokens, cfg.hidden), dtype=torch.uint8,
                                generator=generator, device="cpu")
            scales = torch.rand(cfg.tokens, cfg.hidden // 128, generator=generator,
                                device="cpu")
            everyone8 = oracle.gather_inputs(group, hidden=fp8, routing_map=routing_map,
                                             scaling_factor=scales)
            want8 = oracle.expected_dispatch(everyone8, rank, cfg.experts_per_rank, per_domain)
            x8, s8 = fp8.to(device), scales.to(device)
            (out8, _, out_scales, _), t8 = _time(
                lambda x8=x8, s8=s8, h=handle: buffer.dispatch(x8, scaling_factor=s8, handle=h),
                device, group)
            _check("dispatched_token (fp8)", out8, want8[0])
            _check("dispatched_scaling_factor", out_scales, want8[2])
            if record:
                times["dispatch-fp8"].append(t8)
        (combined, combined_probs), tc = _time(
            lambda o=out, p=out_probs, h=handle: buffer.combine(o, probs=p, handle=h), device,
            group)
        _check("combined_token", combined,
               oracle.expected_combine_of_dispatch(hidden, routing_map, cfg.experts_per_rank,
                                                   per_domain, EnvSettings.read().combine_wire))
        _check("combined_probs", combined_probs, probs)
        if record:
            times["combine-bf16"].append(tc)

    mean_rows = statistics.fmean(rows_seen)
    table = []
    for op in ops:
        median = statistics.median(times[op])
        width = (1 + 4 / 128) / 2 if op == "dispatch-fp8" else 1.0
        mine = mean_rows * cfg.hidden * 2 * width / median / 1e9
        per_rank = [None] * cfg.ranks
        dist.all_gather_object(per_rank, (median, mine, mean_rows))
        table.append(Row(op, 1e3 * statistics.fmean(p[0] for p in per_rank),
                         statistics.fmean(p[1] for p in per_rank),
                         statistics.fmean(p[2] for p in per_rank)))
    return table


def run(cfg: BenchConfig) -> tuple[str, list[Row]]:
    if cfg.ranks % cfg.nodes != 0:
        raise ValueError(f"--nodes {cfg.nodes} must divide --ranks {cfg.ranks}")
    device = pick_device(cfg.device)
    if device == "cuda":
        raise NotImplementedError("run(): the reference engine on the CPU only; the CUDA "
                                  "engine is benchmarked by hybrid_ep_bench.gpubench "
                                  "(hybrid-ep bench --device cuda)")
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(_worker, args=(cfg, free_port(), device, results), nprocs=cfg.ranks,
                       start_method="spawn")
    return device, results.get()


def source_commit() -> str:
    """The commit of the measured code: $HYBRID_EP_COMMIT (set it where the checkout has no
    .git, e.g. a copied tree on a GPU machine), else the git checkout the bench runs from."""
    if os.environ.get("HYBRID_EP_COMMIT"):
        return os.environ["HYBRID_EP_COMMIT"]
    # safe.directory: a copied checkout may belong to another user.
    git = ["git", "-c", "safe.directory=*", "-C", os.getcwd()]
    try:
        commit = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def environment() -> dict:
    commit = source_commit()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return {"date": datetime.date.today().isoformat(), "commit": commit,
            "host": f"{platform.machine()} {os.cpu_count()} cores", "gpu": gpu,
            "torch": torch.__version__}


def format_table(cfg: BenchConfig, device: str, rows: list[Row]) -> str:
    env = environment()
    engine = "reference (gloo)" if device == "cpu" else "cuda"
    lines = [
        (f"hybrid-ep bench — {env['date']}, commit {env['commit']}, {env['host']}, GPU "
         f"{env['gpu']}, torch {env['torch']}"),
        (f"config: {cfg.ranks} ranks as {cfg.nodes} domain(s) x {cfg.ranks // cfg.nodes}, "
         f"hidden {cfg.hidden}, {cfg.tokens} tokens/rank, {cfg.experts_per_rank} experts/rank, "
         f"top-{cfg.topk}, {cfg.iters} timed iterations (+{cfg.warmup} warm-up), engine "
         f"{engine}"),
        "",
        "| op | engine | rows/rank | API time (ms, median) | algbw/rank (GB/s) | verified |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row.op} | {engine} | {row.rows_per_rank:.0f} | {row.median_ms:.3f} | "
                     f"{row.algbw_gbps:.3f} | yes |")
    return "\n".join(lines)


def as_dict(cfg: BenchConfig, device: str, rows: list[Row]) -> dict:
    return {"config": asdict(cfg), "device": device, "env": environment(),
            "rows": [asdict(r) for r in rows]}
