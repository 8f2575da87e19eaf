#!/usr/bin/env bash
# Runs N copies of a probe at once, as N ranks sharing one GPU (start MPS first, e.g. through
# tools/gpu_run.sh with BENCH_RANKS=N), and prints the sum of the GB/s on each copy's last line.
#
#   bash benchmarks/cuda/processes.sh N PROBE [ARGS...]
#
# Every copy sets up, then waits for PROBE_START_AT (a Unix time a few seconds ahead, the same
# for all) before timing, so that the copies' timed launches overlap. Copies that print
# "together: BYTES bytes, end T" (launches from that instant to T) also get their summed rate
# as all bytes / (last end - start): the per-copy best-of rates may count time a copy ran alone.
# Each copy gets PROBE_RANK (0..N-1) and PROBE_RANKS; with PROBE_IPC=1 also PROBE_IPC_DIR, a
# fresh folder where the copies exchange CUDA IPC handles. Copies that print "gated: BYTES bytes,
# launch S s" (launches started together on the GPU, each timed alone) get their summed rate as
# all bytes / the longest copy's mean launch. With PROBE_TRACE_OUT set, the copies' "TRACE probe"
# lines (PROBE_TRACE=1) are appended to that file, each with its copy's rank.
set -euo pipefail
if [ $# -lt 2 ]; then sed -n '2,15p' "$0" >&2; exit 2; fi
n=$1
shift
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
export PROBE_START_AT
PROBE_START_AT=$(python3 -c "import time; print(time.time() + 3)")
export PROBE_RANKS=$n
if [ "${PROBE_IPC:-0}" = 1 ]; then
  export PROBE_IPC_DIR=$logs/ipc
  mkdir "$PROBE_IPC_DIR"
fi
for i in $(seq "$n"); do PROBE_RANK=$((i - 1)) "$@" >"$logs/$i.txt" 2>&1 & done
wait
if [ -n "${PROBE_TRACE_OUT:-}" ]; then
  for i in $(seq "$n"); do sed -n "s/^TRACE probe /TRACE probe r=$((i - 1)) /p" "$logs/$i.txt"; done >>"$PROBE_TRACE_OUT"
fi
python3 - "$logs" "$n" "$*" "$PROBE_START_AT" <<'PY'
import re, sys
logs, n, args, start = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
rates, moved, ends = [], 0.0, []
gated_bytes, launches = 0.0, []
for i in range(1, n + 1):
    text = open(f"{logs}/{i}.txt").read()
    found = re.findall(r"([\d.]+) GB/s", text.strip().splitlines()[-1] if text.strip() else "")
    rates.append(float(found[0]) if found else float("nan"))
    if not found or "WRONG" in text:
        print(f"copy {i}:", text[-400:])
    for b, e in re.findall(r"together: ([\d.]+) bytes, end ([\d.]+)", text):
        moved += float(b)
        ends.append(float(e))
    for b, s in re.findall(r"gated: ([\d.]+) bytes, launch ([\d.]+) s", text):
        gated_bytes += float(b)
        launches.append(float(s))
print(f"{n} copies of {args}: {sum(rates):.1f} GB/s in all, {min(rates):.0f}-{max(rates):.0f} each")
if len(ends) == n:
    print(f"{n} copies of {args}: together {moved / (max(ends) - start) / 1e9:.1f} GB/s "
          f"(from the common start to the last end, {1e3 * (max(ends) - start):.2f} ms; "
          f"first end {1e3 * (min(ends) - start):.2f} ms)")
if len(launches) == n:
    print(f"{n} copies of {args}: gated {gated_bytes / max(launches) / 1e9:.1f} GB/s "
          f"(launches started together, {1e6 * max(launches):.1f} us the longest copy's mean)")
PY
