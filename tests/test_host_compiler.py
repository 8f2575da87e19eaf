"""cmake/HostCompiler.cmake: CMake's CUDA detection and the module's link use the chosen host
compiler even when $CXX and $CUDAHOSTCXX name another, as on the GPU image (/opt/gcc, whose
static libstdc++ must not reach the module). CMake 4.4 took $CUDAHOSTCXX over our cache entry."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"

PROJECT = """cmake_minimum_required(VERSION 3.25...4.1)
list(APPEND CMAKE_MODULE_PATH "{cmake_dir}")
include(HostCompiler)
project(host_compiler_probe LANGUAGES CXX CUDA)
file(WRITE "${{CMAKE_BINARY_DIR}}/seen.txt"
     "host=${{CMAKE_CUDA_HOST_COMPILER}}\\n"
     "dirs=${{CMAKE_CUDA_IMPLICIT_LINK_DIRECTORIES}};${{CMAKE_CUDA_HOST_IMPLICIT_LINK_DIRECTORIES}}\\n")
"""


@pytest.mark.skipif(not (shutil.which("cmake") and os.path.exists(NVCC)
                         and os.path.exists("/usr/bin/g++")),
                    reason="needs cmake, nvcc and /usr/bin/g++")
def test_cuda_detection_ignores_a_foreign_host_compiler(tmp_path):
    foreign = tmp_path / "foreign"
    (foreign / "lib").mkdir(parents=True)
    wrapper = foreign / "g++"
    # A stand-in for another toolchain: the system compiler with its own library directory.
    wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/g++ -L{foreign / "lib"} "$@"\n')
    wrapper.chmod(0o755)
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(PROJECT.format(cmake_dir=REPO / "cmake"))
    env = dict(os.environ, CXX=str(wrapper), CUDAHOSTCXX=str(wrapper), CUDACXX=NVCC)
    done = subprocess.run(["cmake", "-S", str(src), "-B", str(tmp_path / "build")], env=env,
                          check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = dict(line.split("=", 1)
                for line in (tmp_path / "build" / "seen.txt").read_text().splitlines())
    assert seen["host"] == "/usr/bin/g++", seen
    assert str(foreign) not in seen["dirs"], seen
