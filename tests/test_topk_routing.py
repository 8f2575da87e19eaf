"""The topk form's conversion to the dense form (validation.routing_from_topk): the same
routing and probs as the definition in docs/semantics.md, and what it does with values it was
told not to check (a GPU call that must not synchronise)."""

from __future__ import annotations

import pytest
import torch

from hybrid_ep.validation import routing_from_topk

CPU = torch.device("cpu")


def dense_by_definition(idx: torch.Tensor, weights: torch.Tensor, experts: int):
    """routing_map[t, idx[t, j]] = True, probs[t, idx[t, j]] = weights[t, j] for idx >= 0."""
    routing = torch.zeros(idx.shape[0], experts, dtype=torch.bool)
    probs = torch.zeros(idx.shape[0], experts, dtype=torch.float32)
    for t in range(idx.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            if e >= 0:
                routing[t, e] = True
                probs[t, e] = weights[t, j]
    return routing, probs


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16])
@pytest.mark.parametrize("tokens,k,experts", [(37, 4, 16), (1, 1, 3), (0, 2, 8), (9, 8, 8)])
def test_dense_form_matches_the_definition(dtype, tokens, k, experts):
    g = torch.Generator().manual_seed(tokens * 100 + k)
    idx = torch.rand(tokens, experts, generator=g).topk(k, dim=1).indices
    idx = idx.masked_fill(torch.rand(tokens, k, generator=g) < 0.25, -1).to(dtype)
    weights = torch.rand(tokens, k, generator=g)
    weights[:, 0] = -0.0  # a signed zero keeps its sign
    routing, probs = routing_from_topk(idx, weights, tokens, experts, CPU)
    want_routing, want_probs = dense_by_definition(idx, weights, experts)
    assert routing.is_contiguous() and probs.is_contiguous()
    assert torch.equal(routing, want_routing)
    assert torch.equal(probs.view(torch.int32), want_probs.view(torch.int32))  # bitwise
    routing_only, none = routing_from_topk(idx, None, tokens, experts, CPU)
    assert none is None and torch.equal(routing_only, want_routing)


@pytest.mark.parametrize("bad,message", [(16, "out of range"), (-2, "out of range"),
                                         (None, "selects an expert twice")])
def test_checked_values_raise_naming_topk_idx(bad, message):
    idx = torch.tensor([[0, 5], [3, 7]])
    if bad is None:
        idx[1, 1] = 3
    else:
        idx[1, 1] = bad
    with pytest.raises(ValueError, match=f"topk_idx: .*{message}"):
        routing_from_topk(idx, torch.ones(2, 2), 2, 16, CPU)


def test_unchecked_values_drop_out_of_range_entries():
    idx = torch.tensor([[0, 16], [-2, 7]])
    routing, probs = routing_from_topk(idx, torch.tensor([[0.5, 0.25], [0.125, 2.0]]), 2, 16, CPU,
                                       check_values=False)
    want = torch.zeros(2, 16)
    want[0, 0], want[1, 7] = 0.5, 2.0
    assert torch.equal(probs, want)
    assert torch.equal(routing, want != 0)
