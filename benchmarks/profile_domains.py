"""Where a multi-domain call's time goes: ranks on one GPU (under MPS) split into domains run
dispatch and combine under torch.profiler; rank 0 prints its GPU time per kernel and call.

    python3 benchmarks/profile_domains.py [--ranks 4 --nodes 2] [--calls 5]
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

from hybrid_ep import HybridEPBuffer


def rank_main(rank: int, args) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29557")
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.cuda.set_device(0)
    H, T, E = args.hidden, args.tokens, args.experts
    buf = HybridEPBuffer(dist.group.WORLD, H, T, E, num_sms_dispatch_api=args.sms,
                         num_sms_combine_api=args.sms, num_sms_preprocessing_api=args.sms,
                         num_of_hybrid_ep_ranks_per_nvlink_domain=args.ranks // args.nodes)
    experts = E * args.ranks

    def call():
        x = torch.randn(T, H, device="cuda").bfloat16()
        idx = torch.rand(T, experts, device="cuda").topk(args.topk, dim=1).indices
        w = torch.rand(T, args.topk, device="cuda")
        rows, probs, _, handle = buf.dispatch(x, topk_idx=idx, topk_weights=w,
                                              num_of_experts=experts)
        buf.combine(rows, probs=probs, handle=handle)

    call()
    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.calls):
            call()
        torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        print(f"{args.nodes} domains x {args.ranks // args.nodes} ranks, H={H}, T={T}, "
              f"top-{args.topk} of {E} experts/rank, {args.sms} SMs; GPU time of rank 0 per "
              f"kernel over {args.calls} dispatch+combine calls:")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--sms", type=int, default=8)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    mp.start_processes(rank_main, args=(args,), nprocs=args.ranks, start_method="spawn")


if __name__ == "__main__":
    main()
