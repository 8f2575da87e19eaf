"""Every validation error, one test each: ValueError or TypeError naming the offending argument
(or environment variable), raised before any communication (see cases/errors.py)."""

from __future__ import annotations

import pytest

from cases.errors import CALL_CASES, CONSTRUCT_CASES, ENV_CASES

W = 2


@pytest.mark.parametrize("name", sorted(CALL_CASES))
def test_call_error(pools, name):
    print(pools.run(W, "cases.errors", "call_error", name=name)[0])


@pytest.mark.parametrize("name", sorted(CONSTRUCT_CASES))
def test_construction_error(pools, name):
    print(pools.run(W, "cases.errors", "construct_error", name=name)[0])


@pytest.mark.parametrize("variable", sorted(ENV_CASES))
def test_malformed_environment_variable(pools, variable):
    print(pools.run(W, "cases.errors", "env_error", variable=variable)[0])


def test_single_rank_group(pools):
    """World size 1 is valid: a one-rank group dispatches to itself."""
    from _params import seed
    from cases.inputs import make_spec

    spec = make_spec(seed=seed("ws1"), W=1, R=1, E=3, tokens=[17], routing="topk")
    assert pools.run(1, "cases.dispatch", "dispatch_combine", spec=spec) == [17]
    pools.run(1, "cases.permute", "permute_combine", spec=spec, pad_multiple=16,
              modes=("blocking", "nb_tensor"), fuses=(False,))
