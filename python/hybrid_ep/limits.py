"""The CUDA engine's limits (docs/engine.md, "Limits"): what its kernels can index."""

from __future__ import annotations

from .topology import Topology


def check_limits(topo: Topology, max_tokens: int, experts: int) -> None:
    """What the CUDA engine's kernels can index (docs/engine.md, "Limits"), checked the same by
    the runtime (runtime.cpp, again when the buffer grows): every rank raises alike, before any
    exchange. The masks of a token's destinations hold one domain's ranks in 64 bits; the
    all-gather waits for each domain on a thread of one block; the row numbers of received rows
    (group size x T) and of the permute's sources (x E) are 32-bit."""
    rows = topo.group_size * max_tokens
    limits = (
        (topo.ranks_per_domain <= 64,
         f"ranks per NVLink domain: {topo.ranks_per_domain}; at most 64"),
        (topo.num_of_nodes <= 1024, f"NVLink domains: {topo.num_of_nodes}; at most 1024"),
        (rows < 2**31, (f"group size x max_num_of_tokens_per_rank: {topo.group_size} x "
                        f"{max_tokens} = {rows}; at most 2^31 - 1")),
        (rows * experts < 2**31, ("group size x max_num_of_tokens_per_rank x num_local_experts"
                                  f": {rows * experts}; at most 2^31 - 1")),
        (experts <= 6144, f"num_local_experts: {experts}; at most 6144"),
    )
    for ok, what in limits:
        if not ok:
            raise ValueError(f"{what} (the CUDA engine's limits, docs/engine.md)")
