"""The nvshmem build's start-up on a real GPU (HYBRID_EP_TRANSPORT=nvshmem pip install .): two
ranks as two NVLink domains on one host. A bootstrap interface that does not exist makes every
rank raise a clear error instead of hanging; a healthy start builds two buffers in each process
(they share one NVSHMEM session), runs the transport self-test and frees them collectively.
Every rank is a fresh child process: NVSHMEM is process-global and reads its variables once.
The data path itself is covered by the transport and multi-domain GPU tests of this build: on one
host NVSHMEM maps every peer (P2P), so there they run our own stores into its heap; here the same
matrix, counters and transport checks run again with every put and signal through NVSHMEM's
device API (HYBRID_EP_NVSHMEM_DIRECT=0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from gpu_env import transport_build_marks
from gpu_library_puts import MATRIX_PARAMS, run_counters_case, run_matrix_case

pytestmark = transport_build_marks("nvshmem")

# argv: rank, world, store file, buffers to build. Prints one JSON line.
_RANK = r"""
import json, sys
import torch
import torch.distributed as dist
from hybrid_ep import native, transport_bootstrap
rank, world, store, buffers = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
torch.cuda.set_device(0)
dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
C = native.module()
out = {"rank": rank}
try:
    runtimes = []
    for _ in range(buffers):
        rc = C.RuntimeConfig()
        rc.world, rc.ranks, rc.nodes, rc.node_rank, rc.local_rank = world, 1, world, rank, 0
        rc.experts_per_rank, rc.max_tokens, rc.hidden = 2, 64, 1024
        rc.sms_dispatch = rc.sms_combine = rc.sms_preprocessing = 4
        rc.transport_options = transport_bootstrap.group_options(C, dist.group.WORLD, rank, rc)
        runtime = C.Runtime(rc)
        handles = [None] * world
        dist.all_gather_object(handles, runtime.export_handle())
        runtime.open_peers([handles[rank]])
        blobs = [None] * world
        dist.all_gather_object(blobs, runtime.transport_bootstrap())
        runtime.connect_transport(blobs)
        runtimes.append(runtime)
    stream = torch.cuda.current_stream().cuda_stream
    for runtime in runtimes:
        dist.barrier()
        out.setdefault("wrong", []).append(runtime.transport_check(4096, 0, stream))
        out.setdefault("status", []).append(runtime.status()["code"])
    torch.cuda.synchronize()
    dist.barrier()
    for runtime in runtimes:
        runtime.release()
    out["result"] = "ok"
except Exception as error:
    out["error"] = type(error).__name__
    out["message"] = str(error)
print(json.dumps(out))
"""


def _run_ranks(tmp_path, world: int, buffers: int, env: dict[str, str]) -> list[dict]:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHMEM_")}
    child_env.update(env)
    store = str(tmp_path / "store")
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(r), str(world), store,
                               str(buffers)], env=child_env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    outs = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=240)  # a hang fails here
            assert proc.returncode == 0, stdout + stderr
            outs.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return outs


def test_bad_bootstrap_interface_raises_on_every_rank(tmp_path):
    outs = _run_ranks(tmp_path, 2, 1, {"NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": "nosuchif0"})
    for out in outs:
        assert "error" in out, out
        assert out["error"] in ("TransportBootstrapError", "TransportUnavailableError"), out
        assert "nvshmem" in out["message"], out
        assert "nosuchif0" in out["message"] or "nvshmemx_get_uniqueid" in out["message"], out


def test_two_buffers_share_the_session_and_pass_the_transport_check(tmp_path):
    outs = _run_ranks(tmp_path, 2, 2, {})
    for out in outs:
        assert out.get("result") == "ok", out
        assert out["wrong"] == [0, 0] and out["status"] == [0, 0], out


# The same matrix and counters as test_gpu_multi_domain.py, and the transport self-test and
# network sends of test_gpu_transport.py, with every put and signal through NVSHMEM's device API
# (nvshmemx_putmem_nbi_warp, nvshmem_fence + nvshmemx_signal_op): on one host NVSHMEM maps the
# peers (P2P), so by default our own stores carry the data and NVSHMEM's path would go untested.
NVSHMEM_ONLY = {"HYBRID_EP_NVSHMEM_DIRECT": "0"}


@pytest.mark.parametrize("W,placement,R,case", MATRIX_PARAMS)
def test_dispatch_combine_through_nvshmem_puts(gpu_pools, record_property, W, placement, R, case):
    run_matrix_case(gpu_pools, record_property, W, placement, R, case, NVSHMEM_ONLY, "nvshmem puts")


@pytest.mark.parametrize("channels", [1, 4])
def test_counters_through_nvshmem_puts(gpu_pools, channels):
    run_counters_case(gpu_pools, channels, NVSHMEM_ONLY)


@pytest.mark.parametrize("W,nodes,nbytes", [(2, 2, 65536), (4, 2, 4101), (8, 8, 1000)])
def test_transport_check_through_nvshmem_puts(gpu_pools, W, nodes, nbytes):
    results = gpu_pools.run(W, "shared", "under_env", module="gpu_multi_domain_cases",
                            environment=NVSHMEM_ONLY, case="transport_check",
                            cases_module="gpu_transport_cases", nodes=nodes, channels=2,
                            nbytes=nbytes, rounds=5)
    assert len(results) == W


def test_network_send_through_nvshmem_puts(gpu_pools):
    results = gpu_pools.run(4, "shared", "under_env", module="gpu_multi_domain_cases",
                            environment=NVSHMEM_ONLY, case="network_send",
                            cases_module="gpu_transport_cases", nodes=2, chunk=64, pattern="runs",
                            channels=2, rounds=3)
    assert len(results) == 4
