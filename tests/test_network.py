"""The network leg's put plan (reference/network.py) and the counters transport_stats() shows.

Rules (docs/multi-domain.md): per (chunk, destination domain) one put per maximal run of
consecutive tokens per tensor (dense chunk: one per tensor) and exactly one signal, also for
chunks with nothing to send; chunk c on channel (c % blocks) % channels.
"""

from __future__ import annotations

import random

import pytest
import torch

from hybrid_ep.reference.network import plan_runs, restripe_probs


def _naive_runs(bits: list[bool]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, bit in enumerate([*bits, False]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


@pytest.mark.parametrize("length", [0, 1, 2, 63, 64, 65])
def test_plan_runs_matches_a_plain_loop(length):
    rng = random.Random(length)
    masks = [[True] * length, [False] * length]
    masks += [[rng.random() < p for _ in range(length)] for p in (0.1, 0.5, 0.9) for _ in range(20)]
    for bits in masks:
        assert plan_runs(torch.tensor(bits, dtype=torch.bool)) == _naive_runs(bits)


def test_restripe_is_destination_major():
    tokens, nodes, width = 5, 3, 4
    probs = torch.arange(tokens * nodes * width, dtype=torch.float32).reshape(tokens, -1)
    striped = restripe_probs(probs, nodes)
    assert striped.shape == (nodes, tokens, width) and striped.is_contiguous()
    for n in range(nodes):
        for t in range(tokens):
            assert torch.equal(striped[n, t], probs[t, n * width:(n + 1) * width])
    with pytest.raises(ValueError, match="probs"):
        restripe_probs(probs[:, :-1], nodes)


CHUNK = 64


@pytest.mark.parametrize(("dtype", "with_probs"), [("bf16", True), ("fp8", True), ("bf16", False)])
def test_the_reference_counts_the_eager_form(pools, dtype, with_probs):
    """HYBRID_EP_EAGER=1 on the reference engine (it models the p2p build's form): dense
    routing, 2x2, 150 tokens, so chunks of 64, 64 and 22 tokens each one put of their records in
    4 KiB tiles, no signal; the bytes are the tiles' wire bytes."""
    from hybrid_ep.reference.network import RowWidths, eager_record, eager_tiles

    tokens, R = 150, 2
    out = pools.run(4, "cases.network", "dispatch_counters", R=R, pattern="dense", dtype=dtype,
                    with_probs=with_probs, channels=1, my_tokens=tokens, max_tokens=tokens,
                    eager=True)
    widths = RowWidths(row=256 * (1 if dtype == "fp8" else 2),
                       probs=4 * 2 * R if with_probs else 0, scales=8 if dtype == "fp8" else 0)
    record = eager_record(widths)
    assert record == (512 + (16 if with_probs else 0) if dtype == "bf16" else 256 + 16 + 16)
    sent = [eager_tiles(n * record) for n in (64, 64, 22)]
    for stats in out:
        assert (stats["puts"], stats["signals"]) == (3, 0), stats
        assert stats["eager_tiles"] == sum(t for t, _ in sent), stats
        assert stats["bytes"] == sum(b for _, b in sent), stats


@pytest.mark.parametrize(("dtype", "with_probs", "per_put"),
                         [("bf16", True, 2), ("fp8", True, 3), ("bf16", False, 1),
                          ("fp8", False, 2)])
def test_dense_chunks_cost_one_put_per_tensor_and_one_signal(pools, dtype, with_probs, per_put):
    tokens, R = 100, 2  # 2 domains x 2 ranks; chunks of 64 and 36 tokens
    out = pools.run(4, "cases.network", "dispatch_counters", R=R, pattern="dense", dtype=dtype,
                    with_probs=with_probs, channels=1, my_tokens=tokens, max_tokens=tokens)
    chunks, destinations = 2, 1
    row = 256 * (1 if dtype == "fp8" else 2)
    side = (4 * 2 * R if with_probs else 0) + (4 * 2 if dtype == "fp8" else 0)
    for stats in out:
        assert stats["signals"] == chunks * destinations
        assert stats["puts"] == chunks * destinations * per_put
        assert stats["bytes"] == tokens * (row + side)


def test_sparse_chunks_cost_one_put_per_run(pools):
    from cases.network import expected_runs

    tokens = 150  # chunks of 64, 64, 22 tokens; runs of 4 tokens every 10, cut at chunk ends
    out = pools.run(4, "cases.network", "dispatch_counters", R=2, pattern="runs", dtype="bf16",
                    with_probs=True, channels=1, my_tokens=tokens, max_tokens=tokens)
    runs = sum(expected_runs(tokens, CHUNK))
    for stats in out:
        assert stats["puts"] == 2 * runs and stats["signals"] == 3


@pytest.mark.parametrize("W,R", [(4, 1), (8, 2)])
def test_every_chunk_is_signalled_even_when_empty(pools, W, R):
    """Local-only routing and a rank with fewer tokens than the buffer: no puts, yet one
    signal per chunk of the buffer's maximum and per other domain."""
    max_tokens = 130  # three chunks
    out = pools.run(W, "cases.network", "dispatch_counters", R=R, pattern="local",
                    dtype="bf16", with_probs=True, channels=1, my_tokens=10,
                    max_tokens=max_tokens)
    for stats in out:
        assert stats["puts"] == 0 and stats["bytes"] == 0
        assert stats["signals"] == 3 * (W // R - 1)


@pytest.mark.parametrize("wire", ["bf16", "fp32"])
@pytest.mark.parametrize("with_probs", [True, False])
def test_combine_sends_partials_back_per_chunk_and_domain(pools, with_probs, wire):
    """Dense routing, 2 domains x 2: every chunk's partial rows (BF16, or fp32 with
    HYBRID_EP_COMBINE_WIRE=fp32) and partial probs (fp32) go back to the peer in one put per
    tensor, with one signal per chunk. With BF16 the combine moves the dispatch's bytes."""
    tokens, R, hidden = 150, 2, 256
    out = pools.run(4, "cases.network", "combine_counters", R=R, pattern="dense",
                    with_probs=with_probs, tokens=tokens, wire=wire)
    chunks = -(-tokens // CHUNK)
    per_token = (2 if wire == "bf16" else 4) * hidden + (4 * 2 * R if with_probs else 0)
    for stats in out:
        assert stats["signals"] == chunks
        assert stats["puts"] == chunks * (2 if with_probs else 1)
        assert stats["bytes"] == tokens * per_token
        if wire == "bf16":
            assert stats["bytes"] == stats["dispatch"]["bytes"], stats
            assert stats["puts"] == stats["dispatch"]["puts"], stats


@pytest.mark.parametrize(("pattern", "wire", "with_probs"),
                         [("dense", "bf16", True), ("dense", "fp32", False), ("runs", "bf16", True)])
def test_the_reference_counts_the_eager_combine(pools, pattern, wire, with_probs):
    """HYBRID_EP_EAGER=1, 2x2, 150 tokens (chunks of 64, 64, 22): each (chunk, domain) with
    tokens that came is one put of their records (partial at the wire's width, then probs) in
    4 KiB tiles, no signal; a chunk with none sends nothing."""
    from hybrid_ep.reference.network import RowWidths, eager_record, eager_tiles

    tokens, R, hidden = 150, 2, 256
    out = pools.run(4, "cases.network", "combine_counters", R=R, pattern=pattern,
                    with_probs=with_probs, tokens=tokens, wire=wire, eager=True)
    record = eager_record(RowWidths(row=(2 if wire == "bf16" else 4) * hidden,
                                    probs=4 * 2 * R if with_probs else 0, scales=0))
    # The tokens of each chunk that go to the other domain ("runs": t % 10 < 4).
    came = [sum(1 for t in range(first, min(first + CHUNK, tokens))
                if pattern == "dense" or t % 10 < 4) for first in range(0, tokens, CHUNK)]
    sent = [eager_tiles(n * record) for n in came if n]
    for stats in out:
        assert (stats["puts"], stats["signals"]) == (len(sent), 0), stats
        assert stats["eager_tiles"] == sum(t for t, _ in sent), stats
        assert stats["bytes"] == sum(b for _, b in sent), stats


def test_channels_take_chunks_round_robin_by_block(pools):
    """4 blocks, 2 channels, 5 chunks: chunk c goes to block c % 4, channel block % 2."""
    tokens = 300
    out = pools.run(4, "cases.network", "dispatch_counters", R=2, pattern="dense",
                    dtype="bf16", with_probs=False, channels=2, my_tokens=tokens,
                    max_tokens=tokens, calls=2)
    per_channel = {0: 0, 1: 0}
    for c in range(5):
        per_channel[(c % 4) % 2] += 1
    for stats in out:
        assert [ch["signals"] for ch in stats["channels"]] == [2 * per_channel[0],
                                                                 2 * per_channel[1]]
        assert [ch["puts"] for ch in stats["channels"]] == [2 * per_channel[0],
                                                              2 * per_channel[1]]


def test_counts_of_two_sources_add_per_channel():
    """transport_stats() adds the CUDA engine's device counters to the reference's model."""
    from hybrid_ep.reference.network import ChannelStats, TransportStats

    mine = TransportStats([ChannelStats(1, 2, 30, 3), ChannelStats(0, 1, 0)])
    both = mine.plus([{"puts": 4, "signals": 5, "bytes": 60, "eager_tiles": 2},
                      {"puts": 0, "signals": 0, "bytes": 7, "eager_tiles": 0}])
    assert both.as_dict() == {
        "channels": [{"puts": 5, "signals": 7, "bytes": 90, "eager_tiles": 5},
                     {"puts": 0, "signals": 1, "bytes": 7, "eager_tiles": 0}],
        "puts": 5, "signals": 8, "bytes": 97, "eager_tiles": 5}


def test_eager_dispatch_is_one_put_of_tiles_per_chunk_with_tokens_and_no_signal():
    """HYBRID_EP_EAGER: a (chunk, domain) with n tokens is one put of n records in tiles of
    4080 data bytes and a 16-byte signal (wire bytes, tiles counted apart), an empty one
    nothing; the signalled form of the same routing puts runs and signals every chunk."""
    from hybrid_ep.reference.network import (
        RowWidths,
        TransportStats,
        count_dispatch_sends,
        eager_record,
        eager_tiles,
    )

    goes = torch.zeros(150, 2, dtype=torch.bool)
    goes[0:5, 0] = True  # chunk 0: 5 tokens for the first other domain
    goes[64:66, 0] = goes[70, 0] = True  # chunk 1: 3 tokens in two runs
    widths = RowWidths(row=14336, probs=64, scales=0)
    record = eager_record(widths)
    assert record == 14336 + 64
    eager = TransportStats.with_channels(1)
    count_dispatch_sends(eager, goes, 150, 64, 4, widths, eager=True)
    signalled = TransportStats.with_channels(1)
    count_dispatch_sends(signalled, goes, 150, 64, 4, widths)
    tiles5, wire5 = eager_tiles(5 * record)
    tiles3, wire3 = eager_tiles(3 * record)
    assert (tiles5, wire5) == (18, 17 * 4096 + (5 * record - 17 * 4080) + 16)
    got = eager.as_dict()
    assert (got["puts"], got["signals"], got["eager_tiles"], got["bytes"]) == \
        (2, 0, tiles5 + tiles3, wire5 + wire3)
    want = signalled.as_dict()
    # Runs per tensor (rows, probs): 1 + 2; a signal per chunk (3) and other domain (2).
    assert (want["puts"], want["signals"], want["eager_tiles"]) == (2 * 1 + 2 * 2, 3 * 2, 0)
    assert eager_tiles(0) == (0, 0)
    assert eager_tiles(4080) == (1, 4096) and eager_tiles(4081) == (2, 4096 + 32)


@pytest.mark.parametrize("wire", ["bf16", "fp32"])
def test_reference_models_the_combine_wire(pools, wire):
    """The reference engine's combine across domains rounds each domain's partial to BF16
    (HYBRID_EP_COMBINE_WIRE=bf16, default) or keeps it fp32; the two forms differ somewhere."""
    out = pools.run(6, "cases.network", "wire_numerics", wire=wire)
    assert all(r["differ"] > 0 for r in out), out
