"""Rank code of the GPU receive-cap tests (imported by the pool workers, never by pytest).

A buffer whose ``max_num_of_tokens_for_experts`` is below the rows routed to its ranks: a
blocking dispatch grows the cap (warned, on every rank) and matches the reference engine with
nothing dropped; a non-blocking dispatch_with_permute drops the rows past the cap on the device
and matches the reference engine's non-blocking call, which drops the same rows (outputs,
handle, ``dropped_rows()``), and its combine_with_unpermute matches too: nothing else is lost.
"""

from __future__ import annotations

import warnings

import torch
from gpu_cases import (
    _combine_pair,
    check_round_trip,
    domain_args,
    hidden_args,
    job,
    make_hidden,
    make_routing,
    routing_args,
)
from gpu_checks import Stats, check_dispatch
from gpu_permute_cases import check_permuted, unpermute_pair


def _capped(ctx, spec: dict):
    return ctx.buffer(spec["H"], spec["max_tokens"][ctx.rank], spec["E"],
                      max_num_of_tokens_for_experts=spec["cap"], **domain_args(spec))


def _grew(caught) -> list:
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)
            and "growing max_num_of_tokens_for_experts" in str(w.message)]


@job
def blocking_grows(ctx, spec: dict) -> dict:
    """The blocking dispatch past the cap grows it to the most rows any rank is routed, then
    equals the reference (which, on the grown buffer, drops nothing)."""
    stats = Stats()
    buf = _capped(ctx, spec)
    T = spec["tokens"][ctx.rank]
    x, sf = make_hidden(ctx, spec, T, "x")
    rt = make_routing(ctx, spec, T)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = buf.dispatch(**hidden_args(spec, x, sf), **routing_args(spec, rt))
    assert _grew(caught), f"{ctx.where()} no growth warning from a dispatch past the cap " \
                          f"{spec['cap']}: {[str(w.message) for w in caught]}"
    rows = torch.tensor([out[0].shape[0]], dtype=torch.int64)
    torch.distributed.all_reduce(rows, op=torch.distributed.ReduceOp.MAX)
    assert buf.config.received_rows == int(rows), \
        f"{ctx.where()} cap grew to {buf.config.received_rows}, expected the most rows any " \
        f"rank received ({int(rows)})"
    assert int(buf.dropped_rows().item()) == 0, f"{ctx.where()} a blocking call dropped rows"
    ref = buf.dispatch(**hidden_args(spec, x, sf, on_cpu=True),
                       **routing_args(spec, rt, on_cpu=True))
    check_dispatch(ctx, out, ref, "grown-cap dispatch", x.dtype, stats)
    check_round_trip(ctx, buf, out, x, rt, spec, "grown-cap round trip")
    _combine_pair(ctx, buf, spec, out[3], ref[3], out[0].shape[0], "cap", stats,
                  "grown-cap combine")
    ctx.sync()
    return stats.as_dict(cap=buf.config.received_rows)


@job
def non_blocking_drops(ctx, spec: dict) -> dict:
    """The non-blocking dispatch_with_permute keeps the first ``cap`` rows of every rank, as
    the reference's non-blocking call does, and flags the rest in dropped_rows()."""
    stats = Stats()
    buf = _capped(ctx, spec)
    T = spec["tokens"][ctx.rank]
    x, sf = make_hidden(ctx, spec, T, "x")
    rt = make_routing(ctx, spec, T)
    P = spec["cap"] * spec["E"]  # every kept row fits, whatever its experts
    common = {"pad_multiple": spec["pad"], "fuse_permute_dispatch": spec["fused"],
              "non_blocking": True, "num_permuted_tokens": P}
    ref = buf.dispatch_with_permute(**hidden_args(spec, x, sf, on_cpu=True),
                                    **routing_args(spec, rt, on_cpu=True), **common)
    ref_dropped = int(buf.dropped_rows().item())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = buf.dispatch_with_permute(**hidden_args(spec, x, sf), **routing_args(spec, rt),
                                        **common)
        dropped = buf.dropped_rows()
    assert not _grew(caught), f"{ctx.where()} a non-blocking call grew the cap"
    assert dropped.device == ctx.dev, f"{ctx.where()} dropped_rows() on {dropped.device}"
    assert int(dropped.item()) == ref_dropped, \
        f"{ctx.where()} dropped_rows() {int(dropped.item())}, reference {ref_dropped}"
    kept = int(out[4][3].item())
    assert kept == min(kept + ref_dropped, spec["cap"]), \
        f"{ctx.where()} D={kept} with {ref_dropped} dropped and cap {spec['cap']}"
    check_permuted(ctx, out, ref, "capped non-blocking dispatch_with_permute", False, stats)
    total = torch.tensor([ref_dropped], dtype=torch.int64)
    torch.distributed.all_reduce(total)
    assert int(total) > 0, f"{ctx.where()} the spec dropped nothing: raise the routed rows"
    if spec["dtype"] == "bf16":
        unpermute_pair(ctx, buf, spec, out[4], ref[4], P, "cap", stats,
                       "capped combine_with_unpermute")
    assert buf.config.received_rows == spec["cap"], \
        f"{ctx.where()} cap changed to {buf.config.received_rows}"
    ctx.sync()
    return stats.as_dict(dropped=ref_dropped, rows=kept)
