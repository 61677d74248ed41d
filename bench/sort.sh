#!/usr/bin/env bash
# ulnet sort against GNU sort and cp, side by side in one run (issue 8):
#   Datamation: 10^6 ASCII records, 2 and 4 local nodes, goal <= 0.25 x `LC_ALL=C sort -S 2G`
#   10^7 ASCII records, 2 and 4 local nodes, goal <= 0.25 x GNU sort
#   external: 4 x 10^7 records, 1 GiB of memory in total (2 nodes x 512 MiB), goal <= 3 x `cp`
# Writes bench/results/sort.md (SORT_OUT to write elsewhere). ROUNDS (default 5) and
# SORT_BENCH_DIR (default target/sort-bench; about 12 GB free needed for the external case:
# input, output and the key-range group files) may be set; CASES picks a subset (e.g.
# CASES=datamation). SETTLE_S waits that many seconds after each `sync` (bench/sort.py). Inputs
# are deleted at the end. The external case also times its I/O floor (bench/external-floor.c),
# and runs an untimed `cp` of its input before every timed command (CONDITION=0: not).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p ulnet >/dev/null 2>&1
gcc -O2 -pthread -o target/external-floor bench/external-floor.c
export EXTERNAL_FLOOR=${EXTERNAL_FLOOR:-$PWD/target/external-floor}
OUT=${SORT_OUT:-bench/results/sort.md}
TMP=$(mktemp)
status=0
python3 bench/sort.py --rounds "${ROUNDS:-5}" --dir "${SORT_BENCH_DIR:-target/sort-bench}" \
  --cases "${CASES:-datamation,1e7,external}" --markdown "$TMP" || status=$?
{
  echo "# ulnet sort: side-by-side figures"
  echo
  echo "Run: \`bench/sort.sh\` on $(date -u +%Y-%m-%d), $(nproc) vCPU, $(free -g | awk '/Mem:/{print $2}') GiB,"
  echo "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg) (a shared machine: other work ran meanwhile)."
  echo "Wait after each \`sync\`: ${SETTLE_S:-0} s (SETTLE_S)."
  echo
  cat "$TMP"
} > "$OUT"
rm -f "$TMP"
echo "wrote $OUT"
exit $status
