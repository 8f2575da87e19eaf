"""Rank code of the eager form's GPU tests that the shared cases do not cover: a dispatch under
a slow emulated wire, timed, so that the parent can check the receivers waited for each tile's
emulated delivery (its signal's visible_ns) rather than only for its value."""

from __future__ import annotations

import time

import gpu_cases
import torch
from gpu_cases import Ctx, job

from cases.common import env
from cases.network import E, counter_routing


@job
def slow_wire_dispatch(ctx: Ctx, R: int, tokens: int, H: int, spec: str, calls: int) -> dict:
    """Dense routing (every token to every domain), ``calls`` eager dispatches under ``spec``:
    each output equal to the reference engine's, the wall time of each call and the network
    bytes this rank sent per call."""
    with env(HYBRID_EP_EAGER="1", HYBRID_EP_P2P_WIRE=spec, HYBRID_EP_NUM_CHANNELS="1"):
        buf = ctx.buffer(H, tokens, E, num_of_hybrid_ep_ranks_per_nvlink_domain=R)
    g = torch.Generator().manual_seed(ctx.rank)
    rmap = counter_routing(tokens, "dense", R)
    x = torch.randn(tokens, H, generator=g).to(torch.bfloat16)
    probs = torch.where(rmap, 0.5, 0.0)
    want = buf.dispatch(hidden=x, routing_map=rmap, probs=probs)  # the reference engine
    seconds, sent = [], []
    for _ in range(calls):
        buf.transport_stats(reset=True)
        ctx.sync()
        start = time.perf_counter()
        got = buf.dispatch(hidden=x.to(ctx.dev), routing_map=rmap.to(ctx.dev),
                           probs=probs.to(ctx.dev))
        ctx.sync()
        seconds.append(time.perf_counter() - start)
        sent.append(buf.transport_stats()["bytes"])
        for name, a, b in (("rows", got[0], want[0]), ("probs", got[1], want[1])):
            assert torch.equal(a.cpu(), b), f"{ctx.where()} {name} differ from the reference"
    return {"seconds": seconds, "bytes": sent, "checked": calls, "dry_run": gpu_cases.DRY_RUN}
