#!/usr/bin/env bash
# Side-by-side GPU benchmark of several source trees in one session: each tree is built with
# CMake (the product with the p2p preset, and the benchmark's extension) next to the others and
# run from its own folder (PYTHONPATH), round after round, interleaved, under one MPS daemon, so
# drift between runs hits every tree alike.
#
#   AB_TREES="base=.gpu-runs/base head=." AB_BENCH="--nodes 2 --channels 1 --iters 10 --warmup 2" \
#     bash tools/gpu_ab.sh OUT_DIR [--rounds N] [--dry-run]
#
# AB_TREES: label=folder pairs (relative to the repository root or absolute) (a folder holds a source tree, e.g. `git archive REV | tar x`);
# label=folder@VAR=value,... also sets those variables for that label's runs, so that settings
# of one tree interleave like trees (a folder named by several labels is built once).
# AB_BENCH: the arguments of `python3 -m hybrid_ep bench --device cuda` (default: the
# multi-domain bench at 2 domains). AB_ENV (optional): VAR=value,... set for every bench run.
# AB_ARCH: CUDA architectures of the builds (default 90a). Prints one line per run and writes
# OUT_DIR/ab.md, the median per tree and operation of the API us (and, one domain, the kernel
# us); a run's tables and logs go to OUT_DIR/<label>-r<round>/.
set -uo pipefail

usage() { sed -n '2,15p' "$0"; }
OUT="" ROUNDS=2 DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift ;;
    --dry-run) DRY=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "gpu_ab.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) OUT="$1" ;;
  esac
  shift
done
if [ -z "$OUT" ] || [ -z "${AB_TREES:-}" ]; then usage >&2; exit 2; fi
case "$ROUNDS" in '' | *[!0-9]*) echo "gpu_ab.sh: --rounds must be a count" >&2; exit 2 ;; esac
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH="${AB_BENCH:---nodes 2 --channels 1 --iters 10 --warmup 2}"
IFS=, read -ra EXTRA <<< "${AB_ENV:-}"
run() { if [ "$DRY" = 1 ]; then echo "+ $*"; else "$@"; fi; }

declare -A FOLDER TREE_ENV
LABELS=()
for pair in $AB_TREES; do
  label="${pair%%=*}" folder="${pair#*=}"
  if [ "$label" = "$pair" ] || [ -z "$label" ]; then
    echo "gpu_ab.sh: AB_TREES entry '$pair' is not label=folder[@VAR=value,...]" >&2; exit 2
  fi
  TREE_ENV[$label]=""
  if [ "${folder#*@}" != "$folder" ]; then
    TREE_ENV[$label]="${folder#*@}" folder="${folder%%@*}"
    for setting in ${TREE_ENV[$label]//,/ }; do
      case "$setting" in
        [A-Za-z_]*=*) ;;
        *) echo "gpu_ab.sh: $label: '$setting' is not VAR=value" >&2; exit 2 ;;
      esac
    done
  fi
  [ -d "$ROOT/$folder" ] && folder="$ROOT/$folder"
  if [ ! -f "$folder/CMakePresets.json" ]; then
    echo "gpu_ab.sh: $label: '$folder' holds no source tree" >&2; exit 2
  fi
  FOLDER[$label]="$(cd "$folder" && pwd)"
  LABELS+=("$label")
done

if [ "$DRY" = 0 ]; then
  # shellcheck source=tools/mps.sh
  source "$ROOT/tools/mps.sh"
  start_mps
  trap stop_mps EXIT
  # An editable install would take precedence over the trees' PYTHONPATH.
  python3 -m pip uninstall -y hybrid-ep hybrid-ep-bench >/dev/null 2>&1
fi

PYBIND11_DIR="$(python3 -m pybind11 --cmakedir 2>/dev/null)"
build() {  # label
  local dir="${FOLDER[$1]}"
  run cmake --preset p2p -DCMAKE_CUDA_ARCHITECTURES="${AB_ARCH:-90a}" \
    -Dpybind11_DIR="$PYBIND11_DIR" > "$OUT/cmake-$1.log" 2>&1 &&
    run ninja -C "$dir/build/p2p" > "$OUT/ninja-$1.log" 2>&1 &&
    run cp "$dir"/build/p2p/_C*.so "$dir/python/hybrid_ep/" &&
    # The benchmark's own extension (copy ceiling, start gate): the profiler pass needs it.
    run cmake -S "$dir/benchmarks" -B "$dir/build/bench" -G Ninja \
      -DCMAKE_CUDA_ARCHITECTURES="${AB_ARCH:-90a}" -Dpybind11_DIR="$PYBIND11_DIR" \
      >> "$OUT/cmake-$1.log" 2>&1 &&
    run ninja -C "$dir/build/bench" >> "$OUT/ninja-$1.log" 2>&1 &&
    run cp "$dir"/build/bench/_C*.so "$dir/benchmarks/hybrid_ep_bench/" &&
    echo "built $1 at $SECONDS s" ||
    { echo "BUILD FAILED: $1 (logs in $OUT)"; return 1; }
}
declare -A BUILT  # folder -> the label whose logs its build writes
for label in "${LABELS[@]}"; do
  [ -n "${BUILT[${FOLDER[$label]}]:-}" ] && continue
  BUILT[${FOLDER[$label]}]="$label"
  (cd "${FOLDER[$label]}" && build "$label") &
done
wait
for label in "${LABELS[@]}"; do
  ls "${FOLDER[$label]}"/python/hybrid_ep/_C*.so >/dev/null 2>&1 || [ "$DRY" = 1 ] || exit 1
done

for round in $(seq 1 "$ROUNDS"); do
  for label in "${LABELS[@]}"; do
    dir="${FOLDER[$label]}" tag="$label-r$round"
    IFS=, read -ra SETTINGS <<< "${TREE_ENV[$label]}"
    # shellcheck disable=SC2086  # AB_BENCH is a list of arguments
    (cd "$dir" && run env "${EXTRA[@]}" "${SETTINGS[@]}" PYTHONPATH="$dir/python:$dir/benchmarks" \
      timeout 300 python3 -m hybrid_ep bench --device cuda $BENCH --out-dir "$OUT/$tag" \
      > "$OUT/$tag.log" 2>&1)
    [ "$DRY" = 1 ] && continue
    if ls "$OUT/$tag"/bench-*.md >/dev/null 2>&1; then
      echo "$tag done at $SECONDS s"
    else
      echo "$tag FAILED at $SECONDS s: $(tail -1 "$OUT/$tag.log")"
    fi
  done
done
[ "$DRY" = 1 ] && exit 0

# Median API us per tree and operation over the rounds.
python3 - "$OUT" "$ROUNDS" "$AB_TREES" "$BENCH" "${AB_ENV:-}" "${LABELS[@]}" > "$OUT/ab.md" <<'PY'
import glob, statistics, sys
out, rounds, trees, bench, extra, labels = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
print(f"# Side by side: {trees}, {rounds} rounds\n\nbench: {bench}" + (f"; env: {extra}" if extra else "") + "\n")
print("| tree | operation | API us (median) | runs |\n|---|---|---|---|")
for label in labels:
    times = {}
    for path in sorted(glob.glob(f"{out}/{label}-r*/bench-*.md")):
        for line in open(path):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 3 or not cells[0].isdigit():
                continue
            if len(cells) >= 13:  # one domain: ranks, SMs, op, rows, copies, kernel us, API us
                rows = [(f"{cells[0]} x {cells[1]} {cells[2]} (kernel)", cells[5]),
                        (f"{cells[0]} x {cells[1]} {cells[2]} (API)", cells[6])]
            elif len(cells) >= 10:  # several domains under the wire: a form column first
                rows = [(f"{cells[1]}: {cells[2]}", cells[3])]
            else:  # several domains: channels, op, API us
                rows = [(cells[1], cells[2])]
            for op, value in rows:
                try:
                    times.setdefault(op, []).append(float(value))
                except ValueError:
                    pass
    for op, values in times.items():
        print(f"| {label} | {op} | {statistics.median(values):.0f} | {len(values)} |")
PY
cat "$OUT/ab.md"
