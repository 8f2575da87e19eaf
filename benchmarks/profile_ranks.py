"""Ranks on one GPU running dispatch then combine at the benchmark's configuration, for
profilers (no MPS needed: ncu serialises the profiled kernels; the ranks' waits time-slice).

    ncu --clock-control none -k regex:combine_kernel -c 1 \\
        python3 benchmarks/profile_ranks.py [--ranks 2] [--permute]
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hybrid_ep import HybridEPBuffer


def rank_main(rank: int, args) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29555")
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.cuda.set_device(0)
    H, T, E = args.hidden, args.tokens, args.experts
    buf = HybridEPBuffer(dist.group.WORLD, H, T, E, num_sms_dispatch_api=args.sms,
                         num_sms_combine_api=args.sms, num_sms_preprocessing_api=args.sms,
                         num_of_hybrid_ep_ranks_per_nvlink_domain=args.ranks)
    experts = E * args.ranks
    for _ in range(args.calls):
        x = torch.randn(T, H, device="cuda").bfloat16()
        idx = torch.rand(T, experts, device="cuda").topk(args.topk, dim=1).indices
        w = torch.rand(T, args.topk, device="cuda")
        if args.permute:
            out = buf.dispatch_with_permute(hidden=x, topk_idx=idx, topk_weights=w,
                                            num_of_experts=experts, pad_multiple=16)
            buf.combine_with_unpermute(hidden=out[0], probs=out[1], handle=out[4],
                                       pad_multiple=16)
        else:
            out, probs, _, handle = buf.dispatch(x, topk_idx=idx, topk_weights=w,
                                                 num_of_experts=experts)
            buf.combine(out, probs, handle=handle)
    torch.cuda.synchronize()
    dist.barrier()
    buf.destroy()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--experts", type=int, default=8, help="experts per rank")
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--sms", type=int, default=8)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--permute", action="store_true")
    args = ap.parse_args()
    if args.ranks == 1:
        rank_main(0, args)
    else:
        mp.spawn(rank_main, args=(args,), nprocs=args.ranks)


if __name__ == "__main__":
    main()
