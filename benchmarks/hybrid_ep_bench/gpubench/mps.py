"""MPS for the bench's ranks when several share a GPU.

Without MPS, kernels of different processes time-slice and a cross-process flag round trip
takes milliseconds instead of microseconds, so several ranks on one GPU measure the scheduler,
not the kernels (2 ranks x 8 SMs: dispatch 1550 us instead of 278). The bench uses a running
daemon (``CUDA_MPS_PIPE_DIRECTORY``, default /tmp/nvidia-mps), else starts a private one for its
ranks and stops it afterwards, as tools/gpu_run.sh does; the state goes into every table.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time

DEFAULT_PIPE = "/tmp/nvidia-mps"
# States the tables print; only these two give valid numbers when ranks share a GPU.
RUNNING, STARTED = "running", "started for this run"


def valid(state: str) -> bool:
    return state in (RUNNING, STARTED) or state.startswith("not needed")


def _running() -> bool:
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", DEFAULT_PIPE)
    return os.path.exists(os.path.join(pipe, "control"))


@contextlib.contextmanager
def mps_for_ranks(shared: bool, enabled: bool = True):
    """Yields the MPS state for the bench's tables; ``shared``: some GPU runs several ranks.
    Ranks spawned inside the block inherit the private daemon's pipe directory."""
    if not shared:
        yield "not needed (one rank per GPU)"
        return
    if not enabled:
        yield "off (--no-mps): ranks sharing a GPU time-slice, numbers are not valid"
        return
    if _running():
        yield RUNNING
        return
    tool = shutil.which("nvidia-cuda-mps-control")
    if tool is None:
        yield "could not start (nvidia-cuda-mps-control not found): numbers are not valid"
        return
    root = tempfile.mkdtemp(prefix="hybrid-ep-mps-")
    dirs = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(root, "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": os.path.join(root, "log")}
    for folder in dirs.values():
        os.makedirs(folder)
    env = dict(os.environ, **dirs)
    saved = {k: os.environ.get(k) for k in dirs}
    started = subprocess.run([tool, "-d"], env=env, capture_output=True, text=True, check=False)
    deadline = time.monotonic() + 10
    control = os.path.join(dirs["CUDA_MPS_PIPE_DIRECTORY"], "control")
    while started.returncode == 0 and not os.path.exists(control) and time.monotonic() < deadline:
        time.sleep(0.05)
    if started.returncode != 0 or not os.path.exists(control):
        shutil.rmtree(root, ignore_errors=True)
        why = (started.stderr or started.stdout).strip().splitlines()[-1:] or ["no control pipe"]
        yield f"could not start ({why[0]}): numbers are not valid"
        return
    os.environ.update(dirs)
    try:
        yield STARTED
    finally:
        subprocess.run([tool], input="quit\n", env=env, capture_output=True, text=True,
                       check=False)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(root, ignore_errors=True)
