"""One rank, one GPU: dispatch then combine at the benchmark's configuration, for profilers.

    ncu --clock-control none -k regex:combine_kernel -c 1 python3 benchmarks/profile_one_rank.py
"""

import os

import torch
import torch.distributed as dist

from hybrid_ep import HybridEPBuffer


def main(hidden=7168, tokens=4096, experts=8, topk=8, sms=8, calls=3):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29555")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.cuda.set_device(0)
    buf = HybridEPBuffer(None, hidden, tokens, experts, num_sms_dispatch_api=sms,
                         num_sms_combine_api=sms, num_sms_preprocessing_api=sms)
    for _ in range(calls):
        x = torch.randn(tokens, hidden, device="cuda").bfloat16()
        idx = torch.rand(tokens, experts, device="cuda").topk(topk, dim=1).indices
        w = torch.rand(tokens, topk, device="cuda")
        out, probs, _, handle = buf.dispatch(x, topk_idx=idx, topk_weights=w,
                                             num_of_experts=experts)
        buf.combine(out, probs, handle=handle)
    torch.cuda.synchronize()
    buf.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
