"""Rank code of the GPU failure tests (test_gpu_failures.py): calls the ranks do not make alike,
peers that skip a call, and the drop-in fixes on the CUDA engine."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from gpu_cases import (
    DRY_RUN,
    Ctx,
    check_round_trip,
    job,
    make_hidden,
    make_routing,
    routing_args,
    run_spec,
)
from gpu_checks import Stats

from cases.common import env


def _spec(W: int, R: int, H: int = 512) -> dict:
    return {"seed": 4242, "W": W, "R": R, "E": 2, "H": H, "dtype": "bf16", "form": "map",
            "k": 2, "routing": "uniform", "with_probs": True, "tokens": [48] * W,
            "max_tokens": [64] * W}


def _warm_buffer(ctx: Ctx, spec: dict, limit_s: float | None = None):
    """A buffer of ``spec`` after one checked round trip on every rank (engine made, kernels
    loaded), with HYBRID_EP_TIMEOUT_S = ``limit_s`` when given."""
    warm = ctx.buffer(spec["H"], 64, spec["E"], num_of_hybrid_ep_ranks_per_nvlink_domain=spec["R"])
    run_spec(ctx, warm, spec, Stats(), salt="/warm")
    if limit_s is None:
        return warm
    ctx.drop(warm)
    del warm
    with env(HYBRID_EP_TIMEOUT_S=str(limit_s)):
        buf = ctx.buffer(spec["H"], 64, spec["E"],
                         num_of_hybrid_ep_ranks_per_nvlink_domain=spec["R"])
    x, _ = make_hidden(ctx, spec, 48, "x")
    rt = make_routing(ctx, spec, 48)
    out = buf.dispatch(hidden=x, **routing_args(spec, rt))
    check_round_trip(ctx, buf, out, x, rt, spec, "round trip before the failure")
    ctx.quiesce()
    return buf


def _mismatched(kind: str, buf, spec: dict, x, rt, handle_out):
    """This rank's part of the call of ``kind``; rank 1 differs."""
    odd = dist.get_rank() == 1
    if kind == "probs":
        kw = routing_args(spec, rt)
        if odd:
            kw.pop("probs")
        return buf.dispatch(hidden=x, **kw)
    if kind == "fp8":
        hidden = x.view(torch.uint8)[:, : x.shape[1]] if odd else x
        scales = torch.ones(x.shape[0], x.shape[1] // 128, device=x.device) if odd else None
        return buf.dispatch(hidden=hidden, scaling_factor=scales, **routing_args(spec, rt))
    tokens, probs, _, handle = handle_out
    if kind == "combine_width":
        return buf.combine(tokens[:, : tokens.shape[1] // 2] if odd else tokens, probs=probs,
                           handle=handle)
    if kind == "combine_vs_dispatch":
        if odd:
            return buf.dispatch(hidden=x, **routing_args(spec, rt))
        return buf.combine(tokens, probs=probs, handle=handle)
    raise ValueError(kind)


@job
def mismatch(ctx: Ctx, R: int, kind: str) -> dict:
    """Every rank raises HybridEPMismatchError (a ValueError) naming the other rank: at the
    call (blocking dispatch, or the reference engine) or at the next call (a combine returns
    before its kernels ran), before any data moved."""
    from hybrid_ep import HybridEPMismatchError

    spec = _spec(ctx.W, R)
    buf = _warm_buffer(ctx, spec, limit_s=20)
    x, _ = make_hidden(ctx, spec, 48, "x")
    rt = make_routing(ctx, spec, 48)
    handle_out = buf.dispatch(hidden=x, **routing_args(spec, rt))
    ctx.quiesce()
    start = time.monotonic()
    result = {"rank": ctx.rank}
    try:
        _mismatched(kind, buf, spec, x, rt, handle_out)
        ctx.sync()
        result["raised_at"] = "next call"
        buf.dispatch(hidden=x, **routing_args(spec, rt))
        result["raised_at"] = "nowhere"
    except HybridEPMismatchError as error:
        result["message"] = str(error)
    result.setdefault("raised_at", "call")
    result["seconds"] = time.monotonic() - start
    dist.barrier()
    return result


@job
def skipped(ctx: Ctx, R: int, op: str, limit_s: float) -> dict:
    """Rank 1 skips the call (``op``): rank 0 raises HybridEPTimeoutError naming the call,
    the wait site and rank 1 after about ``limit_s``; its next call raises at once."""
    spec = _spec(ctx.W, R)
    buf = _warm_buffer(ctx, spec, limit_s=limit_s)
    x, _ = make_hidden(ctx, spec, 48, "x")
    rt = make_routing(ctx, spec, 48)
    dispatched = buf.dispatch(hidden=x, **routing_args(spec, rt))
    ctx.quiesce()
    result = {"rank": ctx.rank}
    if ctx.rank == 0:
        result = _attempts(ctx, buf, op, spec, x, rt, dispatched)
    dist.barrier()  # rank 1 waits here
    return result


def _attempts(ctx: Ctx, buf, op: str, spec: dict, x, rt, dispatched) -> dict:
    """The call of ``op`` (a combine of ``dispatched``, else a dispatch) and then a dispatch,
    each timed until it raised HybridEPTimeoutError (its message kept) or returned."""
    from hybrid_ep import HybridEPTimeoutError

    result = {"rank": ctx.rank}
    for attempt in ("first", "again"):
        start = time.monotonic()
        try:
            if op == "dispatch" or attempt == "again":
                buf.dispatch(hidden=x, **routing_args(spec, rt))
            else:
                tokens, probs, _, handle = dispatched
                buf.combine(tokens, probs=probs, handle=handle)
            ctx.sync()
            buf.dispatch(hidden=x, **routing_args(spec, rt))  # raises if the GPU did
            result[attempt] = "returned"
        except HybridEPTimeoutError as error:
            result[attempt] = "timeout"
            result[f"{attempt}_message"] = str(error)
        result[f"{attempt}_seconds"] = time.monotonic() - start
    return result


@job
def starved(ctx: Ctx, R: int, op: str, limit_s: float) -> dict:
    """Every rank withholds the ring credits of ``op`` (HYBRID_EP_FAULT) on rings of 2 of the 4
    chunks: each sender has chunks 0 and 1 in its peers' rings and waits for chunk 0's credit
    before chunk 2, so every rank raises HybridEPTimeoutError naming the call, the credit wait
    and the peer after about ``limit_s``; its next call raises at once."""
    tokens = 4 * 64
    spec = {**_spec(ctx.W, R), "tokens": [tokens] * ctx.W, "max_tokens": [tokens] * ctx.W}
    warm = ctx.buffer(spec["H"], tokens, spec["E"], num_of_hybrid_ep_ranks_per_nvlink_domain=R)
    run_spec(ctx, warm, spec, Stats(), salt="/warm")  # the kernels are loaded
    ctx.drop(warm)
    del warm
    fault = f"withhold_{op}_credits"
    with env(HYBRID_EP_TIMEOUT_S=str(limit_s), HYBRID_EP_NET_RING_CHUNKS="2",
             HYBRID_EP_FAULT=fault):
        buf = ctx.buffer(spec["H"], tokens, spec["E"], num_of_hybrid_ep_ranks_per_nvlink_domain=R)
    x, _ = make_hidden(ctx, spec, tokens, "x")
    rt = make_routing(ctx, spec, tokens)
    dispatched = None
    if op == "combine":  # the dispatch's credits flow
        dispatched = buf.dispatch(hidden=x, **routing_args(spec, rt))
    ctx.quiesce()
    result = _attempts(ctx, buf, op, spec, x, rt, dispatched)
    dist.barrier()
    return result


@job
def default_device(ctx: Ctx) -> int:
    """cases.agreement.default_device under torch.set_default_device('cuda')."""
    from cases.agreement import default_device as check

    return check("cuda" if not DRY_RUN else "cpu")
