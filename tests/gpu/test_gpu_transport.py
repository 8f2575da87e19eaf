"""The p2p transport between NVLink domains on one GPU: the ranks split into domains
(2x1, 2x2, 4x2, 8x1 domains x ranks), every rank puts a pattern into the peer of every other
domain and signals it, over every channel several times; the bytes arrive intact and the
per-channel counters count exactly one put, one signal and the bytes per peer and round."""

from __future__ import annotations

import gpu_env
import pytest
from gpu_env import gpu_marks, placement_param

pytestmark = [*gpu_marks,
              pytest.mark.skipif(gpu_env.DRY_RUN, reason="drives the CUDA runtime directly")]

# (ranks, domains, bytes per put): aligned puts use 16-byte stores, the odd size bytes.
CASES = [(2, 2, 65536), (4, 2, 4101), (8, 4, 65536), (8, 8, 1000)]


@pytest.mark.parametrize(
    "W,placement,nodes,nbytes",
    [placement_param(W, "shared", nodes, nbytes, id_extra=f"{nodes}domains-{nbytes}B")
     for W, nodes, nbytes in CASES])
def test_transport_check(gpu_pools, W, placement, nodes, nbytes):
    results = gpu_pools.run(W, placement, "transport_check", module="gpu_transport_cases",
                            nodes=nodes, channels=2, nbytes=nbytes, rounds=5)
    assert len(results) == W


# (ranks, domains, dispatch chunk, routing pattern): tail chunks (200 tokens), dense chunks
# (one put per chunk and domain), short runs, random routing with an empty stretch.
NETWORK_CASES = [(2, 2, 64, "dense"), (4, 2, 64, "runs"), (8, 4, 48, "random"),
                 (8, 8, 64, "random"), (4, 4, 100, "runs")]


@pytest.mark.parametrize(
    "W,placement,nodes,chunk,pattern",
    [placement_param(W, "shared", nodes, chunk, pattern,
                     id_extra=f"{nodes}domains-chunk{chunk}-{pattern}")
     for W, nodes, chunk, pattern in NETWORK_CASES])
def test_network_send(gpu_pools, W, placement, nodes, chunk, pattern):
    """The dispatch network leg's sends: rows arrive where the routing says, and the put,
    signal and byte counters per channel equal the reference engine's count."""
    results = gpu_pools.run(W, placement, "network_send", module="gpu_transport_cases",
                            nodes=nodes, chunk=chunk, pattern=pattern, channels=2, rounds=3)
    assert len(results) == W
