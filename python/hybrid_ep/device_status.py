"""The CUDA engine's device status (common/status.h) as the Python error it stands for.

A kernel that cannot make progress records what it waited for and gives up; the engine reads
the record before its next launch and raises here, naming the wait, the peer and the call.
"""

from __future__ import annotations

import functools

from . import native
from .call_stamp import CallStamp, differences
from .errors import HybridEPMismatchError, HybridEPTimeoutError
from .topology import Topology

# What each wait site of common/status.h (_C.WaitSite, by name) waited for.
WAIT_SITES = {"kBarrier": "domain barrier", "kAllgather": "routing all-gather",
              "kDispatchChunk": "dispatch chunk flag", "kNetworkFlag": "network dispatch chunk",
              "kNetworkCombine": "network combine chunk", "kNetworkBarrier": "network barrier",
              "kNetworkAllgather": "network routing all-gather",
              "kForward": "forwarded routing maps", "kUnpermuteChunk": "unpermuted chunk",
              "kReceiveRelease": "start of this dispatch (targets published, rows released)",
              "kGatheredStamps": "routing all-gather (every rank's stamp)",
              "kDispatchCredit": "network dispatch ring credit",
              "kCombineCredit": "network combine ring credit",
              "kCombinePulled": "a peer's reads of this rank's previous combine input"}
# Sites whose peer is a domain (its rank: the same local rank there); kGatheredStamps' is a
# global rank.
_NETWORK_SITES = ("kNetworkFlag", "kNetworkCombine", "kNetworkBarrier", "kNetworkAllgather",
                  "kDispatchCredit", "kCombineCredit")
DOMAIN_DISAGREES = 1 << 63  # kDomainDisagrees of kernels/common/flags.cuh (tests compare)


def raise_for_status(status: dict, topo: Topology, timeout_s: float) -> None:
    """Raises the error of a failed ``status`` (Runtime.status(), code not kOk)."""
    codes, sites = _status_names()
    name = sites.get(status["site"])
    site = WAIT_SITES.get(name, f"site {status['site']}")
    network = name in _NETWORK_SITES
    R = topo.ranks_per_domain
    if codes.get(status["code"]) == "kMismatch":
        # The peer is the rank whose stamp differed (a local rank, or the peer of a domain).
        peer = (status["peer"] if name == "kGatheredStamps"
                else status["peer"] * R + topo.local_rank if network
                else topo.node_rank * R + status["peer"])
        mine = CallStamp.unpack(status["expected"])
        theirs = CallStamp.unpack(status["seen"] & ~DOMAIN_DISAGREES)
        if status["seen"] & DOMAIN_DISAGREES and mine == theirs:
            what = (f"rank {peer} (the peer in domain {status['peer']}) found ranks of its "
                    "domain disagreeing")
        else:
            what = (f"rank {peer}: {theirs.describe()} "
                    f"({'; '.join(differences(mine, theirs))})")
        raise HybridEPMismatchError(
            f"rank {topo.rank}: ranks disagree on the call (every rank must make the "
            f"same call), found at the {site}: this rank: {mine.describe()}; {what}. The "
            "call did not move data; this buffer cannot be used any more")
    peer = (f"rank {status['peer'] * R + topo.local_rank} (the peer in domain "
            f"{status['peer']})" if network
            else f"rank {topo.node_rank * R + status['peer']} (local rank "
                 f"{status['peer']})")
    # The kernel that failed recorded the stamp of its call.
    op = CallStamp.unpack(status["stamp"]).op if status["stamp"] else "an internal step"
    raise HybridEPTimeoutError(
        f"rank {topo.rank}: {op}: GPU wait at the {site} "
        f"for {peer} (slot {status['slot']}) timed out after {timeout_s:g} s: "
        f"expected {status['expected']}, saw {status['seen']}. The peer died, hangs, raised "
        "before the call, or called a different operation; this buffer cannot be used any "
        "more (HYBRID_EP_TIMEOUT_S sets the limit)")


@functools.cache
def _status_names() -> tuple[dict[int, str], dict[int, str]]:
    """{value: name} of _C.StatusCode and of _C.WaitSite."""
    C = native.module()
    return tuple({int(value): name for name, value in enum.__members__.items()}
                 for enum in (C.StatusCode, C.WaitSite))
