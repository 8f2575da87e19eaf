"""The CUDA engine's limits (docs/engine.md, "Limits"): the same in the Python engine's check
and in the runtime's, which raises before anything touches a GPU; past 64 ranks a group is
refused only where a kernel could not index it."""

from __future__ import annotations

import pytest

from hybrid_ep import native
from hybrid_ep.limits import check_limits
from hybrid_ep.topology import Topology


def _topo(domains: int, per_domain: int) -> Topology:
    return Topology(rank=0, group_size=domains * per_domain, ranks_per_domain=per_domain)


@pytest.mark.parametrize("domains,per_domain,tokens,experts", [
    (64, 8, 4096, 8),  # 512 ranks: what memory_plan plans
    (1024, 1, 2048, 8),
    (1, 64, 4096, 32),
])
def test_groups_within_the_limits_pass(domains, per_domain, tokens, experts):
    check_limits(_topo(domains, per_domain), tokens, experts)


# One group past each limit, with what the engine's check and the runtime's each name.
PAST_A_LIMIT = [
    ((1, 65, 128, 8), "ranks per NVLink domain: 65", "ranks per NVLink domain 65 > 64"),
    ((1025, 1, 128, 8), "NVLink domains: 1025", "NVLink domains 1025 > 1024"),
    ((64, 8, 2**23, 1), "group size x max_num_of_tokens_per_rank: 512 x 8388608",
     "max_num_of_tokens_per_rank = 4294967296"),
    ((64, 8, 4096, 1024), "x num_local_experts: 2147483648", "experts per rank = 2147483648"),
    ((1, 2, 128, 6145), "num_local_experts: 6145", "experts per rank 6145 > 6144"),
]


@pytest.mark.parametrize("group,names", [(g, py) for g, py, _ in PAST_A_LIMIT])
def test_groups_past_a_limit_raise(group, names):
    domains, per_domain, tokens, experts = group
    with pytest.raises(ValueError, match="CUDA engine's limits") as e:
        check_limits(_topo(domains, per_domain), tokens, experts)
    assert names in str(e.value)


def _config(domains: int, per_domain: int, tokens: int, experts: int):
    rc = native.module().RuntimeConfig()
    rc.world, rc.ranks, rc.nodes = domains * per_domain, per_domain, domains
    rc.max_tokens, rc.experts_per_rank = tokens, experts
    return rc


@pytest.mark.parametrize("group,names", [(g, cpp) for g, _, cpp in PAST_A_LIMIT])
def test_runtime_refuses_the_same_before_allocating(group, names):
    """The runtime checks again (it is rebuilt when a buffer grows): it raises before any CUDA
    call, so this runs without a GPU."""
    with pytest.raises(ValueError, match="CUDA engine's limits") as e:
        native.module().Runtime(_config(*group))
    assert names in str(e.value)
