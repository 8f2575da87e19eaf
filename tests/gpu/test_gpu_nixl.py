"""The nixl build on a real GPU: a runtime spanning two domains refuses memory views whose header is
not the UCX layout it was compiled for, and blobs that are not view addresses, naming the domain
(the start-up check of backends/nixl/view_header.h), in a child process so that the pytest process
creates no CUDA context; and the multi-domain matrix with every put and signal through UCX's device
API. The transport and multi-domain GPU tests cover the default data path when the installed build
is nixl."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from gpu_env import transport_build_marks
from gpu_library_puts import MATRIX_PARAMS, run_counters_case, run_matrix_case

pytestmark = transport_build_marks("nixl")

_CHILD = r"""
import json, struct, sys
import torch
from hybrid_ep import native
C = native.module()
rc = C.RuntimeConfig()
rc.world, rc.ranks, rc.nodes, rc.node_rank, rc.local_rank = 2, 1, 2, 0, 0
rc.max_tokens, rc.hidden = 16, 256
runtime = C.Runtime(rc)
fake = torch.zeros(64, dtype=torch.uint8, device="cuda")
fake[0:5] = torch.tensor([int(sys.argv[1]), 0, 0, 0, 1], dtype=torch.uint8)  # version; 0 lanes; 1 element
blob = struct.pack("<Q", fake.data_ptr())
out = {"bootstrap": runtime.transport_bootstrap().decode()}
for name, blobs in (("short", [b"1234", blob]), ("header", [blob, blob])):
    try:
        runtime.connect_transport(blobs)
        out[name] = "connected"
    except Exception as error:
        out[name] = f"{type(error).__name__}: {error}"
print(json.dumps(out))
"""


# A local view may have no lane (UCX takes the lane from the remote view); a remote one may not.
@pytest.mark.parametrize("version,fragment,domain",
                         [(0, "layout version 0", 0), (2, "has no lane", 1)])
def test_bad_views_fail_at_connect_naming_the_domain(version, fragment, domain):
    done = subprocess.run([sys.executable, "-c", _CHILD, str(version)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    address, size, device = (int(x) for x in out["bootstrap"].split())
    assert address and size and device >= 0, out
    assert "8-byte memory view address" in out["short"] and "domain 0" in out["short"], out
    assert fragment in out["header"] and f"domain {domain}" in out["header"], out


# The same matrix and counters as test_gpu_multi_domain.py with every put and signal through
# UCX's device API (ucp_device_put, ucp_device_counter_inc): on one host UCX maps the peers
# (cuda_ipc), so by default our own stores carry the data and UCX's path would go untested.
UCX_ONLY = {"HYBRID_EP_NIXL_DIRECT": "0"}


@pytest.mark.parametrize("W,placement,R,case", MATRIX_PARAMS)
def test_dispatch_combine_through_ucx_puts(gpu_pools, record_property, W, placement, R, case):
    run_matrix_case(gpu_pools, record_property, W, placement, R, case, UCX_ONLY, "ucx puts")


@pytest.mark.parametrize("channels", [1, 4])
def test_counters_through_ucx_puts(gpu_pools, channels):
    run_counters_case(gpu_pools, channels, UCX_ONLY)
