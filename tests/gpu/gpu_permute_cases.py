"""Rank code of the GPU permute tests (imported by the pool workers, never by pytest itself).

As in ``gpu_cases``, the oracle of every CUDA call is the same call with CPU copies of the
inputs through the same ``HybridEPBuffer`` (the reference engine). Permuted outputs, tokens per
expert and the 11-entry handle must match bitwise; combine_with_unpermute within BF16 rounding
of the fp32 sum (usually bitwise), its probs exactly. A permute spec is a ``gpu_specs`` spec
plus ``pad`` (pad_multiple), ``budget`` (``exact``: the blocking size; ``over``: one pad less
per expert, so rows drop; ``under``: two pads more) and ``non_blocking``.
"""

from __future__ import annotations

import torch
from gpu_cases import (
    FP8_KINDS,
    capture_graph,
    cpu,
    domain_args,
    hidden_args,
    job,
    make_hidden,
    make_routing,
    nobody_received,
    routing_args,
)
from gpu_checks import Stats, as_bytes, check_combine, check_same

from cases.check import plus_zero

PERMUTE_HANDLE_TENSORS = {0: "sparse_to_dense_map", 1: "rdma_to_attn_map",
                          2: "attn_to_rdma_map", 3: "num_dispatched_tokens_tensor",
                          4: "local_expert_routing_map", 5: "dense_chunk_layout",
                          6: "dense_to_expert_map", 7: "tokens_per_expert", 10: "overflow"}


def check_permute_handle(ctx, handle, ref, what: str, blocking: bool) -> None:
    assert isinstance(handle, tuple) and len(handle) == 11, \
        f"{ctx.where()} {what}: expected an 11-tuple handle, got {type(handle).__name__}"
    for pos, name in PERMUTE_HANDLE_TENSORS.items():
        check_same(ctx, handle[pos], ref[pos], f"{what} handle[{pos}] {name}")
    assert handle[8] == ref[8], f"{ctx.where()} {what} handle[8]: {handle[8]} vs {ref[8]}"
    fields = ["buffer_id", "num_tokens", "num_permuted_tokens", "pad_multiple"]
    if blocking:  # a non-blocking CUDA call leaves the dispatched count on the device
        fields.append("num_dispatched_tokens")
    for field in fields:
        got, exp = getattr(handle[9], field), getattr(ref[9], field)
        assert got == exp, f"{ctx.where()} {what} handle[9].{field}: {got} vs reference {exp}"


def check_permuted(ctx, out, ref, what: str, blocking: bool, stats: Stats) -> None:
    assert isinstance(out, tuple) and len(out) == 5, \
        f"{ctx.where()} {what}: dispatch_with_permute returned {type(out).__name__}"
    check_same(ctx, as_bytes(out[0]), as_bytes(ref[0]), f"{what}: permuted tokens")
    check_same(ctx, out[1], ref[1], f"{what}: permuted probs")
    check_same(ctx, out[2], ref[2], f"{what}: permuted scaling_factor")
    tpe = out[3]
    if blocking:
        assert tpe.device.type == "cpu", \
            f"{ctx.where()} {what}: blocking tokens_per_expert on {tpe.device}, expected the CPU"
        assert tpe.is_pinned() or ctx.dev.type == "cpu", \
            f"{ctx.where()} {what}: blocking tokens_per_expert must be pinned CPU memory"
        assert torch.equal(tpe, ref[3]), f"{ctx.where()} {what}: tokens_per_expert {tpe} vs {ref[3]}"
    else:
        check_same(ctx, tpe, ref[3], f"{what}: tokens_per_expert")
    check_permute_handle(ctx, out[4], ref[4], what, blocking)
    stats.dispatches += 1


def budget_of(spec: dict, exact: int, E: int) -> int:
    pad = spec["pad"] or 1
    if spec["budget"] == "exact":
        return exact
    if spec["budget"] == "over":
        return max(exact - pad * E, 0)
    return exact + 2 * pad


def permute_pair(ctx, buf, spec, x, sf, rt, stats, what, **extra):
    """CUDA dispatch_with_permute and its reference (blocking on the CPU, with the budget of the
    spec). Returns (out, ref)."""
    blocking = not spec["non_blocking"]
    common = {"pad_multiple": spec["pad"], "fuse_permute_dispatch": spec["fused"]}
    ref_args = {**hidden_args(spec, x, sf, on_cpu=True), **routing_args(spec, rt, on_cpu=True)}
    exact = buf.dispatch_with_permute(**ref_args, **common)
    P = budget_of(spec, exact[0].shape[0], spec["E"])
    if spec["budget"] != "exact" or not blocking:
        common["num_permuted_tokens"] = P
        ref = buf.dispatch_with_permute(**ref_args, **common)
    else:
        ref = exact
    out = buf.dispatch_with_permute(**hidden_args(spec, x, sf), **routing_args(spec, rt),
                                    non_blocking=spec["non_blocking"], **common, **extra)
    check_permuted(ctx, out, ref, what, blocking, stats)
    return out, ref


def unpermute_pair(ctx, buf, spec, handle, ref_handle, rows, salt, stats, what):
    g = ctx.generator(spec["seed"], ctx.rank, "unpermute", salt)
    y = torch.randn((rows, spec["H"]), generator=g, device=ctx.dev).to(torch.bfloat16)
    yp = torch.rand((rows,), generator=g, device=ctx.dev) if spec["with_probs"] else None
    common = {"pad_multiple": spec["pad"], "fuse_unpermute_combine": spec["fused"]}
    got = buf.combine_with_unpermute(hidden=y, probs=yp, handle=handle, **common)
    if nobody_received(ref_handle):
        T = ref_handle[9].num_tokens
        exp = (torch.zeros((T, spec["H"]), dtype=torch.bfloat16),
               torch.zeros((T, spec["W"] * spec["E"])) if yp is not None else None)
    else:
        exp = buf.combine_with_unpermute(hidden=y.cpu(), probs=cpu(yp), handle=ref_handle,
                                         **common)
    check_combine(ctx, got, exp, what, stats)


@job
def permute_combine(ctx, spec: dict) -> dict:
    """dispatch_with_permute, combine_with_unpermute, then the backward pattern: the handle
    reused by dispatch_with_permute (hidden, handle, pad_multiple, num_permuted_tokens only)
    and by combine_with_unpermute again."""
    buf = ctx.buffer(spec["H"], spec["max_tokens"][ctx.rank], spec["E"],
                     fp8=spec["dtype"] in FP8_KINDS, **domain_args(spec))
    stats = Stats()
    T = spec["tokens"][ctx.rank]
    x, sf = make_hidden(ctx, spec, T, "x")
    rt = make_routing(ctx, spec, T)
    out, ref = permute_pair(ctx, buf, spec, x, sf, rt, stats, "dispatch_with_permute")
    handle, ref_handle = out[4], ref[4]
    P = out[0].shape[0]
    if spec["dtype"] == "bf16":
        unpermute_pair(ctx, buf, spec, handle, ref_handle, P, "a", stats,
                       "combine_with_unpermute")
    # backward of combine: only hidden, handle, pad_multiple, num_permuted_tokens
    g = make_hidden(ctx, {**spec, "dtype": "bf16"}, T, "grad")[0]  # gradients are BF16
    back = buf.dispatch_with_permute(hidden=g, handle=handle, pad_multiple=spec["pad"],
                                     num_permuted_tokens=P,
                                     fuse_permute_dispatch=spec["fused"])
    back_ref = buf.dispatch_with_permute(hidden=as_bytes(g.cpu()), handle=ref_handle,
                                         pad_multiple=spec["pad"], num_permuted_tokens=P,
                                         fuse_permute_dispatch=spec["fused"])
    check_same(ctx, as_bytes(back[0]), as_bytes(back_ref[0]), "backward dispatch_with_permute")
    if spec["dtype"] == "bf16":
        unpermute_pair(ctx, buf, spec, handle, ref_handle, P, "b", stats,
                       "combine_with_unpermute with the reused handle")
    ctx.sync()
    return stats.as_dict(rows=P)


@job
def mode_mismatch(ctx, spec: dict) -> dict:
    """A permute handle refused by plain combine, a plain handle by combine_with_unpermute."""
    buf = ctx.buffer(spec["H"], spec["max_tokens"][ctx.rank], spec["E"])
    T = spec["tokens"][ctx.rank]
    x, _ = make_hidden(ctx, spec, T, "x")
    rt = make_routing(ctx, spec, T)
    permuted = buf.dispatch_with_permute(hidden=x, **routing_args(spec, rt))
    plain = buf.dispatch(hidden=x, **routing_args(spec, rt))
    messages = []
    for call in (lambda: buf.combine(hidden=plain[0], handle=permuted[4]),
                 lambda: buf.combine_with_unpermute(hidden=permuted[0], handle=plain[3])):
        try:
            call()
        except ValueError as error:
            messages.append(str(error))
        else:
            raise AssertionError(f"{ctx.where()} a handle of the other mode was accepted")
    ctx.sync()
    return {"messages": messages}


@job
def graph_replay(ctx, spec: dict, replays: int) -> dict:
    """The non-blocking dispatch_with_permute + combine_with_unpermute pair captured once in a
    CUDA graph and replayed with fresh inputs (same shapes), every replay against the
    reference. Routing in ``spec["form"]``: a capture fails on any host synchronisation, so
    the topk form also shows that its conversion has none."""
    buf = ctx.buffer(spec["H"], spec["max_tokens"][ctx.rank], spec["E"], **domain_args(spec))
    stats = Stats()
    T = spec["tokens"][ctx.rank]

    def fresh(n):
        x, _ = make_hidden(ctx, spec, T, f"x{n}")
        rt = make_routing(ctx, spec, T, f"routing{n}")
        return x, rt

    x0, rt0 = fresh(0)
    # A budget every replay fits: each expert gets every dispatch row at most.
    pad = spec["pad"]
    P = spec["E"] * -(-T * spec["W"] // pad) * pad
    static_x = x0.clone()
    static_rt = {key: value.clone() for key, value in rt0.items()}
    static_y = torch.zeros((P, spec["H"]), dtype=torch.bfloat16, device=ctx.dev)

    def step():
        out = buf.dispatch_with_permute(hidden=static_x, **routing_args(spec, static_rt),
                                        pad_multiple=spec["pad"],
                                        num_permuted_tokens=P, non_blocking=True,
                                        fuse_permute_dispatch=spec.get("fused", False))
        # the "expert": a fixed function of the permuted rows
        static_y.copy_(out[0] * 0.5 + out[1].unsqueeze(1).to(torch.bfloat16))
        combined = buf.combine_with_unpermute(hidden=static_y, probs=out[1], handle=out[4],
                                              pad_multiple=spec["pad"],
                                              fuse_unpermute_combine=spec.get("fused", False))
        return out, combined

    graph, (captured_out, captured_combined) = capture_graph(ctx, step)
    for n in range(1, replays + 1):
        x, rt = fresh(n)
        static_x.copy_(x)
        for key, value in rt.items():
            static_rt[key].copy_(value)
        graph.replay()
        ctx.sync()
        ref = buf.dispatch_with_permute(hidden=x.cpu(), **routing_args(spec, rt, on_cpu=True),
                                        pad_multiple=spec["pad"], num_permuted_tokens=P,
                                        non_blocking=True)
        what = f"replay {n}"
        check_same(ctx, captured_out[0], ref[0], f"{what}: permuted tokens")
        check_same(ctx, captured_out[1], ref[1], f"{what}: permuted probs")
        check_same(ctx, captured_out[3], ref[3], f"{what}: tokens_per_expert")
        check_same(ctx, captured_out[4][6], ref[4][6], f"{what}: dense_to_expert_map")
        ref_y = ref[0] * 0.5 + ref[1].unsqueeze(1).to(torch.bfloat16)
        exp = buf.combine_with_unpermute(hidden=ref_y, probs=ref[1], handle=ref[4],
                                         pad_multiple=spec["pad"])
        check_combine(ctx, captured_combined, exp, f"{what}: combine_with_unpermute", stats)
        ctx.quiesce()
    del graph
    return stats.as_dict(replays=replays)


class _Holder:
    """What the autograd functions below share: the buffer, the handle, the pad."""

    def __init__(self, buf, pad: int):
        self.buf, self.pad, self.handle, self.rows = buf, pad, None, 0


class _DispatchPermute(torch.autograd.Function):
    """Like Megatron's fused dispatch: backward is combine_with_unpermute of the gradients."""

    @staticmethod
    def forward(ctx, hidden, probs, routing_map, holder):
        out = holder.buf.dispatch_with_permute(hidden=hidden, routing_map=routing_map,
                                               probs=probs, pad_multiple=holder.pad)
        holder.handle, holder.rows = out[4], out[0].shape[0]
        ctx.holder = holder
        return out[0], out[1]

    @staticmethod
    def backward(ctx, grad_rows, grad_probs):
        h = ctx.holder
        grad_hidden, grad_dense_probs = h.buf.combine_with_unpermute(
            hidden=grad_rows.contiguous(), probs=grad_probs.contiguous(), handle=h.handle,
            pad_multiple=h.pad)
        return grad_hidden, grad_dense_probs, None, None


class _CombineUnpermute(torch.autograd.Function):
    """Like Megatron's fused combine: backward re-dispatches the gradient with the handle."""

    @staticmethod
    def forward(ctx, rows, holder):
        ctx.holder = holder
        return holder.buf.combine_with_unpermute(hidden=rows, handle=holder.handle,
                                                 pad_multiple=holder.pad)[0]

    @staticmethod
    def backward(ctx, grad_out):
        h = ctx.holder
        out = h.buf.dispatch_with_permute(hidden=grad_out.contiguous(), handle=h.handle,
                                          pad_multiple=h.pad, num_permuted_tokens=h.rows)
        return out[0], None


@job
def autograd_round_trip(ctx, spec: dict) -> dict:
    """dispatch_with_permute -> an "expert" (rows scaled by their probs) -> combine_with_unpermute
    through the autograd functions above; the gradients of hidden and probs on CUDA against the
    same graph on the reference engine."""
    buf = ctx.buffer(spec["H"], spec["max_tokens"][ctx.rank], spec["E"], **domain_args(spec))
    stats = Stats()
    T = spec["tokens"][ctx.rank]
    x, _ = make_hidden(ctx, spec, T, "x")
    rt = make_routing(ctx, spec, T)
    g = ctx.generator(spec["seed"], ctx.rank, "weights")
    w = torch.randn((T, spec["H"]), generator=g, device=ctx.dev)
    grads = {}
    for where, dev in (("cuda", ctx.dev), ("reference", torch.device("cpu"))):
        hidden = x.to(dev).detach().requires_grad_(True)
        probs = rt["probs"].to(dev).detach().requires_grad_(True)
        holder = _Holder(buf, spec["pad"])
        rows, row_probs = _DispatchPermute.apply(hidden, probs, rt["map"].to(dev), holder)
        expert = rows * row_probs.unsqueeze(1).to(rows.dtype)
        combined = _CombineUnpermute.apply(expert, holder)
        (combined.float() * w.to(dev)).sum().backward()
        grads[where] = (hidden.grad, probs.grad, combined.detach())
    got, exp = grads["cuda"], grads["reference"]
    for name, a, b in (("combined", got[2], exp[2]), ("hidden.grad", got[0], exp[0])):
        torch.testing.assert_close(a.cpu().float(), b.float(), rtol=1e-2, atol=1e-2,
                                   msg=lambda m, name=name: f"{ctx.where()} {name}: {m}")
    torch.testing.assert_close(got[1].cpu(), exp[1], rtol=1e-2, atol=1e-2,
                               msg=lambda m: f"{ctx.where()} probs.grad: {m}")
    stats.combines += 1
    stats.bitwise += int(torch.equal(plus_zero(got[2].cpu()), plus_zero(exp[2])))
    ctx.sync()
    return stats.as_dict()
