"""Cases that combine the basic ones: two buffers alive in one process; the arguments accepted
for compatibility."""

from __future__ import annotations

from .check import assert_combined, assert_same
from .common import make_buffer, rank
from .dispatch import check_dispatch_handle, dispatch_combine, handle_T
from .inputs import gen_all_inputs, gen_combine_inputs, routing_kwargs
from .oracle import Oracle
from .permute import check_permute


def two_buffers(spec_a: dict, spec_b: dict, pad_multiple) -> None:
    """Two buffers of different configs alive at once; calls interleaved, each checked against
    its own oracle."""
    r = rank()
    buf_a = make_buffer(spec_a)
    buf_b = make_buffer(spec_b)
    inputs_a, inputs_b = gen_all_inputs(spec_a), gen_all_inputs(spec_b)
    orc_a, orc_b = Oracle(spec_a, inputs_a), Oracle(spec_b, inputs_b)
    a, b = inputs_a[r], inputs_b[r]

    out_a = buf_a.dispatch(hidden=a["hidden"], scaling_factor=a["scaling_factor"],
                           **routing_kwargs(spec_a, a))
    out_b = buf_b.dispatch_with_permute(hidden=b["hidden"], scaling_factor=b["scaling_factor"],
                                        pad_multiple=pad_multiple,
                                        **routing_kwargs(spec_b, b, permute=True))
    T_a, T_b = handle_T(out_a[3], spec_a), handle_T(out_b[4], spec_b)
    exp_a = orc_a.dispatch(r)
    assert_same(out_a[0], exp_a["tokens"], "buffer A dispatched_token", r,
                dtype=a["hidden"].dtype)
    assert_same(out_a[1], exp_a["probs"], "buffer A dispatched_probs", r)
    check_dispatch_handle(out_a[3], orc_a, r, T_a)
    exps_b = [orc_b.permute(d, pad_multiple, T=T_b) for d in range(spec_b["W"])]
    check_permute(out_b, exps_b[r], orc_b, r, T_b, "buffer B", b["hidden"].dtype)

    # combine on A, then unpermute on B, with independent inputs
    width = spec_a["E"] * spec_a["R"]
    cin_a = [gen_combine_inputs(spec_a, d, len(orc_a.recv[d]), width) for d in range(spec_a["W"])]
    combined, cprobs = buf_a.combine(hidden=cin_a[r][0], probs=cin_a[r][1], handle=out_a[3])
    exp = orc_a.combine(r, [c[0] for c in cin_a], [c[1] for c in cin_a])
    assert_combined(combined, exp, "buffer A combined_token", r)
    assert_same(cprobs, exp["probs"], "buffer A combined_probs", r)

    cin_b = [gen_combine_inputs(spec_b, d, exps_b[d]["P"], 0) for d in range(spec_b["W"])]
    combined, cprobs = buf_b.combine_with_unpermute(hidden=cin_b[r][0], probs=cin_b[r][1],
                                                    handle=out_b[4], pad_multiple=pad_multiple)
    exp = orc_b.combine(r, [c[0] for c in cin_b], [c[1] for c in cin_b],
                        d2e_maps=[e["dense_to_expert_map"] for e in exps_b])
    assert_combined(combined, exp, "buffer B combined_token", r)
    assert_same(cprobs, exp["probs"], "buffer B combined_probs", r)

    # and A again, after B was used
    dispatch_combine(spec_a, buf=buf_a, reuse=False)


def compatibility_arguments(spec: dict) -> None:
    """What compat.py lists is accepted and changes nothing; its checks still raise."""
    import pytest

    buf = make_buffer(spec, load_cached_kernels=True, use_shared_buffer=False,
                      enable_custom_allgather=True)
    before = buf.config
    assert buf.update_template_config(num_of_stages_s2g_combine_api=4) == before
    with pytest.raises(ValueError, match="num_of_stages_s2g_combine_api"):
        buf.update_template_config(num_of_stages_s2g_combine_api=0)
    assert buf.empty_jit_cache() is None
    r, inputs = rank(), gen_all_inputs(spec)
    a = inputs[r]
    out = buf.dispatch_with_permute(hidden=a["hidden"], scaling_factor=a["scaling_factor"],
                                    use_host_meta=True, **routing_kwargs(spec, a, permute=True))
    T = handle_T(out[4], spec)
    check_permute(out, Oracle(spec, inputs).permute(r, 1, T=T), Oracle(spec, inputs), r, T,
                  "use_host_meta=True", a["hidden"].dtype)
