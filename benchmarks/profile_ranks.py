"""Ranks on one GPU running dispatch then combine at the benchmark's configuration, for
profilers (no MPS needed for ncu: it serialises the profiled kernels; the ranks' waits
time-slice), optionally split into NVLink domains (--nodes).

    ncu --clock-control none -k regex:combine_kernel -c 1 \\
        python3 benchmarks/profile_ranks.py [--ranks 2] [--permute [--fused BLOCKS]]

With --torch-profile (under MPS) rank 0 prints its GPU time per kernel over the calls after a
warm-up call, e.g. where a multi-domain call's time goes:

    python3 benchmarks/profile_ranks.py --ranks 4 --nodes 2 --calls 5 --torch-profile
"""

from __future__ import annotations

import argparse
import contextlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

from hybrid_ep import HybridEPBuffer


def rank_main(rank: int, args) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29555")
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.cuda.set_device(0)
    H, T, E = args.hidden, args.tokens, args.experts
    buf = HybridEPBuffer(dist.group.WORLD, H, T, E, num_sms_dispatch_api=args.sms,
                         num_sms_combine_api=args.sms, num_sms_preprocessing_api=args.sms,
                         num_of_hybrid_ep_ranks_per_nvlink_domain=args.ranks // args.nodes,
                         num_blocks_permute=args.fused or None,
                         num_blocks_unpermute=args.fused or None)
    experts = E * args.ranks

    def call():
        x = torch.randn(T, H, device="cuda").bfloat16()
        idx = torch.rand(T, experts, device="cuda").topk(args.topk, dim=1).indices
        w = torch.rand(T, args.topk, device="cuda")
        if args.permute:
            out = buf.dispatch_with_permute(hidden=x, topk_idx=idx, topk_weights=w,
                                            num_of_experts=experts, pad_multiple=16,
                                            fuse_permute_dispatch=bool(args.fused))
            buf.combine_with_unpermute(hidden=out[0], probs=out[1], handle=out[4],
                                       pad_multiple=16, fuse_unpermute_combine=bool(args.fused))
        else:
            out, probs, _, handle = buf.dispatch(x, topk_idx=idx, topk_weights=w,
                                                 num_of_experts=experts)
            buf.combine(out, probs, handle=handle)

    if args.torch_profile:
        call()
        torch.cuda.synchronize()
        dist.barrier()
    session = (profile(activities=[ProfilerActivity.CUDA]) if args.torch_profile
               else contextlib.nullcontext())
    with session as prof:
        for _ in range(args.calls):
            call()
        torch.cuda.synchronize()
    dist.barrier()
    if args.torch_profile and rank == 0:
        print(f"{args.nodes} domain(s) x {args.ranks // args.nodes} ranks, H={H}, T={T}, "
              f"top-{args.topk} of {E} experts/rank, {args.sms} SMs; GPU time of rank 0 per "
              f"kernel over {args.calls} calls:")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18))
    buf.destroy()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=1, help="NVLink domains the ranks split into")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--experts", type=int, default=8, help="experts per rank")
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--sms", type=int, default=8)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--permute", action="store_true")
    ap.add_argument("--fused", type=int, default=0, metavar="BLOCKS",
                    help="with --permute: the fused grids with this many permute/unpermute blocks")
    ap.add_argument("--torch-profile", action="store_true",
                    help="print rank 0's GPU time per kernel (torch.profiler)")
    args = ap.parse_args()
    if args.ranks % args.nodes != 0:
        raise SystemExit(f"--nodes {args.nodes} must divide --ranks {args.ranks}")
    if args.ranks == 1:
        rank_main(0, args)
    else:
        mp.spawn(rank_main, args=(args,), nprocs=args.ranks)


if __name__ == "__main__":
    main()
