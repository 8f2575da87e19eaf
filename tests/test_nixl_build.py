"""The nixl build: configuring fails naming what is missing (UCX device headers, the NIXL
runtime), and the preset's module (build/nixl, made by `cmake --preset nixl && cmake --build
--preset nixl`; tools/setup.sh --test makes it) loads and reports its transport on a CPU."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "nixl"

_CHILD = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("_C", sys.argv[1])
C = importlib.util.module_from_spec(spec)
spec.loader.exec_module(C)
print(json.dumps({"transport": C.build_info()["transport"], "preflight": C.transport_preflight()}))
"""


def _configure(tmp_path: Path, *defines: str) -> str:
    """Configures the nixl transport with a Python that knows no wheel; returns the output."""
    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        pytest.skip("cmake and ninja are needed")
    no_wheels = tmp_path / "python"
    no_wheels.write_text("#!/bin/sh\nexit 1\n")
    no_wheels.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("UCX_HOME", "NIXL_HOME")}
    done = subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"), "-G", "Ninja",
         "-DHYBRID_EP_TRANSPORT=nixl", f"-DPython_EXECUTABLE={no_wheels}", *defines],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0, done.stdout
    return " ".join((done.stdout + done.stderr).split())


def _ucx_include() -> str:
    try:
        import libucx
    except ImportError:
        pytest.skip("libucx-cu13 is not installed (pip install libucx-cu13==1.22.0)")
    return str(Path(next(iter(libucx.__path__))) / "include")


def test_configure_without_ucx_headers_names_the_wheel_and_ucx_home(tmp_path):
    text = _configure(tmp_path)
    assert "UCX's GPU device API headers" in text, text
    assert 'pip install "libucx-cu13==1.22.0"' in text and "UCX_HOME" in text, text


def test_configure_with_incomplete_ucx_headers_names_the_missing_one(tmp_path):
    include = tmp_path / "ucx" / "include" / "ucp" / "api" / "device"
    include.mkdir(parents=True)
    (include / "ucp_device_impl.h").write_text("")
    text = _configure(tmp_path, f"-DUCX_HOME={tmp_path / 'ucx'}")
    assert "lack ucp/api/device/ucp_device_types.h" in text, text


def test_configure_without_nixl_names_the_wheel_and_nixl_home(tmp_path):
    ucx_home = Path(_ucx_include()).parent
    text = _configure(tmp_path, f"-DUCX_HOME={ucx_home}")
    assert "NIXL runtime with its UCX plugin" in text, text
    assert 'pip install "nixl-cu13==1.5.1"' in text and "NIXL_HOME" in text, text


def test_the_nixl_build_loads_and_names_its_transport():
    found = glob.glob(str(BUILD / "_C*.so"))
    if not found:
        reason = ("the nixl build is missing: run `cmake --preset nixl && cmake --build --preset "
                  "nixl` (bash tools/setup.sh --test does)")
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    done = subprocess.run([sys.executable, "-c", _CHILD, found[0]], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["transport"] == "nixl"
    assert "UCX device API 2" in out["preflight"] and "nixl_cu13" in out["preflight"], out
