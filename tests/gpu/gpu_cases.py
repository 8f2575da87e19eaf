"""Rank code of the GPU tests (imported by the pool workers, never by pytest itself).

The oracle of every CUDA call is the same call with CPU copies of the inputs through the same
``HybridEPBuffer``: CPU tensors run on the reference engine, CUDA tensors on the CUDA engine.
Dispatch outputs and handles must match bitwise; combine must match within BF16 rounding of
the fp32 sum (and usually bitwise: the reduction order is the same), combined_probs exactly.

Inputs are generated on the rank's device from a seed per (case, rank, purpose), so a failure
reproduces. A *spec* is a plain dict:

- ``seed``, ``W`` (ranks), ``E`` (experts per rank), ``H`` (hidden);
- ``dtype``: ``bf16``, ``u8`` (FP8 bytes as torch.uint8) or ``e4m3`` (torch.float8_e4m3fn),
  the FP8 kinds with fp32 scales ``[T, H/128]``;
- ``form``: ``map`` (routing_map + probs) or ``topk`` (topk_idx + topk_weights);
- ``k``: experts per token; ``routing``: ``uniform``, ``skew`` (every token only to experts of
  rank ``target``, default the last), ``domain`` (every token to every expert of the NVLink
  domain of ``target``: k is E*R) or ``empty`` (no token goes anywhere); all but empty leave
  about one slot in eight empty (-1), so some tokens go nowhere;
- ``with_probs``; ``tokens``: T_r per rank (ragged, zeros allowed); ``max_tokens``: each rank's
  ``max_num_of_tokens_per_rank`` argument (they may differ; the buffer agrees on the maximum);
- ``reuse``: also dispatch again with the handle and combine twice with it;
- ``strided``: pass non-contiguous inputs (column-major hidden / routing / probs, a stride-0
  expanded combine input);
- ``R`` (optional): ranks per NVLink domain, splitting the W ranks into W / R domains (default
  W: one domain).
"""

from __future__ import annotations

import functools
import gc
import os
import time
import warnings
import zlib

import torch
import torch.distributed as dist
from gpu_checks import (
    Stats,
    as_bytes,
    check_combine,
    check_dispatch,
    check_handle,
    first_mismatch,
)

from cases.check import plus_zero, round_trip_rows
from cases.common import env

DRY_RUN = os.environ.get("HYBRID_EP_GPU_TESTS_DRY_RUN", "") == "1"
FP8_KINDS = ("u8", "e4m3")


# -- the rank's context ----------------------------------------------------------------------
class Ctx:
    """This rank's device (from the placement), SM budget and buffers."""

    def __init__(self, placement: str):
        self.rank = dist.get_rank()
        self.W = dist.get_world_size()
        self.placement = placement
        if placement not in ("shared", "per_gpu"):
            raise ValueError(f"placement {placement!r}")
        if DRY_RUN:
            self.dev = torch.device("cpu")
            gpus = int(os.environ.get("HYBRID_EP_GPU_TESTS_DRY_RUN_GPUS", "1"))
        else:
            gpus = torch.cuda.device_count()
            index = 0 if placement == "shared" else self.rank % gpus
            torch.cuda.set_device(index)
            self.dev = torch.device("cuda", index)
        ranks_per_gpu = self.W if placement == "shared" else -(-self.W // max(gpus, 1))
        # Persistent kernels of all ranks on one GPU must fit at once: ranks x SMs <= 132.
        self.sms = max(1, min(16, 64 // ranks_per_gpu))
        self.buffers = []

    def where(self) -> str:
        return f"[rank {self.rank}/{self.W} {self.placement} {self.dev}]"

    def generator(self, *parts) -> torch.Generator:
        seed = zlib.crc32("/".join(str(p) for p in parts).encode())
        return torch.Generator(device=self.dev).manual_seed(seed)

    def buffer(self, H: int, max_tokens: int, E: int, fp8: bool = False, **overrides):
        from hybrid_ep import HybridEPBuffer

        kwargs = {"num_sms_dispatch_api": self.sms, "num_sms_combine_api": self.sms,
                      "num_sms_preprocessing_api": self.sms,
                      "num_of_hybrid_ep_ranks_per_nvlink_domain": self.W}
        kwargs.update(overrides)
        buf = HybridEPBuffer(dist.group.WORLD, hidden_dim=H, max_num_of_tokens_per_rank=max_tokens,
                             num_local_experts=E, use_fp8=fp8, **kwargs)
        self.buffers.append(buf)
        return buf

    def sync(self) -> None:
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)

    def quiesce(self) -> None:
        """Collective: no rank's GPU work is in flight any more (a peer may still read this
        rank's registered memory until then)."""
        self.sync()
        dist.barrier()

    def drop(self, buf) -> None:
        """Collective: quiesce, then release ``buf`` (the caller deletes its own reference)."""
        self.quiesce()
        self.buffers.remove(buf)
        gc.collect()


def domain_args(spec: dict) -> dict:
    """The buffer's domain split of ``spec`` (one domain unless the spec names ``R``)."""
    if "R" not in spec:
        return {}
    return {"num_of_hybrid_ep_ranks_per_nvlink_domain": spec["R"]}


def job(function):
    """A pool job: ``function(ctx, **kwargs)`` with the rank on its GPU; afterwards every rank
    quiesces before the buffers are released, so no rank frees memory a peer still reads."""

    @functools.wraps(function)
    def run(*, placement: str, **kwargs):
        ctx = Ctx(placement)
        result = function(ctx, **kwargs)
        ctx.quiesce()
        ctx.buffers.clear()
        gc.collect()
        if ctx.dev.type == "cuda":
            torch.cuda.empty_cache()
        dist.barrier()
        return result

    return run


# -- inputs ----------------------------------------------------------------------------------
def colmajor(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous (column-major) 2-D view."""
    return t.t().contiguous().t()


def cpu(t):
    return t.cpu() if isinstance(t, torch.Tensor) else t


def make_hidden(ctx: Ctx, spec: dict, T: int, salt: str):
    """(hidden [T, H], scales [T, H/128] or None) on the rank's device."""
    H = spec["H"]
    g = ctx.generator(spec["seed"], ctx.rank, "hidden", salt)
    if spec["dtype"] == "bf16":
        return torch.randn((T, H), generator=g, device=ctx.dev).to(torch.bfloat16), None
    raw = torch.randint(0, 256, (T, H), generator=g, device=ctx.dev, dtype=torch.uint8)
    # (A dry run keeps e4m3 as bytes: both of its sides run on the reference engine.)
    keep_bytes = spec["dtype"] == "u8" or DRY_RUN
    hidden = raw if keep_bytes else raw.view(torch.float8_e4m3fn)
    scales = torch.rand((T, H // 128), generator=g, device=ctx.dev) * 4 + 0.01
    return hidden, scales


def make_routing(ctx: Ctx, spec: dict, T: int, salt: str = "routing") -> dict:
    """Routing of this rank in both forms: idx/weights [T, k'] and dense map/probs
    [T, E_total], on the rank's device."""
    W, E = spec["W"], spec["E"]
    E_total = W * E
    g = ctx.generator(spec["seed"], ctx.rank, "routing", salt)
    pattern, k = spec["routing"], spec["k"]
    if pattern == "uniform":
        assert k <= E_total, (k, E_total)
        idx = torch.rand((T, E_total), generator=g, device=ctx.dev).topk(k, dim=1).indices
    elif pattern == "skew":
        target = spec.get("target", W - 1)
        k = min(k, E)
        idx = target * E + torch.rand((T, E), generator=g, device=ctx.dev).topk(k, dim=1).indices
    elif pattern == "domain":  # every expert of the target's NVLink domain (k is E*R)
        width = E * spec.get("R", W)
        k = width
        first = spec.get("target", W - 1) * E // width * width
        idx = (first + torch.arange(width, device=ctx.dev)).expand(T, width).contiguous()
    elif pattern == "empty":
        idx = torch.full((T, k), -1, dtype=torch.int64, device=ctx.dev)
    else:
        raise ValueError(pattern)
    if pattern != "empty":
        holes = torch.rand((T, k), generator=g, device=ctx.dev) < 0.125
        idx = idx.masked_fill(holes, -1)
    weights = torch.rand((T, k), generator=g, device=ctx.dev)
    valid = idx >= 0
    rows = torch.arange(T, device=ctx.dev).unsqueeze(1).expand_as(idx)[valid]
    cols = idx[valid]
    dense_map = torch.zeros((T, E_total), dtype=torch.bool, device=ctx.dev)
    dense_map[rows, cols] = True
    dense_probs = torch.zeros((T, E_total), dtype=torch.float32, device=ctx.dev)
    dense_probs[rows, cols] = weights[valid]
    return {"idx": idx, "weights": weights, "map": dense_map, "probs": dense_probs}


def routing_args(spec: dict, rt: dict, on_cpu: bool = False) -> dict:
    """Routing keyword arguments of a dispatch call (CPU copies for the reference call)."""
    move = cpu if on_cpu else (lambda t: t)
    strided = colmajor if spec.get("strided") else (lambda t: t)
    if spec["form"] == "map":
        kw = {"routing_map": move(strided(rt["map"]))}
        if spec["with_probs"]:
            kw["probs"] = move(strided(rt["probs"]))
        return kw
    kw = {"topk_idx": move(rt["idx"]), "num_of_experts": spec["W"] * spec["E"]}
    if spec["with_probs"]:
        kw["topk_weights"] = move(rt["weights"])
    return kw


def hidden_args(spec: dict, hidden, scales, on_cpu: bool = False) -> dict:
    if on_cpu:
        return {"hidden": as_bytes(hidden.cpu()), "scaling_factor": cpu(scales)}
    if spec.get("strided"):
        if spec["dtype"] == "bf16":
            hidden = colmajor(hidden)
        if scales is not None:
            scales = colmajor(scales)
    return {"hidden": hidden, "scaling_factor": scales}


def combine_inputs(ctx: Ctx, spec: dict, rows: int, salt: str):
    """(BF16 [rows, H], fp32 probs [rows, E*R] or None) on the device, and the arguments to
    pass (a stride-0 expansion of one row in strided specs)."""
    H, width = spec["H"], spec["E"] * spec.get("R", spec["W"])
    g = ctx.generator(spec["seed"], ctx.rank, "combine", salt)
    if spec.get("strided"):
        one = torch.randn((1, H), generator=g, device=ctx.dev).to(torch.bfloat16)
        passed = one.expand(rows, H)
        y = passed.contiguous()
    else:
        y = torch.randn((rows, H), generator=g, device=ctx.dev).to(torch.bfloat16)
        passed = y
    yp = None
    if spec["with_probs"]:
        yp = torch.rand((rows, width), generator=g, device=ctx.dev)
    passed_probs = colmajor(yp) if (yp is not None and spec.get("strided")) else yp
    return y, yp, passed, passed_probs


# -- checks (the rest: gpu_checks.py) ------------------------------------------------------
def check_round_trip(ctx: Ctx, buf, out, x: torch.Tensor, rt: dict, spec: dict, what: str):
    """combine(dispatch(x)) == x * copies exactly (BF16 x, fp32 sum of equal copies is exact;
    across domains with the BF16 wire, of each domain's rounded partial: round_trip_rows);
    combined_probs == the dense probs passed. Returns the combine outputs."""
    tokens, dprobs, _, handle = out
    combined, cprobs = engine_combine(buf, spec, tokens, dprobs, handle)
    T, W = x.shape[0], spec["W"]
    R = spec.get("R") or W
    per_rank = rt["map"].view(T, W, spec["E"]).any(dim=2)
    want = round_trip_rows(x, per_rank.view(T, W // R, R).sum(dim=2))
    assert combined.device == ctx.dev and combined.dtype == torch.bfloat16, \
        f"{ctx.where()} {what}: combined {combined.dtype} on {combined.device}"
    if not torch.equal(plus_zero(combined), plus_zero(want)):
        raise AssertionError(f"{ctx.where()} {what}: combine(dispatch(x)) != x * copies: "
                             + first_mismatch(combined, want))
    if spec["with_probs"]:
        assert cprobs is not None and torch.equal(cprobs, rt["probs"]), \
            f"{ctx.where()} {what}: combined_probs of the round trip != the probs passed"
    else:
        assert cprobs is None, f"{ctx.where()} {what}: combined_probs without probs"
    return combined, cprobs


# -- cases -----------------------------------------------------------------------------------
def _dispatch_pair(ctx, buf, spec, x, sf, rt, stats, what, **extra):
    """The CUDA call and its reference; compared. Returns (out, ref)."""
    out = buf.dispatch(**hidden_args(spec, x, sf), **routing_args(spec, rt), **extra)
    ref = buf.dispatch(**hidden_args(spec, x, sf, on_cpu=True),
                       **routing_args(spec, rt, on_cpu=True),
                       **{k: cpu(v) for k, v in extra.items()})
    check_dispatch(ctx, out, ref, what, x.dtype, stats)
    return out, ref


def nobody_received(handle) -> bool:
    """Collective: no rank's dispatch received a row (a dispatch or a permute handle)."""
    from hybrid_ep.handle import handle_config

    rows = torch.tensor([handle_config(handle).num_dispatched_tokens], dtype=torch.int64)
    dist.all_reduce(rows)
    return int(rows) == 0


def reference_combine(buf, spec: dict, hidden, probs, ref_handle):
    """Collective: the reference combine of CPU inputs. When no rank received anything the
    expectation is written out instead -- zeros -- because the reference engine cannot combine
    zero rows on every rank (IndexError in movement.reduce_in_domain)."""
    if nobody_received(ref_handle):
        T = ref_handle[6].num_tokens
        zeros = torch.zeros((T, spec["H"]), dtype=torch.bfloat16)
        return zeros, (torch.zeros((T, spec["W"] * spec["E"])) if probs is not None else None)
    return buf.combine(hidden=hidden, probs=probs, handle=ref_handle)


def engine_combine(buf, spec: dict, hidden, probs, handle):
    """The combine under test (in a dry run its "engine" is the reference too, so a combine
    where nobody received anything takes the written-out zeros)."""
    if DRY_RUN and nobody_received(handle):
        return reference_combine(buf, spec, hidden, probs, handle)
    return buf.combine(hidden=hidden, probs=probs, handle=handle)


def _combine_pair(ctx, buf, spec, handle, ref_handle, rows, salt, stats, what):
    y, yp, passed, passed_probs = combine_inputs(ctx, spec, rows, salt)
    got = engine_combine(buf, spec, passed, passed_probs, handle)
    exp = reference_combine(buf, spec, y.cpu(), cpu(yp), ref_handle)
    check_combine(ctx, got, exp, what, stats)


def capture_graph(ctx: Ctx, step):
    """``step`` run once on a side stream (engine made, kernels loaded), then captured in a
    CUDA graph. Returns (graph, what the captured call returned)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    ctx.quiesce()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    ctx.quiesce()
    return graph, captured


def run_spec(ctx: Ctx, buf, spec: dict, stats: Stats, salt: str = "") -> dict:
    """One dispatch (+ round trip) and combine(s) of ``spec`` on ``buf``, against the
    reference; with ``reuse``: dispatch again with the handle, combine twice with it."""
    T = spec["tokens"][ctx.rank]
    x, sf = make_hidden(ctx, spec, T, "x" + salt)
    rt = make_routing(ctx, spec, T, "routing" + salt)
    out, ref = _dispatch_pair(ctx, buf, spec, x, sf, rt, stats, f"dispatch{salt}")
    handle, ref_handle = out[3], ref[3]
    rows = out[0].shape[0]
    bf16 = spec["dtype"] == "bf16"
    if bf16:
        check_round_trip(ctx, buf, out, x, rt, spec, f"round trip{salt}")
    for n in range(2 if spec.get("reuse") else 1):
        _combine_pair(ctx, buf, spec, handle, ref_handle, rows, f"{salt}#{n}", stats,
                      f"combine #{n + 1}{salt}")
    if spec.get("reuse"):
        x2, sf2 = make_hidden(ctx, spec, T, "x2" + salt)
        extra = {"probs": rt["probs"]} if spec["with_probs"] else {}
        out2 = buf.dispatch(**hidden_args(spec, x2, sf2), handle=handle, **extra)
        ref2 = buf.dispatch(**hidden_args(spec, x2, sf2, on_cpu=True), handle=ref_handle,
                            **{k: cpu(v) for k, v in extra.items()})
        check_dispatch(ctx, out2, ref2, f"dispatch(handle=h){salt}", x.dtype, stats)
        check_handle(ctx, out2[3], ref_handle, f"dispatch(handle=h){salt} vs first handle")
        if bf16:
            check_round_trip(ctx, buf, out2, x2, rt, spec, f"round trip of the reuse{salt}")
    return {"rows": rows, "handle": handle, "ref_handle": ref_handle, "x": x, "sf": sf, "rt": rt}


@job
def dispatch_combine(ctx: Ctx, spec: dict) -> dict:
    buf = ctx.buffer(spec["H"], spec["max_tokens"][ctx.rank], spec["E"],
                     fp8=spec["dtype"] in FP8_KINDS, **domain_args(spec))
    stats = Stats()
    start = time.monotonic()
    got = run_spec(ctx, buf, spec, stats)
    return stats.as_dict(rows=got["rows"], seconds=time.monotonic() - start)


@job
def two_buffers(ctx: Ctx, spec_a: dict, spec_b: dict) -> dict:
    """Two buffers alive at once, calls interleaved (handles of both in flight)."""
    stats = Stats()
    r = ctx.rank
    a = ctx.buffer(spec_a["H"], spec_a["max_tokens"][r], spec_a["E"],
                   fp8=spec_a["dtype"] in FP8_KINDS, **domain_args(spec_a))
    b = ctx.buffer(spec_b["H"], spec_b["max_tokens"][r], spec_b["E"],
                   fp8=spec_b["dtype"] in FP8_KINDS, **domain_args(spec_b))
    Ta, Tb = spec_a["tokens"][r], spec_b["tokens"][r]
    xa, sfa = make_hidden(ctx, spec_a, Ta, "x")
    rta = make_routing(ctx, spec_a, Ta)
    xb, sfb = make_hidden(ctx, spec_b, Tb, "x")
    rtb = make_routing(ctx, spec_b, Tb)
    out_a, ref_a = _dispatch_pair(ctx, a, spec_a, xa, sfa, rta, stats, "A dispatch")
    out_b, ref_b = _dispatch_pair(ctx, b, spec_b, xb, sfb, rtb, stats, "B dispatch")
    _combine_pair(ctx, a, spec_a, out_a[3], ref_a[3], out_a[0].shape[0], "A1", stats,
                  "A combine #1")
    xa2, sfa2 = make_hidden(ctx, spec_a, Ta, "x2")
    out_a2 = a.dispatch(**hidden_args(spec_a, xa2, sfa2), handle=out_a[3])
    ref_a2 = a.dispatch(**hidden_args(spec_a, xa2, sfa2, on_cpu=True), handle=ref_a[3])
    check_dispatch(ctx, out_a2, ref_a2, "A dispatch(handle=h)", xa.dtype, stats)
    _combine_pair(ctx, b, spec_b, out_b[3], ref_b[3], out_b[0].shape[0], "B1", stats,
                  "B combine #1")
    _combine_pair(ctx, a, spec_a, out_a[3], ref_a[3], out_a[0].shape[0], "A2", stats,
                  "A combine #2")
    _combine_pair(ctx, b, spec_b, out_b[3], ref_b[3], out_b[0].shape[0], "B2", stats,
                  "B combine #2")
    # fresh routing on both, each with its round trip where BF16
    run_spec(ctx, a, spec_a, stats, salt="/again")
    run_spec(ctx, b, spec_b, stats, salt="/again")
    return stats.as_dict()


@job
def long_run(ctx: Ctx, seed: int, H: int, E: int, max_tokens: int, iters: int,
             check_every: int, R: int | None = None, slow_domain: int | None = None,
             sleep_cycles: int = 0) -> dict:
    """``iters`` dispatch/combine pairs with fresh routing, token counts, forms and top-k each
    time; every combine(dispatch(x)) checked exactly, every ``check_every``-th call against the
    reference too, every 7th also re-dispatched with its handle. With ``slow_domain`` the ranks
    of that domain run a GPU sleep of ``sleep_cycles`` before each dispatch and combine, so that
    they lag behind the others' kernels."""
    W, r = ctx.W, ctx.rank
    # (The dry run on a CPU has no GPU to sleep on.)
    slow = (slow_domain is not None and R is not None and r // R == slow_domain
            and torch.cuda.is_available())

    def lag():
        if slow:
            torch.cuda._sleep(sleep_cycles)

    buf = ctx.buffer(H, max_tokens, E, **domain_args({"R": R} if R else {}))
    stats = Stats()
    reused = 0
    start = time.monotonic()
    for i in range(iters):
        knobs = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{i}/{r}".encode()))
        T = int(torch.randint(0, max_tokens + 1, (1,), generator=knobs))
        if float(torch.rand(1, generator=knobs)) < 0.1:
            T = 0
        # The same kind of call on every rank (forms, probs and k agree; data and T do not).
        spec = {"seed": seed * 1000 + i, "W": W, "E": E, "H": H, "dtype": "bf16",
                    "form": "topk" if i % 2 else "map", "k": (1, 2, 8)[i % 3],
                    "routing": "empty" if i % 25 == 24 else "skew" if i % 10 == 5 else "uniform",
                    "target": i % W, "with_probs": i % 4 != 3,
                    "tokens": [T if s == r else -1 for s in range(W)]}
        if R:
            spec["R"] = R
        x, _ = make_hidden(ctx, spec, T, "x")
        rt = make_routing(ctx, spec, T)
        what = f"call {i}"
        lag()
        out = buf.dispatch(hidden=x, **routing_args(spec, rt))
        compare = i % check_every == 0 or i == iters - 1
        if compare:
            ref = buf.dispatch(hidden=x.cpu(), **routing_args(spec, rt, on_cpu=True))
            check_dispatch(ctx, out, ref, what, x.dtype, stats)
        lag()
        combined = check_round_trip(ctx, buf, out, x, rt, spec, f"{what} round trip")
        if compare:  # the reference's round trip, from the reference's own dispatch
            exp = reference_combine(buf, spec, ref[0], ref[1], ref[3])
            check_combine(ctx, combined, exp, f"{what} combine", stats)
        if i % 7 == 3:
            again = buf.dispatch(hidden=x, handle=out[3])
            assert torch.equal(again[0], out[0]), \
                f"{ctx.where()} {what}: dispatch(x, handle=h) != dispatch(x): " \
                + first_mismatch(again[0], out[0])
            reused += 1
    ctx.sync()
    return stats.as_dict(iterations=iters, reused=reused, seconds=time.monotonic() - start)


def _growth_warnings(caught) -> list:
    return [str(w.message) for w in caught
            if issubclass(w.category, RuntimeWarning) and "growing" in str(w.message)]


def dispatch_with_warnings(ctx: Ctx, buf, spec: dict):
    """A dispatch of fresh inputs of ``spec`` on this rank, with the warnings it raised (a
    growth warns). Returns (outputs, hidden, routing, warnings)."""
    T = spec["tokens"][ctx.rank]
    x, _ = make_hidden(ctx, spec, T, "x")
    rt = make_routing(ctx, spec, T)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = buf.dispatch(hidden=x, **routing_args(spec, rt))
    return out, x, rt, caught


@job
def growth(ctx: Ctx, spec_small: dict, spec_big: dict, spec_after: dict) -> dict:
    """A blocking dispatch with more tokens than the buffer holds grows it (warned, on every
    rank) and still matches the reference; the handle of an earlier call still works; a call
    that fits does not grow again."""
    r = ctx.rank
    stats = Stats()
    small = spec_small["max_tokens"][r]
    buf = ctx.buffer(spec_small["H"], small, spec_small["E"], **domain_args(spec_small))
    first = run_spec(ctx, buf, spec_small, stats, salt="/small")  # engine at the small size
    before = buf.max_num_of_tokens_per_rank

    out, x, rt, caught = dispatch_with_warnings(ctx, buf, spec_big)
    grew = _growth_warnings(caught)
    assert grew, f"{ctx.where()} no 'growing' RuntimeWarning from a dispatch of " \
                 f"{spec_big['tokens']} tokens into a buffer of {before}; got " \
                 f"{[str(w.message) for w in caught]}"
    after = buf.max_num_of_tokens_per_rank
    assert after == max(spec_big["tokens"]), \
        f"{ctx.where()} max_num_of_tokens_per_rank {before} -> {after}, expected " \
        f"{max(spec_big['tokens'])}"
    ref = buf.dispatch(hidden=x.cpu(), **routing_args(spec_big, rt, on_cpu=True))
    check_dispatch(ctx, out, ref, "grown dispatch", x.dtype, stats)
    check_round_trip(ctx, buf, out, x, rt, spec_big, "grown round trip")
    _combine_pair(ctx, buf, spec_big, out[3], ref[3], out[0].shape[0], "big", stats,
                  "grown combine")

    # The handle made before the growth, on the grown buffer.
    _combine_pair(ctx, buf, spec_small, first["handle"], first["ref_handle"], first["rows"],
                  "old", stats, "combine with the pre-growth handle")
    x0 = first["x"]
    out0 = buf.dispatch(hidden=x0, handle=first["handle"])
    ref0 = buf.dispatch(hidden=x0.cpu(), handle=first["ref_handle"])
    check_dispatch(ctx, out0, ref0, "dispatch with the pre-growth handle", x0.dtype, stats)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_spec(ctx, buf, spec_after, stats, salt="/after")
    again = _growth_warnings(caught)
    assert not again, f"{ctx.where()} grew again for a call that fits: {again}"
    return stats.as_dict(before=before, after=after, warnings=len(grew))


@job
def timeout(ctx: Ctx, spec: dict, limit_s: float) -> dict:
    """Rank 0 dispatches, the others do not: rank 0 gets HybridEPTimeoutError after about
    ``limit_s`` seconds, and the next call on that buffer raises at once."""
    from hybrid_ep.cuda_engine import HybridEPTimeoutError

    r = ctx.rank
    stats = Stats()
    T = spec["tokens"][r]
    # Warm-up on a default buffer: every kernel is loaded in this process before the short
    # limit applies, so the successful calls below cannot time out on a slow first launch.
    warm = ctx.buffer(spec["H"], spec["max_tokens"][r], spec["E"])
    run_spec(ctx, warm, spec, stats, salt="/warm")
    ctx.drop(warm)
    del warm

    with env(HYBRID_EP_TIMEOUT_S=str(limit_s)):
        buf = ctx.buffer(spec["H"], spec["max_tokens"][r], spec["E"])
    x, _ = make_hidden(ctx, spec, T, "x")
    rt = make_routing(ctx, spec, T)
    dist.barrier()
    out = buf.dispatch(hidden=x, **routing_args(spec, rt))  # creates the engine (collective)
    check_round_trip(ctx, buf, out, x, rt, spec, "round trip before the timeout")
    ctx.quiesce()

    result = {"rank": r}
    if r == 0:
        for attempt in ("first", "again"):
            start = time.monotonic()
            try:
                buf.dispatch(hidden=x, **routing_args(spec, rt))
                ctx.sync()
                result[attempt] = "returned"
            except HybridEPTimeoutError as error:
                result[attempt] = "timeout"
                result[f"{attempt}_message"] = str(error)
            except Exception as error:  # noqa: BLE001 - any other outcome is recorded and asserted on
                result[attempt] = f"{type(error).__name__}: {error}"
            result[f"{attempt}_seconds"] = time.monotonic() - start
    dist.barrier()  # the other ranks wait here while rank 0 times out
    return result
