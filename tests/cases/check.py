"""Comparisons with messages that say what differed, where, and on which rank."""

from __future__ import annotations

import os

import torch


def combine_wire() -> str:
    """HYBRID_EP_COMBINE_WIRE as the buffers under test read it."""
    return (os.environ.get("HYBRID_EP_COMBINE_WIRE") or "bf16").strip()


def round_trip_rows(x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """What a combine returns for rows that are ``x`` times ``counts[:, n]`` in domain n (copies
    of a token there, or the experts it selected there after an unpermute): one domain, or the
    fp32 wire, BF16 of the whole product (exact in fp32); across domains with the BF16 wire,
    each domain's partial rounded to BF16 first, summed in fp32 in ascending domain order."""
    xf = x.float()
    counts = counts.to(xf.device, torch.float32)
    if counts.shape[1] == 1 or combine_wire() == "fp32":
        return (xf * counts.sum(1, keepdim=True)).to(torch.bfloat16)
    total = torch.zeros_like(xf)
    for n in range(counts.shape[1]):
        part = (xf * counts[:, n:n + 1]).to(torch.bfloat16).float()
        total = total + torch.where(counts[:, n:n + 1] > 0, part, 0.0)
    return total.to(torch.bfloat16)


def _where(rank) -> str:
    return f"[rank {rank}] " if rank is not None else ""


def _bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.dim() == 0:
        t = t.reshape(1)
    return t.view(torch.uint8)


def _first_diff(got: torch.Tensor, exp: torch.Tensor) -> str:
    g, e = got.contiguous(), exp.contiguous()
    if g.dtype == torch.float8_e4m3fn:
        g, e = g.view(torch.uint8), e.view(torch.uint8)
    if g.dim() == 0:
        return f"got {g.item()}, expected {e.item()}"
    diff = (_bytes(g).reshape(g.shape[0], -1) != _bytes(e).reshape(e.shape[0], -1)).any(dim=1)
    bad = torch.nonzero(diff).flatten().tolist()
    row = bad[0]
    return (f"{len(bad)} of {g.shape[0]} rows differ, first row {row}:\n"
            f"  got      {g[row].tolist() if g.dim() > 1 else g[row].item()}\n"
            f"  expected {e[row].tolist() if e.dim() > 1 else e[row].item()}")


def assert_same(got, exp, what: str, rank=None, dtype=None) -> None:
    """Bitwise equality of tensors (shape and dtype too), or equality of non-tensors."""
    where = _where(rank)
    if exp is None:
        assert got is None, f"{where}{what}: expected None, got {type(got).__name__}"
        return
    if not isinstance(exp, torch.Tensor):
        assert got == exp, f"{where}{what}: got {got!r}, expected {exp!r}"
        return
    assert isinstance(got, torch.Tensor), \
        f"{where}{what}: expected a tensor, got {type(got).__name__}"
    want_dtype = exp.dtype if dtype is None else dtype
    assert got.dtype == want_dtype, f"{where}{what}: dtype {got.dtype}, expected {want_dtype}"
    assert tuple(got.shape) == tuple(exp.shape), \
        f"{where}{what}: shape {tuple(got.shape)}, expected {tuple(exp.shape)}"
    assert got.device.type == "cpu", f"{where}{what}: on {got.device}, expected cpu"
    if got.dtype == torch.float8_e4m3fn:
        got = got.view(torch.uint8)
    if exp.dtype == torch.float8_e4m3fn:
        exp = exp.view(torch.uint8)
    if got.numel() and not torch.equal(_bytes(got), _bytes(exp.to(got.dtype))):
        raise AssertionError(f"{where}{what}: not bitwise equal; {_first_diff(got, exp)}")


def assert_combined(got, expected: dict, what: str, rank=None) -> None:
    """A BF16 combine output against the oracle's exact sum, within fp32-accumulation and
    BF16 rounding."""
    where = _where(rank)
    exact, bound = expected["exact"], expected["bound"]
    assert isinstance(got, torch.Tensor), f"{where}{what}: got {type(got).__name__}"
    assert got.dtype == torch.bfloat16, f"{where}{what}: dtype {got.dtype}, expected bfloat16"
    assert tuple(got.shape) == tuple(exact.shape), \
        f"{where}{what}: shape {tuple(got.shape)}, expected {tuple(exact.shape)}"
    err = (got.double() - exact).abs()
    bad = err > bound
    if bad.any():
        t, h = torch.nonzero(bad)[0].tolist()
        raise AssertionError(
            f"{where}{what}: {int(bad.sum())} elements outside fp32 rounding; first at "
            f"[{t}, {h}]: got {got[t, h].item()}, exact {exact[t, h].item()}, "
            f"bound {bound[t, h].item()}")


def plus_zero(t):
    """-0.0 as +0.0 (a sum of no copies is +0; x * 0 may be -0); other values unchanged."""
    if isinstance(t, torch.Tensor) and t.is_floating_point():
        return t + 0.0
    return t
