"""One rank of test_gpu_failures.test_peer_killed_mid_call (not collected by pytest).

    python peer_killed.py RANK PORT LAYOUT      (LAYOUT: 1x2 or 2x1 domains x ranks)

Both ranks share GPU 0, make a buffer and one checked-free dispatch/combine; then rank 1 dies
(os._exit(9)) in its next dispatch after the routing all-gather, before its dispatch kernel.
Rank 0's dispatch waits for rank 1 (its publish at the dispatch's start inside one domain, its
chunks across domains) until HYBRID_EP_TIMEOUT_S, and its next call raises
HybridEPTimeoutError: it prints RAISED and the message, and exits 0.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


class _DiesAtDispatch:
    """Rank 1's runtime: its dispatch launch ends the process once the all-gather is done."""

    def __init__(self, runtime):
        self._runtime = runtime

    def __getattr__(self, name):
        if name == "dispatch":
            def die(*args, **kwargs):
                torch.cuda.synchronize()  # the all-gather with rank 0 has completed
                os._exit(9)
            return die
        return getattr(self._runtime, name)


def main() -> None:
    rank, port, layout = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    ranks_per_domain = {"1x2": 2, "2x1": 1}[layout]
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=120))
    from hybrid_ep import HybridEPBuffer, HybridEPTimeoutError

    buf = HybridEPBuffer(dist.group.WORLD, hidden_dim=512, max_num_of_tokens_per_rank=64,
                         num_local_experts=2, num_sms_dispatch_api=4, num_sms_combine_api=4,
                         num_sms_preprocessing_api=4,
                         num_of_hybrid_ep_ranks_per_nvlink_domain=ranks_per_domain)
    g = torch.Generator(device="cuda").manual_seed(rank)
    hidden = torch.randn(64, 512, generator=g, device="cuda").to(torch.bfloat16)
    routing = torch.rand(64, 4, generator=g, device="cuda") < 0.5
    tokens, probs, _, handle = buf.dispatch(hidden, routing_map=routing, probs=routing.float())
    buf.combine(tokens, probs=probs, handle=handle)
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 1:
        buf._cuda_engine.runtime = _DiesAtDispatch(buf._cuda_engine.runtime)
    start = time.monotonic()
    try:
        buf.dispatch(hidden, routing_map=routing, probs=routing.float())
        torch.cuda.synchronize()  # the dispatch kernel gives up after the timeout
        buf.dispatch(hidden, routing_map=routing, probs=routing.float())
    except HybridEPTimeoutError as error:
        print("RAISED", round(time.monotonic() - start, 1), str(error), flush=True)
        os._exit(0)  # teardown with a dead peer is not under test
    print("NO ERROR", flush=True)
    os._exit(1)


if __name__ == "__main__":
    main()
