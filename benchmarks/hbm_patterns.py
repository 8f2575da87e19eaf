"""What the HBM of this GPU moves for the traffic mixes of our kernels, with plain torch copies
(no hybrid-ep code): pure writes (torch's fill kernel, and the CUDA runtime's memset), 1 read :
1 write, and 1 read : k writes (the fused permute's fan-out, each row written to k places). A
reference for the roofline fractions of the benchmark, whose roofline is the 1 : 1 copy.

    python3 benchmarks/hbm_patterns.py [--rows 4096] [--hidden 7168] [--fanout 8]
"""

from __future__ import annotations

import argparse
import ctypes

import libcudart
import torch


def time_us(fn, iters: int = 20) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--fanout", type=int, default=8)
    args = ap.parse_args()
    k = args.fanout
    src = torch.randn(args.rows, args.hidden, device="cuda").bfloat16()
    row = src.shape[1] * src.element_size()
    # row-major fan-out: a row's k copies are written one after another, so it is read once
    fan = torch.empty(src.shape[0], k, src.shape[1], device="cuda", dtype=src.dtype)
    one = torch.empty_like(src)

    def memset() -> None:
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        libcudart.call("cudaMemsetAsync", ctypes.c_void_p(fan.data_ptr()), 0,
                    ctypes.c_size_t(fan.numel() * 2), stream)

    cases = {
        f"write only ({k} x rows, zero_)": (lambda: fan.zero_(), k * src.numel() * 2),
        f"write only ({k} x rows, cudaMemsetAsync)": (memset, k * src.numel() * 2),
        "copy 1 read : 1 write": (lambda: one.copy_(src), 2 * src.numel() * 2),
        f"fan-out 1 read : {k} writes": (lambda: fan.copy_(src[:, None].expand(-1, k, -1)),
                                         (1 + k) * src.numel() * 2),
    }
    print(f"GPU {torch.cuda.get_device_name()}, {args.rows} rows of {row} bytes")
    print("| pattern | bytes (MB) | time (us) | GB/s |")
    print("|---|---|---|---|")
    for name, (fn, nbytes) in cases.items():
        us = time_us(fn)
        print(f"| {name} | {nbytes / 1e6:.1f} | {us:.1f} | {nbytes / us / 1e3:.0f} |")


if __name__ == "__main__":
    main()
