"""Test-side helpers of the GPU suite: specs (see gpu_cases) and the report of a case."""

from __future__ import annotations

from _params import seed
from cases.inputs import token_counts


def make_spec(W: int, *, H: int, dtype: str = "bf16", form: str = "topk", k: int = 2,
              routing: str = "uniform", probs: bool = True, E: int = 4, tokens="ragged",
              max_tok: int = 128, max_tokens: str = "equal", reuse: bool = False,
              strided: bool = False, tag: str = "") -> dict:
    """``tokens``: a list per rank, or a pattern of cases.inputs.token_counts (``ragged``: one
    rank has none, one has ``max_tok``). ``max_tokens``: ``equal`` (every rank passes the
    largest count) or ``own`` (each rank passes its own count; the buffer agrees on the
    maximum)."""
    s = seed("gpu", W, H, dtype, form, k, routing, probs, E, tokens, max_tok, tag)
    counts = list(tokens) if isinstance(tokens, (list, tuple)) else \
        token_counts(W, tokens, s, maximum=max_tok)
    assert len(counts) == W, counts
    if max_tokens == "equal":
        maxima = [max(max(counts), 1)] * W
    elif max_tokens == "own":
        maxima = [max(c, 1) for c in counts]
    else:
        raise ValueError(max_tokens)
    return {"seed": s, "W": W, "E": E, "H": H, "dtype": dtype, "form": form, "k": k, "routing": routing,
                "with_probs": probs, "tokens": counts, "max_tokens": maxima, "reuse": reuse,
                "strided": strided}


def growth_specs(W: int, small: int, big: int, tag: str = "") -> tuple[dict, dict, dict]:
    """The growth case: a buffer sized for ``small`` tokens per rank (spec_small), the last rank
    then dispatching ``big`` into it (spec_big), and a call that fits the grown buffer with
    handle reuse (spec_after)."""
    spec_small = make_spec(W, H=4096, form="topk", k=2, max_tok=small, tag=f"{tag}small")
    big_tokens = list(spec_small["tokens"])
    big_tokens[W - 1] = big
    spec_big = make_spec(W, H=4096, form="topk", k=2, tokens=big_tokens, tag=f"{tag}big")
    spec_big["max_tokens"] = spec_small["max_tokens"]
    spec_after = make_spec(W, H=4096, form="map", k=2, max_tok=big, reuse=True,
                           tag=f"{tag}after")
    return spec_small, spec_big, spec_after


def spec_id(case: dict) -> str:
    """A readable test id of make_spec's keyword arguments."""
    parts = [f"h{case['H']}", case.get("dtype", "bf16"),
             f"{case.get('form', 'topk')}{case.get('k', 2)}", case.get("routing", "uniform"),
             "probs" if case.get("probs", True) else "noprobs", f"E{case.get('E', 4)}"]
    parts += [flag for flag in ("reuse", "strided") if case.get(flag)]
    return "-".join(parts)


def report(record_property, results: list, label: str = "", *, dispatches: int = 1,
           combines: int = 1) -> dict:
    """Sum the per-rank tallies into the junit properties (and stdout), after asserting that
    every rank checked at least ``dispatches`` dispatch and ``combines`` combine outputs against
    the reference: a worker that checked nothing must not pass."""
    for rank, r in enumerate(results):
        assert isinstance(r, dict), f"rank {rank} returned {r!r}, not its tallies"
        assert r.get("dispatches", 0) >= dispatches, \
            f"{label}: rank {rank} checked {r.get('dispatches', 0)} dispatches, expected at " \
            f"least {dispatches}: {r}"
        assert r.get("combines", 0) >= combines, \
            f"{label}: rank {rank} checked {r.get('combines', 0)} combines, expected at least " \
            f"{combines}: {r}"
    combines_done = sum(r.get("combines", 0) for r in results)
    bitwise = sum(r.get("combine_bitwise", 0) for r in results)
    diff = max((r.get("max_abs_diff", 0.0) for r in results), default=0.0)
    dispatches_done = sum(r.get("dispatches", 0) for r in results)
    record_property("dispatches_checked", dispatches_done)
    record_property("combines_checked", combines_done)
    record_property("combines_bitwise", bitwise)
    record_property("combine_max_abs_diff", diff)
    record_property("combine_all_bitwise", bitwise == combines_done)
    print(f"{label} dispatches checked {dispatches_done}; combines bitwise {bitwise}/"
          f"{combines_done} (max |diff| {diff:g})")
    return {"combines": combines_done, "bitwise": bitwise, "max_abs_diff": diff,
            "dispatches": dispatches_done}


def domain_matrix_spec(W: int, R: int, case: dict) -> dict:
    """A multi-domain matrix case (test_gpu_multi_domain.MATRIX) as a spec of W ranks."""
    spec = make_spec(W, **case)
    spec["R"] = R
    return spec


def domain_permute_spec(W: int, R: int, extra: dict) -> dict:
    """A multi-domain permute pair (test_gpu_multi_domain.PERMUTE) as a spec of W ranks."""
    spec = make_spec(W, H=4096 if extra["dtype"] != "bf16" else 2064, dtype=extra["dtype"],
                     form="topk", k=2, E=4, max_tok=96, tag="domains")
    spec.update(extra, R=R)
    return spec


def run_under_env(gpu_pools, W: int, placement: str, environment: dict, case: str, spec: dict,
                  cases_module: str | None = None) -> list:
    """``case`` (of gpu_cases, or of ``cases_module``) on W ranks with ``environment`` set for
    its whole run, so that the buffers it makes read it."""
    return gpu_pools.run(W, placement, "under_env", module="gpu_multi_domain_cases",
                         environment=environment, case=case, cases_module=cases_module,
                         spec=spec)


def matrix_under_env(gpu_pools, record_property, W: int, placement: str, R: int, case: dict,
                     environment: dict, label: str) -> None:
    """A multi-domain matrix case (test_gpu_multi_domain.MATRIX) with ``environment`` set,
    checked against the reference and reported."""
    spec = domain_matrix_spec(W, R, case)
    results = run_under_env(gpu_pools, W, placement, environment, "dispatch_combine", spec)
    report(record_property, results, label=f"{W // R}x{R} {label} tokens={spec['tokens']}")


def permute_under_env(gpu_pools, record_property, W: int, placement: str, R: int, extra: dict,
                      environment: dict, label: str) -> None:
    """A multi-domain permute pair (test_gpu_multi_domain.PERMUTE) with ``environment`` set; its
    combine is checked where the pair is BF16."""
    spec = domain_permute_spec(W, R, extra)
    results = run_under_env(gpu_pools, W, placement, environment, "permute_combine", spec,
                            cases_module="gpu_permute_cases")
    report(record_property, results, label=f"permute {W // R}x{R} {label}",
           combines=int(extra["dtype"] == "bf16"))
