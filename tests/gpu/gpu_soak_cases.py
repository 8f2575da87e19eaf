"""Rank code of the soak test (test_gpu_soak.py): thousands of calls with random routing, ragged
token counts, a random choice among the dispatch/combine variants and occasional growth, every
output checked by its round trip and every few hundred calls against the reference engine;
afterwards the GPU memory and file descriptors are what they were before the buffer."""

from __future__ import annotations

import gc
import os
import time
import warnings
import zlib

import torch
import torch.distributed as dist
from gpu_cases import (
    Ctx,
    check_round_trip,
    job,
    make_hidden,
    make_routing,
    reference_combine,
    routing_args,
)
from gpu_checks import Stats, check_combine, check_dispatch, first_mismatch

from cases.check import plus_zero, round_trip_rows

VARIANTS = ("dispatch", "permute", "permute_fused", "permute_nonblocking")
PAD = 16


def _knobs(seed: int, pair: int) -> torch.Generator:
    """Choices every rank makes alike (the variant, k, probs, growth)."""
    return torch.Generator().manual_seed(zlib.crc32(f"soak/{seed}/{pair}".encode()))


def _check_permute_round_trip(ctx: Ctx, buf, x, rt, spec, fused: bool, non_blocking: bool,
                              budget: int, what: str) -> None:
    """combine_with_unpermute(dispatch_with_permute(x)) through the identity expert ==
    BF16(x * experts selected), exactly; its probs == the dense probs passed."""
    extra = {"num_permuted_tokens": budget} if non_blocking else {}
    rows, row_probs, _, _, handle = buf.dispatch_with_permute(
        hidden=x, pad_multiple=PAD, fuse_permute_dispatch=fused, non_blocking=non_blocking,
        **routing_args(spec, rt), **extra)
    combined, combined_probs = buf.combine_with_unpermute(
        hidden=rows, probs=row_probs, handle=handle, pad_multiple=PAD,
        fuse_unpermute_combine=fused)
    if non_blocking:
        assert int(handle[10].item()) == 0, f"{ctx.where()} {what}: overflow with the budget"
    T, W = x.shape[0], spec["W"]
    R = spec.get("R") or W
    want = round_trip_rows(x, rt["map"].view(T, W // R, R * spec["E"]).sum(dim=2))
    if not torch.equal(plus_zero(combined), plus_zero(want)):
        raise AssertionError(f"{ctx.where()} {what}: unpermute+combine of the permuted rows != "
                             "x * experts selected: " + first_mismatch(combined, want))
    if spec["with_probs"]:
        assert torch.equal(combined_probs, rt["probs"]), \
            f"{ctx.where()} {what}: combined_probs != the probs passed"


def _against_reference(ctx: Ctx, buf, x, rt, spec, stats: Stats, what: str) -> None:
    """The CUDA engine's dispatch and combine of ``x`` against the reference engine's."""
    out = buf.dispatch(hidden=x, **routing_args(spec, rt))
    ref = buf.dispatch(hidden=x.cpu(), **routing_args(spec, rt, on_cpu=True))
    check_dispatch(ctx, out, ref, what, x.dtype, stats)
    got = buf.combine(hidden=out[0], probs=out[1], handle=out[3])
    exp = reference_combine(buf, spec, ref[0], ref[1], ref[3])
    check_combine(ctx, got, exp, f"{what} combine", stats)


def _usage(ctx: Ctx) -> dict:
    """Collective: device memory free and this process's open file descriptors, once every
    rank has released what it no longer holds."""
    ctx.sync()
    gc.collect()
    if ctx.dev.type == "cuda":
        torch.cuda.empty_cache()
    dist.barrier()
    free = torch.cuda.mem_get_info(ctx.dev)[0] if ctx.dev.type == "cuda" else 0
    allocated = torch.cuda.memory_allocated(ctx.dev) if ctx.dev.type == "cuda" else 0
    fds = len(os.listdir("/proc/self/fd"))
    dist.barrier()
    return {"free": free, "allocated": allocated, "fds": fds}


def _calls(ctx: Ctx, buf, seed: int, calls: int, check_every: int, H: int, E: int,
           max_tokens: int, grow_at: tuple, stats: Stats) -> dict:
    """The soak's calls on ``buf`` (a function of its own: its tensors are gone on return)."""
    W, r = ctx.W, ctx.rank
    counts = dict.fromkeys(VARIANTS, 0)
    grown, capacity = 0, max_tokens
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # growth warns, as documented
        for pair in range(calls // 2):
            knobs = _knobs(seed, pair)
            variant = VARIANTS[int(torch.randint(0, len(VARIANTS), (1,), generator=knobs))]
            grow = pair in grow_at
            if grow:
                variant = "dispatch"  # blocking: grows the buffer collectively
            mine = torch.Generator().manual_seed(zlib.crc32(f"soak/{seed}/{pair}/{r}".encode()))
            T = int(torch.randint(0, capacity + 1, (1,), generator=mine))
            if grow and r == pair % W:
                T = capacity + 64
            spec = {"seed": seed * 100003 + pair, "W": W, "E": E, "H": H, "dtype": "bf16",
                    "form": "topk" if pair % 2 else "map",
                    "k": (1, 2, 4)[int(torch.randint(0, 3, (1,), generator=knobs))],
                    "routing": "skew" if pair % 17 == 5 else "uniform", "target": pair % W,
                    "with_probs": bool(torch.rand(1, generator=knobs) < 0.8),
                    "tokens": [T if s == r else -1 for s in range(W)]}
            x, _ = make_hidden(ctx, spec, T, "x")
            rt = make_routing(ctx, spec, T)
            what = f"pair {pair} ({variant}, T={T})"
            if pair % check_every == 0 and not grow:
                _against_reference(ctx, buf, x, rt, spec, stats, what)
            elif variant == "dispatch":
                out = buf.dispatch(hidden=x, **routing_args(spec, rt))
                check_round_trip(ctx, buf, out, x, rt, spec, what)
            else:
                budget = -(-(W * capacity * E + E * PAD) // PAD) * PAD
                _check_permute_round_trip(ctx, buf, x, rt, spec, variant == "permute_fused",
                                          variant == "permute_nonblocking", budget, what)
            counts[variant] += 1
            if grow:
                grown += 1
                capacity = buf.max_num_of_tokens_per_rank
    ctx.sync()
    return {"variants": counts, "grown": grown, "capacity": capacity}


@job
def soak(ctx: Ctx, seed: int, calls: int, check_every: int, H: int, E: int,
         max_tokens: int, grow_at: tuple) -> dict:
    """``calls`` calls (dispatch-like and combine-like in pairs). Returns the tallies, the
    variants run, the growths and the resource usage before the buffer and after its destroy."""
    before = _usage(ctx)
    buf = ctx.buffer(H, max_tokens, E)
    stats = Stats()
    start = time.monotonic()
    ran = _calls(ctx, buf, seed, calls, check_every, H, E, max_tokens, grow_at, stats)
    seconds = time.monotonic() - start
    buf.destroy()
    ctx.buffers.remove(buf)
    del buf
    after = _usage(ctx)
    return stats.as_dict(calls=2 * (calls // 2), seconds=seconds, before=before, after=after,
                         **ran)
