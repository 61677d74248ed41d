#!/bin/bash
# One external sort of the 4x10^7 benchmark (2 nodes x 512 MiB) with the disk's counters
# around it: bytes written and bytes discarded (/proc/diskstats fields 10 and 17) while the
# sort ran, after the previous output's removal has settled (BENCHMARKS.md, issue 8).
# usage: bench/sort-disk-counters.sh ULNET_BINARY [DIR (default /var/tmp/sortx, holds ext.in)]
set -eu
u=$1; d=${2:-/var/tmp/sortx}
dev=$(lsblk -no PKNAME "$(findmnt -no SOURCE --target "$d")" 2>/dev/null || true)
dev=${dev:-$(basename "$(findmnt -no SOURCE --target "$d")")}
counters() { awk -v d="$dev" '$3==d {print $10 * 512, $17 * 512}' /proc/diskstats; }
rm -f "$d/ext.out"; sync; sleep 6
flock /work/bench.lock bash -c "cp '$d/ext.in' '$d/ext.cp'; rm '$d/ext.cp'; sync; sleep 6"
read -r w0 x0 < <(counters)
"$u" sort --input "$d/ext.in" --output "$d/ext.out" --nodes 2 --memory 512MiB --temp-dir "$d" --json > "$d/counters.json"
read -r w1 x1 < <(counters)
python3 -c "
import json, sys
r = json.load(open('$d/counters.json'))
print(f'sort {r[\"total_s\"]:.3f} s (pass 1 {r[\"read_distribute_s\"]:.3f}, pass 2 {r[\"sort_s\"]:.3f}); '
      f'written {($w1 - $w0) / 1e9:.2f} GB, discarded {($x1 - $x0) / 1e6:.0f} MB; '
      f'in the output\'s cells {sum(n.get(\"spare_bytes\", 0) for n in r[\"per_node\"]) / 1e9:.2f} GB')"
rm -f "$d/counters.json"
