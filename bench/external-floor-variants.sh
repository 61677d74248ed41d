#!/usr/bin/env bash
# The external sort's I/O floor (bench/external-floor.c) in each of its variants, beside `cp`
# of the same input, ROUNDS times, `sync` before every command (BENCHMARKS.md, issue 8).
#   usage: bench/external-floor-variants.sh INPUT SCRATCH_DIR [ROUNDS] [RESIDENT_MIB]
# Takes /work/bench.lock for each round. Prints one line per run: the label, the wall time
# and the floor's JSON.
set -euo pipefail
input=$1 dir=$2 rounds=${3:-4} resident=${4:-668}
floor=$(mktemp -d)/external-floor
gcc -O2 -pthread -o "$floor" "$(dirname "$0")/external-floor.c"
mkdir -p "$dir"
variants=(
  "direct|"
  "temp direct|TEMP_DIRECT=1"
  "budget 2000 + punch|DIRTY_BUDGET_MIB=2000 PUNCH=1"
  "temp direct + budget 2400|TEMP_DIRECT=1 DIRTY_BUDGET_MIB=2400"
  "split direct|OUTPUT_SPLIT=1"
  "split buffered|OUTPUT_SPLIT=1 DIRTY_BUDGET_MIB=1000000"
)
timed() {
  local label=$1 s e
  shift
  sync
  s=$(date +%s.%N)
  "$@" >"$dir/last.json"
  e=$(date +%s.%N)
  printf '%-28s %6.3f %s\n' "$label" "$(awk "BEGIN { print $e - $s }")" "$(cat "$dir/last.json")"
  rm -f "$dir/out" "$dir"/out.* "$dir/copy"
}
for ((r = 1; r <= rounds; r++)); do
  echo "== round $r"
  flock /work/bench.lock bash -c "$(declare -f timed); dir=$dir
    timed cp cp $input $dir/copy
    $(for v in "${variants[@]}"; do
        printf 'timed %q env %s %q %q %q %q %q\n' "${v%%|*}" "${v#*|}" "$floor" "$input" "$dir" "$dir/out" "$resident"
      done)"
done
