"""Deterministic inputs: any rank can regenerate any rank's tensors from the spec and a seed.

A *spec* is a plain dict (it travels to the workers by pickle):

- ``seed``: int; ``W``: ranks; ``R``: ranks per NVLink domain; ``E``: experts per rank;
  ``H``: hidden size;
- ``tokens``: list of ``T_r`` per rank (ragged, zeros allowed);
- ``max_tokens``: list of each rank's ``max_num_of_tokens_per_rank`` constructor argument;
- ``routing``: ``"map"`` (routing_map + probs), ``"topk"`` (topk_idx + topk_weights, with -1
  slots), ``"skew"`` (topk restricted to the experts of ranks 0 and 1, so other ranks may
  receive nothing);
- ``dtype``: ``"bf16"``, ``"u8"`` (FP8 bytes as torch.uint8) or ``"e4m3"``
  (torch.float8_e4m3fn), the FP8 kinds with fp32 scaling factors ``[T, H/128]``;
- ``with_probs``: whether probs / topk_weights are passed;
- ``k``: slots per token for the topk kinds;
- ``layout``: ``"contig"``, ``"noncontig"`` (every input a strided view) or ``"expanded"``
  (hidden / scales / combine inputs are stride-0 expansions of one row, the rest strided).
"""

from __future__ import annotations

import zlib

import torch

FP8_KINDS = ("u8", "e4m3")


def make_spec(*, seed: int, W: int, R: int, E: int = 2, H: int | None = None,
              tokens=None, max_tokens=None, routing: str = "map", dtype: str = "bf16",
              with_probs: bool = True, k: int = 4, layout: str = "contig") -> dict:
    if H is None:
        H = 256 if dtype in FP8_KINDS else 128
    if tokens is None:
        tokens = token_counts(W, "ragged", seed)
    if max_tokens is None:
        max_tokens = [max(max(tokens), 1)] * W
    return {"seed": seed, "W": W, "R": R, "E": E, "H": H, "tokens": list(tokens),
            "max_tokens": list(max_tokens), "routing": routing, "dtype": dtype,
            "with_probs": with_probs, "k": k, "layout": layout}


def seed_of(*parts) -> int:
    return zlib.crc32("/".join(str(p) for p in parts).encode())


def generator(*parts) -> torch.Generator:
    return torch.Generator().manual_seed(seed_of(*parts))


def token_counts(W: int, pattern: str, seed: int, maximum: int = 48) -> list:
    """Token counts per rank for a named pattern."""
    g = generator("tokens", pattern, seed, W)
    if pattern == "ragged":  # random in [1, maximum], one rank with none (when W > 1)
        counts = torch.randint(1, maximum + 1, (W,), generator=g).tolist()
        if W > 1:
            counts[int(torch.randint(0, W, (1,), generator=g))] = 0
        counts[int(torch.argmax(torch.tensor(counts)))] = maximum
        return counts
    if pattern == "equal":
        return [maximum] * W
    if pattern == "one_nonzero":
        counts = [0] * W
        counts[W - 1] = maximum
        return counts
    if pattern == "all_zero":
        return [0] * W
    if pattern == "tiny":
        return [1 + (r % 2) for r in range(W)]
    raise ValueError(pattern)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous view."""
    if t.dim() == 2:
        return t.t().contiguous().t()
    base = torch.zeros(*t.shape[:-1], t.shape[-1] * 2, dtype=t.dtype)
    view = base[..., ::2]
    view.copy_(t)
    return view


def _rows(g: torch.Generator, kind: str, shape, dtype: str | None = None) -> torch.Tensor:
    if kind == "hidden":
        if dtype == "bf16":
            return torch.randn(shape, generator=g).to(torch.bfloat16)
        raw = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
        return raw if dtype == "u8" else raw.view(torch.float8_e4m3fn)
    if kind == "scales":
        return torch.rand(shape, generator=g) * 4 + 0.01
    if kind == "grad":
        return torch.randn(shape, generator=g).to(torch.bfloat16)
    if kind == "probs":
        return torch.rand(shape, generator=g)
    raise ValueError(kind)


def _dense_tensor(spec, g, kind, T, width, dtype=None) -> torch.Tensor:
    """A [T, width] tensor of random rows in the spec's layout."""
    if spec["layout"] == "expanded" and kind in ("hidden", "scales", "grad"):
        return _rows(g, kind, (1, width), dtype).expand(T, width)
    t = _rows(g, kind, (T, width), dtype)
    return _strided(t) if spec["layout"] != "contig" else t


def _maybe_strided(spec, t: torch.Tensor) -> torch.Tensor:
    return _strided(t) if spec["layout"] != "contig" else t


def gen_inputs(spec: dict, rank: int, salt: str = "fwd") -> dict:
    """The dispatch inputs of ``rank`` (API argument names as keys, None where not passed)."""
    W, E, H, dtype = spec["W"], spec["E"], spec["H"], spec["dtype"]
    T = spec["tokens"][rank]
    E_total = E * W
    g = generator(spec["seed"], rank, salt)
    out = {"hidden": _dense_tensor(spec, g, "hidden", T, H, dtype), "scaling_factor": None,
           "routing_map": None, "probs": None, "topk_idx": None, "topk_weights": None,
           "num_of_experts": None}
    if dtype in FP8_KINDS:
        out["scaling_factor"] = _dense_tensor(spec, g, "scales", T, H // 128)
    g = generator(spec["seed"], rank, "routing")  # routing does not depend on the salt
    if spec["routing"] == "map":
        density = torch.rand((T, 1), generator=g)
        density[::7] = 0.0  # some tokens go nowhere
        routing_map = torch.rand((T, E_total), generator=g) < density
        out["routing_map"] = _maybe_strided(spec, routing_map)
        if spec["with_probs"]:
            probs = torch.rand((T, E_total), generator=g) * routing_map
            out["probs"] = _maybe_strided(spec, probs)
    else:
        pool = E_total if spec["routing"] == "topk" else min(2 * E, E_total)
        k = min(spec["k"], pool)
        idx = torch.stack([torch.randperm(pool, generator=g)[:k] for _ in range(T)]) \
            if T else torch.zeros((0, k), dtype=torch.int64)
        empty = torch.rand((T, k), generator=g) < 0.25
        idx = torch.where(empty, torch.full_like(idx, -1), idx)
        out["topk_idx"] = _maybe_strided(spec, idx.to(torch.int64))
        out["num_of_experts"] = E_total
        if spec["with_probs"]:
            weights = torch.rand((T, k), generator=g)
            weights = torch.where(empty, torch.full_like(weights, 9.0), weights)  # ignored
            out["topk_weights"] = _maybe_strided(spec, weights)
    return out


def gen_all_inputs(spec: dict, salt: str = "fwd") -> list:
    return [gen_inputs(spec, r, salt) for r in range(spec["W"])]


def gen_combine_inputs(spec: dict, rank: int, rows: int, probs_width: int | None,
                       salt: str = "combine") -> tuple:
    """Inputs of a combine on ``rank``: BF16 hidden ``[rows, H]`` and fp32 probs
    (``[rows, probs_width]``, or ``[rows]`` when ``probs_width`` is 0, None when not passed)."""
    g = generator(spec["seed"], rank, salt)
    hidden = _dense_tensor(spec, g, "grad", rows, spec["H"])
    if not spec["with_probs"] or probs_width is None:
        return hidden, None
    if probs_width == 0:
        if spec["layout"] == "expanded":
            return hidden, torch.rand((1,), generator=g).expand(rows)
        return hidden, _maybe_strided(spec, torch.rand((rows,), generator=g))
    return hidden, _maybe_strided(spec, torch.rand((rows, probs_width), generator=g))


def routing_kwargs(spec: dict, inputs: dict, permute: bool = False) -> dict:
    """The routing keyword arguments of a dispatch call for these inputs."""
    if spec["routing"] == "map":
        kw = {"routing_map": inputs["routing_map"]}
        if inputs["probs"] is not None:
            kw["probs"] = inputs["probs"]
        return kw
    kw = {"topk_idx": inputs["topk_idx"], "num_of_experts": inputs["num_of_experts"]}
    if inputs["topk_weights"] is not None:
        kw["topk_weights"] = inputs["topk_weights"]
    if permute:
        kw["num_of_experts_per_rank"] = spec["E"]
    return kw
