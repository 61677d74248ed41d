#!/usr/bin/env bash
# The 10^7-record correctness matrix of issue 8 (too long for CI on 2 cores): uniform and
# skewed keys, binary and ASCII records, 1, 2 and 4 nodes, in memory and external
# (--memory of an eighth of the input per node, at least 16 MiB, so that every node spills
# at every size); every output checked with `ulnet valsort` (order, count) and its checksum
# compared with gensort's checksum of the input, and each run's mode (from its report) with
# the one asked for. External mode runs twice: as it comes, and with no page-cache share for
# the group files (--debug-files-budget 0), so that every group byte its cells in the
# output can hold goes there (the 'external, cells' rows). Writes
# bench/results/sort-matrix.md (MATRIX_OUT to change; RECORDS, default 10^7, sets the input
# size); SORT_BENCH_DIR (default target/sort-bench) holds the files.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p ulnet >/dev/null 2>&1
U=target/release/ulnet
D=${SORT_BENCH_DIR:-target/sort-bench}
N=${RECORDS:-10000000}
mkdir -p "$D"
OUT=${MATRIX_OUT:-bench/results/sort-matrix.md}
EXT_MEMORY=$(( N * 100 / 8 > 16 << 20 ? N * 100 / 8 : 16 << 20 ))
{
  echo "# ulnet sort: the $N-record matrix"
  echo
  echo "Run: \`bench/sort-matrix.sh\` on $(date -u +%Y-%m-%d) ($N records per input; external mode with --memory $EXT_MEMORY bytes per node; load average $(cut -d' ' -f1-3 /proc/loadavg))."
  echo
  echo "| keys | format | nodes | mode | records | checksum in | checksum out | verdict | seconds |"
  echo "|---|---|---|---|---|---|---|---|---|"
} > "$OUT"
fail=0
for keys in uniform skewed; do
  for format in binary ascii; do
    flags=()
    [ "$keys" = skewed ] && flags+=(-s)
    [ "$format" = ascii ] && flags+=(-a)
    in="$D/matrix.in"
    sum_in=$($U gensort -c "${flags[@]}" "$N" "$in" 2>&1)
    for nodes in 1 2 4; do
      for mode in memory external external-cells; do
        extra=()
        [ "$mode" != memory ] && extra=(--memory "$EXT_MEMORY" --temp-dir "$D")
        [ "$mode" = external-cells ] && extra+=(--debug-files-budget 0)
        out="$D/matrix.out"
        report=$($U sort --input "$in" --output "$out" --nodes "$nodes" --json "${extra[@]}")
        secs=$(echo "$report" | python3 -c 'import sys,json; r=json.load(sys.stdin); print("%.2f" % r["total_s"], r["mode"] + ("-cells" if sum(n.get("spare_bytes", 0) for n in r["per_node"]) else ""))')
        v=$($U valsort "$out" 2>&1 || true)
        sum_out=$(echo "$v" | awk '/^Checksum:/{print $2}')
        recs=$(echo "$v" | awk '/^Records:/{print $2}')
        ran=${secs#* }
        # With its default share a node may use the cells too (on a machine with little memory).
        [ "$mode" = external ] && [ "$ran" = external-cells ] && ran=external
        if echo "$v" | grep -q SUCCESS && [ "$sum_out" = "$sum_in" ] && [ "$recs" = "$N" ] && [ "$ran" = "$mode" ]; then
          ok=SUCCESS
        else
          ok=FAIL
          fail=1
        fi
        echo "| $keys | $format | $nodes | ${ran/-cells/, cells} | $recs | $sum_in | $sum_out | $ok | ${secs% *} |" | tee -a "$OUT"
        rm -f "$out"
      done
    done
    rm -f "$in"
  done
done
rmdir "$D" 2>/dev/null || true
echo "wrote $OUT"
exit $fail
