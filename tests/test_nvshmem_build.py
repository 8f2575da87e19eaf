"""The nvshmem build (build/nvshmem, made by `cmake --preset nvshmem && cmake --build --preset
nvshmem`; tools/setup.sh --test makes it) on a machine without a GPU: what it reports, what its
preflight finds, the unique id, its error table and version rule on fixed inputs, and the
message when libnvshmem_host.so.3 cannot be found. Each check runs the module in a child
process, so that it never meets the installed hybrid_ep._C of another transport."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "nvshmem"

# Loads the module under its own name, runs the named check, prints one JSON line.
_CHILD = r"""
import importlib.util, json, sys
path, what = sys.argv[1], sys.argv[2]
out = {}
try:
    spec = importlib.util.spec_from_file_location("_C", path)
    C = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(C)
except ImportError as error:
    from hybrid_ep import native
    out["import_error"] = str(error)
    out["message"] = native.missing_library_message(error, path)
    print(json.dumps(out))
    raise SystemExit
out["build_info"] = {k: v for k, v in C.build_info().items() if isinstance(v, (str, bool))}
try:
    if what == "preflight":
        out["result"] = C.transport_preflight()
    elif what == "unique_id":
        out["result"] = C.transport_unique_id().hex()
    elif what == "describe":
        out["result"] = {f"{s},{t}": C.transport_describe_failure("nvshmemi_init_thread", s, t)
                         for s in range(-1, 9) for t in range(-1, 6)}
    elif what == "versions":
        cases = json.loads(sys.argv[3])
        out["result"] = [C.transport_version_mismatch(*case) for case in cases]
except Exception as error:
    out["error"] = type(error).__name__
    out["message"] = str(error)
print(json.dumps(out))
"""


def module_path() -> str:
    found = glob.glob(str(BUILD / "_C*.so"))
    if not found:
        reason = ("the nvshmem build is missing: run `cmake --preset nvshmem && cmake --build "
                  "--preset nvshmem` (bash tools/setup.sh --test does when nvidia-nvshmem-cu13 "
                  "is usable)")
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return found[0]


def run(what: str, *args: str, path: str | None = None, env: dict | None = None) -> dict:
    child_env = {k: v for k, v in os.environ.items()
                 if not k.startswith("NVSHMEM_") and k != "LD_LIBRARY_PATH"}
    child_env.update(env or {})
    done = subprocess.run([sys.executable, "-c", _CHILD, path or module_path(), what, *args],
                          env=child_env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_build_info_names_nvshmem_and_its_version():
    info = run("preflight")["build_info"]
    assert info["transport"] == "nvshmem", info
    found = re.fullmatch(r"NVSHMEM (\d+)\.(\d+)\.(\d+) \((.+)\)", info["transport_library"])
    assert found, info
    assert int(found[1]) == 3, info
    assert os.path.isfile(os.path.join(found[4], "libnvshmem_host.so.3")), info


def test_preflight_finds_the_host_library_and_the_bootstrap_plugin():
    out = run("preflight")
    assert "error" not in out, out
    assert out["result"].startswith("nvshmem: libnvshmem_host.so.3 3."), out
    assert "nvshmem_bootstrap_uid.so.3" in out["result"], out


def test_preflight_with_ibgda_names_the_plugin_or_what_it_needs():
    out = run("preflight", env={"NVSHMEM_IB_ENABLE_IBGDA": "1"})
    if "error" in out:  # no rdma-core here: the IBGDA plugin cannot load
        assert out["error"] == "TransportUnavailableError", out
        assert "IBGDA" in out["message"] and "libibverbs" in out["message"], out
    else:
        assert "IBGDA" in out["result"] and "nvshmem_transport_ibgda.so" in out["result"], out


def test_unique_id_is_128_bytes_without_a_gpu():
    out = run("unique_id")
    assert "error" not in out, out
    assert len(bytes.fromhex(out["result"])) == 128, out


def test_error_table_names_the_call_status_stage_and_hints():
    table = run("describe", env={"NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": "nosuchif0",
                                 "NVSHMEM_REMOTE_TRANSPORT": "none"})["result"]
    names = ["NVSHMEMX_SUCCESS", "NVSHMEMX_ERROR_INVALID_VALUE", "NVSHMEMX_ERROR_OUT_OF_MEMORY",
             "NVSHMEMX_ERROR_NOT_SUPPORTED", "NVSHMEMX_ERROR_SYMMETRY",
             "NVSHMEMX_ERROR_GPU_NOT_SELECTED", "NVSHMEMX_ERROR_COLLECTIVE_LAUNCH_FAILED",
             "NVSHMEMX_ERROR_INTERNAL"]
    for status, name in enumerate(names):
        assert f"status {status} ({name})" in table[f"{status},1"]
    assert "status 8 (unknown status)" in table["8,1"]
    assert "status -1 (unknown status)" in table["-1,1"]
    stages = ["not initialised", "bootstrapped", "initialised",
              "initialised, limited multiple PEs per GPU", "initialised, full multiple PEs per GPU"]
    for stage, name in enumerate(stages):
        assert f"stage {stage} ({name})" in table[f"7,{stage}"]
    for message in table.values():
        assert message.startswith("nvshmem transport: nvshmemi_init_thread failed with status")
        assert "NVSHMEM_DEBUG=INFO" in message
    # Hints by stage, showing the variables' current values.
    assert "bootstrap did not complete" in table["7,0"]
    assert "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=nosuchif0" in table["7,0"]
    assert "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=nosuchif0" in table["7,-1"]
    assert "NVSHMEM_REMOTE_TRANSPORT=none" in table["7,1"]
    assert "NVSHMEM_DISABLE_CUDA_VMM=<unset>" in table["7,1"]
    assert "NVSHMEM_SYMMETRIC_SIZE=<unset>" in table["2,2"]


def test_version_rule_same_major_and_a_host_library_at_least_as_new():
    cases = [(3, 4, 5, 3, 4, 5), (3, 4, 5, 3, 8, 0), (3, 4, 5, 3, 4, 0),
             (3, 8, 0, 3, 4, 5), (3, 4, 5, 4, 0, 0), (4, 0, 0, 3, 8, 0)]
    out = run("versions", json.dumps(cases))["result"]
    assert out[:3] == ["", "", ""], out  # the patch level does not matter
    assert "device code is 3.8.0" in out[3] and "is 3.4.5" in out[3], out
    assert "nvidia-nvshmem-cu13 3.x >= 3.8" in out[3], out
    assert "is 4.0.0" in out[4] and "device code is 4.0.0" in out[5], out


def _copy_out_of_reach(tmp_path: Path) -> Path:
    """A copy of the module whose RUNPATH names a folder that does not exist: the absolute
    folder (build trees) is overwritten in place by a same-length path, everywhere except in
    the build's library note (build_info.cpp), which the message reads."""
    source = Path(module_path())
    copy = tmp_path / source.name
    shutil.copyfile(source, copy)
    data = bytearray(copy.read_bytes())
    note = data.find(b"hybrid-ep transport library: ")
    note_end = data.find(b"\0", note)
    folder = re.search(rb"\(([^()]+)\)", bytes(data[note:note_end]))[1]
    fake = (b"/nonexistent" + b"x" * len(folder))[:len(folder)]
    at = data.find(folder)
    while at >= 0:
        if not note <= at < note_end:
            data[at:at + len(folder)] = fake
        at = data.find(folder, at + 1)
    copy.write_bytes(bytes(data))
    return copy


def test_missing_host_library_gives_the_install_hint(tmp_path):
    out = run("preflight", path=str(_copy_out_of_reach(tmp_path)))
    assert "libnvshmem_host.so.3" in out.get("import_error", ""), out
    message = out["message"]
    assert message is not None, out
    for fragment in ("libnvshmem_host.so.3 is missing", "the nvshmem build",
                     "nvidia-nvshmem-cu13>=3.", ",<4", "LD_LIBRARY_PATH"):
        assert fragment in message, (fragment, message)


def test_linkage_host_library_on_the_module_only():
    """libnvshmem_host.so.3 is a NEEDED of _C found through its RUNPATH, and stays off nvcc's
    device-link line (a shared library there breaks the device link); no libcuda."""
    module_path()  # skips (fails on CI) when the nvshmem build is missing
    ninja = (BUILD / "build.ninja").read_text()
    block = ninja[ninja.index("build CMakeFiles/_C.dir/cmake_device_link.o"):]
    block = block[:block.index("\n\n")]
    libraries = next(line for line in block.splitlines()
                     if line.strip().startswith("LINK_LIBRARIES"))
    assert "libnvshmem_device.a" in libraries and "libnvshmem_host" not in libraries, libraries
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf is missing")
    dynamic = subprocess.run([readelf, "-d", module_path()], capture_output=True, text=True,
                             check=True).stdout
    assert "[libnvshmem_host.so.3]" in dynamic and "libcuda" not in dynamic, dynamic
    info = run("preflight")["build_info"]["transport_library"]
    folder = re.fullmatch(r"NVSHMEM [\d.]+ \((.+)\)", info)[1]
    assert re.search(rf"R(UN)?PATH.*\[{re.escape(folder)}[:\]]", dynamic), dynamic


def test_configure_without_nvshmem_names_what_is_missing_and_how_to_install(tmp_path):
    if shutil.which("cmake") is None or shutil.which("nvcc") is None:
        pytest.skip("needs cmake and nvcc")
    python = tmp_path / "python"  # a Python without the wheel: every import fails
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "NVSHMEM_HOME"}
    done = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"), "-G", "Ninja",
                           "-DHYBRID_EP_TRANSPORT=nvshmem", f"-DPython_EXECUTABLE={python}"],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0, done.stdout
    text = " ".join((done.stdout + done.stderr).split())
    for fragment in ("Could NOT find NVSHMEM", "libnvshmem_host.so.3",
                     "pip install nvidia-nvshmem-cu13", "NVSHMEM_HOME"):
        assert fragment in text, (fragment, text[-3000:])
