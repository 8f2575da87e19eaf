"""dispatch / combine on the CUDA engine against the reference engine (same buffer, CPU copies).

A covering matrix rather than a product: over each world size (1, 2, 4, 8 ranks on GPU 0),
every hidden size with each dtype it supports (FP8 needs H % 128 == 0: 7168, 4096 and 640;
2064 is an odd multiple of 16, BF16 only), each top-k (1, 2, 8), each routing (uniform, skewed
onto one rank, every expert of the domain, empty), both routing forms, with and without probs, ragged token counts with a
rank of none, handle reuse and non-contiguous inputs. The first two cases of every world size also run
with one rank per GPU where there are enough GPUs.
"""

from __future__ import annotations

import pytest
from gpu_env import gpu_marks, placement_param
from gpu_specs import make_spec, report, spec_id

pytestmark = gpu_marks

# (W, make_spec keyword arguments, also one rank per GPU)
MATRIX = [
    (1, {"H": 7168, "form": "topk", "k": 8, "E": 8, "tokens": [512], "reuse": True}, False),
    (1, {"H": 4096, "dtype": "e4m3", "form": "topk", "k": 1, "routing": "skew", "E": 8, "tokens": [300]}, False),
    (1, {"H": 2064, "form": "map", "k": 2, "routing": "empty", "probs": False, "E": 8, "tokens": [100],
             "strided": True}, False),

    (2, {"H": 4096, "form": "map", "k": 2, "tokens": [512, 0], "reuse": True}, True),
    (2, {"H": 7168, "dtype": "u8", "form": "topk", "k": 8, "max_tok": 256}, True),
    (2, {"H": 2064, "form": "topk", "k": 1, "routing": "skew", "probs": False, "max_tok": 300,
             "strided": True}, False),
    (2, {"H": 7168, "dtype": "e4m3", "form": "map", "k": 2, "routing": "empty", "tokens": "equal",
             "max_tok": 64}, False),
    # probs rows of 24 B and scale rows of 20 B: the copy-out's and staging's 4-byte path
    (2, {"H": 640, "dtype": "e4m3", "form": "topk", "k": 2, "E": 3, "tokens": [200, 77],
             "reuse": True}, False),

    (4, {"H": 7168, "form": "topk", "k": 8, "max_tok": 256, "max_tokens": "own", "reuse": True}, True),
    (4, {"H": 4096, "dtype": "e4m3", "form": "map", "k": 2, "routing": "skew", "tokens": "equal",
             "max_tok": 128}, True),
    (4, {"H": 2064, "form": "topk", "k": 2, "routing": "empty", "probs": False, "max_tok": 512}, False),
    (4, {"H": 7168, "dtype": "u8", "form": "topk", "k": 1, "probs": False, "max_tok": 200}, False),
    (4, {"H": 4096, "form": "map", "k": 1, "max_tok": 300, "strided": True}, False),
    # every token to all 40 experts of the domain (ranks of 10 straddle the gathered bits' words)
    (4, {"H": 2064, "form": "topk", "k": 40, "E": 10, "routing": "domain", "max_tok": 128}, False),

    (8, {"H": 7168, "form": "topk", "k": 8, "E": 32, "max_tok": 128, "reuse": True}, True),
    (8, {"H": 4096, "dtype": "u8", "form": "map", "k": 2, "routing": "skew", "max_tok": 256}, True),
    (8, {"H": 2064, "form": "topk", "k": 1, "E": 8, "max_tok": 512, "max_tokens": "own", "reuse": True}, False),
    (8, {"H": 2064, "form": "map", "k": 2, "routing": "empty", "probs": False, "max_tok": 64,
             "strided": True}, False),
    (8, {"H": 7168, "dtype": "e4m3", "form": "topk", "k": 2, "probs": False, "max_tok": 128}, False),
    # every token of every rank to all 8 experts of one rank: one hot receiver
    (8, {"H": 4096, "form": "topk", "k": 8, "routing": "skew", "E": 8, "tokens": "equal", "max_tok": 128},
     False),
]


def _params():
    out = []
    for W, case, per_gpu in MATRIX:
        out.append(placement_param(W, "shared", case, id_extra=spec_id(case)))
        if per_gpu:
            out.append(placement_param(W, "per_gpu", case, id_extra=spec_id(case)))
    return out


@pytest.mark.parametrize("W,placement,case", _params())
def test_dispatch_combine(gpu_pools, record_property, W, placement, case):
    spec = make_spec(W, **case)
    results = gpu_pools.run(W, placement, "dispatch_combine", spec=spec)
    report(record_property, results, label=f"W={W} {placement} tokens={spec['tokens']}")
