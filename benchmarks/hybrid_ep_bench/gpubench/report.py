"""Tables, environment facts and the entry point ``run``."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import time
from dataclasses import asdict

import torch

from . import mps
from .config import GpuBenchConfig
from .ranks import run_spec, specs
from .summary import summarize


# ---- report -------------------------------------------------------------------------------------
def environment() -> dict:
    from ..cpu import environment as base

    env = base()
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
        *([f"**NOT VALID: several ranks share a GPU and MPS {env['mps']}.**", ""]
          if not mps.valid(env["mps"]) else []),
        (f"{env['date']}, commit {env['commit']}, GPU {runs[0]['gpu']} ({runs[0]['sm_count']} "
         f"SMs), {env['host']}, torch {env['torch']}, MPS {env['mps']}"),
        (f"hidden {cfg.hidden}, {cfg.tokens} tokens/rank, top-{cfg.topk} uniform over "
         f"{cfg.experts_per_rank} experts/rank, fresh routing per call, {cfg.iters} timed calls "
         f"(+{cfg.warmup} warm-up; median per rank, mean over ranks); verified against the "
         f"oracle: {', '.join(runs[0]['verified'])}"),
        ("HBM roofline (device-to-device copy, read + write, same run): "
         + ", ".join(f"{r['ranks']} rank(s): {_f(r['roofline_gbps'], 0)} GB/s" for r in runs)),
        ("API floor (one empty kernel launched and synchronised, timed like the calls; under "
         "every API time): "
         + ", ".join(f"{r['ranks']} rank(s): {_f(r.get('api_floor_us'), 0)}"
                     + (" us" if _f(r.get("api_floor_us")) != "n/a" else "") for r in runs)),
        ("API floor of a call that meets every rank (the runtime's barrier alone, timed the "
         "same way): "
         + ", ".join(f"{r['ranks']} rank(s): {_f(r.get('api_floor_barrier_us'), 0)}"
                     + (" us" if _f(r.get("api_floor_barrier_us")) != "n/a" else "")
                     for r in runs)),
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
        ("- kernel: device time of dispatch_kernel / combine_kernel (+ permute_kernel / "
         "unpermute_kernel for the permute pair; the fused ops are the one dispatch_kernel / "
         "combine_kernel grid with its permute / unpermute blocks; torch.profiler, separate "
         "pass); API: "
         "whole Python call, the ranks starting at one agreed instant, to "
         "torch.cuda.synchronize()."),
        ("- HBM traffic/SM: bytes the kernels must read and write once (rows, probs, FP8 "
         "scales) / kernel time, summed over the ranks on a GPU, / (SMs per rank x ranks on "
         "it); roofline fraction: that sum / the HBM roofline."),
        ("- allowance: kernel time + one pass over the output (read + write, all ranks on the "
         "GPU) at the roofline + 30 us; 'dispatch bf16 + preprocess' and the two 'dispatch "
         "bf16 + ... permute' ops also count their preprocessing kernels as kernel time."),
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
    shared = any(s.ranks > gpus for s in specs(cfg))
    with mps.mps_for_ranks(shared, cfg.mps) as state:
        return _run(cfg, json_path, state)


def _run(cfg: GpuBenchConfig, json_path: str | None, mps_state: str) -> dict:
    env = environment()
    env["mps"] = mps_state
    print(f"hybrid-ep bench: MPS {mps_state}", flush=True)
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
