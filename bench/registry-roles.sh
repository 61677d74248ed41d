#!/usr/bin/env bash
# Where the work goes at 32 nodes, by role: CPU share and voluntary/involuntary context
# switches per second of each node's control thread (the one that runs GUP) while 16
# closed-loop clients (64-byte values) load the registry for 5 s, averaged over the locker,
# the senders (nodes n0..n15, which the load's clients use) and the other members. Also
# prints the same for the idle cluster first (membership and control threads, 5 s).
# Usage: flock /work/bench.lock bench/registry-roles.sh target/release/ulnet
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=$1; n=32; WORK=/var/tmp/ulnet-registry-bench-roles; SECS=5
rm -rf $WORK && mkdir -p $WORK
. bench/lib/registry-nodes.sh
make_cluster_secret "$WORK"
pids=(); seeds=""
cleanup() { for p in "${pids[@]:-}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
for i in $(seq 0 $((n - 1))); do
  "$BIN" node --name "n$i" --listen "127.0.0.1:$((28000 + i))" ${seeds:+--seeds "$seeds"} --data-dir "$WORK/n$i" --secret-file "$WORK/secret" >"$WORK/n$i.log" 2>&1 &
  pids+=($!); seeds=${seeds:-127.0.0.1:28000}
done
addrs=$(seq -s, 28000 $((28000 + n - 1)) | sed 's/\([0-9]*\)/127.0.0.1:\1/g')
# Per thread of the given name: node index, CPU ticks, voluntary and involuntary switches.
snap() {
  i=0
  for p in "${pids[@]}"; do
    for t in /proc/$p/task/*; do
      [ "$(cat $t/comm)" = "$1" ] || continue
      s=($(cut -d')' -f2 $t/stat))
      echo "$i $((${s[11]} + ${s[12]})) $(grep -E '^(non)?voluntary_ctxt' $t/status | awk '{print $2}' | tr '\n' ' ')"
    done
    i=$((i + 1))
  done
}
# Per role: CPU % of one thread, voluntary and involuntary switches per second.
by_role() {
  paste "$1" "$2" | awk -v L="$3" -v S=$SECS '{
    cpu = ($6 - $2) / S; vol = ($7 - $3) / S; inv = ($8 - $4) / S
    role = ($1 == L) ? "locker" : ($1 < 16 ? "sender" : "other")
    c[role]++; tc[role] += cpu; tv[role] += vol; ti[role] += inv
  } END { for (r in c) printf "  %-7s n=%2d  cpu %% %5.1f  voluntary/s %6.0f  involuntary/s %6.0f\n", r, c[r], tc[r]/c[r], tv[r]/c[r], ti[r]/c[r] }'
}
"$BIN" registry load --connect "$addrs" --clients 16 --value-bytes 64 --seconds 2 --wait-members $n --json >/dev/null 2>&1
locker=""
for i in $(seq 0 $((n - 1))); do
  if "$BIN" registry status --connect 127.0.0.1:$((28000 + i)) --json 2>/dev/null | grep -q '"locker":true'; then locker=$i; fi
done
sleep 1
for thread in membership control; do snap $thread >"$WORK/idle-a-$thread"; done
sleep $SECS
for thread in membership control; do snap $thread >"$WORK/idle-b-$thread"; done
echo "idle, locker n$locker:"
for thread in membership control; do echo " $thread thread:"; by_role "$WORK/idle-a-$thread" "$WORK/idle-b-$thread" "$locker"; done
snap control >"$WORK/a"
r=$("$BIN" registry load --connect "$addrs" --clients 16 --value-bytes 64 --seconds $SECS --warmup 0 --json 2>/dev/null)
snap control >"$WORK/b"
echo "loaded: $r"
echo " control thread:"
by_role "$WORK/a" "$WORK/b" "$locker"
