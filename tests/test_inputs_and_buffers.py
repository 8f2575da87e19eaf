"""Token-count patterns, buffer sizing, input layouts, chunking and several buffers."""

from __future__ import annotations

import pytest

from _params import seed, topo_id
from cases.inputs import make_spec, token_counts

PATTERNS = ["equal", "one_nonzero", "all_zero", "tiny", "ragged"]
PATTERN_TOPOLOGIES = [(4, 2), (8, 4)]


@pytest.mark.parametrize("topo", PATTERN_TOPOLOGIES, ids=[topo_id(t) for t in PATTERN_TOPOLOGIES])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_token_count_patterns(pools, topo, pattern):
    """Ragged token counts across ranks, including ranks (or all ranks) with no tokens."""
    W, R = topo
    tokens = token_counts(W, pattern, seed("tok", W, pattern), maximum=40)
    spec = make_spec(seed=seed("pat", W, R, pattern), W=W, R=R, E=2, tokens=tokens,
                     max_tokens=[40] * W, routing="topk")
    assert pools.run(W, "cases.dispatch", "dispatch_combine", spec=spec) == [40] * W
    assert pools.run(W, "cases.permute", "permute_combine", spec=spec, pad_multiple=16,
                     modes=("blocking", "nb_int"), fuses=(False,)) == [40] * W


def test_max_tokens_differ_between_ranks(pools):
    """Ranks pass different max_num_of_tokens_per_rank: the handles use the agreed maximum, and
    a non-blocking call may use up to it on every rank."""
    W, R = 4, 2
    spec = make_spec(seed=seed("maxdiff"), W=W, R=R, E=2, tokens=[30, 8, 0, 12],
                     max_tokens=[10, 8, 36, 12])
    assert pools.run(W, "cases.dispatch", "dispatch_combine", spec=spec) == [36] * W
    assert pools.run(W, "cases.permute", "permute_combine", spec=spec, pad_multiple=None,
                     modes=("nb_tensor",), fuses=(False,)) == [36] * W


def test_blocking_call_grows_buffers(pools):
    """A blocking call with more tokens than the buffer was made for grows it collectively;
    the handles then describe the grown maximum (the same on every rank)."""
    W, R = 4, 1
    spec = make_spec(seed=seed("grow"), W=W, R=R, E=2, tokens=[20, 3, 0, 17],
                     max_tokens=[4] * W)
    Ts = pools.run(W, "cases.dispatch", "dispatch_combine", spec=spec)
    assert len(set(Ts)) == 1 and Ts[0] >= 20, Ts
    Ts = pools.run(W, "cases.permute", "permute_combine", spec=spec, pad_multiple=16,
                   modes=("blocking",), fuses=(False,))
    assert len(set(Ts)) == 1 and Ts[0] >= 20, Ts


LAYOUT_CASES = [((2, 1), "noncontig", "map", "bf16"), ((4, 2), "expanded", "topk", "bf16"),
                ((8, 4), "noncontig", "topk", "u8"), ((4, 1), "expanded", "map", "e4m3")]


@pytest.mark.parametrize("topo,layout,routing,dtype", LAYOUT_CASES,
                         ids=[f"{topo_id(c[0])}-{c[1]}-{c[2]}-{c[3]}" for c in LAYOUT_CASES])
def test_strided_and_expanded_inputs(pools, topo, layout, routing, dtype):
    """Non-contiguous and stride-0 expanded inputs (hidden, scales, routing, probs, combine
    inputs) are accepted and give the oracle's results, which equal the contiguous ones."""
    W, R = topo
    spec = make_spec(seed=seed("layout", W, R, layout), W=W, R=R, E=2, routing=routing,
                     dtype=dtype, layout=layout)
    pools.run(W, "cases.dispatch", "dispatch_combine", spec=spec)
    pools.run(W, "cases.permute", "permute_combine", spec=spec, pad_multiple=16,
              modes=("blocking", "nb_tensor"), fuses=(False,))


@pytest.mark.parametrize("chunk", [5, 16])
def test_dense_chunk_layout_follows_chunk_size(pools, chunk):
    """NUM_OF_TOKENS_PER_CHUNK_DISPATCH_API sets the chunking that handle[5] describes."""
    W, R = 4, 2
    spec = make_spec(seed=seed("chunk", chunk), W=W, R=R, E=2, routing="map")
    pools.run(W, "cases.permute", "permute_combine", spec=spec, pad_multiple=None,
              modes=("blocking",), fuses=(False,), chunk=chunk)


@pytest.mark.parametrize("topo", [(2, 1), (8, 4)], ids=["W2xN2", "W8xN2"])
def test_two_buffers_alive(pools, topo):
    W, R = topo
    spec_a = make_spec(seed=seed("twoA", W), W=W, R=R, E=2, routing="map", dtype="bf16")
    spec_b = make_spec(seed=seed("twoB", W), W=W, R=R, E=1, routing="topk", dtype="u8",
                       tokens=token_counts(W, "ragged", 99, maximum=24))
    pools.run(W, "cases.misc", "two_buffers", spec_a=spec_a, spec_b=spec_b, pad_multiple=64)


def test_compatibility_arguments_change_nothing(pools):
    spec = make_spec(seed=seed("compat"), W=2, R=2, E=2, tokens=[9, 5])
    pools.run(2, "cases.misc", "compatibility_arguments", spec=spec)
