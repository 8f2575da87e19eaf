#!/usr/bin/env bash
# The multi-domain benchmark on several transport builds in one run, one after the other:
#
#   bash tools/gpu_compare_transports.sh OUT_DIR TRANSPORT... [-- BENCH_ARGS...]
#
# For each TRANSPORT (p2p, nixl, ...): rebuild the editable install with
# HYBRID_EP_TRANSPORT=TRANSPORT, then `hybrid-ep bench --device cuda --nodes N --label
# TRANSPORT` for N in $NODES (default "2 4"), through tools/gpu_run.sh --bench-only (MPS,
# logs, summary) into OUT_DIR/TRANSPORT. BENCH_ARGS go to every bench (default
# "--channels 1"). The build each transport needs (UCX_HOME, NIXL_HOME, ...) comes from the
# environment. Exit status: non-zero when any transport's build or bench failed.
set -uo pipefail

if [ $# -lt 2 ]; then sed -n '2,11p' "$0" >&2; exit 2; fi
OUT="$1"; shift
TRANSPORTS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do TRANSPORTS+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
ARGS=("$@")
[ ${#ARGS[@]} -eq 0 ] && ARGS=(--channels 1)
NODES="${NODES:-2 4}"
PY="${PYTHON:-python3}"

cd "$(dirname "${BASH_SOURCE[0]}")/.."
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
failed=0
for transport in "${TRANSPORTS[@]}"; do
  dir="$OUT/$transport"
  cmd=""
  for n in $NODES; do
    cmd+="${cmd:+ && }$PY -m hybrid_ep bench --device cuda --nodes $n --label $transport"
    cmd+=" --out-dir $dir ${ARGS[*]}"
  done
  echo "== $transport: $cmd"
  HYBRID_EP_TRANSPORT="$transport" BENCH_CMD="$cmd" BENCH_RANKS=8 \
    bash tools/gpu_run.sh "$dir" --bench-only || failed=1
done
exit "$failed"
