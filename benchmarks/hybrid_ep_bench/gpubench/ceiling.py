"""The per-SM TMA copy ceiling (``_C.copy_ceiling``), measured and checked."""

from __future__ import annotations

import math

import torch

from .config import GpuBenchConfig
from .timing import event_median


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
    from .. import native

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
                seconds = event_median(launch, 2, 7, busy_before=True)
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
