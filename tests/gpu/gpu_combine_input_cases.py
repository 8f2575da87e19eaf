"""Rank code of the GPU tests of get_combine_input_buffer (imported by the pool workers).

The combine input written straight into the registered buffer: its combine must equal the same
combine of an ordinary tensor bitwise (the same kernel sums the same copies in the same order)
and the reference's within BF16 rounding; one claimed tensor serves one combine; a buffer that
grows or is destroyed while such a tensor lives keeps that memory until the tensor goes.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from gpu_cases import (
    DRY_RUN,
    _dispatch_pair,
    capture_graph,
    combine_inputs,
    dispatch_with_warnings,
    domain_args,
    job,
    make_hidden,
    make_routing,
    reference_combine,
    routing_args,
)
from gpu_checks import Stats, check_combine, check_same, first_mismatch

from cases.check import plus_zero
from cases.common import raises


def _claimed(buf, spec, handle, rows: torch.Tensor) -> torch.Tensor:
    """get_combine_input_buffer's tensor with ``rows`` written into it, as an expert would."""
    zin = buf.get_combine_input_buffer(handle, hidden_dim=spec["H"])
    assert zin.shape == rows.shape and zin.dtype == torch.bfloat16, \
        f"get_combine_input_buffer: {tuple(zin.shape)} {zin.dtype}, expected " \
        f"{tuple(rows.shape)} bfloat16"
    zin.copy_(rows)
    return zin


def _check_equal(ctx, got, want, what: str) -> None:
    for i, name in ((0, "rows"), (1, "probs")):
        a, b = got[i], want[i]
        if a is None or b is None:
            assert a is None and b is None, f"{ctx.where()} {what} {name}: {a} vs {b}"
            continue
        assert torch.equal(plus_zero(a) if i == 0 else a, plus_zero(b) if i == 0 else b), \
            f"{ctx.where()} {what} {name} differ from the plain combine's: " \
            + first_mismatch(a, b)


def _dispatched(ctx, spec: dict, salt: str):
    """A buffer for ``spec``, this rank's rows (``salt``) and routing, and one dispatch of them
    checked against the reference: (buf, stats, T, x, routing, out, reference out)."""
    buf = ctx.buffer(spec["H"], spec["max_tokens"][ctx.rank], spec["E"], **domain_args(spec))
    stats = Stats()
    T = spec["tokens"][ctx.rank]
    x, _ = make_hidden(ctx, spec, T, salt)
    rt = make_routing(ctx, spec, T)
    out, ref = _dispatch_pair(ctx, buf, spec, x, None, rt, stats, "dispatch")
    return buf, stats, T, x, rt, out, ref


@job
def combine_input(ctx, spec: dict) -> dict:
    """Claimed input vs plain input (bitwise) vs reference; the round trip through a claimed
    tensor; a claimed tensor passed to a second combine, and part of one, are refused."""
    buf, stats, T, x, rt, out, ref = _dispatched(ctx, spec, "x")
    handle, rows = out[3], out[0].shape[0]

    y, yp, _, _ = combine_inputs(ctx, spec, rows, "claimed")
    plain = buf.combine(hidden=y, probs=yp, handle=handle)
    zin = _claimed(buf, spec, handle, y)
    got = buf.combine(hidden=zin, probs=yp, handle=handle)
    _check_equal(ctx, got, plain, "combine of the claimed tensor")
    exp = reference_combine(buf, spec, y.cpu(), yp.cpu() if yp is not None else None, ref[3])
    check_combine(ctx, got, exp, "combine of the claimed tensor vs reference", stats)

    # The round trip, claimed twice in a row (the second claim returns the same region).
    _claimed(buf, spec, handle, out[0])
    zin = _claimed(buf, spec, handle, out[0])
    back = buf.combine(hidden=zin, probs=out[1], handle=handle)
    _check_equal(ctx, back, buf.combine(hidden=out[0], probs=out[1], handle=handle),
                 "round trip through the claimed tensor")

    refused = 0
    everyone = torch.tensor([rows], dtype=torch.int64)
    dist.all_reduce(everyone, op=dist.ReduceOp.MIN)  # every rank refuses, or none calls
    if not DRY_RUN and int(everyone) > 0:  # the reference engine registers nothing
        with raises("again") as caught:  # a second combine of it (launches nothing)
            buf.combine(hidden=zin, probs=out[1], handle=handle)
        assert caught[0].startswith("ValueError") and "get_combine_input_buffer" in caught[0], \
            f"{ctx.where()} a second combine of it: {caught[0]}"
        refused += 1
    # Half the tokens: fewer rows, which part of the claimed tensor then has.
    half = T // 2
    out2 = buf.dispatch(hidden=x[:half], **routing_args(spec, _first(rt, half)))
    fewer = out2[0].shape[0]
    counts = torch.tensor([fewer, rows - fewer], dtype=torch.int64)
    dist.all_reduce(counts, op=dist.ReduceOp.MIN)
    wide = _claimed(buf, spec, handle, out[0])
    if not DRY_RUN and int(counts[0]) > 0 and int(counts[1]) > 0:
        part = wide[1:1 + fewer]
        with raises("part of the tensor") as caught:
            buf.combine(hidden=part, handle=out2[3])
        assert caught[0].startswith("ValueError"), f"{ctx.where()} part of it: {caught[0]}"
        refused += 1
    # The claim stands after a refused call: the next combine reads the claimed rows.
    back = buf.combine(hidden=wide, probs=out[1], handle=handle)
    _check_equal(ctx, back, buf.combine(hidden=out[0], probs=out[1], handle=handle),
                 "combine after a refused call")
    return stats.as_dict(rows=rows, refused=refused)


@job
def combine_input_graph(ctx, spec: dict, replays: int) -> dict:
    """A dispatch with a fixed handle, the expert writing into get_combine_input_buffer's tensor
    and the combine of it, captured once in a CUDA graph and replayed with fresh hidden rows:
    every replay against the reference (a capture fails on any host synchronisation, and the
    claim's barrier must stay matched with the combine's on every replay)."""
    buf, stats, T, x, _, out, ref = _dispatched(ctx, spec, "x0")
    handle = out[3]
    static_x = x.clone()

    def step():
        rows = buf.dispatch(hidden=static_x, handle=handle)[0]
        zin = buf.get_combine_input_buffer(handle)
        zin.copy_(rows * 0.5)  # the "expert": a fixed function of the rows
        return rows, buf.combine(hidden=zin, handle=handle)

    graph, (captured_rows, captured_combined) = capture_graph(ctx, step)
    for n in range(1, replays + 1):
        x, _ = make_hidden(ctx, spec, T, f"x{n}")
        static_x.copy_(x)
        graph.replay()
        ctx.sync()
        ref_rows = buf.dispatch(hidden=x.cpu(), handle=ref[3])[0]
        check_same(ctx, captured_rows, ref_rows, f"replay {n}: dispatched rows")
        exp = reference_combine(buf, spec, ref_rows * 0.5, None, ref[3])
        check_combine(ctx, captured_combined, exp, f"replay {n}: combine of the claimed tensor",
                      stats)
        ctx.quiesce()
    del graph
    return stats.as_dict(replays=replays)


def _first(rt: dict, n: int) -> dict:
    """The routing of the first ``n`` tokens (both forms)."""
    return {key: value[:n] for key, value in rt.items()}


@job
def combine_input_lifetime(ctx, spec_small: dict, spec_big: dict) -> dict:
    """A claimed tensor alive while the buffer grows and while it is destroyed: both warn on
    every rank, and the tensor keeps its memory and values; the grown buffer hands out its
    own region, and the old tensor is still an ordinary combine input."""
    r = ctx.rank
    stats = Stats()
    buf = ctx.buffer(spec_small["H"], spec_small["max_tokens"][r], spec_small["E"])
    T = spec_small["tokens"][r]
    x, _ = make_hidden(ctx, spec_small, T, "x")
    rt = make_routing(ctx, spec_small, T)
    out, ref = _dispatch_pair(ctx, buf, spec_small, x, None, rt, stats, "small dispatch")
    y, yp, _, _ = combine_inputs(ctx, spec_small, out[0].shape[0], "old")
    old = _claimed(buf, spec_small, out[3], y)
    buf.combine(hidden=old, probs=yp, handle=out[3])
    kept = old.clone()

    big, _, _, caught = dispatch_with_warnings(ctx, buf, spec_big)
    _expect_view_warning(ctx, caught, "growth")
    assert torch.equal(old, kept), f"{ctx.where()} the claimed tensor changed as the buffer grew"
    zin = _claimed(buf, spec_big, big[3], big[0])
    if not DRY_RUN and old.numel() and zin.numel():
        assert zin.data_ptr() != old.data_ptr(), \
            f"{ctx.where()} the grown buffer handed out the old region"
    # The old tensor, now outside the registered buffer, is staged like any input.
    got = buf.combine(hidden=old, probs=yp, handle=out[3])
    exp = reference_combine(buf, spec_small, y.cpu(), yp.cpu() if yp is not None else None,
                            ref[3])
    check_combine(ctx, got, exp, "combine of the pre-growth tensor", stats)

    zin = _claimed(buf, spec_big, big[3], big[0])
    kept = zin.clone()
    ctx.quiesce()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        buf.destroy()
    _expect_view_warning(ctx, caught, "destroy")
    assert torch.equal(zin, kept), f"{ctx.where()} the claimed tensor changed at destroy"
    del old, zin
    return stats.as_dict()


def _expect_view_warning(ctx, caught, when: str) -> None:
    if DRY_RUN:
        return  # nothing registered: nothing to keep
    found = [str(w.message) for w in caught if "get_combine_input_buffer" in str(w.message)]
    assert found, f"{ctx.where()} {when} with a claimed tensor alive: no warning among " \
                  f"{[str(w.message) for w in caught]}"
