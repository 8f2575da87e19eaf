"""The eager form's tile layout (csrc/hybrid_ep/memory/eager_tiles.h), through the
binding that runs the kernels' own functions on the host, against its definition: 4 KiB tiles
of up to 4080 data bytes and a 16-byte signal after them (16-byte aligned), one record per row
(data, probs, FP8 scales, each from a 16-byte boundary), signal values from the call's epoch
and the chunk's sequence that are never 0 and never repeat before the epoch wraps."""

from __future__ import annotations

import itertools

import pytest

from hybrid_ep import native

DATA = 4080


def _align(n: int) -> int:
    return -(-n // 16) * 16


# (rows, row bytes, prob bytes, scale bytes): BF16 rows of hidden 7168 with probs of 8 x 8
# experts, FP8 rows with their scales, a record of exactly one tile, rows smaller than a tile,
# odd prob widths (3 experts), probs without scales, an empty chunk, one byte short of a tile.
CASES = [(3, 14336, 256, 0), (5, 7168, 32, 224), (1, DATA, 0, 0), (40, 256, 12, 0),
         (7, 14336, 0, 0), (0, 14336, 256, 224), (2, DATA - 16, 0, 0), (9, 2048, 4, 64)]


@pytest.mark.parametrize("rows,row_bytes,prob_bytes,scale_bytes", CASES)
def test_tiles_and_records_match_the_definition(rows, row_bytes, prob_bytes, scale_bytes):
    got = native.module().eager_tiles(rows, row_bytes, prob_bytes, scale_bytes)
    probs_at = _align(row_bytes)
    scales_at = _align(probs_at + prob_bytes)
    record = _align(scales_at + scale_bytes)
    payload = rows * record
    assert (got["probs_at"], got["scales_at"], got["record"], got["bytes"]) == \
        (probs_at, scales_at, record, payload)

    tiles = got["tiles"]
    assert len(tiles) == -(-payload // DATA)
    assert sum(t[0] for t in tiles) == payload
    for i, (data, signal_at, wire) in enumerate(tiles):
        assert data == (DATA if i < len(tiles) - 1 else payload - DATA * (len(tiles) - 1))
        assert 0 < data <= DATA and signal_at == _align(data) and wire == signal_at + 16
    assert got["wire_bytes"] == (0 if not tiles else 4096 * (len(tiles) - 1) + tiles[-1][2])

    # Every byte a row uses lies in its tiles; its data starts where the slot's layout says.
    used = scales_at + scale_bytes if scale_bytes else (probs_at + prob_bytes if prob_bytes
                                                        else row_bytes)
    for r, ((first, last), at) in enumerate(zip(got["row_tiles"], got["row_wire_offsets"])):
        begin, end = r * record, r * record + used
        assert (first, last) == (begin // DATA, (end - 1) // DATA)
        assert at == begin // DATA * 4096 + begin % DATA
    assert len(got["row_tiles"]) == rows


def test_a_row_spanning_tiles_needs_each_of_them():
    got = native.module().eager_tiles(3, 14336, 256, 0)
    # 14592-byte records: row 0 in tiles 0-3, row 1 from tile 3 (shared with row 0) to 7.
    assert got["row_tiles"] == [(0, 3), (3, 7), (7, 10)]
    assert got["tiles"][-1] == (43776 - 10 * DATA, 2976, 2992)  # the last tile is short


def test_the_binding_rejects_impossible_chunks():
    with pytest.raises(ValueError, match="row_bytes"):
        native.module().eager_tiles(1, 0)
    with pytest.raises(ValueError, match="rows"):
        native.module().eager_tiles(-1, 16)


def test_signal_values_are_nonzero_and_distinct_until_the_epoch_wraps():
    value = native.module().eager_signal_value
    epochs = [0, 1, 2, 1000, (1 << 32) - 1, 1 << 32, (1 << 40) - 2, (1 << 40) - 1]
    sequences = [0, 1, 2, 511, (1 << 24) - 2, (1 << 24) - 1]
    seen = {}
    for epoch, sequence in itertools.product(epochs, sequences):
        v = value(epoch, sequence)
        assert 0 < v < 1 << 64
        seen.setdefault(v, []).append((epoch, sequence))
    # The one repeat: the last value before the wrap comes round as the first one's.
    repeats = {v: pairs for v, pairs in seen.items() if len(pairs) > 1}
    assert repeats == {1: [(0, 0), ((1 << 40) - 1, (1 << 24) - 1)]}
    # Later calls of one slot expect larger values (until the wrap), and the epoch wraps at 2^40.
    assert value(5, 3) < value(6, 0) < value(6, 1)
    assert value(1 << 40, 7) == value(0, 7)


@pytest.mark.parametrize("rows,row_bytes,prob_bytes,scale_bytes", CASES)
def test_the_reference_counts_the_kernels_tiles(rows, row_bytes, prob_bytes, scale_bytes):
    """The reference engine's eager counts (reference/network.py) use the same record and tile
    arithmetic as the kernels."""
    from hybrid_ep.reference.network import RowWidths, eager_record, eager_tiles

    got = native.module().eager_tiles(rows, row_bytes, prob_bytes, scale_bytes)
    assert eager_record(RowWidths(row_bytes, prob_bytes, scale_bytes)) == got["record"]
    assert eager_tiles(got["bytes"]) == (len(got["tiles"]), got["wire_bytes"])
