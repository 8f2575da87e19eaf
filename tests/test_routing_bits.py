"""The gathered routing's format (csrc/hybrid_ep/kernels/common/routing_bits.h), through the
binding that runs the kernels' own functions on the host: the all-gather packs each token's
columns of one domain into 32-bit words, bit j * E + e for expert e of local rank j, whatever
the number of experts per token; the metadata's rank mask is the set of local ranks with a
bit set."""

from __future__ import annotations

import random

import pytest

from hybrid_ep import native

# (experts per rank E, ranks per domain R, domains N): words whole, split mid-rank, one rank
# wider than a word, columns not a multiple of 16 (the bytewise reads), 64 ranks.
SHAPES = [(8, 8, 2), (3, 5, 3), (40, 2, 2), (12, 4, 1), (1, 64, 2), (33, 3, 2), (16, 4, 4)]


def _map(tokens: int, cols: int, nodes: int, density: float, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    # Any nonzero byte is a true bool: the packing must not read only bit 0.
    return [[rng.choice((1, 2, 0x80, 0xFF)) if rng.random() < density else 0
             for _ in range(cols * nodes)] for _ in range(tokens)]


def _words(row: list[int], cols: int, domain: int) -> list[int]:
    bits = [int(v != 0) for v in row[domain * cols:(domain + 1) * cols]]
    return [sum(b << i for i, b in enumerate(bits[w:w + 32])) for w in range(0, cols, 32)]


@pytest.mark.parametrize("E,R,N", SHAPES)
@pytest.mark.parametrize("density", [0.0, 0.1, 0.6, 1.0])
def test_pack_and_ranks_match_the_definition(E, R, N, density):
    C = native.module()
    cols, tokens = E * R, 9
    rows = _map(tokens, cols, N, density, seed=E * 1000 + R * 10 + N)
    data = bytes(v for row in rows for v in row)
    count = -(-cols // 32)
    for domain in range(N):
        words = C.pack_routing(data, tokens, cols, domain)
        assert len(words) == tokens * count
        for t, row in enumerate(rows):
            mine = words[t * count:(t + 1) * count]
            assert mine == _words(row, cols, domain), (t, domain)
            want = sum(1 << j for j in range(R)
                       if any(row[domain * cols + j * E + e] for e in range(E)))
            assert C.routing_ranks(mine, E) == want, (t, domain)


def test_every_expert_of_a_domain_fits():
    """More than 32 experts per token (no top-k limit): every bit set, every rank in the mask."""
    C = native.module()
    E, R = 16, 8
    words = C.pack_routing(bytes([1] * (E * R * 2)), 1, E * R, 1)
    assert words == [0xFFFFFFFF] * 4
    assert C.routing_ranks(words, E) == (1 << R) - 1


def test_a_rank_wider_than_a_word_is_found_by_its_last_bit():
    C = native.module()
    E = 40  # rank 0 is bits 0..39, rank 1 bits 40..79
    assert C.routing_ranks([0, 1 << 7, 0], E) == 1  # bit 39
    assert C.routing_ranks([0, 1 << 8, 0], E) == 2  # bit 40
    assert C.routing_ranks([1, 0, 1 << 15], E) == 3  # bits 0 and 79


def test_bad_arguments_raise():
    C = native.module()
    with pytest.raises(ValueError, match="pack_routing"):
        C.pack_routing(bytes(10), 3, 2, 0)
    with pytest.raises(ValueError, match="pack_routing"):
        C.pack_routing(bytes(8), 2, 2, 2)
    with pytest.raises(ValueError, match="routing_ranks"):
        C.routing_ranks([0] * 3, 1)
