"""dispatch / combine cases (run on every rank of a pool)."""

from __future__ import annotations

import torch

from .check import assert_combined, assert_same, plus_zero, round_trip_rows
from .common import check_buffer_attributes, make_buffer, rank
from .inputs import gen_all_inputs, gen_combine_inputs, routing_kwargs
from .oracle import Oracle


def check_dispatch_handle(handle, orc: Oracle, r: int, T: int) -> None:
    assert isinstance(handle, tuple) and len(handle) == 7, \
        f"[rank {r}] dispatch handle: expected a 7-tuple, got {type(handle).__name__} " \
        f"of {len(handle) if isinstance(handle, tuple) else '-'}"
    expected = orc.dispatch_handle(r, T)
    names = ["sparse_to_dense_map", "rdma_to_attn_map", "attn_to_rdma_map",
             "num_dispatched_tokens_tensor", "local_expert_routing_map",
             "num_of_tokens_per_rank"]
    for pos, name in enumerate(names):
        assert_same(handle[pos], expected[pos], f"handle[{pos}] {name}", r)
    config = handle[6]
    assert config is not None, f"[rank {r}] handle[6] (config) is None"
    got = getattr(config, "max_num_of_tokens_per_rank", None)
    assert got == T, f"[rank {r}] handle config.max_num_of_tokens_per_rank = {got!r}, handle T {T}"


def handle_T(handle, spec: dict) -> int:
    """The buffer maximum T a handle was made with; checked against the agreed maximum."""
    r = rank()
    T = handle[5] if len(handle) == 7 else handle[8]
    assert isinstance(T, int), f"[rank {r}] handle num_of_tokens_per_rank: {type(T).__name__}"
    assert T >= max(spec["tokens"]), f"[rank {r}] handle T = {T} < max tokens {spec['tokens']}"
    assert T >= max(spec["max_tokens"]), \
        f"[rank {r}] handle T = {T} < agreed max_num_of_tokens_per_rank {spec['max_tokens']}"
    return T


def dispatch_combine(spec: dict, buf=None, reuse: bool = True) -> int:
    """dispatch against the oracle; the handle; combine(dispatch(x)) == x * copies and
    combined_probs == probs; combine of independent inputs; dispatch(hidden, handle=h)."""
    r = rank()
    inputs = gen_all_inputs(spec)
    orc = Oracle(spec, inputs)
    if buf is None:
        buf = make_buffer(spec)
        check_buffer_attributes(buf, spec)
    mine = inputs[r]
    out = buf.dispatch(hidden=mine["hidden"], scaling_factor=mine["scaling_factor"],
                       **routing_kwargs(spec, mine))
    assert isinstance(out, tuple) and len(out) == 4, f"[rank {r}] dispatch returned {out!r:.80}"
    tokens, dprobs, dscales, handle = out
    exp = orc.dispatch(r)
    assert_same(tokens, exp["tokens"], "dispatched_token", r,
                dtype=mine["hidden"].dtype)
    assert_same(dprobs, exp["probs"], "dispatched_probs", r)
    assert_same(dscales, exp["scaling_factor"], "dispatched_scaling_factor", r)
    T = handle_T(handle, spec)
    check_dispatch_handle(handle, orc, r, T)
    D = len(orc.recv[r])

    if spec["dtype"] == "bf16":  # the round trip
        combined, cprobs = buf.combine(hidden=tokens, probs=dprobs, handle=handle)
        want = round_trip_rows(mine["hidden"], orc.copies_per_domain(r))
        assert_same(plus_zero(combined), plus_zero(want), "combine(dispatch(x)) vs x * copies", r)
        assert_same(cprobs, orc.dense_probs(r) if spec["with_probs"] else None,
                    "combined_probs vs probs", r)

    # combine of independent per-rank inputs
    width = spec["E"] * spec["R"]
    combine_in = [gen_combine_inputs(spec, d, len(orc.recv[d]), width) for d in range(spec["W"])]
    y, yp = combine_in[r]
    assert y.shape[0] == D
    combined, cprobs = buf.combine(hidden=y, probs=yp, handle=handle)
    exp = orc.combine(r, [c[0] for c in combine_in], [c[1] for c in combine_in])
    assert_combined(combined, exp, "combined_token", r)
    assert_same(cprobs, exp["probs"], "combined_probs", r)
    # the same inputs written into the tensor get_combine_input_buffer hands out
    claimed = buf.get_combine_input_buffer(handle, hidden_dim=y.shape[1])
    assert claimed.shape == y.shape and claimed.dtype == torch.bfloat16, \
        f"[rank {r}] get_combine_input_buffer: {tuple(claimed.shape)} {claimed.dtype}"
    claimed.copy_(y)
    again, again_probs = buf.combine(hidden=claimed, probs=yp, handle=handle)
    assert_same(again, combined, "combine of get_combine_input_buffer's tensor", r)
    assert_same(again_probs, cprobs, "its combined_probs", r)

    if reuse:  # dispatch(hidden, handle=h): same rows, new data, no routing re-read
        again = gen_all_inputs(spec, salt="again")
        out = buf.dispatch(hidden=again[r]["hidden"], scaling_factor=again[r]["scaling_factor"],
                           handle=handle)
        tokens2, dprobs2, dscales2, handle2 = out
        exp = orc.dispatch(r, hidden=[a["hidden"] for a in again],
                           scales=[a["scaling_factor"] for a in again])
        assert_same(tokens2, exp["tokens"], "dispatch(handle=h) dispatched_token", r,
                    dtype=mine["hidden"].dtype)
        assert_same(dprobs2, None, "dispatch(handle=h) dispatched_probs (no probs given)", r)
        assert_same(dscales2, exp["scaling_factor"], "dispatch(handle=h) scaling_factor", r)
        check_dispatch_handle(handle2, orc, r, T)
    return T
