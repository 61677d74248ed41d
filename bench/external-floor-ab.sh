#!/bin/bash
# Two variants of the I/O floor (bench/external-floor.c) alternating, each after an untimed
# `cp` of the input, removed (as bench/sort.py conditions the sort); prints each run's JSON
# line, the `cp` time and the megabytes discarded while it ran (BENCHMARKS.md, issue 8).
# usage: bench/external-floor-ab.sh ROUNDS "ENV_A" "ENV_B" [DIR (default /var/tmp/sortx)]
#   e.g. bench/external-floor-ab.sh 3 NO_SPARE=1 SPARE_BUDGET_MIB=2000
set -eu
rounds=$1; a=$2; b=$3; d=${4:-/var/tmp/sortx}
floor=$(mktemp); gcc -O2 -pthread -o "$floor" "$(dirname "$0")/external-floor.c"
dev=$(lsblk -no PKNAME "$(findmnt -no SOURCE --target "$d")" 2>/dev/null || true)
dev=${dev:-$(basename "$(findmnt -no SOURCE --target "$d")")}
mkdir -p "$d/floor-ab"
for r in $(seq 1 "$rounds"); do
  for v in "$a" "$b"; do
    rm -f "$d/ext.out"
    flock /work/bench.lock bash -c "
      t=\$(date +%s.%N); cp '$d/ext.in' '$d/ext.cp'; c=\$(date +%s.%N); rm '$d/ext.cp'
      x0=\$(awk '\$3==\"$dev\" {print \$17}' /proc/diskstats)
      env $v '$floor' '$d/ext.in' '$d/floor-ab' '$d/ext.out' 668
      x1=\$(awk '\$3==\"$dev\" {print \$17}' /proc/diskstats)
      echo \"round $r [$v] cp \$(echo \"\$c - \$t\" | bc) s, discarded \$(( (x1 - x0) / 2048 )) MB\""
  done
done
rm -f "$d/ext.out" "$floor"; rmdir "$d/floor-ab"
