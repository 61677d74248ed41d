#!/bin/bash
# The disk's pace for the external sort's output (BENCHMARKS.md, issue 8): STREAMS `dd`s write
# 4 GB with O_DIRECT, each its own part of one preallocated file, in writes of BS_MIB MiB.
# usage: bench/direct-write-streams.sh BS_MIB STREAMS [DIR (default /var/tmp/sortx)]
set -eu
bs=$1; n=$2; f=${3:-/var/tmp/sortx}/direct-streams.out
rm -f "$f"; fallocate -l 4000000000 "$f"; sync
per=$((4000 / bs / n))
s=$(date +%s.%N)
for i in $(seq 0 $((n - 1))); do
  dd if=/dev/zero of="$f" bs="${bs}M" count=$per seek=$((i * per)) oflag=direct conv=notrunc status=none &
done
wait
e=$(date +%s.%N)
echo "writes of ${bs} MiB, $n streams: $(echo "$e - $s" | bc) s"
rm -f "$f"
