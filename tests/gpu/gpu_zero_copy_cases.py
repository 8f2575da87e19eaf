"""Rank code of the GPU tests of zero-copy dispatch outputs and combine inputs (imported by the
pool workers; docs/zero-copy.md).

Inside one domain a dispatch's outputs are blocks of the registered pool that the peers store
into, and a combine of a pool tensor is read in place: every output must equal the reference's
as the copying path's do, nothing may be copied in the steady state (copy_stats), a returned
tensor must keep its values across later calls, growth and a second buffer, and a pool too
small must fall back to copying (counted, warned once) with the same results. With several
domains and puts that read only registered memory, a dispatch's rows from the pool are what
the network's puts read: nothing staged for them.
"""

from __future__ import annotations

import warnings

import torch
from gpu_cases import (
    DRY_RUN,
    _dispatch_pair,
    combine_inputs,
    dispatch_with_warnings,
    domain_args,
    job,
    make_hidden,
    make_routing,
    reference_combine,
    routing_args,
)
from gpu_checks import Stats, check_combine, check_dispatch, check_same

from cases.common import env


def _round(ctx, buf, spec, salt: str, stats: Stats):
    """A fresh-routing dispatch, a dispatch with its handle and the combine of its rows, each
    against the reference. Returns (dispatch out, its reference out)."""
    T = spec["tokens"][ctx.rank]
    x, _ = make_hidden(ctx, spec, T, salt)
    rt = make_routing(ctx, spec, T, salt=f"routing{salt}")
    out, ref = _dispatch_pair(ctx, buf, spec, x, None, rt, stats, f"dispatch {salt}")
    again = buf.dispatch(hidden=x, handle=out[3])
    check_dispatch(ctx, again, buf.dispatch(hidden=x.cpu(), handle=ref[3]),
                   f"dispatch {salt} with its handle", x.dtype, stats)
    got = buf.combine(hidden=out[0], probs=out[1], handle=out[3])
    exp = reference_combine(buf, spec, ref[0], ref[1], ref[3])
    check_combine(ctx, got, exp, f"combine {salt}", stats)
    return out, ref


def _copied(buf) -> dict:
    s = buf.copy_stats()
    return {k: s[k] for k in ("dispatch_zero_copy", "dispatch_bytes_copied",
                              "combine_bytes_staged", "pool_fallbacks")}


@job
def steady(ctx, spec: dict) -> dict:
    """Rounds of dispatch / dispatch with handle / combine against the reference: nothing copied
    after the first; the first round's outputs keep their values through the later rounds; an
    output read on another stream; empty_zero_copy's tensor combined in place, bitwise equal to
    the combine of an ordinary tensor of the same rows."""
    stats = Stats()
    buf = ctx.buffer(spec["H"], spec["max_tokens"][ctx.rank], spec["E"])
    first, first_ref = _round(ctx, buf, spec, "a", stats)
    kept = [t.clone() if t is not None else None for t in first[:3]]
    buf.copy_stats(reset=True)
    for salt in ("b", "c", "d"):
        _round(ctx, buf, spec, salt, stats)
    copied = _copied(buf)
    if not DRY_RUN:
        copies = {k: v for k, v in copied.items() if k != "dispatch_zero_copy"}
        assert copies == {"dispatch_bytes_copied": 0, "combine_bytes_staged": 0,
                          "pool_fallbacks": 0}, f"{ctx.where()} copies in the steady state: " \
                                                f"{buf.copy_stats()}"
    for i, t in enumerate(kept):
        if t is not None:
            assert torch.equal(first[i], t), f"{ctx.where()} output {i} of the first dispatch " \
                                             "changed during later calls"
    check_same(ctx, first[0], first_ref[0], "first dispatch's rows after later calls")

    # Another stream reads an output (ordered after the dispatch, as torch asks).
    side = torch.cuda.Stream(ctx.dev) if ctx.dev.type == "cuda" else None
    rows = first[0]
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(ctx.dev))
        with torch.cuda.stream(side):
            doubled = rows.float() * 2
        torch.cuda.current_stream(ctx.dev).wait_stream(side)
    else:
        doubled = rows.float() * 2
    assert torch.equal(doubled.cpu(), first_ref[0].float() * 2), \
        f"{ctx.where()} an output read on another stream"

    # Expert outputs in the pool: the combine reads them in place.
    n = first[0].shape[0]
    y, yp, _, _ = combine_inputs(ctx, spec, n, "pooled")
    pooled = buf.empty_zero_copy(n, spec["H"], dtype=torch.bfloat16, device=ctx.dev)
    pooled.copy_(y)
    if yp is not None:  # probs in the pool too: nothing staged at all
        pooled_probs = buf.empty_zero_copy(*yp.shape, dtype=torch.float32, device=ctx.dev)
        pooled_probs.copy_(yp)
        yp = pooled_probs
    before = buf.copy_stats()["combine_zero_copy"]
    got = buf.combine(hidden=pooled, probs=yp, handle=first[3])
    if not DRY_RUN and n > 0:
        assert buf.copy_stats()["combine_zero_copy"] == before + 1, \
            f"{ctx.where()} combine of empty_zero_copy's tensor was staged: {buf.copy_stats()}"
    plain = buf.combine(hidden=y.clone(), probs=yp, handle=first[3])
    assert torch.equal(got[0], plain[0]), f"{ctx.where()} combine of a pool tensor differs"
    exp = reference_combine(buf, spec, y.cpu(), yp.cpu() if yp is not None else None,
                            first_ref[3])
    check_combine(ctx, got, exp, "combine of a pool tensor vs reference", stats)
    # The steady state's counts: the combine of the ordinary tensor above stages, as it should.
    return stats.as_dict(**copied)


@job
def fallback(ctx, spec: dict, pool_mb: str, zero_copy: str) -> dict:
    """A pool too small for the outputs (or zero-copy off): the calls copy, with results equal
    to the reference; too small a pool counts its fallbacks and warns once."""
    stats = Stats()
    with env(HYBRID_EP_ZERO_COPY_POOL_MB=pool_mb, HYBRID_EP_ZERO_COPY=zero_copy):
        buf = ctx.buffer(spec["H"], spec["max_tokens"][ctx.rank], spec["E"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for salt in ("a", "b"):
                _round(ctx, buf, spec, salt, stats)
    s = buf.copy_stats()
    warned = [w for w in caught if "zero-copy pool" in str(w.message)]
    if not DRY_RUN and spec["tokens"][ctx.rank] > 0:
        assert s["dispatch_zero_copy"] == 0 and s["dispatch_copied"] >= 1, \
            f"{ctx.where()} copy_stats {s}"
        if zero_copy == "1":
            assert s["pool_fallbacks"] >= 1 and len(warned) == 1, \
                f"{ctx.where()} fallbacks {s}, warnings {[str(w.message) for w in warned]}"
        else:
            assert s["pool_fallbacks"] == 0 and not warned, f"{ctx.where()} {s}"
    return stats.as_dict(fallbacks=s["pool_fallbacks"], warned=len(warned))


@job
def two_buffers_and_growth(ctx, spec_a: dict, spec_small: dict, spec_big: dict) -> dict:
    """Two buffers' outputs interleaved, each against the reference; then one grows while an
    output of its old pool is alive: that output keeps its values."""
    stats = Stats()
    a = ctx.buffer(spec_a["H"], spec_a["max_tokens"][ctx.rank], spec_a["E"])
    b = ctx.buffer(spec_small["H"], spec_small["max_tokens"][ctx.rank], spec_small["E"])
    out_a, ref_a = _round(ctx, a, spec_a, "a", stats)
    out_b, ref_b = _round(ctx, b, spec_small, "b", stats)
    _round(ctx, a, spec_a, "a2", stats)
    check_same(ctx, out_a[0], ref_a[0], "buffer A's rows after buffer B's calls")
    kept = out_b[0].clone()
    big, x, rt, _ = dispatch_with_warnings(ctx, b, spec_big)
    assert torch.equal(out_b[0], kept), f"{ctx.where()} an output changed as its buffer grew"
    ref_big = b.dispatch(hidden=x.cpu(), **routing_args(spec_big, rt, on_cpu=True))
    check_dispatch(ctx, big, ref_big, "dispatch after growth", x.dtype, stats)
    check_same(ctx, out_b[0], ref_b[0], "pre-growth rows after growth")
    return stats.as_dict()


@job
def network_sources(ctx, spec: dict) -> dict:
    """Several domains, puts that read only registered memory (HYBRID_EP_FAULT=
    stage_network_sources: the p2p build behaves as doca's puts do): a dispatch of an ordinary
    tensor stages its rows for the network; the same rows in a tensor from empty_zero_copy are
    read in place, with the same results."""
    stats = Stats()
    with env(HYBRID_EP_FAULT="stage_network_sources", HYBRID_EP_ZERO_COPY_POOL_MB="64"):
        buf = ctx.buffer(spec["H"], spec["max_tokens"][ctx.rank], spec["E"], **domain_args(spec))
    T = spec["tokens"][ctx.rank]
    x, _ = make_hidden(ctx, spec, T, "n")
    rt = make_routing(ctx, spec, T, salt="routingn")
    out, ref = _dispatch_pair(ctx, buf, spec, x, None, rt, stats, "dispatch, sources staged")
    staged = buf.copy_stats()["network_bytes_staged"]
    pooled = buf.empty_zero_copy(*x.shape, dtype=x.dtype, device=ctx.dev)
    pooled.copy_(x)
    again = buf.dispatch(hidden=pooled, handle=out[3])
    check_dispatch(ctx, again, buf.dispatch(hidden=x.cpu(), handle=ref[3]),
                   "dispatch of a pool tensor, sources read in place", x.dtype, stats)
    pooled_staged = buf.copy_stats()["network_bytes_staged"] - staged
    return stats.as_dict(tokens=T, staged=staged, pooled_staged=pooled_staged)
