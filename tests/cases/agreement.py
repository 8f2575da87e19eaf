"""Calls that the ranks do not make alike (run on every rank of a pool, reference engine).

Every call starts with an exchange of a stamp (op, dtypes, widths, optional tensors, handle)
through the group's store (hybrid_ep/rendezvous.py): when the stamps differ, or a rank raised
on its input, every rank raises HybridEPMismatchError before data moves and the buffer stays
usable; when a rank does not come, the others raise HybridEPTimeoutError naming it after
HYBRID_EP_TIMEOUT_S. Before this, gloo aborted the process (sizes that differ) or blocked for
the process group's timeout.
"""

from __future__ import annotations

import time
import warnings

import torch

from .common import env, make_buffer, rank, world
from .dispatch import dispatch_combine
from .inputs import gen_inputs, make_spec, routing_kwargs

H = 256


def _spec(seed: int = 21, dtype: str = "bf16", **kw) -> dict:
    W = world()
    return make_spec(seed=seed, W=W, R=W, E=2, H=H, tokens=[6] * W, max_tokens=[8] * W,
                     routing="map", dtype=dtype, **kw)


def _dispatch(buf, spec, inputs, **override):
    kw = dict(hidden=inputs["hidden"], scaling_factor=inputs["scaling_factor"],
              **routing_kwargs(spec, inputs))
    kw.update(override)
    return buf.dispatch(**kw)


def _mismatched_call(kind: str, buf, spec, inp, fp8_inp, handles):
    """This rank's part of the mismatched call of ``kind``: rank 1 differs from the rest."""
    odd = rank() == 1
    if kind == "fp8_vs_bf16":
        return _dispatch(buf, spec, fp8_inp if odd else inp)
    if kind == "width":
        hidden = inp["hidden"][:, : H // 2] if odd else inp["hidden"]
        return _dispatch(buf, spec, inp, hidden=hidden)
    if kind == "probs_on_one_rank":
        return _dispatch(buf, spec, inp, probs=None if odd else inp["probs"])
    if kind == "combine_vs_dispatch":
        if odd:
            tokens, probs, _, handle = handles[0]
            return buf.combine(tokens, probs=probs, handle=handle)
        return _dispatch(buf, spec, inp)
    if kind == "different_handles":
        tokens, probs, _, handle = handles[1 if odd else 0]
        return buf.combine(tokens, probs=probs, handle=handle)
    raise ValueError(kind)


# kind -> (field the message must name as differing)
MISMATCHES = {"fp8_vs_bf16": "fp8", "width": "width", "probs_on_one_rank": "probs",
              "combine_vs_dispatch": "op", "different_handles": "handle"}


def mismatch(kind: str) -> str:
    """Every rank raises HybridEPMismatchError (a ValueError) naming rank 1 (or, on rank 1,
    rank 0) and the field; then the same buffer runs a correct dispatch/combine."""
    from hybrid_ep.errors import HybridEPMismatchError

    spec = _spec()
    buf = make_buffer(spec)
    inp = gen_inputs(spec, rank())
    fp8_inp = gen_inputs(_spec(dtype="u8"), rank())
    handles = [_dispatch(buf, spec, inp), _dispatch(buf, spec, inp)]
    try:
        _mismatched_call(kind, buf, spec, inp, fp8_inp, handles)
    except HybridEPMismatchError as error:
        message = str(error)
    else:
        raise AssertionError(f"[rank {rank()}] {kind}: no HybridEPMismatchError")
    other = 0 if rank() == 1 else 1
    assert f"rank {other}:" in message, f"[rank {rank()}] names no rank {other}: {message}"
    assert f"{MISMATCHES[kind]} " in message, \
        f"[rank {rank()}] does not name {MISMATCHES[kind]!r}: {message}"
    dispatch_combine(spec, buf, reuse=False)  # nothing moved: the buffer is still usable
    return message


def bad_input_on_one_rank() -> dict:
    """Rank 0 passes probs of the wrong shape: it raises its ValueError, the other ranks raise
    HybridEPMismatchError with its message at once (not after the timeout); the buffer stays
    usable."""
    from hybrid_ep.errors import HybridEPMismatchError

    with env(HYBRID_EP_TIMEOUT_S=60):
        spec = _spec()
        buf = make_buffer(spec)
    inp = gen_inputs(spec, rank())
    start = time.monotonic()
    try:
        if rank() == 0:
            _dispatch(buf, spec, inp, probs=inp["probs"][:, :1])
        else:
            _dispatch(buf, spec, inp)
    except HybridEPMismatchError as error:
        assert rank() != 0, f"[rank 0] expected its own ValueError, got {error}"
        assert "rank 0 raised on its input" in str(error) and "probs" in str(error), str(error)
        outcome = "mismatch"
    except ValueError as error:
        assert rank() == 0 and "probs" in str(error), f"[rank {rank()}] {error}"
        outcome = "own error"
    else:
        raise AssertionError(f"[rank {rank()}] the call did not raise")
    seconds = time.monotonic() - start
    assert seconds < 10, f"[rank {rank()}] took {seconds:.1f} s to raise (timeout 60 s)"
    dispatch_combine(spec, buf, reuse=False)
    return {"outcome": outcome, "seconds": seconds}


def skipped_call(limit_s: float) -> dict:
    """Rank 1 does not call: the others raise HybridEPTimeoutError naming the op and rank 1
    after about ``limit_s``; rank 1 then returns."""
    from hybrid_ep.errors import HybridEPTimeoutError

    with env(HYBRID_EP_TIMEOUT_S=limit_s):
        spec = _spec()
        buf = make_buffer(spec)
    if rank() == 1:
        return {"skipped": True}
    inp = gen_inputs(spec, rank())
    start = time.monotonic()
    try:
        _dispatch(buf, spec, inp)
    except HybridEPTimeoutError as error:
        message = str(error)
    else:
        raise AssertionError(f"[rank {rank()}] the call did not raise")
    seconds = time.monotonic() - start
    assert "dispatch" in message and "ranks [1]" in message, message
    assert "HYBRID_EP_TIMEOUT_S" in message, message
    assert limit_s * 0.8 <= seconds <= limit_s + 5, f"raised after {seconds:.1f} s"
    try:  # the buffer is out of step with rank 1 now: it refuses at once
        _dispatch(buf, spec, inp)
    except HybridEPTimeoutError:
        pass
    else:
        raise AssertionError("the next call on the timed-out buffer did not raise")
    return {"message": message, "seconds": seconds}


def _round_trip(buf, spec, inp) -> list:
    """dispatch, combine, dispatch_with_permute, combine_with_unpermute of ``inp``."""
    tokens, probs, _, handle = _dispatch(buf, spec, inp)
    combined, combined_probs = buf.combine(tokens, probs=probs, handle=handle)
    rows, row_probs, _, per_expert, permuted = buf.dispatch_with_permute(
        hidden=inp["hidden"], pad_multiple=8, **routing_kwargs(spec, inp, permute=True))
    back, back_probs = buf.combine_with_unpermute(hidden=rows, probs=row_probs,
                                                  handle=permuted, pad_multiple=8)
    return [tokens, probs, combined, combined_probs, rows, row_probs, per_expert, back,
            back_probs]


def default_device(device: str) -> int:
    """Every output of the four calls under torch.set_default_device(device) equals the same
    calls' outputs without it: every allocation of the library names its device (on the CPU,
    device='meta' breaks any that does not)."""
    spec = _spec()
    buf = make_buffer(spec)
    inp = gen_inputs(spec, rank())
    if device == "cuda":
        inp = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inp.items()}
    want = _round_trip(buf, spec, inp)
    torch.set_default_device(device)
    try:
        got = _round_trip(buf, spec, inp)
    finally:
        torch.set_default_device(None)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.device == b.device, f"[rank {rank()}] output {k} on {a.device}, not {b.device}"
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bfloat16 else a,
                           b.view(torch.uint8) if b.dtype == torch.bfloat16 else b), \
            f"[rank {rank()}] output {k} differs under the default device {device}"
    return len(got)


def scaling_factor_with_bf16() -> int:
    """scaling_factor with BF16 hidden is ignored (as the original does), with one warning."""
    spec = _spec()
    buf = make_buffer(spec)
    inp = gen_inputs(spec, rank())
    scales = torch.ones(inp["hidden"].shape[0], H // 128)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = _dispatch(buf, spec, inp, scaling_factor=scales)
        second = _dispatch(buf, spec, inp, scaling_factor=scales)
    plain = _dispatch(buf, spec, inp)
    assert first[2] is None and second[2] is None, "scales returned for BF16"
    assert torch.equal(first[0].view(torch.int16), plain[0].view(torch.int16))
    about = [w for w in caught if "scaling_factor" in str(w.message)]
    assert len(about) <= 1, [str(w.message) for w in about]
    return len(about)


def wide_hidden() -> str:
    """Rows wider than the buffer's hidden_dim raise at the API (both engines alike)."""
    spec = _spec()
    buf = make_buffer(spec)
    inp = gen_inputs(spec, rank())
    wide = torch.zeros(inp["hidden"].shape[0], 2 * H, dtype=torch.bfloat16)
    try:
        _dispatch(buf, spec, inp, hidden=wide)
    except ValueError as error:
        assert "hidden_dim" in str(error) and "update_template_config" in str(error), str(error)
        return str(error)
    raise AssertionError("no ValueError for rows wider than hidden_dim")
