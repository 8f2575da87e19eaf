"""Configuration, the per-rank result record and the benchmark's inputs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

ALLOWANCE_S = 30e-6
ROOFLINE_BYTES = 2 << 30  # bytes copied per roofline measurement (4 GiB read + written)

# op key -> (label, kernel name, row dtype). A step calls them in this order; the permute path
# adds a second kernel to its op (PAIRED_KERNELS).
OPS = {
    "dispatch_pre": ("dispatch bf16 + preprocess", "dispatch_kernel", "bf16"),
    "dispatch_bf16": ("dispatch bf16", "dispatch_kernel", "bf16"),
    "dispatch_fp8": ("dispatch fp8", "dispatch_kernel", "fp8"),
    "combine_bf16": ("combine bf16", "combine_kernel", "bf16"),
    "combine_registered": ("combine bf16, input in place", "combine_kernel", "bf16"),
    "dispatch_permute": ("dispatch bf16 + permute", "dispatch_kernel", "bf16"),
    "dispatch_fused": ("dispatch bf16 + fused permute", "dispatch_kernel", "bf16"),
    "combine_unpermute": ("unpermute + combine", "combine_kernel", "bf16"),
    "combine_fused": ("fused unpermute + combine", "combine_kernel", "bf16"),
}
# The plain combine, of an input tensor of the caller's own or (combine_registered) of the one
# get_combine_input_buffer handed out, which the combine reads in place.
PLAIN_COMBINE_OPS = ("combine_bf16", "combine_registered")
PAIRED_KERNELS = {"dispatch_permute": "permute_kernel", "combine_unpermute": "unpermute_kernel"}
# fuse_permute_dispatch / fuse_unpermute_combine: one kernel each, the dispatch or combine grid
# with permute or unpermute blocks (RunSpec.permute_blocks of them).
FUSED_OPS = ("dispatch_fused", "combine_fused")
PERMUTE_OPS = (*PAIRED_KERNELS, *FUSED_OPS)
PAD_MULTIPLE = 16  # the permute path's pad_multiple
PREPROCESS_KERNELS = ("allgather_kernel", "dest_mask_kernel", "scan_kernel")


@dataclass(frozen=True)
class GpuBenchConfig:
    regimes: tuple[str, ...] = ("hbm", "sm")
    # 4 and 8 ranks per node are where the other design led (issue 40); both run by default.
    hbm_ranks: tuple[int, ...] = (4, 8)
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
    permute: bool = True  # also the dispatch_with_permute / combine_with_unpermute pair
    # Permute blocks of the fused dispatch per rank; None: what an even split of the GPU's SMs
    # among the ranks sharing it leaves besides the dispatch SMs (0: no fused op).
    permute_blocks: int | None = None
    seed: int = 0
    label: str = ""
    # Ranks sharing a GPU get an MPS share of SMs for their SMs per rank and the permute blocks
    # (by default an even split of the GPU; ranks.plan_sharing), so that one rank's copy
    # kernels (copy-out, staging) cannot occupy the SMs another rank's persistent kernel
    # needs, as separate GPUs would not either.
    mps_partition: bool = True
    # Ranks sharing a GPU run under MPS: a running daemon, else a private one the bench starts
    # and stops (gpubench/mps.py); False runs them without (time-sliced, numbers not valid).
    mps: bool = True
    out_dir: str | None = None
    # Each rank also writes the GPU kernels its profiler saw (start, duration, name) to
    # out_dir/kernels-<regime>-<ranks>r-rank<rank>.json, for gpubench/rank_skew.py.
    kernel_traces: bool = False
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
    permute_blocks: int = 0  # of the fused dispatch (num_blocks_permute); 0: not run


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
    api_permuted: list[int] = field(default_factory=list)  # P per timed API step
    kernel_permuted: list[int] = field(default_factory=list)
    preprocess_kernels_s: float | None = None  # mean per call, all preprocessing kernels
    api_floor_s: float | None = None  # median API time of one empty kernel (ranks.py)
    api_floor_barrier_s: float | None = None  # and of the runtime's barrier alone (ranks > 1)
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
