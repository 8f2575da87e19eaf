"""dispatch_with_permute / combine_with_unpermute against the oracle: every pad_multiple,
blocking and non-blocking (count as int and as a 0-d tensor), both fuse flags, overflow and
underflow, and Megatron's backward pattern."""

from __future__ import annotations

import pytest

from _params import TOPOLOGIES, seed, topo_id, topologies
from cases.inputs import make_spec

PADS = [None, 16, 64]
pads = pytest.mark.parametrize("pad_multiple", PADS, ids=[f"pad{p}" for p in PADS])


@topologies
@pads
@pytest.mark.parametrize("routing,dtype,with_probs", [
    ("map", "bf16", True), ("topk", "u8", True), ("topk", "bf16", False), ("map", "e4m3", False),
], ids=["map-bf16-probs", "topk-u8-probs", "topk-bf16-noprobs", "map-e4m3-noprobs"])
def test_permute_modes(pools, topo, pad_multiple, routing, dtype, with_probs):
    """All four calling modes and both fuse flags give the oracle's layout (so identical
    results); combine_with_unpermute after each: x * copies, probs back, independent inputs."""
    W, R = topo
    spec = make_spec(seed=seed("pm", W, R, pad_multiple, routing, dtype), W=W, R=R,
                     E=1 + (W // R + pad_multiple if pad_multiple else W) % 4, routing=routing,
                     dtype=dtype, with_probs=with_probs)
    Ts = pools.run(W, "cases.permute", "permute_combine", spec=spec, pad_multiple=pad_multiple,
                   combine_modes=("blocking", "nb_tensor"))
    assert Ts == [max(spec["max_tokens"])] * W


# Overflow / underflow: a subset of topologies keeps the suite fast; every domain count is in.
BUDGET_TOPOLOGIES = [(2, 1), (4, 2), (8, 2), (8, 8)]


@pytest.mark.parametrize("topo", BUDGET_TOPOLOGIES, ids=[topo_id(t) for t in BUDGET_TOPOLOGIES])
@pads
@pytest.mark.parametrize("fuse", [False, True], ids=["unfused", "fused"])
def test_permute_overflow_underflow(pools, topo, pad_multiple, fuse):
    """Non-blocking with num_permuted_tokens 0, half, one segment short, exact and too large:
    the flag, tokens_per_expert never past the output, kept rows exact, dropped rows left out
    of the combine."""
    W, R = topo
    spec = make_spec(seed=seed("ovf", W, R, pad_multiple, fuse), W=W, R=R, E=3,
                     routing="topk" if fuse else "map", dtype="bf16")
    flags = pools.run(W, "cases.permute", "permute_budget", spec=spec, pad_multiple=pad_multiple,
                      fuse=fuse, count_as_tensor=not fuse)
    # budgets: zero, half, minus_pad, minus_one, exact, plus -> somebody overflowed at zero
    assert any(f[0] for f in flags), f"no rank overflowed with a zero budget: {flags}"
    assert all(f[4] == 0 and f[5] == 0 for f in flags), f"flag set without overflow: {flags}"


@topologies
@pads
def test_permute_backward_pattern(pools, topo, pad_multiple):
    """combine's backward: dispatch_with_permute(hidden=grad, scaling_factor=None, handle=h,
    pad_multiple, num_permuted_tokens) with no routing (grads stride-0 expanded, forward FP8
    on half of the cases); dispatch's backward: combine_with_unpermute(hidden=grad,
    probs=grad_probs, handle=h)."""
    W, R = topo
    index = TOPOLOGIES.index(topo) + PADS.index(pad_multiple)
    spec = make_spec(seed=seed("bwd", W, R, pad_multiple), W=W, R=R, E=2,
                     routing=("map", "topk")[index % 2], dtype=("bf16", "u8")[index // 2 % 2],
                     layout="expanded")
    pools.run(W, "cases.permute", "permute_backward", spec=spec, pad_multiple=pad_multiple,
              fuse=index % 3 == 0, non_blocking=index % 4 >= 2)
