"""Rank-side cases for the network counters (HybridEPBuffer.transport_stats)."""

from __future__ import annotations

import torch

from hybrid_ep import HybridEPBuffer

from .common import env, job_group, rank, world

E = 2  # experts per rank


def _buffer(R: int, tokens: int, channels: int, use_fp8: bool, hidden: int,
            eager: bool = False) -> HybridEPBuffer:
    with env(HYBRID_EP_NUM_CHANNELS=channels, HYBRID_EP_EAGER="1" if eager else "0"):
        return HybridEPBuffer(job_group(), hidden, tokens, E, use_fp8=use_fp8,
                              num_sms_dispatch_api=4,
                              num_of_hybrid_ep_ranks_per_nvlink_domain=R)


def counter_routing(tokens: int, pattern: str, R: int) -> torch.Tensor:
    """Bool [tokens, E_total]. dense: every token to one expert on every rank; runs: tokens go
    to the other domains only where t % 10 < 4 (runs of 4 tokens, also across chunk ends);
    local: never leaves the domain."""
    W = world()
    experts_total = E * W
    rmap = torch.zeros(tokens, experts_total, dtype=torch.bool)
    mine = rank() // R
    for t in range(tokens):
        for d in range(W):
            remote = d // R != mine
            if pattern == "dense" or (pattern == "runs" and (not remote or t % 10 < 4)) or (
                    pattern == "local" and not remote):
                rmap[t, d * E + t % E] = True
    return rmap


def expected_runs(tokens: int, chunk: int) -> list[int]:
    """Runs per chunk of the 'runs' pattern (t % 10 < 4), split at chunk ends."""
    out = []
    for c in range(-(-tokens // chunk)):
        ts = [t for t in range(c * chunk, min((c + 1) * chunk, tokens)) if t % 10 < 4]
        out.append(sum(1 for i, t in enumerate(ts) if i == 0 or ts[i - 1] != t - 1))
    return out


def dispatch_counters(R: int, pattern: str, dtype: str, with_probs: bool, channels: int,
                      my_tokens: int, max_tokens: int, calls: int = 1, eager: bool = False
                      ) -> dict:
    hidden = 256
    use_fp8 = dtype == "fp8"
    buf = _buffer(R, max_tokens, channels, use_fp8, hidden, eager)
    rmap = counter_routing(my_tokens, pattern, R)
    if use_fp8:
        x = torch.randint(0, 256, (my_tokens, hidden), dtype=torch.uint8)
        scales = torch.rand(my_tokens, hidden // 128)
    else:
        x = torch.randn(my_tokens, hidden).to(torch.bfloat16)
        scales = None
    probs = torch.where(rmap, 0.5, 0.0) if with_probs else None
    for _ in range(calls):
        buf.dispatch(x, scaling_factor=scales, routing_map=rmap, probs=probs)
    stats = buf.transport_stats(reset=True)
    assert buf.transport_stats()["puts"] == 0, "reset did not clear the counters"
    return stats


def combine_counters(R: int, pattern: str, with_probs: bool, tokens: int,
                     wire: str = "bf16", eager: bool = False) -> dict:
    """transport_stats of one combine (the dispatch's counts reset first; returned under
    "dispatch"): the partial sums of the peers' tokens that came to this domain go back to them,
    at the width of HYBRID_EP_COMBINE_WIRE=``wire`` (``eager``: HYBRID_EP_EAGER=1)."""
    hidden = 256
    with env(HYBRID_EP_COMBINE_WIRE=wire):
        buf = _buffer(R, tokens, 1, False, hidden, eager)
    rmap = counter_routing(tokens, pattern, R)
    x = torch.randn(tokens, hidden).to(torch.bfloat16)
    probs = torch.where(rmap, 0.5, 0.0) if with_probs else None
    rows, rows_probs, _, handle = buf.dispatch(x, routing_map=rmap, probs=probs)
    dispatched = buf.transport_stats(reset=True)
    buf.combine(rows, probs=rows_probs, handle=handle)
    return {**buf.transport_stats(reset=True), "dispatch": dispatched}


def wire_numerics(wire: str) -> dict:
    """2 domains x 3 ranks; every token goes to all 3 ranks of domain 0 and to two ranks of
    domain 1. combine(dispatch(x)) is BF16(BF16(3x) + BF16(2x)) with the BF16 wire (each
    domain's partial rounded once, then the partials summed in fp32 in ascending domain order)
    and BF16(5x) with the fp32 wire. Returns how many elements the two forms tell apart."""
    R, tokens, hidden = 3, 32, 256
    with env(HYBRID_EP_COMBINE_WIRE=wire):
        buf = HybridEPBuffer(job_group(), hidden, tokens, E,
                             num_of_hybrid_ep_ranks_per_nvlink_domain=R)
    experts_total = E * world()
    rmap = torch.zeros(tokens, experts_total, dtype=torch.bool)
    for d in (0, 1, 2, 3, 4):
        rmap[:, d * E] = True
    g = torch.Generator().manual_seed(100 + rank())
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    rows, _, _, handle = buf.dispatch(x, routing_map=rmap)
    combined, _ = buf.combine(rows, handle=handle)
    bf16 = ((x.float() * 3).to(torch.bfloat16).float() + 2 * x.float()).to(torch.bfloat16)
    fp32 = (x.float() * 5).to(torch.bfloat16)
    want = bf16 if wire == "bf16" else fp32
    assert torch.equal(combined.view(torch.int16), want.view(torch.int16)), \
        f"[rank {rank()}] {wire} wire: combine(dispatch(x)) is not the documented sum"
    return {"differ": int((bf16 != fp32).sum())}
