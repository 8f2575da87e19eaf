"""Rank code of the GPU test of dispatches back to back with one handle (imported by the pool
workers).

Inside one NVLink domain a dispatch that reuses its handle takes no domain barrier: before
writing into a peer's receive buffer it waits until that peer has read the previous dispatch's
rows out of it. The skewed routing sends every token to the last rank, whose copy out (or
permute) of those rows is the longest of the call, while the other ranks receive nothing and
start their next dispatch at once; their rows must not land before that read is done. Every
output of a burst of calls without host synchronisation must equal the same call made alone
(the whole domain idle before and after it), and the first call the reference's. A call that
one rank refuses after its launch (a wrong ``num_dispatched_tokens``) must still release that
rank's rows: the next call then runs on every rank instead of timing out.

With the wait switched off, the fused permute case failed on the H200 (2 ranks); the plain
dispatch and the standalone permute passed, their copy-out and permute kernel reading the rows
faster than the next dispatch overwrote them (benchmarks/results/2026-12-01-receive-release.md).
"""

from __future__ import annotations

from gpu_cases import Ctx, hidden_args, job, make_hidden, make_routing, routing_args
from gpu_checks import as_bytes, check_same


def _dispatch(buf, spec: dict, rt: dict, hidden, scales, handle, on_cpu: bool = False,
              **extra):
    """The call of ``spec["op"]``: its output tensors and its handle."""
    args = hidden_args(spec, hidden, scales, on_cpu) | extra
    if handle is None:
        args.update(routing_args(spec, rt, on_cpu))
    else:
        args["handle"] = handle
        if spec["with_probs"]:
            args["probs"] = rt["probs"].cpu() if on_cpu else rt["probs"]
    if spec["op"] == "dispatch":
        *tensors, made = buf.dispatch(**args)
        return tensors, made
    out, probs, scales, tokens_per_expert, made = buf.dispatch_with_permute(
        **args, pad_multiple=16, fuse_permute_dispatch=spec["op"] == "fused permute")
    return [out, probs, scales, tokens_per_expert.to(out.device)], made


def _check_all(ctx: Ctx, got: list, exp: list, what: str) -> None:
    for n, (g, e) in enumerate(zip(got, exp, strict=True)):
        if g is None or e is None:
            assert g is None and e is None, f"{ctx.where()} {what} output {n}: {g} vs {e}"
            continue
        check_same(ctx, as_bytes(g), as_bytes(e.cpu()), f"{what} output {n}")


@job
def handle_burst(ctx: Ctx, spec: dict, calls: int) -> dict:
    """``calls`` dispatches of new rows with one handle and no synchronisation in between."""
    T = spec["tokens"][ctx.rank]
    buf = ctx.buffer(spec["H"], spec["max_tokens"][ctx.rank], spec["E"])
    rt = make_routing(ctx, spec, T)
    inputs = [make_hidden(ctx, spec, T, f"x{i}") for i in range(calls)]
    first, handle = _dispatch(buf, spec, rt, *inputs[0], None)
    ref, _ = _dispatch(buf, spec, rt, *inputs[0], None, on_cpu=True)
    _check_all(ctx, first, ref, "the first call against the reference")
    ctx.quiesce()
    burst = [_dispatch(buf, spec, rt, x, sf, handle)[0] for x, sf in inputs]
    ctx.quiesce()
    for i, (x, sf) in enumerate(inputs):
        alone, _ = _dispatch(buf, spec, rt, x, sf, handle)
        ctx.quiesce()
        _check_all(ctx, burst[i], alone, f"call {i} of the burst against the same call alone")
    wrong = {"num_dispatched_tokens": 1 << 20} if ctx.rank == 0 else {}
    try:
        _dispatch(buf, spec, rt, *inputs[0], handle, **wrong)
        refused = False
    except ValueError as error:
        assert "num_dispatched_tokens" in str(error), error
        refused = True
    assert refused == (ctx.rank == 0), f"{ctx.where()}: refused {refused}"
    after, _ = _dispatch(buf, spec, rt, *inputs[1], handle)
    ctx.quiesce()
    _check_all(ctx, after, burst[1], "the call after a refused one")
    return {"rank": ctx.rank, "rows": first[0].shape[0], "dispatches": calls + 1}
