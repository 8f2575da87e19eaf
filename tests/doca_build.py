"""Runs code against the doca build's module (build/doca, made by `cmake --preset doca &&
cmake --build --preset doca`; tools/setup.sh --test makes it) in a child process, so that it
never meets the installed hybrid_ep._C of another transport in one interpreter."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "doca"

# The child loads the module under its own name and prints one JSON line: what happened.
_CHILD = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("_C", sys.argv[1])
C = importlib.util.module_from_spec(spec)
spec.loader.exec_module(C)
out = {"transport": C.build_info()["transport"], "devices": C.device_count()}
try:
    if sys.argv[2] == "preflight":
        out["result"] = C.transport_preflight()
    else:  # a runtime spanning two domains, on the GPU
        rc = C.RuntimeConfig()
        rc.world, rc.ranks, rc.nodes, rc.node_rank, rc.local_rank = 2, 1, 2, 0, 0
        rc.max_tokens, rc.hidden = 16, 256
        C.Runtime(rc)
        out["result"] = "constructed"
except Exception as error:
    out["error"] = type(error).__name__
    out["is_runtime_error"] = isinstance(error, RuntimeError)
    out["message"] = str(error)
print(json.dumps(out))
"""


def module_path() -> str:
    found = glob.glob(str(BUILD / "_C*.so"))
    if not found:
        reason = (
            "the doca build is missing: run `cmake --preset doca && cmake --build --preset "
            "doca` (bash tools/setup.sh --test does)"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return found[0]


def run(what: str, lib_dir: str | None = None, library_path: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "HYBRID_EP_DOCA_LIB_DIR"}
    if lib_dir is not None:
        env["HYBRID_EP_DOCA_LIB_DIR"] = lib_dir
    if library_path is not None:
        env["LD_LIBRARY_PATH"] = library_path
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, module_path(), what],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def stub_libraries(folder: Path, names: list[str]) -> None:
    """Empty shared libraries under the given names: they load, and export nothing."""
    source = folder / "stub.c"
    source.write_text("int hybrid_ep_stub;\n")
    for name in names:
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-o", str(folder / name), str(source)], check=True
        )
