"""Parameter grids shared by the test files."""

from __future__ import annotations

import pytest

# (world size, ranks per NVLink domain): 2, 4 and 8 ranks in 1, 2 and 4 domains.
TOPOLOGIES = [(2, 2), (2, 1), (4, 4), (4, 2), (4, 1), (8, 8), (8, 4), (8, 2)]


def topo_id(topo) -> str:
    W, R = topo
    return f"W{W}xN{W // R}"


topologies = pytest.mark.parametrize("topo", TOPOLOGIES, ids=[topo_id(t) for t in TOPOLOGIES])


def seed(*parts) -> int:
    """A stable seed per test parameter combination."""
    import zlib

    return zlib.crc32("/".join(map(str, parts)).encode()) % (2 ** 31)
