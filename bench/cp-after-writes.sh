#!/bin/bash
# Does `cp` pay for the writes before it (BENCHMARKS.md, issue 8)? Each round: the external sort,
# the I/O floor, `cp`, `cp` again, the sort again, each after `rm` of the one before and `sync`.
# Needs /var/tmp/sortx/ext.in (`ulnet gensort 40000000`) and target/external-floor (bench/sort.sh builds it).
d=/var/tmp/sortx; cd "$(dirname "$0")/.."; U=$PWD/target/release/ulnet; F=$PWD/target/external-floor
t() { local s=$(date +%s.%N); "$@" >/dev/null 2>&1; local e=$(date +%s.%N); echo "$e - $s" | bc; }
for r in 1 2 3; do
  rm -f $d/ext.out $d/ext.cp; sync
  a=$(t $U sort --input $d/ext.in --output $d/ext.out --nodes 2 --memory 512MiB --temp-dir $d --json)
  rm -f $d/ext.out; sync
  b=$(t $F $d/ext.in $d $d/ext.out 668)
  rm -f $d/ext.out; sync
  c1=$(t cp $d/ext.in $d/ext.cp); rm -f $d/ext.cp; sync
  c2=$(t cp $d/ext.in $d/ext.cp); rm -f $d/ext.cp; sync
  s2=$(t $U sort --input $d/ext.in --output $d/ext.out --nodes 2 --memory 512MiB --temp-dir $d --json)
  rm -f $d/ext.out; sync
  echo "round $r: sort $a floor $b | cp after them $c1 | cp after cp $c2 | sort after cp $s2"
done
