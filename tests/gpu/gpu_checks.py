"""Checks of the GPU tests' rank code (gpu_cases and the other case modules): outputs and handles
of the CUDA engine against the reference engine's, bitwise or within BF16 rounding."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from gpu_env import DRY_RUN

from cases.check import assert_same, plus_zero

if TYPE_CHECKING:
    from gpu_cases import Ctx

HANDLE_NAMES = ("sparse_to_dense_map", "rdma_to_attn_map", "attn_to_rdma_map",
                "num_dispatched_tokens_tensor", "local_expert_routing_map")


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn as its uint8 bytes (the reference engine's CPU ops lack some float8
    kernels, e.g. masked_fill; it moves bytes either way); other dtypes unchanged."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


class Stats:
    """Per-rank tally of the combine comparisons (reported by the tests)."""

    def __init__(self):
        self.combines = 0
        self.bitwise = 0
        self.max_abs_diff = 0.0
        self.dispatches = 0

    def as_dict(self, **extra) -> dict:
        return dict(combines=self.combines, combine_bitwise=self.bitwise,
                    max_abs_diff=self.max_abs_diff, dispatches=self.dispatches, **extra)


def check_same(ctx: Ctx, got, exp, what: str) -> None:
    """``got`` (on the rank's device) bitwise equal to ``exp`` (CPU), or both None."""
    if exp is None:
        assert got is None, f"{ctx.where()} {what}: expected None, got {type(got).__name__}"
        return
    assert isinstance(got, torch.Tensor), \
        f"{ctx.where()} {what}: expected a tensor, got {type(got).__name__}"
    assert got.device == ctx.dev, f"{ctx.where()} {what}: on {got.device}, expected {ctx.dev}"
    assert_same(got.cpu(), exp, what, ctx.rank)


def check_handle(ctx: Ctx, handle, ref, what: str) -> None:
    assert isinstance(handle, tuple) and len(handle) == 7, \
        f"{ctx.where()} {what}: expected a 7-tuple handle, got {type(handle).__name__}"
    for pos, name in enumerate(HANDLE_NAMES):
        check_same(ctx, handle[pos], ref[pos], f"{what} handle[{pos}] {name}")
    assert handle[5] == ref[5], \
        f"{ctx.where()} {what} handle[5] num_of_tokens_per_rank: {handle[5]} vs {ref[5]}"
    for field in ("buffer_id", "num_tokens", "num_dispatched_tokens",
                  "max_num_of_tokens_per_rank"):
        got, exp = getattr(handle[6], field), getattr(ref[6], field)
        assert got == exp, f"{ctx.where()} {what} handle[6].{field}: {got} vs reference {exp}"
    check_own_rows(ctx, handle[6].own_rows, ref, what)


def check_own_rows(ctx: Ctx, own, ref, what: str) -> None:
    """The CUDA engine's range of a rank's rows from itself (which skip its buffer inside one
    domain) holds exactly the rows where the reference put this rank's tokens for itself."""
    if DRY_RUN:
        return  # the reference engine on both sides: it has no such range
    assert own is not None, f"{ctx.where()} {what}: the CUDA handle has no own_rows"
    s2d, config = ref[0], ref[6]
    if config.num_of_nodes > 1:
        return  # forwarded tokens share the map; the range is used inside one domain only
    rows = s2d[:, ctx.rank % s2d.shape[1]]
    rows = rows[rows >= 0]
    begin, end = own
    if rows.numel() == 0:
        assert begin == end, f"{ctx.where()} {what}: own_rows {own} for no own rows"
        return
    assert (begin, end) == (int(rows.min()), int(rows.max()) + 1) and end - begin == rows.numel(), \
        f"{ctx.where()} {what}: own_rows {own}, the reference's own rows are " \
        f"{int(rows.min())}..{int(rows.max())} ({rows.numel()})"


def check_dispatch(ctx: Ctx, out, ref, what: str, dtype, stats: Stats) -> None:
    assert isinstance(out, tuple) and len(out) == 4, \
        f"{ctx.where()} {what}: dispatch returned {type(out).__name__}"
    tokens = out[0]
    assert isinstance(tokens, torch.Tensor) and tokens.dtype == dtype, \
        f"{ctx.where()} {what}: dispatched_token dtype {getattr(tokens, 'dtype', None)}, " \
        f"expected {dtype}"
    check_same(ctx, as_bytes(tokens), as_bytes(ref[0]), f"{what}: dispatched_token")
    check_same(ctx, out[1], ref[1], f"{what}: dispatched_probs")
    check_same(ctx, out[2], ref[2], f"{what}: dispatched_scaling_factor")
    check_handle(ctx, out[3], ref[3], what)
    stats.dispatches += 1


def check_combine(ctx: Ctx, out, ref, what: str, stats: Stats) -> None:
    """Within BF16 rounding of the fp32 sum (assert_close), bitwise noted; probs exact."""
    assert isinstance(out, tuple) and len(out) == 2, \
        f"{ctx.where()} {what}: combine returned {type(out).__name__}"
    tokens, probs = out
    ref_tokens, ref_probs = ref
    assert isinstance(tokens, torch.Tensor) and tokens.device == ctx.dev, \
        f"{ctx.where()} {what}: combined_token on {getattr(tokens, 'device', None)}"
    assert tokens.dtype == torch.bfloat16, f"{ctx.where()} {what}: dtype {tokens.dtype}"
    assert tuple(tokens.shape) == tuple(ref_tokens.shape), \
        f"{ctx.where()} {what}: shape {tuple(tokens.shape)} vs {tuple(ref_tokens.shape)}"
    got = tokens.cpu()
    torch.testing.assert_close(
        got.float(), ref_tokens.float(), rtol=1e-2, atol=1e-3,
        msg=lambda m: f"{ctx.where()} {what}: combined_token vs the reference engine: {m}")
    stats.combines += 1
    if torch.equal(plus_zero(got), plus_zero(ref_tokens)):
        stats.bitwise += 1
    if got.numel():
        diff = float((got.float() - ref_tokens.float()).abs().max())
        stats.max_abs_diff = max(stats.max_abs_diff, diff)
    check_same(ctx, probs, ref_probs, f"{what}: combined_probs")


def first_mismatch(got: torch.Tensor, want: torch.Tensor) -> str:
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {got.dtype} {tuple(got.shape)}, expected {want.dtype} {tuple(want.shape)}"
    g, w = got.cpu(), want.cpu()
    if g.is_floating_point():
        g, w = plus_zero(g), plus_zero(w)
    rows = torch.nonzero((g != w).reshape(g.shape[0], -1).any(dim=1)).flatten().tolist()
    if not rows:
        return "no differing rows (shapes or dtypes differ?)"
    t = rows[0]
    cols = torch.nonzero(g[t] != w[t]).flatten().tolist()
    return (f"{len(rows)} of {g.shape[0]} rows differ; row {t}, columns {cols[:8]}...: got "
            f"{g[t, cols[:4]].tolist()}, expected {w[t, cols[:4]].tolist()}")
