"""Rank code of the multi-domain GPU tests that the shared cases do not cover: the network
counters of the CUDA engine (HybridEPBuffer.transport_stats) against the reference engine's
model of the same calls, and the exact put counts of dense and run-structured routing."""

from __future__ import annotations

import torch
from gpu_cases import Ctx, cpu, job

from cases.common import env

E = 2  # experts per rank


def _routing(W: int, R: int, rank: int, tokens: int, pattern: str) -> torch.Tensor:
    """Bool [tokens, E*W]. dense: every token to one expert of every rank; runs: tokens leave
    the domain only where t % 10 < 4 (runs of 4, also cut at chunk ends)."""
    rmap = torch.zeros(tokens, E * W, dtype=torch.bool)
    mine = rank // R
    for d in range(W):
        remote = d // R != mine
        for t in range(tokens):
            if pattern == "dense" or not remote or t % 10 < 4:
                rmap[t, d * E + t % E] = True
    return rmap


def _calls(buf, on: torch.device, x, scales, rmap, probs, H: int):
    """One dispatch and one combine of the given inputs on the engine of device ``on``."""
    to = (lambda t: None if t is None else t.to(on))
    out = buf.dispatch(hidden=to(x), scaling_factor=to(scales), routing_map=to(rmap),
                       probs=to(probs))
    rows = out[0].shape[0]
    y = torch.ones(rows, H, dtype=torch.bfloat16, device=on)
    combine_probs = out[1] if probs is not None else None
    buf.combine(hidden=y, probs=combine_probs, handle=out[3])
    return out


@job
def counters(ctx: Ctx, R: int, pattern: str, dtype: str, with_probs: bool, channels: int,
             tokens: int) -> dict:
    """transport_stats after one CUDA dispatch and after one CUDA combine, each equal to the
    reference engine's count of the same call; returns both for the exact-count checks."""
    H = 256
    fp8 = dtype == "fp8"
    with env(HYBRID_EP_NUM_CHANNELS=channels):
        buf = ctx.buffer(H, tokens, E, fp8=fp8, num_of_hybrid_ep_ranks_per_nvlink_domain=R)
    g = torch.Generator().manual_seed(ctx.rank)
    rmap = _routing(ctx.W, R, ctx.rank, tokens, pattern)
    if fp8:
        x = torch.randint(0, 256, (tokens, H), dtype=torch.uint8, generator=g)
        scales = torch.rand(tokens, H // 128, generator=g)
    else:
        x = torch.randn(tokens, H, generator=g).to(torch.bfloat16)
        scales = None
    probs = torch.where(rmap, 0.5, 0.0) if with_probs else None
    result = {}
    for name, device in (("cuda", ctx.dev), ("reference", torch.device("cpu"))):
        buf.transport_stats(reset=True)
        out = buf.dispatch(hidden=x.to(device), scaling_factor=cpu(scales) if device.type ==
                           "cpu" else (None if scales is None else scales.to(device)),
                           routing_map=rmap.to(device),
                           probs=None if probs is None else probs.to(device))
        ctx.sync()
        result[f"{name}_dispatch"] = buf.transport_stats(reset=True)
        rows = out[0].shape[0]
        y = torch.ones(rows, H, dtype=torch.bfloat16, device=device)
        buf.combine(hidden=y, probs=out[1], handle=out[3])
        ctx.sync()
        result[f"{name}_combine"] = buf.transport_stats(reset=True)
    for leg in ("dispatch", "combine"):
        got, want = result[f"cuda_{leg}"], result[f"reference_{leg}"]
        assert got == want, f"{ctx.where()} {leg} counters {got}, the reference counts {want}"
    return result
