"""dispatch_with_permute / combine_with_unpermute on the CUDA engine against the reference
engine: both modes (standalone, fused flag) x BF16/FP8 x with/without probs x pad_multiple
{None, 16, 64, 256} x 2, 4, 8 ranks on GPU 0 (and 2 ranks with one GPU each, where there are
two: the fused grids' default size depends on the ranks sharing a GPU), in blocking and
non-blocking mode, with budgets
that fit exactly, overflow and underflow; the backward pattern (handle reuse); a handle of the
other mode refused; and CUDA graph capture of the non-blocking pair with 50 replays."""

from __future__ import annotations

import itertools

import gpu_env
import pytest
from gpu_env import gpu_marks, placement_param
from gpu_specs import make_spec, report, spec_id

pytestmark = gpu_marks
MODULE = "gpu_permute_cases"

PADS = (None, 16, 64, 256)


def _matrix():
    """Each (W, fused, dtype, probs) once, the pads, budgets and modes rotating over them."""
    rows = []
    combos = itertools.product((2, 4, 8), (False, True), ("bf16", "e4m3"), (True, False))
    for n, (W, fused, dtype, probs) in enumerate(combos):
        case = {"H": 4096 if dtype != "bf16" else (2064, 7168)[n % 2], "dtype": dtype,
                "form": ("topk", "map")[n % 2], "k": (2, 8, 1)[n % 3], "E": (4, 8)[n % 2],
                "probs": probs, "max_tok": 96}
        extra = {"pad": PADS[n % 4], "budget": ("exact", "over", "under")[n % 3],
                 "non_blocking": n % 2 == 1, "fused": fused}
        rows.append((W, case, extra))
    return rows


def _id(case, extra) -> str:
    mode = "fused" if extra["fused"] else "standalone"
    block = "nonblocking" if extra["non_blocking"] else "blocking"
    return f"{spec_id(case)}-{mode}-pad{extra['pad']}-{extra['budget']}-{block}"


@pytest.mark.parametrize(
    "W,placement,case,extra",
    [placement_param(W, placement, case, extra, id_extra=_id(case, extra))
     for W, case, extra in _matrix()
     for placement in (("shared", "per_gpu") if W == 2 else ("shared",))])
def test_permute_combine(gpu_pools, record_property, W, placement, case, extra):
    spec = make_spec(W, **case)
    spec.update(extra)
    results = gpu_pools.run(W, placement, "permute_combine", module=MODULE, spec=spec)
    # FP8 rows have no combine (combine takes BF16).
    report(record_property, results, label=f"permute W={W} {_id(case, extra)}",
           combines=int(spec["dtype"] == "bf16"))


@pytest.mark.parametrize("W,placement", [placement_param(2, "shared")])
def test_mode_mismatch(gpu_pools, W, placement):
    spec = make_spec(W, H=512, form="topk", k=2, max_tok=32)
    results = gpu_pools.run(W, placement, "mode_mismatch", module=MODULE, spec=spec)
    for r in results:
        assert "belongs to combine_with_unpermute" in r["messages"][0], r
        assert "belongs to combine " in r["messages"][1] or "belongs to combine (" in \
            r["messages"][1], r


@pytest.mark.skipif(gpu_env.DRY_RUN, reason="CUDA graphs need a GPU (dry run on the CPU)")
@pytest.mark.parametrize("form", ["map", "topk"])
@pytest.mark.parametrize("fused", [False, True], ids=["standalone", "fused"])
@pytest.mark.parametrize("W,placement", [*gpu_env.placements((2,)),
                                         placement_param(4, "shared")])
def test_graph_replay(gpu_pools, record_property, W, placement, fused, form):
    spec = make_spec(W, H=1024, form=form, k=2, E=4, tokens="equal", max_tok=64)
    spec.update(pad=16, fused=fused)
    results = gpu_pools.run(W, placement, "graph_replay", module=MODULE, timeout_s=240,
                            spec=spec, replays=50)
    assert all(r["replays"] == 50 for r in results), results
    report(record_property, results, label=f"graph replay W={W} fused={fused} {form}",
           dispatches=0)


@pytest.mark.parametrize("W,placement", [placement_param(2, "shared"),
                                         placement_param(4, "shared")])
def test_autograd_round_trip(gpu_pools, record_property, W, placement):
    """Megatron's pattern: autograd functions whose backward passes call the other operation
    with the forward's handle; gradients equal the reference's (within BF16 rounding)."""
    spec = make_spec(W, H=512, form="map", k=2, E=4, max_tok=64)
    spec["pad"] = 16
    results = gpu_pools.run(W, placement, "autograd_round_trip", module=MODULE, spec=spec)
    report(record_property, results, label=f"autograd W={W}", dispatches=0)
