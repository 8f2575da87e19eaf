"""Checks at the Python boundary: each failure names the argument, the value and the expectation.

Everything here runs before any communication, so a bad input raises on the rank that has it.
"""

from __future__ import annotations

import warnings

import torch

# Warnings given once per process.
_warned = {"scaling_factor": False}

BF16_TYPES = (torch.bfloat16,)
FP8_TYPES = tuple(
    t for t in (torch.uint8, getattr(torch, "float8_e4m3fn", None),
                getattr(torch, "float8_e5m2", None)) if t is not None)
FP8_BLOCK = 128
BF16_ALIGN = 16


def describe(t: torch.Tensor) -> str:
    return f"tensor(shape={tuple(t.shape)}, dtype={t.dtype}, device={t.device})"


def require_tensor(name: str, value, *, dtypes=None, ndim=None, shape=None,
                   device=None) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if dtypes is not None and value.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name}: dtype {value.dtype} is not supported; expected {names} "
                        f"(got {describe(value)})")
    if ndim is not None and value.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got {describe(value)}")
    if shape is not None:
        for axis, want in enumerate(shape):
            if want is not None and value.shape[axis] != want:
                expected = tuple("*" if s is None else s for s in shape)
                raise ValueError(f"{name}: expected shape {expected}, got {describe(value)}")
    if device is not None and value.device != device:
        raise ValueError(f"{name}: on {value.device}, expected the device of hidden ({device})")
    return value


def require_int(name: str, value, *, minimum: int = 0) -> int:
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.dtype.is_floating_point or value.dtype == torch.bool:
            raise TypeError(f"{name}: expected an int or a 0-d integer tensor, got "
                            f"{describe(value)}")
        if value.device.type != "cpu":
            raise ValueError(f"{name}: a tensor value must live on the CPU (reading it from "
                             f"{value.device} would synchronise the host), got {describe(value)}")
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}={value}: expected an int >= {minimum}")
    return value


def optional_positive(name: str, value, default: int | None) -> int | None:
    """``value`` as an int >= 1, or ``default`` when it is None."""
    if value is None:
        return default
    return require_int(name, value, minimum=1)


def check_flag(name: str, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {value!r}")


def check_same(name: str, given, made, made_with: str | None = None):
    """A call reusing a handle must pass the value the handle was made with."""
    if given != made:
        raise ValueError(f"{name}={given}: the handle was made with {made_with or name}={made}; "
                         "a call that reuses a handle must use the same value")


def check_handle_device(handle, hidden: torch.Tensor) -> None:
    device = handle[0].device
    if device != hidden.device:
        raise ValueError(f"handle: its tensors live on {device}, hidden on {hidden.device}; a "
                         "handle works only with tensors on the device of the call that made it")


def check_dispatched_count(value, actual: int | None):
    """``actual`` is None in the CUDA engine's non-blocking mode (the count stays on the
    device), where the given value cannot be checked without a host synchronisation."""
    if value is None or actual is None:
        return
    value = require_int("num_dispatched_tokens", value)
    if value != actual:
        raise ValueError(f"num_dispatched_tokens={value}: this rank receives {actual} rows")


def normalize_pad_multiple(value) -> int:
    """None, 0 and 1 all mean "no padding"."""
    if value is None:
        return 1
    value = require_int("pad_multiple", value, minimum=0)
    return max(value, 1)


def is_fp8(hidden: torch.Tensor) -> bool:
    return hidden.dtype in FP8_TYPES


def check_hidden(hidden, *, allow_fp8: bool, name: str = "hidden") -> bool:
    """Returns True for FP8 rows."""
    dtypes = BF16_TYPES + FP8_TYPES if allow_fp8 else BF16_TYPES
    require_tensor(name, hidden, dtypes=dtypes, ndim=2)
    is_fp8 = hidden.dtype in FP8_TYPES
    width = hidden.shape[1]
    align = FP8_BLOCK if is_fp8 else BF16_ALIGN
    if width == 0 or width % align != 0:
        kind = "FP8 rows (one fp32 scale per 128 values)" if is_fp8 else "BF16 rows"
        raise ValueError(f"{name}: hidden size {width} is not a positive multiple of {align}, "
                         f"which {kind} need (got {describe(hidden)})")
    return is_fp8


def check_scaling_factor(scaling_factor, hidden: torch.Tensor, is_fp8: bool):
    if not is_fp8:
        if scaling_factor is not None and not _warned["scaling_factor"]:
            # The original ignores it for BF16 tokens, and clients pass it unconditionally.
            _warned["scaling_factor"] = True
            warnings.warn(f"scaling_factor: given ({describe(scaling_factor)}) with {hidden.dtype} "
                          "hidden, which has no scaling factors; ignored (warned once)",
                          UserWarning, stacklevel=4)
        return None
    if scaling_factor is None:
        raise ValueError(f"scaling_factor: required for FP8 hidden ({describe(hidden)}); expected "
                         f"fp32 [{hidden.shape[0]}, {hidden.shape[1] // FP8_BLOCK}]")
    return require_tensor("scaling_factor", scaling_factor, dtypes=(torch.float32,), ndim=2,
                          shape=(hidden.shape[0], hidden.shape[1] // FP8_BLOCK),
                          device=hidden.device)


def routing_from_topk(topk_idx, topk_weights, num_tokens: int, num_experts: int,
                      device: torch.device, check_values: bool = True):
    """topk form -> (bool routing_map [T, E_total], fp32 probs or None).

    Built without a host synchronisation (no boolean-mask indexing): slot (t, j) lands at flat
    index t * E_total + topk_idx[t, j], and empty slots at one spare element past the end.
    Checking the values (range, duplicates) reads them on the host, which on a GPU is a
    synchronisation: ``check_values=False`` skips it there (non-blocking calls, calls with a
    handle); out-of-range entries are then dropped like empty slots and a duplicated expert
    keeps one of its weights."""
    require_tensor("topk_idx", topk_idx, dtypes=(torch.int64, torch.int32, torch.int16),
                   ndim=2, shape=(num_tokens, None), device=device)
    k = topk_idx.shape[1]
    if topk_weights is not None:
        require_tensor("topk_weights", topk_weights, dtypes=(torch.float32,), ndim=2,
                       shape=(num_tokens, k), device=device)
    idx = topk_idx.to(torch.int64)
    if check_values:
        _check_topk_values(idx, num_experts)
    cells = num_tokens * num_experts
    valid = (idx >= 0) & (idx < num_experts)
    rows = torch.arange(num_tokens, device=device).unsqueeze(1)
    flat = torch.where(valid, rows * num_experts + idx, cells).reshape(-1)
    routing = torch.zeros(cells + 1, dtype=torch.bool, device=device)
    routing.index_fill_(0, flat, True)
    routing_map = routing[:cells].view(num_tokens, num_experts)
    probs = None
    if topk_weights is not None:
        dense = torch.zeros(cells + 1, dtype=torch.float32, device=device)
        dense.index_put_((flat,), topk_weights.reshape(-1))
        probs = dense[:cells].view(num_tokens, num_experts)
    return routing_map, probs


def _check_topk_values(idx: torch.Tensor, num_experts: int) -> None:
    """Out-of-range entries and experts selected twice in a row, in one host read."""
    bad = (idx < -1) | (idx >= num_experts)
    dup = None
    if idx.shape[1] > 1:
        ordered, _ = idx.sort(dim=1)
        dup = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
    found = bad.any() if dup is None else bad.any() | dup.any()
    if not bool(found):
        return
    if bool(bad.any()):
        where = tuple(int(v) for v in torch.nonzero(bad)[0])
        raise ValueError(f"topk_idx: entry {where} = {int(idx[where])} is out of range; expected "
                         f"-1 (no expert) or 0..{num_experts - 1}")
    row = int(torch.nonzero(dup)[0, 0])
    raise ValueError(f"topk_idx: row {row} selects an expert twice ({idx[row].tolist()}); "
                     "expected distinct experts per token")


def resolve_routing(*, hidden: torch.Tensor, routing_map, probs, topk_idx, topk_weights,
                    num_of_experts, expected_experts: int, has_handle: bool,
                    non_blocking: bool = False):
    """Returns (routing_map or None, probs or None); raises on a twice-given or missing routing.
    topk_idx values on a GPU are checked only by blocking calls without a handle: elsewhere the
    check would be the call's only host synchronisation (routing_from_topk). On the CPU it costs
    nothing and always runs."""
    num_tokens = hidden.shape[0]
    if num_of_experts is not None:
        num_of_experts = require_int("num_of_experts", num_of_experts, minimum=1)
        if num_of_experts != expected_experts:
            raise ValueError(f"num_of_experts={num_of_experts}: expected {expected_experts} "
                             "(num_local_experts x group size)")
    if routing_map is not None and topk_idx is not None:
        raise ValueError("routing given twice: pass routing_map (+probs) or topk_idx "
                         "(+topk_weights), not both")
    if topk_idx is None and topk_weights is not None:
        raise ValueError("topk_weights: given without topk_idx; expected both or neither")
    if routing_map is not None and topk_weights is not None:
        raise ValueError("topk_weights: given with routing_map; use probs with routing_map")
    if topk_idx is not None and probs is not None:
        raise ValueError("probs: given with topk_idx; use topk_weights with topk_idx")
    # With a handle the routing is fixed by it: routing inputs are checked (on a GPU, topk_idx
    # only for its shape and type), then used for the probs alone.
    if topk_idx is not None:
        return routing_from_topk(topk_idx, topk_weights, num_tokens, expected_experts,
                                 hidden.device,
                                 check_values=hidden.device.type == "cpu"
                                 or (not has_handle and non_blocking is not True))
    if routing_map is not None:
        require_tensor("routing_map", routing_map, dtypes=(torch.bool,), ndim=2,
                       shape=(num_tokens, expected_experts), device=hidden.device)
    elif not has_handle:
        raise ValueError("no routing: pass routing_map (+probs), topk_idx (+topk_weights) or "
                         "the handle of an earlier dispatch")
    if probs is not None:
        require_tensor("probs", probs, dtypes=(torch.float32,), ndim=2,
                       shape=(num_tokens, expected_experts), device=hidden.device)
    return routing_map, probs
