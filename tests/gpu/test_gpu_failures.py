"""Failures across ranks on the CUDA engine (issue 38): calls the ranks do not make alike raise
HybridEPMismatchError on every rank before data moves; a peer that skips a call or dies in the
middle of one makes the others raise HybridEPTimeoutError naming the call, the wait and the
rank after HYBRID_EP_TIMEOUT_S; the library works under torch.set_default_device('cuda').

The timeout cases run last (the buffers they leave are unusable)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_env import DRY_RUN, gpu_marks, placement_param

pytestmark = gpu_marks

MODULE = "gpu_failure_cases"
LIMIT_S = 3.0


@pytest.mark.parametrize("kind", ["probs", "fp8", "combine_width", "combine_vs_dispatch"])
@pytest.mark.parametrize("W,placement,R", [placement_param(2, "shared", 2, id_extra="1x2"),
                                           placement_param(2, "shared", 1, id_extra="2x1"),
                                           placement_param(4, "shared", 2, id_extra="2x2")])
def test_mismatch_raises_on_every_rank(gpu_pools, W, placement, R, kind):
    results = gpu_pools.run(W, placement, "mismatch", module=MODULE, R=R, kind=kind,
                            timeout_s=120)
    for rank, r in enumerate(results):
        assert "message" in r, f"rank {rank} raised no HybridEPMismatchError: {r}"
        assert r["raised_at"] in ("call", "next call"), r
        assert "disagree" in r["message"], r["message"]
        # Rank 1 differs: in one domain, or with one rank per domain, every other rank names it
        # (in 2x2, a rank of the other domain may name its peer, which saw the mismatch).
        if rank != 1 and (R == W or R == 1):
            assert "rank 1" in r["message"], r["message"]
        assert r["seconds"] < 15, f"rank {rank} raised after {r['seconds']:.1f} s: {r}"
    print(results[0]["message"])


@pytest.mark.skipif(DRY_RUN, reason="needs CUDA tensors")
@pytest.mark.parametrize("W,placement", [placement_param(2, "shared")])
def test_default_device_cuda(gpu_pools, W, placement):
    assert gpu_pools.run(W, placement, "default_device", module=MODULE) == [9] * W


@pytest.mark.gpu_last
@pytest.mark.parametrize("W,placement,R,op,site", [
    placement_param(2, "shared", 1, "dispatch", "network routing all-gather",
                    id_extra="2x1-dispatch"),
    placement_param(2, "shared", 2, "combine", "domain barrier", id_extra="1x2-combine"),
    placement_param(2, "shared", 1, "combine", "network barrier", id_extra="2x1-combine")])
def test_skipped_call_times_out(gpu_pools, W, placement, R, op, site):
    try:
        results = gpu_pools.run(W, placement, "skipped", module=MODULE, R=R, op=op,
                                limit_s=LIMIT_S, timeout_s=120)
    finally:
        gpu_pools.close()
    first = results[0]
    assert first["first"] == "timeout", first
    message = first["first_message"]
    assert op in message and "HYBRID_EP_TIMEOUT_S" in message, message
    assert "rank 1" in message or "ranks [1]" in message, message
    if not DRY_RUN:
        assert site in message, message
    assert LIMIT_S * 0.5 <= first["first_seconds"] <= LIMIT_S + 10, first
    assert first["again"] == "timeout" and first["again_seconds"] < 2, first


@pytest.mark.gpu_last
@pytest.mark.skipif(DRY_RUN, reason="the reference engine has no rings to starve")
@pytest.mark.parametrize("op", ["dispatch", "combine"])
@pytest.mark.parametrize("W,placement", [placement_param(2, "shared", id_extra="2x1")])
def test_starved_of_credits_times_out(gpu_pools, W, placement, op):
    """Issue 39: a sender whose receivers never credit a ring slot back (HYBRID_EP_FAULT) raises
    the timeout naming the credit wait and the peer, instead of overwriting the slot or hanging."""
    try:
        results = gpu_pools.run(W, placement, "starved", module=MODULE, R=1, op=op,
                                limit_s=LIMIT_S, timeout_s=120)
    finally:
        gpu_pools.close()
    assert len(results) == W, f"{len(results)} of {W} ranks reported: {results}"
    for rank, r in enumerate(results):
        assert r["first"] == "timeout", r
        message = r["first_message"]
        assert op in message and "HYBRID_EP_TIMEOUT_S" in message, message
        assert f"network {op} ring credit" in message, message
        assert f"rank {1 - rank}" in message or f"ranks [{1 - rank}]" in message, message
        assert LIMIT_S * 0.5 <= r["first_seconds"] <= LIMIT_S + 10, r
        assert r["again"] == "timeout" and r["again_seconds"] < 2, r


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.gpu_last
@pytest.mark.skipif(DRY_RUN, reason="kills a process with CUDA work in flight")
@pytest.mark.parametrize("layout,site", [("1x2", "start of this dispatch"),
                                         ("2x1", "network dispatch chunk")])
def test_peer_killed_mid_call(layout, site):
    """Rank 1 dies after the routing all-gather of a dispatch, before its dispatch kernel:
    rank 0's dispatch gives up waiting for rank 1 (inside one domain at the dispatch's start,
    where each rank publishes its targets; across domains for its chunks) and its next call
    raises HybridEPTimeoutError naming the dispatch, the wait and rank 1 (gpu/peer_killed.py)."""
    script = Path(__file__).with_name("peer_killed.py")
    port = _port()
    env = dict(os.environ, OMP_NUM_THREADS="1", HYBRID_EP_TIMEOUT_S=str(LIMIT_S))
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port, layout], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=180)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + "\n[killed after 180 s]")
    assert procs[1].returncode == 9, outs[1][-3000:]
    assert procs[0].returncode == 0, outs[0][-3000:]
    line = next(ln for ln in outs[0].splitlines() if ln.startswith("RAISED"))
    assert "dispatch" in line and site in line and "rank 1" in line, line
