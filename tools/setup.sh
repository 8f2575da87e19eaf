#!/usr/bin/env bash
# Set up this checkout on a fresh machine, or bring an existing setup up to date:
#   bash tools/setup.sh          install hybrid-ep and its benchmark (hybrid-ep-bench, from
#                                benchmarks/: what `hybrid-ep bench` runs)
#   bash tools/setup.sh --test   the same with the test dependencies, and compile and
#                                link the doca, nixl and nvshmem transports (build/doca,
#                                build/nixl, build/nvshmem; their tests use them)
# Uses whatever `python` is first on PATH (override with PYTHON=...). Safe to re-run: the
# CMake build directories (build/<wheel tag>, benchmarks/build/<wheel tag>) persist, so a re-run
# recompiles only changes.
# Build options travel as environment variables, e.g. HYBRID_EP_TRANSPORT=p2p CUDAARCHS=90a.
set -euo pipefail

extras=""
for arg in "$@"; do
  case "$arg" in
    --test) extras="[test]" ;;
    -h | --help)
      sed -n '2,11p' "$0"
      exit 0
      ;;
    *)
      echo "setup.sh: unknown argument '$arg' (use --test or --help)" >&2
      exit 2
      ;;
  esac
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."
py="${PYTHON:-python}"

run() {
  echo "+ $*"
  "$@"
}

# One transport's CMake preset, configured with the Python that builds (its wheels hold the
# headers and libraries the find modules look for), then built.
build_preset() {
  echo "== $1 transport: compile and link (cmake --preset $1)"
  run cmake --preset "$1" -DPython_EXECUTABLE="$("$py" -c 'import sys; print(sys.executable)')"
  run cmake --build --preset "$1"
}

echo "== hybrid-ep setup: $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])')"

# 1. torch. An installed torch, CUDA build or not, is never touched. Otherwise install the
# CPU build: this pin resolves to a local CPU wheel on our CI image, while an unpinned
# `torch` would pull a multi-GB CUDA build. (Elsewhere, add
# --index-url https://download.pytorch.org/whl/cpu to get a CPU build.)
if torch_version=$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
  echo "== torch $torch_version is installed; leaving it alone"
elif torch_version=$("$py" -c 'import importlib.metadata as m; print(m.version("torch"))' \
  2>/dev/null); then
  # Installed but broken (e.g. a CUDA build missing a library): replacing it could lose the
  # user's CUDA build, so report it instead.
  echo "== WARNING: torch $torch_version is installed but 'import torch' fails; leaving it alone"
else
  echo "== no torch: installing the CPU build"
  run "$py" -m pip install "torch==2.13.0"
fi

# 2. Build requirements, installed into this environment so that the build below can run
# without isolation: an isolated build gets a new temporary environment each time, whose
# changed paths would make CMake rebuild everything. Keep in sync with [build-system] in
# pyproject.toml.
echo "== build requirements"
run "$py" -m pip install "scikit-build-core>=0.10" "pybind11>=2.13"
# cmake/ninja wheels only if the ones on PATH are missing or too old (scikit-build-core
# decides, from the versions pyproject.toml asks for).
tools=$("$py" -c \
  'from scikit_build_core.build import get_requires_for_build_wheel as g; print(" ".join(g()))')
if [ -n "$tools" ]; then
  # shellcheck disable=SC2086  # requirement specifiers contain no spaces
  run "$py" -m pip install $tools
fi

# 3. hybrid-ep itself and its benchmark, a package of its own (the product's wheel holds no
# measurement code), in one pip call so that the benchmark's hybrid-ep requirement is this
# checkout. pip keeps an installed torch that satisfies torch>=2.4.
echo "== hybrid-ep${extras} and hybrid-ep-bench"
run "$py" -m pip install --no-build-isolation ".${extras}" ./benchmarks

run "$py" -c 'import hybrid_ep._C as c; print("hybrid_ep._C:", c.build_info())'
run "$py" -c 'import hybrid_ep_bench._C as c; print("hybrid_ep_bench._C:", c.__file__)'

# 4. With --test: the doca transport's build (preset doca) beside the installed one. It needs
# only the DOCA GPUNetIO headers and links no DOCA library; tests/test_doca_loader.py runs its
# run-time loading against absent libraries. The headers come from DOCA_HOME, or from the
# nvidia-nvshmem-cu13 wheel (>= 3.8). An installed older wheel is left alone (a CUDA build of
# torch pins its own version): the doca build is then skipped and its tests skip too.
if [ -n "$extras" ]; then
  nvshmem=$("$py" - <<'PY'
import importlib.metadata as md
import os
try:
    version = md.version("nvidia-nvshmem-cu13")
except md.PackageNotFoundError:
    print("absent")
    raise SystemExit
import nvidia.nvshmem as wheel
root = list(wheel.__path__)[0]
found = os.path.isfile(os.path.join(root, "include", "gpunetio", "doca_gpunetio_device.h"))
print("headers" if found else f"no-headers {version}")
PY
)
  if [ -z "${DOCA_HOME:-}" ] && [ "$nvshmem" = "absent" ]; then
    run "$py" -m pip install "nvidia-nvshmem-cu13>=3.8"
    nvshmem=headers
  fi
  if [ -n "${DOCA_HOME:-}" ] || [ "$nvshmem" = "headers" ]; then
    build_preset doca
  else
    echo "== doca transport: skipped (installed nvidia-nvshmem-cu13 ${nvshmem#no-headers } has"
    echo "   no DOCA GPUNetIO headers and stays as it is; set DOCA_HOME to build the doca preset)"
  fi
  # The nixl transport (preset nixl): UCX's device headers from libucx-cu13 and the NIXL
  # runtime check against nixl-cu13, both test extras; tests/test_nixl_build.py loads it.
  build_preset nixl

  # 5. The nvshmem transport's build (preset nvshmem): NVSHMEM's headers, libnvshmem_device.a
  # and libnvshmem_host.so.3 from NVSHMEM_HOME or the installed nvidia-nvshmem-cu13 (whatever
  # version is there, installed by step 4 or pinned by torch: never changed here);
  # tests/test_nvshmem_build.py runs it without a GPU. Skipped when neither is usable.
  nvshmem_lib=$("$py" - <<'PY'
import os
try:
    import nvidia.nvshmem as wheel
except ImportError:
    print("absent")
    raise SystemExit
root = list(wheel.__path__)[0]
need = ("include/nvshmem.h", "include/non_abi/nvshmem_version.h", "lib/libnvshmem_device.a",
        "lib/libnvshmem_host.so.3")
missing = [p for p in need if not os.path.isfile(os.path.join(root, p))]
print("usable" if not missing else "incomplete " + ",".join(missing))
PY
)
  if [ -n "${NVSHMEM_HOME:-}" ] || [ "$nvshmem_lib" = "usable" ]; then
    build_preset nvshmem
  else
    echo "== nvshmem transport: skipped (nvidia-nvshmem-cu13: $nvshmem_lib; set NVSHMEM_HOME"
    echo "   or install nvidia-nvshmem-cu13 to build the nvshmem preset)"
  fi
fi
# pyenv only finds new console scripts (hybrid-ep) after a rehash.
if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
command -v hybrid-ep >/dev/null 2>&1 ||
  echo "== note: hybrid-ep is not on PATH here; 'python -m hybrid_ep' runs the same"
echo "== setup done"
