"""dispatch_with_permute / combine_with_unpermute cases (run on every rank of a pool)."""

from __future__ import annotations

import torch

from .check import assert_combined, assert_same, plus_zero, round_trip_rows
from .common import as_tensor_count, env, make_buffer, rank
from .dispatch import check_dispatch_handle, handle_T
from .inputs import gen_all_inputs, gen_combine_inputs, routing_kwargs
from .oracle import Oracle

MODES = ("blocking", "blocking_P", "nb_int", "nb_tensor")


def _call_kwargs(mode: str, P: int) -> dict:
    if mode == "blocking":
        return {"non_blocking": False}
    if mode == "blocking_P":
        return {"non_blocking": False, "num_permuted_tokens": P}
    if mode == "nb_int":
        return {"non_blocking": True, "num_permuted_tokens": P}
    if mode == "nb_tensor":
        return {"non_blocking": True, "num_permuted_tokens": as_tensor_count(P)}
    raise ValueError(mode)


def check_permute(out, exp: dict, orc: Oracle, r: int, T: int, what: str,
                  hidden_dtype, chunk: int = 64, check_handle: bool = True) -> tuple:
    assert isinstance(out, tuple) and len(out) == 5, \
        f"[rank {r}] {what}: dispatch_with_permute returned {type(out).__name__}"
    tokens, probs, scales, tpe, handle = out
    P, valid = exp["P"], exp["valid"]
    # The tail past the padded total is unspecified: compare the leading `valid` rows.
    assert isinstance(tokens, torch.Tensor) and tuple(tokens.shape) == (P, orc.H), \
        f"[rank {r}] {what}: tokens shape {getattr(tokens, 'shape', None)}, expected {(P, orc.H)}"
    assert_same(tokens[:valid], exp["tokens"][:valid], f"{what}: permuted tokens", r,
                dtype=hidden_dtype)
    if exp["probs"] is None:
        assert_same(probs, None, f"{what}: permuted probs", r)
    else:
        assert isinstance(probs, torch.Tensor) and tuple(probs.shape) == (P,), \
            f"[rank {r}] {what}: probs shape {getattr(probs, 'shape', None)}, expected {(P,)}"
        assert_same(probs[:valid], exp["probs"][:valid], f"{what}: permuted probs", r)
    if exp["scaling_factor"] is None:
        assert_same(scales, None, f"{what}: permuted scaling_factor", r)
    else:
        assert isinstance(scales, torch.Tensor) and tuple(scales.shape) == (P, orc.H // 128), \
            f"[rank {r}] {what}: scaling_factor shape {getattr(scales, 'shape', None)}"
        assert_same(scales[:valid], exp["scaling_factor"][:valid],
                    f"{what}: permuted scaling_factor", r)
    assert_same(tpe, torch.tensor(exp["tokens_per_expert"], dtype=torch.int64),
                f"{what}: tokens_per_expert", r)
    # no count ever points past the output
    assert int(tpe.sum()) <= P, f"[rank {r}] {what}: tokens_per_expert {tpe.tolist()} > {P} rows"
    if check_handle:
        check_permute_handle(handle, exp, orc, r, T, what, chunk)
    return out


def check_permute_handle(handle, exp: dict, orc: Oracle, r: int, T: int, what: str,
                         chunk: int = 64) -> None:
    assert isinstance(handle, tuple) and len(handle) == 11, \
        f"[rank {r}] {what}: permute handle should be an 11-tuple"
    check_dispatch_handle(handle[:5] + (handle[8], handle[9]), orc, r, T)
    assert_same(handle[5], orc.dense_chunk_layout(r, T, chunk),
                f"{what}: handle[5] dense_chunk_layout", r)
    assert_same(handle[6], exp["dense_to_expert_map"], f"{what}: handle[6] dense_to_expert_map", r)
    assert_same(handle[7], torch.tensor(exp["counts"], dtype=torch.int32),
                f"{what}: handle[7] tokens_per_expert (raw)", r)
    assert_same(handle[8], T, f"{what}: handle[8] num_of_tokens_per_rank", r)
    assert handle[9] is not None, f"[rank {r}] {what}: handle[9] (config) is None"
    assert_same(handle[10], torch.tensor([exp["overflow"]], dtype=torch.int32),
                f"{what}: handle[10] overflow flag", r)


def _unpermute_checks(buf, spec, orc, inputs, handle, pad_multiple, fuse, exps, P_of,
                      tokens, probs, what, roundtrip=True):
    """combine_with_unpermute: the round trip (BF16) and independent per-rank inputs."""
    r = rank()
    W = spec["W"]
    if roundtrip and spec["dtype"] == "bf16":
        combined, cprobs = buf.combine_with_unpermute(
            hidden=tokens, probs=probs, handle=handle, pad_multiple=pad_multiple,
            fuse_unpermute_combine=fuse)
        want = round_trip_rows(inputs[r]["hidden"], orc.kept_expert_copies(r, exps))
        assert_same(plus_zero(combined), plus_zero(want),
                    f"{what}: combine_with_unpermute(permute(x)) vs x * copies", r)
        if not spec["with_probs"]:
            assert_same(cprobs, None, f"{what}: combined_probs", r)
        elif all(e["overflow"] == 0 for e in exps):
            assert_same(cprobs, orc.dense_probs(r), f"{what}: combined_probs vs probs", r)
    combine_in = [gen_combine_inputs(spec, d, P_of[d], 0, salt=f"unpermute{P_of[d]}")
                  for d in range(W)]
    y, yp = combine_in[r]
    combined, cprobs = buf.combine_with_unpermute(
        hidden=y, probs=yp, handle=handle, pad_multiple=pad_multiple,
        fuse_unpermute_combine=fuse)
    exp = orc.combine(r, [c[0] for c in combine_in], [c[1] for c in combine_in],
                      d2e_maps=[e["dense_to_expert_map"] for e in exps])
    assert_combined(combined, exp, f"{what}: combine_with_unpermute combined_token", r)
    assert_same(cprobs, exp["probs"], f"{what}: combine_with_unpermute combined_probs", r)


def permute_combine(spec: dict, pad_multiple, modes=MODES, fuses=(False, True),
                    chunk: int | None = None, combine_modes=None) -> int:
    """dispatch_with_permute in each mode and fuse flag against the oracle (and each other),
    the permute handle, and combine_with_unpermute for the modes in ``combine_modes``."""
    with env(NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API=chunk):
        return _permute_combine(spec, pad_multiple, modes, fuses, chunk or 64,
                                combine_modes if combine_modes is not None else modes)


def _permute_combine(spec, pad_multiple, modes, fuses, chunk, combine_modes):
    r = rank()
    W = spec["W"]
    inputs = gen_all_inputs(spec)
    orc = Oracle(spec, inputs)
    buf = make_buffer(spec)
    mine = inputs[r]
    T = None
    first = None
    for fuse in fuses:
        for mode in modes:
            what = f"mode={mode} fuse={fuse} pad_multiple={pad_multiple}"
            P = orc.permute(r, pad_multiple)["P"]
            out = buf.dispatch_with_permute(
                hidden=mine["hidden"], scaling_factor=mine["scaling_factor"],
                pad_multiple=pad_multiple, fuse_permute_dispatch=fuse,
                **routing_kwargs(spec, mine, permute=True), **_call_kwargs(mode, P))
            handle = out[4] if isinstance(out, tuple) and len(out) == 5 else None
            if T is None and isinstance(handle, tuple) and len(handle) == 11:
                T = handle_T(handle, spec)
            exps = [orc.permute(d, pad_multiple, T=T) for d in range(W)]
            check_permute(out, exps[r], orc, r, T, what, mine["hidden"].dtype, chunk)
            if first is None:
                first = out
            else:  # identical across modes and fuse flags
                for pos in range(4):
                    assert_same(out[pos], first[pos], f"{what}: output {pos} vs the first call", r)
            if mode in combine_modes:
                _unpermute_checks(buf, spec, orc, inputs, handle, pad_multiple, fuse, exps,
                                  [e["P"] for e in exps], out[0], out[1], what)
    return T


BUDGETS = ("zero", "half", "minus_pad", "minus_one", "exact", "plus")


def _budget(kind: str, total: int, pad: int) -> int:
    if kind == "zero":
        return 0
    if kind == "half":
        return pad * (total // (2 * pad))
    if kind == "minus_pad":
        return max(0, total - pad)
    if kind == "minus_one":  # one row short (multiple of pad only when pad is 1)
        return max(0, total - 1) if pad == 1 else max(0, total - pad)
    if kind == "exact":
        return total
    if kind == "plus":
        return total + 3 * pad
    raise ValueError(kind)


def permute_budget(spec: dict, pad_multiple, fuse: bool = False, budgets=BUDGETS,
                   count_as_tensor: bool = True) -> list:
    """Non-blocking dispatch_with_permute with a too small (overflow) or too large (underflow)
    num_permuted_tokens, then combine_with_unpermute; returns the overflow flags seen."""
    r = rank()
    W = spec["W"]
    pad = 1 if pad_multiple in (None, 0, 1) else pad_multiple
    inputs = gen_all_inputs(spec)
    orc = Oracle(spec, inputs)
    buf = make_buffer(spec)
    mine = inputs[r]
    T = max(spec["max_tokens"])
    flags = []
    for kind in budgets:
        totals = [orc.permute(d, pad_multiple, T=T)["total"] for d in range(W)]
        P_of = [_budget(kind, tot, pad) for tot in totals]
        exps = [orc.permute(d, pad_multiple, P=P_of[d], T=T) for d in range(W)]
        what = f"budget={kind} P={P_of[r]} total={totals[r]} pad_multiple={pad_multiple}"
        P = as_tensor_count(P_of[r]) if count_as_tensor else P_of[r]
        out = buf.dispatch_with_permute(
            hidden=mine["hidden"], scaling_factor=mine["scaling_factor"],
            pad_multiple=pad_multiple, fuse_permute_dispatch=fuse, non_blocking=True,
            num_permuted_tokens=P, **routing_kwargs(spec, mine, permute=True))
        check_permute(out, exps[r], orc, r, T, what, mine["hidden"].dtype)
        flags.append(exps[r]["overflow"])
        _unpermute_checks(buf, spec, orc, inputs, out[4], pad_multiple, fuse, exps, P_of,
                          out[0], out[1], what)
    return flags


def permute_backward(spec: dict, pad_multiple, fuse: bool, non_blocking: bool) -> None:
    """Megatron's backward pattern: combine's backward calls dispatch_with_permute(hidden=grad,
    scaling_factor=None, handle=h, ...) with no routing; dispatch's backward calls
    combine_with_unpermute(hidden=grad, probs=grad_probs, handle=h, ...). Gradients come in
    the spec's layout (``expanded``: stride-0, as autograd passes them)."""
    r = rank()
    W = spec["W"]
    inputs = gen_all_inputs(spec)
    orc = Oracle(spec, inputs)
    buf = make_buffer(spec)
    mine = inputs[r]
    P = orc.permute(r, pad_multiple)["P"]
    out = buf.dispatch_with_permute(
        hidden=mine["hidden"], scaling_factor=mine["scaling_factor"], pad_multiple=pad_multiple,
        fuse_permute_dispatch=fuse, non_blocking=non_blocking,
        num_permuted_tokens=P if non_blocking else None,
        **routing_kwargs(spec, mine, permute=True))
    handle = out[4]
    T = handle_T(handle, spec)
    exps = [orc.permute(d, pad_multiple, T=T) for d in range(W)]
    check_permute(out, exps[r], orc, r, T, "forward", mine["hidden"].dtype)

    # combine's backward: BF16 gradients of the combined tokens, permuted with the handle
    grads = [gen_combine_inputs(spec, s, spec["tokens"][s], None, salt="grad_x")[0]
             for s in range(W)]
    for count in (P, as_tensor_count(P)):
        back = buf.dispatch_with_permute(hidden=grads[r], scaling_factor=None, handle=handle,
                                         pad_multiple=pad_multiple, num_permuted_tokens=count,
                                         fuse_permute_dispatch=fuse, non_blocking=non_blocking)
        exp = orc.permute(r, pad_multiple, hidden=grads, scales=None, with_probs=False, T=T)
        check_permute(back, exp, orc, r, T, "backward dispatch_with_permute", torch.bfloat16,
                      check_handle=False)
        assert_same(back[3], out[3], "backward tokens_per_expert vs forward", r)

    # dispatch's backward: gradients of the permuted tokens and probs
    _unpermute_checks(buf, spec, orc, inputs, handle, pad_multiple, fuse, exps,
                      [e["P"] for e in exps], out[0], out[1], "backward combine_with_unpermute",
                      roundtrip=False)
