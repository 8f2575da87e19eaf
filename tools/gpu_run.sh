#!/usr/bin/env bash
# One GPU run: build, GPU tests, benchmark. Logs and a summary go to OUT_DIR.
#
#   bash tools/gpu_run.sh OUT_DIR [--skip-build] [--tests-only | --bench-only | --build-only]
#
# OUT_DIR/env.txt        nvidia-smi, GPU count, versions, build info, MPS state
# OUT_DIR/build.log      pip install --no-build-isolation --no-deps -e . ./benchmarks
# OUT_DIR/gpu-tests.log  pytest tests/gpu -m gpu (junit: OUT_DIR/gpu-tests.xml)
# OUT_DIR/bench.log      the benchmark ($BENCH_CMD)
# OUT_DIR/summary.md     step status and times, test counts, bench exit status
#
# Environment: PYTHON (default python3); BENCH_CMD (default
# "$PYTHON -m hybrid_ep bench --device cuda --out-dir OUT_DIR"); TESTS_TIMEOUT_S and
# BENCH_TIMEOUT_S (default 480 each); PYTEST_ARGS (extra pytest arguments, e.g. "-k W8");
# BENCH_RANKS (ranks the benchmark puts on the GPUs, for the MPS decision with --bench-only;
# default 4). A device call is capped at 600 s: build in one call (--build-only), then run
# tests and bench with --skip-build.
#
# Several ranks on one GPU need MPS: started here when ranks will share a GPU, stopped at exit.
# The tests keep going to the benchmark when they fail; the exit status is non-zero when any
# step failed. GPU clocks, power and compute mode are never touched; the GPU is never reset.
set -euo pipefail

usage() { sed -n '2,21p' "$0"; }

OUT=""
DO_BUILD=1
DO_TESTS=1
DO_BENCH=1
for arg in "$@"; do
  case "$arg" in
    --skip-build) DO_BUILD=0 ;;
    --tests-only) DO_BENCH=0 ;;
    --bench-only) DO_TESTS=0 ;;
    --build-only) DO_TESTS=0; DO_BENCH=0 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "gpu_run.sh: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
    *)
      if [ -n "$OUT" ]; then echo "gpu_run.sh: one OUT_DIR only ('$OUT', '$arg')" >&2; exit 2; fi
      OUT="$arg"
      ;;
  esac
done
if [ -z "$OUT" ]; then usage >&2; exit 2; fi

cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PY="${PYTHON:-python3}"
TESTS_TIMEOUT_S="${TESTS_TIMEOUT_S:-480}"
BENCH_TIMEOUT_S="${BENCH_TIMEOUT_S:-480}"
BENCH_CMD="${BENCH_CMD:-$PY -m hybrid_ep bench --device cuda --out-dir $OUT}"
PYTEST_ARGS="${PYTEST_ARGS:-}"
BENCH_RANKS="${BENCH_RANKS:-4}"

# -- bookkeeping -----------------------------------------------------------------------------
STEPS=()     # "name|status|seconds|note"
FAILED=0
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
record() {  # name status seconds [note]
  STEPS+=("$1|$2|$3|${4:-}")
  echo "== $1: $2 (${3} s)${4:+ - $4}"
  case "$2" in ok | skipped) ;; *) FAILED=1 ;; esac
}

# -- MPS -------------------------------------------------------------------------------------
# shellcheck source=tools/mps.sh
source tools/mps.sh  # the repository root is the working folder (above)
trap stop_mps EXIT
trap 'exit 130' INT TERM

# -- summary ---------------------------------------------------------------------------------
write_summary() {
  local file="$OUT/summary.md"
  {
    echo "# GPU run $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo
    # The device tool copies the working tree, not always a current .git: the caller's label
    # (HYBRID_EP_COMMIT) wins over what git says here.
    if [ -n "${HYBRID_EP_COMMIT:-}" ]; then
      echo "- commit: $HYBRID_EP_COMMIT (HYBRID_EP_COMMIT; git here: $(git rev-parse --short HEAD 2>/dev/null || echo none))"
    else
      echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(
        [ -n "$(git status --porcelain 2>/dev/null | head -1)" ] && echo ' (+ uncommitted changes)')"
    fi
    echo "- GPUs: ${GPU_COUNT:-?} x ${GPU_NAME:-?}; MPS: $([ "$MPS_USED" = 1 ] && echo on || echo off)"
    echo
    echo "| step | status | seconds | note |"
    echo "|---|---|---|---|"
    local s
    for s in "${STEPS[@]}"; do
      IFS='|' read -r name status secs note <<<"$s"
      echo "| $name | $status | $secs | $note |"
    done
    if [ -f "$OUT/gpu-tests.xml" ]; then
      echo
      "$PY" - "$OUT/gpu-tests.xml" <<'EOF' || echo "(could not parse gpu-tests.xml)"
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
count = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors",
                                                             "skipped")}
passed = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
print(f"GPU tests: {passed} passed, {count['failures']} failed, {count['errors']} errors, "
      f"{count['skipped']} skipped (of {count['tests']})")
bad, not_bitwise = [], []
for case in root.iter("testcase"):
    name = f"{case.get('classname', '')}::{case.get('name', '')}"
    if case.find("failure") is not None or case.find("error") is not None:
        bad.append(name)
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    if props.get("combine_all_bitwise") == "False":
        not_bitwise.append(f"{name} ({props.get('combines_bitwise')}/"
                           f"{props.get('combines_checked')} bitwise, max |diff| "
                           f"{props.get('combine_max_abs_diff')})")
for name in bad:
    print(f"- FAILED {name}")
if not_bitwise:
    print("\nCombine within tolerance but not bitwise equal to the reference:")
    for name in not_bitwise:
        print(f"- {name}")
EOF
    fi
    echo
    echo "Logs: env.txt, build.log, gpu-tests.log, gpu-tests.xml, bench.log (in $OUT)"
  } >"$file"
  echo "== summary: $file"
  cat "$file"
}

# -- environment -----------------------------------------------------------------------------
GPU_COUNT=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
MPS_USED=0
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  echo "commit: ${HYBRID_EP_COMMIT:-unset} (HYBRID_EP_COMMIT); git: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "gpu count (nvidia-smi -L): $GPU_COUNT"
  echo "CUDA_VISIBLE_DEVICES: ${CUDA_VISIBLE_DEVICES:-unset}"
  echo "python: $PY = $(command -v "$PY" || echo missing)"
  "$PY" -c 'import sys; print("python version:", sys.version.replace("\n", " "))' || true
  "$PY" -c 'import torch; print("torch:", torch.__version__, "cuda:", torch.version.cuda,
"devices:", torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>&1 || true
  echo "--- nvcc"; nvcc --version 2>&1 | tail -2 || true
  echo "--- cmake"; cmake --version 2>&1 | head -1 || true
  echo "--- packages"
  "$PY" -m pip list 2>/dev/null | grep -i -E '^(torch|pytest|pybind11|scikit-build-core|numpy|nvidia-n)' || true
  echo "--- environment"
  env | grep -E '^(HYBRID_EP_|NUM_OF_|USE_MNNVL|CUDA_|NCCL_|NVSHMEM_)' | sort || true
  echo "--- nvidia-smi"
  nvidia-smi 2>&1 || echo "nvidia-smi failed"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm,compute_mode \
    --format=csv 2>&1 || true
} >"$OUT/env.txt" 2>&1
echo "== env: $OUT/env.txt ($GPU_COUNT GPU(s): ${GPU_NAME:-unknown})"

# -- build -----------------------------------------------------------------------------------
if [ "$DO_BUILD" = 1 ]; then
  t0=$(now)
  # The benchmark package (benchmarks/, hybrid_ep_bench) too: the bench step runs it.
  echo "== build: $PY -m pip install --no-build-isolation --no-deps -e . ./benchmarks (log: build.log)"
  if "$PY" -m pip install --no-build-isolation --no-deps -e . ./benchmarks >"$OUT/build.log" 2>&1; then
    record build ok "$(elapsed "$t0")"
  else
    record build FAILED "$(elapsed "$t0")" "see build.log"
    echo "---- last lines of $OUT/build.log ----"
    tail -n 60 "$OUT/build.log"
    write_summary
    exit 1
  fi
else
  record build skipped 0 "--skip-build"
fi
{
  echo "--- hybrid_ep.build_info()"
  "$PY" -c 'import json, hybrid_ep; print(json.dumps(hybrid_ep.build_info(), indent=1))' 2>&1 || true
  so=$("$PY" -c 'import hybrid_ep._C as c; print(c.__file__)' 2>/dev/null || true)
  if [ -n "$so" ]; then
    echo "--- $so: NEEDED"
    readelf -d "$so" 2>/dev/null | grep NEEDED || true
  fi
} >>"$OUT/env.txt" 2>&1

# -- MPS when ranks will share a GPU ---------------------------------------------------------
# The GPU tests always put 2, 4 and 8 ranks on GPU 0; the benchmark shares a GPU when it runs
# more ranks than there are GPUs.
if [ "$DO_TESTS" = 1 ] || { [ "$DO_BENCH" = 1 ] && [ "$BENCH_RANKS" -gt "${GPU_COUNT:-0}" ]; }; then
  start_mps
  MPS_USED=$MPS_OWNED
fi
echo "MPS: $([ "$MPS_USED" = 1 ] && echo "on, pipe $CUDA_MPS_PIPE_DIRECTORY" || echo off)" >>"$OUT/env.txt"

# -- GPU tests -------------------------------------------------------------------------------
if [ "$DO_TESTS" = 1 ]; then
  t0=$(now)
  if ! "$PY" -c 'import pytest' >/dev/null 2>&1; then
    if [ -d wheels ]; then
      echo "== pytest missing: installing from wheels/"
      "$PY" -m pip install --no-index --find-links wheels pytest >"$OUT/pytest-install.log" 2>&1 ||
        { echo "pytest install failed:"; tail -n 20 "$OUT/pytest-install.log"; }
    else
      echo "== pytest missing and no wheels/ folder"
    fi
  fi
  echo "== GPU tests (timeout ${TESTS_TIMEOUT_S} s; log: gpu-tests.log)"
  rc=0
  # shellcheck disable=SC2086  # PYTEST_ARGS is a list of words
  timeout --kill-after=20 "$TESTS_TIMEOUT_S" \
    "$PY" -m pytest tests/gpu -m gpu -q -x -rfEs --durations=20 \
    -o junit_family=xunit1 --junitxml "$OUT/gpu-tests.xml" $PYTEST_ARGS >"$OUT/gpu-tests.log" 2>&1 || rc=$?
  tail -n 40 "$OUT/gpu-tests.log"
  note="pytest exit $rc"
  status=ok
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    status=TIMEOUT
    note="killed after ${TESTS_TIMEOUT_S} s"
  elif [ "$rc" != 0 ]; then
    status=FAILED
  elif ! grep -q -E '[0-9]+ passed' "$OUT/gpu-tests.log"; then
    status=FAILED
    note="nothing passed (all skipped?)"
  fi
  record gpu-tests "$status" "$(elapsed "$t0")" "$note"
fi

# -- benchmark -------------------------------------------------------------------------------
if [ "$DO_BENCH" = 1 ]; then
  t0=$(now)
  echo "== bench: $BENCH_CMD (timeout ${BENCH_TIMEOUT_S} s; log: bench.log)"
  rc=0
  timeout --kill-after=20 "$BENCH_TIMEOUT_S" bash -c "$BENCH_CMD" >"$OUT/bench.log" 2>&1 || rc=$?
  tail -n 40 "$OUT/bench.log"
  if [ "$rc" = 0 ]; then
    record bench ok "$(elapsed "$t0")" "exit 0"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    record bench TIMEOUT "$(elapsed "$t0")" "killed after ${BENCH_TIMEOUT_S} s"
  else
    record bench FAILED "$(elapsed "$t0")" "exit $rc"
  fi
fi

stop_mps
write_summary
exit "$FAILED"
