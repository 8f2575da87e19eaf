"""From per-rank records to the numbers of the tables (bytes, bandwidths, fractions)."""

from __future__ import annotations

import math
import statistics

from .config import ALLOWANCE_S, OPS, PERMUTE_OPS, PLAIN_COMBINE_OPS, GpuBenchConfig, RunSpec


# ---- numbers ------------------------------------------------------------------------------------
def _median(values):
    return statistics.median(values) if values else float("nan")


def _mean(values):
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(values) if values else float("nan")


def _bytes(cfg: GpuBenchConfig, ranks: int, op: str, rows: float, copies: float,
           permuted: float = 0.0) -> dict:
    """HBM bytes one rank's kernels must move once, and the bytes of its output. The permute
    path adds its own passes: permute reads the D received rows and writes P permuted ones;
    unpermute reads P rows and writes D fp32 sums, which the combine then pulls."""
    H, T, E = cfg.hidden, cfg.tokens, cfg.experts_per_rank
    prob_cols = E * ranks  # one domain's columns
    combined = T * (2 * H + 4 * E * ranks)
    if op in PLAIN_COMBINE_OPS:
        return {"moved": copies * (2 * H + 4 * E) + combined, "output": combined}
    if op in ("combine_unpermute", "combine_fused"):
        unpermute = permuted * (2 * H + 4) + rows * (4 * H + 4 * E)
        return {"moved": unpermute + copies * (4 * H + 4 * E) + combined, "output": combined}
    if op in ("dispatch_permute", "dispatch_fused"):
        row = 2 * H + 4 * prob_cols
        moved = T * row + copies * row + rows * row + permuted * (2 * H + 4)
        return {"moved": moved, "output": permuted * (2 * H + 4)}
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
            perm_api = _mean(r.get("api_permuted", []))
            perm_k = _mean(r.get("kernel_permuted", [])) if r.get("kernel_permuted") else perm_api
            b_k = _bytes(cfg, spec.ranks, op, rows_k, copies_k, perm_k)
            b_api = _bytes(cfg, spec.ranks, op, rows_api, copies_api, perm_api)
            # preprocessing in the call
            fresh = op in ("dispatch_pre", "dispatch_permute", "dispatch_fused")
            extra = (r["preprocess_kernels_s"] or 0.0) if fresh else 0.0
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
        if ceilings and op not in PERMUTE_OPS:  # the copy kernel models the plain kernels
            pattern = "fan-in" if op in PLAIN_COMBINE_OPS else "fan-out"
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
                     "(an MPS share of SMs for their SMs per rank and the fused grids' permute "
                     "blocks, by default an even split of the GPU, so that one rank's copy "
                     "kernels cannot take the SMs another rank's persistent kernel needs); the "
                     "roofline was measured before, without that limit")
    if len(on_gpu) > 1:
        notes.append(f"ranks on {len(on_gpu)} GPUs: rows to ranks on other GPUs cross NVLink, "
                     "while the TMA copy ceiling is measured on one GPU's HBM, so the ceiling "
                     "fractions compare unlike patterns")
    if spec.permute_blocks:
        notes.append(f"fused ops: a grid of {spec.sms} dispatch / combine blocks + "
                     f"{spec.permute_blocks} permute / unpermute blocks per rank, every block "
                     f"doing both roles inside one domain; their traffic per SM still divides by "
                     f"the {spec.sms} SMs only, and their bytes are the standalone pair's (the "
                     "fused dispatch skips a rank's own rows' trip through its own buffer, so "
                     "its roofline fraction overstates the HBM traffic it moves)")
    return {"regime": spec.regime, "ranks": spec.ranks, "sms_per_rank": spec.sms,
            "gpus": len(on_gpu), "gpu": ranks[0]["gpu"], "sm_count": ranks[0]["sm_count"],
            "roofline_gbps": _mean(list(roofline.values())),
            "preprocess_kernels_us": 1e6 * _mean([r["preprocess_kernels_s"] for r in ranks]),
            "api_floor_us": 1e6 * _mean([r.get("api_floor_s") for r in ranks]),
            "api_floor_barrier_us": 1e6 * _mean([r.get("api_floor_barrier_s") for r in ranks]),
            "verified": ranks[0]["verified"], "notes": notes, "ops": rows,
            "ceilings": ceilings, "raw": ranks}
