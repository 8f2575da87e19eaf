"""Several NVLink domains on one GPU (the p2p transport between them): domains x ranks 2x1,
2x2, 2x4, 4x2 and 8x1, against the reference engine. Dispatch and combine over dtypes,
routings (uniform, skewed onto one domain, every expert of one domain, empty; up to 48 experts
per token), ragged counts below the maximum with 3+ domains, handle reuse; the permute path in
both modes; 200 alternating calls with fresh routing; and the network counters: exactly 2
(BF16) or 3 (FP8) puts and 1 signal per (chunk, destination domain) for dense routing, one put
per run for run-structured routing, the CUDA engine's counters equal to the reference's model
for dispatch and combine."""

from __future__ import annotations

import gpu_env
import pytest
from gpu_env import gpu_marks, placement_param
from gpu_specs import (
    domain_matrix_spec,
    domain_permute_spec,
    growth_specs,
    make_spec,
    matrix_under_env,
    permute_under_env,
    report,
    spec_id,
)

pytestmark = gpu_marks

# (domains, ranks per domain, make_spec keyword arguments)
MATRIX = [
    (2, 1, {"H": 7168, "form": "topk", "k": 2, "E": 4, "max_tok": 256, "reuse": True}),
    (2, 1, {"H": 4096, "dtype": "e4m3", "form": "map", "k": 1, "routing": "skew", "max_tok": 96}),
    (2, 2, {"H": 4096, "form": "map", "k": 2, "tokens": "ragged", "max_tok": 200, "reuse": True}),
    (2, 2, {"H": 2064, "form": "topk", "k": 8, "E": 8, "probs": False, "max_tok": 130}),
    (2, 2, {"H": 7168, "dtype": "u8", "form": "topk", "k": 2, "routing": "empty", "max_tok": 64}),
    (2, 4, {"H": 7168, "form": "topk", "k": 8, "E": 8, "max_tok": 128, "reuse": True}),
    (2, 4, {"H": 4096, "dtype": "e4m3", "form": "map", "k": 2, "routing": "skew", "max_tok": 100,
            "strided": True}),
    # many experts per token: all 48 of the last domain (ranks of 12 straddle the 32-bit words
    # of the gathered bits), and 40 of 96 across both domains
    (2, 4, {"H": 2064, "form": "map", "k": 48, "E": 12, "routing": "domain", "max_tok": 96}),
    (2, 2, {"H": 4096, "form": "topk", "k": 40, "E": 24, "tokens": "ragged", "max_tok": 64}),
    (4, 2, {"H": 4096, "form": "topk", "k": 2, "tokens": "ragged", "max_tok": 150,
            "max_tokens": "own", "reuse": True}),
    (4, 2, {"H": 7168, "dtype": "u8", "form": "map", "k": 8, "E": 8, "max_tok": 64}),
    (4, 2, {"H": 2064, "form": "topk", "k": 1, "routing": "skew", "probs": False, "max_tok": 200}),
    (8, 1, {"H": 4096, "form": "topk", "k": 2, "tokens": "ragged", "max_tok": 128, "reuse": True}),
    (8, 1, {"H": 7168, "dtype": "e4m3", "form": "map", "k": 8, "E": 8, "max_tok": 64}),
    (8, 1, {"H": 2064, "form": "map", "k": 2, "routing": "empty", "probs": False, "max_tok": 64}),
]


def matrix_params(suffix: str = "", most_ranks: int | None = None) -> list:
    """(W, placement, R, case) of the matrix cases (of at most ``most_ranks`` ranks), their ids
    ending in ``suffix``: the matrix under another environment reuses them."""
    return [placement_param(N * R, "shared", R, case, id_extra=f"{N}x{R}-{spec_id(case)}{suffix}")
            for N, R, case in MATRIX if most_ranks is None or N * R <= most_ranks]


@pytest.mark.parametrize("W,placement,R,case", matrix_params())
def test_dispatch_combine_domains(gpu_pools, record_property, W, placement, R, case):
    spec = domain_matrix_spec(W, R, case)
    results = gpu_pools.run(W, placement, "dispatch_combine", spec=spec)
    report(record_property, results, label=f"{W // R}x{R} tokens={spec['tokens']}")


# (domains, ranks, dtype, fused flag, pad, budget, non-blocking)
PERMUTE = [(2, 2, "bf16", False, 16, "exact", False), (2, 2, "e4m3", True, None, "over", True),
           (4, 2, "bf16", True, 64, "under", True), (2, 4, "e4m3", False, 256, "exact", False),
           (8, 1, "bf16", False, None, "exact", True)]


def permute_params(suffix: str = "", dtypes: tuple[str, ...] | None = None) -> list:
    """(W, placement, R, extra) of the permute pairs (of ``dtypes``, default all), their ids
    ending in ``suffix``."""
    return [placement_param(N * R, "shared", R,
                            {"dtype": dtype, "fused": fused, "pad": pad, "budget": budget,
                             "non_blocking": nb},
                            id_extra=f"{N}x{R}-{dtype}-{'fused' if fused else 'standalone'}-"
                                     f"pad{pad}-{budget}-{'nonblocking' if nb else 'blocking'}"
                                     f"{suffix}")
            for N, R, dtype, fused, pad, budget, nb in PERMUTE
            if dtypes is None or dtype in dtypes]


@pytest.mark.parametrize("W,placement,R,extra", permute_params())
def test_permute_domains(gpu_pools, record_property, W, placement, R, extra):
    spec = domain_permute_spec(W, R, extra)
    results = gpu_pools.run(W, placement, "permute_combine", module="gpu_permute_cases",
                            spec=spec)
    # FP8 rows have no combine (combine takes BF16).
    report(record_property, results, label=f"permute {W // R}x{R}",
           combines=int(extra["dtype"] == "bf16"))


@pytest.mark.parametrize("W,placement,R", [placement_param(4, "shared", 2, id_extra="2x2"),
                                           placement_param(8, "shared", 2, id_extra="4x2")])
def test_long_run_domains(gpu_pools, record_property, W, placement, R):
    """200 dispatch/combine pairs with fresh routing across domains: no drift, no hang."""
    results = gpu_pools.run(W, placement, "long_run", timeout_s=300, seed=77 + W, H=2064, E=4,
                            max_tokens=128, iters=200, check_every=25, R=R)
    assert all(r["iterations"] == 200 for r in results), results
    report(record_property, results, label=f"long run {W // R}x{R}")


CHUNK = 64  # the default dispatch chunk


@pytest.mark.parametrize("dtype,with_probs,per_put", [("bf16", True, 2), ("fp8", True, 3),
                                                       ("bf16", False, 1)])
def test_dense_counters(gpu_pools, dtype, with_probs, per_put):
    """Dense routing, 2x2, 150 tokens (3 chunks): per (chunk, destination domain) exactly one
    put per tensor and one signal."""
    W, R, tokens = 4, 2, 150
    results = gpu_pools.run(W, "shared", "counters", module="gpu_multi_domain_cases", R=R,
                            pattern="dense", dtype=dtype, with_probs=with_probs, channels=1,
                            tokens=tokens)
    chunks = -(-tokens // CHUNK)
    for r in results:
        sent = r["cuda_dispatch"]
        assert sent["signals"] == chunks and sent["puts"] == chunks * per_put, sent
        if dtype == "bf16":  # BF16 partials: the combine moves the dispatch's bytes back
            back = r["cuda_combine"]
            assert back["bytes"] == sent["bytes"] and back["puts"] == sent["puts"], (back, sent)


@pytest.mark.parametrize("channels", [1, 2, 4])
def test_run_counters(gpu_pools, channels):
    """Tokens leave the domain in runs of 4 every 10 (cut at chunk ends): one put per run per
    tensor, spread over the channels like the reference's model."""
    W, R, tokens = 8, 2, 150
    results = gpu_pools.run(W, "shared", "counters", module="gpu_multi_domain_cases", R=R,
                            pattern="runs", dtype="bf16", with_probs=True, channels=channels,
                            tokens=tokens)
    runs = 0
    for c in range(-(-tokens // CHUNK)):
        ts = [t for t in range(c * CHUNK, min((c + 1) * CHUNK, tokens)) if t % 10 < 4]
        runs += sum(1 for i, t in enumerate(ts) if i == 0 or ts[i - 1] != t - 1)
    for r in results:
        sent = r["cuda_dispatch"]
        assert sent["puts"] == 2 * runs * (W // R - 1), sent
        assert len(sent["channels"]) == channels


@pytest.mark.skipif(gpu_env.DRY_RUN, reason="CUDA graphs need a GPU (dry run on the CPU)")
@pytest.mark.parametrize("W,placement,R", [placement_param(4, "shared", 2, id_extra="2x2")])
def test_graph_replay_domains(gpu_pools, record_property, W, placement, R):
    """The non-blocking permute pair across domains, captured once and replayed 50 times with
    fresh inputs, every replay against the reference."""
    spec = make_spec(W, H=1024, form="map", k=2, E=4, tokens="equal", max_tok=64, tag="graph")
    spec.update(pad=16, R=R)
    results = gpu_pools.run(W, placement, "graph_replay", module="gpu_permute_cases",
                            timeout_s=240, spec=spec, replays=50)
    assert all(r["replays"] == 50 for r in results), results
    report(record_property, results, label=f"graph replay {W // R}x{R}", dispatches=0)


@pytest.mark.parametrize("W,placement,R", [placement_param(4, "shared", 2, id_extra="2x2")])
def test_autograd_round_trip_domains(gpu_pools, record_property, W, placement, R):
    """Megatron's autograd pattern across domains: gradients equal the reference's."""
    spec = make_spec(W, H=512, form="map", k=2, E=4, max_tok=64, tag="autograd")
    spec.update(pad=16, R=R)
    results = gpu_pools.run(W, placement, "autograd_round_trip", module="gpu_permute_cases",
                            spec=spec)
    report(record_property, results, label=f"autograd {W // R}x{R}", dispatches=0)


@pytest.mark.parametrize("W,placement,R", [placement_param(4, "shared", 2, id_extra="2x2")])
def test_growth_domains(gpu_pools, record_property, W, placement, R):
    """A buffer of 64 tokens per rank grows when the last rank dispatches 300; the handle made
    before the growth (indexed with the old T across domains) still works after it."""
    small, big = 64, 300
    spec_small, spec_big, spec_after = growth_specs(W, small, big, tag="d")
    for spec in (spec_small, spec_big, spec_after):
        spec["R"] = R
    results = gpu_pools.run(W, placement, "growth", spec_small=spec_small, spec_big=spec_big,
                            spec_after=spec_after)
    assert all(r["before"] == small and r["after"] == big for r in results), results
    report(record_property, results, label=f"growth {W // R}x{R}")


@pytest.mark.parametrize("W,placement,R", [placement_param(4, "shared", 2, id_extra="2x2")])
def test_two_buffers_domains(gpu_pools, record_property, W, placement, R):
    """Two buffers alive at once across domains, calls interleaved."""
    spec_a = make_spec(W, H=4096, form="topk", k=2, E=4, max_tok=256, tag="dA")
    spec_b = make_spec(W, H=7168, dtype="e4m3", form="map", k=2, E=2, max_tok=128, tag="dB")
    spec_a["R"] = spec_b["R"] = R
    results = gpu_pools.run(W, placement, "two_buffers", spec_a=spec_a, spec_b=spec_b)
    report(record_property, results, label=f"two buffers {W // R}x{R}")


FP32_WIRE = {"HYBRID_EP_COMBINE_WIRE": "fp32"}


@pytest.mark.parametrize("W,placement,R,case", matrix_params("-unmapped"))
def test_dispatch_combine_domains_unmapped(gpu_pools, record_property, W, placement, R, case):
    """HYBRID_EP_FAULT=unmapped_peers: the signalled path of the RDMA builds (puts and signals
    from registered sources, no store into a peer of another domain) on the p2p build."""
    matrix_under_env(gpu_pools, record_property, W, placement, R, case,
                     {"HYBRID_EP_FAULT": "unmapped_peers"}, "unmapped")


@pytest.mark.parametrize("W,placement,R,case", matrix_params("-fp32wire"))
def test_dispatch_combine_domains_fp32_wire(gpu_pools, record_property, W, placement, R, case):
    """The matrix with HYBRID_EP_COMBINE_WIRE=fp32: the partials travel unrounded (the oracle,
    the reference engine under the same variable, and the round trip x * copies follow)."""
    matrix_under_env(gpu_pools, record_property, W, placement, R, case, FP32_WIRE, "fp32 wire")


@pytest.mark.parametrize("W,placement,R,extra", permute_params("-fp32wire", ("bf16",)))
def test_permute_domains_fp32_wire(gpu_pools, record_property, W, placement, R, extra):
    # bf16 only: H 2064
    permute_under_env(gpu_pools, record_property, W, placement, R, extra, FP32_WIRE, "fp32 wire")
