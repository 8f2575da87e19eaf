"""Validation errors: one case each (run on every rank of a pool).

Every rank builds the same buffer (and any handle it needs) collectively over a group whose
collectives time out quickly. Then, for call-time errors, only rank 0 makes the bad call while
the other ranks return: validation must raise before any communication, so the call must not
wait for peers (if it did, the short group timeout turns the wait into a non-ValueError). For
construction-time errors every rank constructs and every rank must raise.
"""

from __future__ import annotations

import torch

from .common import env, make_buffer, raises, rank, short_group
from .inputs import gen_inputs, make_spec, routing_kwargs

T_MAX = 8


def _spec(dtype="bf16", routing="map", **kw):
    from .common import world

    W = world()
    return make_spec(seed=11, W=W, R=W, E=2, tokens=[6] * W, max_tokens=[T_MAX] * W,
                     routing=routing, dtype=dtype, **kw)


def _bf16(T, H=128):
    return torch.randn(T, H).to(torch.bfloat16)


# Each case: (setup(group) -> state on every rank, bad(state) on the failing rank(s), names)
# Call-time cases run `bad` on rank 0 only.


def _basic(group, dtype="bf16", routing="map"):
    spec = _spec(dtype=dtype, routing=routing)
    buf = make_buffer(spec, group=group)
    return {"spec": spec, "buf": buf, "inp": gen_inputs(spec, rank())}


def _with_handle(group, permute=False, pad_multiple=None, fuse=False):
    st = _basic(group)
    inp, buf, spec = st["inp"], st["buf"], st["spec"]
    if permute:
        out = buf.dispatch_with_permute(hidden=inp["hidden"], pad_multiple=pad_multiple,
                                        fuse_permute_dispatch=fuse,
                                        **routing_kwargs(spec, inp, permute=True))
        st.update(handle=out[4], permuted=out[0], pprobs=out[1])
    else:
        out = buf.dispatch(hidden=inp["hidden"], **routing_kwargs(spec, inp))
        st.update(handle=out[3], dispatched=out[0], dprobs=out[1])
    return st


def _dispatch(st, **override):
    kw = dict(hidden=st["inp"]["hidden"], **routing_kwargs(st["spec"], st["inp"]))
    kw.update(override)
    return st["buf"].dispatch(**kw)


def _permute(st, **override):
    kw = dict(hidden=st["inp"]["hidden"], **routing_kwargs(st["spec"], st["inp"], permute=True))
    kw.update(override)
    return st["buf"].dispatch_with_permute(**kw)


def _topk_with(st, idx_rows):
    """topk_idx with some rows replaced (``values`` padded with -1 to the row width)."""
    idx = st["inp"]["topk_idx"].clone()
    for row, values in idx_rows.items():
        values = list(values) + [-1] * (idx.shape[1] - len(values))
        idx[row] = torch.tensor(values, dtype=idx.dtype)
    return idx


def _stale_handle(group):
    st = _with_handle(group)
    st["buf"].update_template_config(num_local_experts=st["spec"]["E"] * 2)
    return st


def _two_buffers(group):
    st = _with_handle(group)
    st["other"] = make_buffer(st["spec"], group=group)
    return st


CALL_CASES = {
    # name: (setup, bad call, names any of which the message must contain)
    "dtype_hidden": (_basic, lambda st: _dispatch(st, hidden=st["inp"]["hidden"].float()),
                     ("hidden",)),
    "dtype_probs": (_basic, lambda st: _dispatch(st, probs=st["inp"]["probs"].double()),
                    ("probs",)),
    "dtype_routing_map": (_basic, lambda st: _dispatch(st, routing_map=st["inp"]["routing_map"]
                                                       .to(torch.int32)), ("routing_map",)),
    "dtype_combine_hidden": (_with_handle, lambda st: st["buf"].combine(
        hidden=st["dispatched"].float(), probs=st["dprobs"], handle=st["handle"]), ("hidden",)),
    "device_probs_meta": (_basic, lambda st: _dispatch(st, probs=st["inp"]["probs"].to("meta")),
                          ("probs",)),
    "shape_probs": (_basic, lambda st: _dispatch(st, probs=st["inp"]["probs"][:, :-1]),
                    ("probs",)),
    "shape_routing_map_rows": (_basic, lambda st: _dispatch(
        st, routing_map=st["inp"]["routing_map"][:-1], probs=st["inp"]["probs"][:-1]),
        ("routing_map", "hidden")),
    "shape_combine_hidden_rows": (_with_handle, lambda st: st["buf"].combine(
        hidden=torch.cat([st["dispatched"], st["dispatched"][:1]]), handle=st["handle"]),
        ("hidden",)),
    "non_blocking_tokens_above_max": (
        _basic, lambda st: _permute(
            st, hidden=_bf16(T_MAX + 1),
            routing_map=torch.zeros(T_MAX + 1, st["spec"]["E"] * st["spec"]["W"], dtype=torch.bool),
            probs=torch.zeros(T_MAX + 1, st["spec"]["E"] * st["spec"]["W"]),
            non_blocking=True, num_permuted_tokens=16),
        ("hidden", "max_num_of_tokens_per_rank", "num_of_tokens")),
    "topk_idx_out_of_range": (
        lambda g: _basic(g, routing="topk"),
        lambda st: _dispatch(st, topk_idx=_topk_with(st, {0: [st["spec"]["E"] * st["spec"]["W"]]})),
        ("topk_idx",)),
    "topk_idx_negative": (
        lambda g: _basic(g, routing="topk"),
        lambda st: _dispatch(st, topk_idx=_topk_with(st, {1: [-2]})),
        ("topk_idx",)),
    "topk_idx_duplicate": (
        lambda g: _basic(g, routing="topk"),
        lambda st: _dispatch(st, topk_idx=_topk_with(st, {2: [1, 1]})),
        ("topk_idx",)),
    "fp8_missing_scaling_factor": (lambda g: _basic(g, dtype="u8"),
                                   lambda st: _dispatch(st, scaling_factor=None),
                                   ("scaling_factor",)),
    "fp8_scaling_factor_shape": (
        lambda g: _basic(g, dtype="u8"),
        lambda st: _dispatch(st, scaling_factor=st["inp"]["scaling_factor"][:, :1]),
        ("scaling_factor",)),
    "routing_twice": (
        _basic,
        lambda st: _dispatch(st, topk_idx=torch.zeros(6, 1, dtype=torch.int64),
                             num_of_experts=st["spec"]["E"] * st["spec"]["W"]),
        ("routing_map", "topk_idx")),
    "routing_missing": (_basic,
                        lambda st: st["buf"].dispatch(hidden=st["inp"]["hidden"]),
                        ("routing_map", "topk_idx", "handle")),
    "routing_missing_permute": (_basic,
                                lambda st: st["buf"].dispatch_with_permute(
                                    hidden=st["inp"]["hidden"]),
                                ("routing_map", "topk_idx", "handle")),
    "handle_from_other_buffer": (_two_buffers, lambda st: st["other"].combine(
        hidden=st["dispatched"], probs=st["dprobs"], handle=st["handle"]), ("handle",)),
    "handle_stale_config": (_stale_handle, lambda st: st["buf"].combine(
        hidden=st["dispatched"], probs=None, handle=st["handle"]), ("handle",)),
    "pad_multiple_mismatch_combine": (
        lambda g: _with_handle(g, permute=True, pad_multiple=16),
        lambda st: st["buf"].combine_with_unpermute(
            hidden=st["permuted"], probs=None, handle=st["handle"], pad_multiple=64),
        ("pad_multiple",)),
    "pad_multiple_mismatch_backward": (
        lambda g: _with_handle(g, permute=True, pad_multiple=16),
        lambda st: st["buf"].dispatch_with_permute(
            hidden=st["inp"]["hidden"], scaling_factor=None, handle=st["handle"],
            pad_multiple=64, num_permuted_tokens=st["permuted"].shape[0] * 4),
        ("pad_multiple",)),
    "fuse_flag_mismatch": (
        lambda g: _with_handle(g, permute=True, fuse=False),
        lambda st: st["buf"].combine_with_unpermute(
            hidden=st["permuted"], probs=st["pprobs"], handle=st["handle"],
            fuse_unpermute_combine=True),
        ("fuse_unpermute_combine",)),
    "permute_handle_to_combine": (
        lambda g: _with_handle(g, permute=True),
        lambda st: st["buf"].combine(hidden=st["permuted"], handle=st["handle"]),
        ("handle",)),
    "dispatch_handle_to_combine_with_unpermute": (
        _with_handle,
        lambda st: st["buf"].combine_with_unpermute(hidden=st["dispatched"], handle=st["handle"]),
        ("handle",)),
    "combine_input_without_handle": (_with_handle, lambda st: st["buf"].get_combine_input_buffer(
        None), ("handle",)),
    "combine_input_permute_handle": (
        lambda g: _with_handle(g, permute=True),
        lambda st: st["buf"].get_combine_input_buffer(st["handle"]), ("handle",)),
    "combine_input_hidden_dim_unaligned": (
        _with_handle, lambda st: st["buf"].get_combine_input_buffer(st["handle"], hidden_dim=72),
        ("hidden_dim",)),
    "combine_input_hidden_dim_above_buffer": (
        _with_handle, lambda st: st["buf"].get_combine_input_buffer(st["handle"], hidden_dim=256),
        ("hidden_dim",)),
    "num_permuted_tokens_not_multiple": (
        _basic, lambda st: _permute(st, pad_multiple=16, non_blocking=True,
                                    num_permuted_tokens=17),
        ("num_permuted_tokens",)),
    "num_permuted_tokens_tensor_not_multiple": (
        _basic, lambda st: _permute(st, pad_multiple=16, non_blocking=True,
                                    num_permuted_tokens=torch.tensor(40, dtype=torch.int64)),
        ("num_permuted_tokens",)),
}


def call_error(name: str):
    setup, bad, names = CALL_CASES[name]
    with short_group() as group:
        state = setup(group)
        if rank() == 0:
            with raises(*names) as caught:
                bad(state)
            return caught[0]
    return None


def _construct(group, hidden_dim=128, dtype="bf16", **overrides):
    spec = _spec(dtype=dtype)
    spec["H"] = hidden_dim
    return make_buffer(spec, group=group, **overrides)


def _construct_and_dispatch(group, hidden_dim, dtype):
    """Construction or the first dispatch must reject the hidden size."""
    buf = _construct(group, hidden_dim=hidden_dim, dtype=dtype)
    from .common import world

    W = world()
    T = 4
    if dtype == "bf16":
        hidden, sf = _bf16(T, hidden_dim), None
    else:
        hidden = torch.zeros(T, hidden_dim, dtype=torch.uint8)
        sf = torch.ones(T, max(hidden_dim // 128, 1))
    routing_map = torch.ones(T, 2 * W, dtype=torch.bool)
    buf.dispatch(hidden=hidden, scaling_factor=sf, routing_map=routing_map,
                 probs=routing_map.float())


CONSTRUCT_CASES = {
    "hidden_not_multiple_of_16_bf16": (lambda g: _construct_and_dispatch(g, 24, "bf16"),
                                       ("hidden",)),
    "hidden_not_multiple_of_128_fp8": (lambda g: _construct_and_dispatch(g, 192, "u8"),
                                       ("hidden",)),
    "ranks_per_domain_argument_not_dividing": (
        lambda g: _construct(g, num_of_hybrid_ep_ranks_per_nvlink_domain=3),
        ("num_of_hybrid_ep_ranks_per_nvlink_domain",)),
    "receive_cap_zero": (lambda g: _construct(g, max_num_of_tokens_for_experts=0),
                         ("max_num_of_tokens_for_experts=0",)),
    "receive_cap_not_an_int": (lambda g: _construct(g, max_num_of_tokens_for_experts=2.5),
                               ("max_num_of_tokens_for_experts",)),
    "receive_cap_differs_between_ranks": (
        lambda g: _construct(g, max_num_of_tokens_for_experts=16 + rank()),
        ("max_num_of_tokens_for_experts: ranks disagree",)),
}

# Malformed environment variables: construction raises and names the variable.
ENV_CASES = {
    "NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API": "abc",
    "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API": "abc",
    "NUM_OF_TOKENS_PER_CHUNK_PREPROCESSING_API": "1.5",
    "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "3",
    "HYBRID_EP_NIC_MAPPING": "garbage",
    "HYBRID_EP_COMBINE_PIECES": "3",
}


def construct_error(name: str) -> str:
    build, names = CONSTRUCT_CASES[name]
    with short_group() as group, raises(*names) as caught:
        build(group)
    return caught[0]


def env_error(variable: str) -> str:
    with short_group() as group, env(**{variable: ENV_CASES[variable]}):
        spec = _spec()
        with raises(variable) as caught:
            # no explicit ranks-per-domain argument, so the variable is the one in force
            make_buffer(spec, group=group, num_of_hybrid_ep_ranks_per_nvlink_domain=None)
    return caught[0]
