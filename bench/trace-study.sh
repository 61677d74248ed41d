#!/usr/bin/env bash
# The data and figures of docs/trace-study.md: ulnet's own workloads traced and studied.
# Re-runnable with one command; writes docs/trace-study/ (tables as .txt, JSON, SVG figures).
# Workloads: `ulnet demo` (4 processes, full mesh over shm), `ulnet bench rpc-lat` over shm
# and tcp (one call at a time), `ulnet bench rpc-rate` (32 calls in flight), `ulnet sort`
# (4 nodes over shm, SORT_RECORDS records of 100 B), and `ulnet node` membership (8 nodes,
# local profile, MEMBER_SECONDS seconds, one node killed half-way).
# WORKLOADS (default "demo rpc sort member") picks a subset; only its outputs are replaced.
# The benchmark workloads run under `flock /work/bench.lock` (LOCK; empty: no lock).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p ulnet >/dev/null 2>&1
U=./target/release/ulnet
OUT=docs/trace-study
T=$(mktemp -d)
mkdir -p "$OUT"
WORKLOADS=${WORKLOADS:-demo rpc sort member}
LOCK=${LOCK-/work/bench.lock}
locked() { if [ -n "$LOCK" ]; then flock "$LOCK" "$@"; else "$@"; fi; }
want() { [[ " $WORKLOADS " == *" $1 "* ]]; }
study() { # NAME FILES...: tables, JSON and SVG figures of a traced workload
  local name=$1; shift
  $U trace analyze "$@" > "$OUT/$name.txt"
  $U trace analyze "$@" --json > "$OUT/$name.json"
  $U trace analyze "$@" --plots "$T/plots-$name" >/dev/null
  rm -rf "${OUT:?}/$name" && mkdir -p "$OUT/$name" && cp "$T/plots-$name"/*.svg "$OUT/$name/"
}
tail_of() { # NAME FILE COLUMN [OPTIONS]: heavy-tail report and figures of one column
  local name=$1 file=$2 column=$3; shift 3
  $U trace tail "$file" --column "$column" "$@" > "$OUT/$name.txt"
  $U trace tail "$file" --column "$column" "$@" --json > "$OUT/$name.json"
  $U trace tail "$file" --column "$column" "$@" --plots "$T/plots-$name" >/dev/null
  rm -rf "${OUT:?}/$name" && mkdir -p "$OUT/$name" && cp "$T/plots-$name"/*.svg "$OUT/$name/"
}
if want demo; then
  ULNET_TRACE="$T/demo-%n.ultrace" $U demo --messages 5000 > "$OUT/demo-run.txt" 2>&1
  study demo "$T"/demo-*.ultrace
  tail_of tail-demo-sizes "$T/demo-0.ultrace" size
  tail_of tail-demo-interarrival "$T/demo-0.ultrace" interarrival_ns
fi
if want rpc; then
  locked $U bench rpc-lat --transport shm --iters 100000 --trace "$T/lat-shm.ultrace" > "$OUT/rpc-lat-shm-run.txt" 2>&1
  study rpc-lat-shm "$T/lat-shm.ultrace" "$T/lat-shm.ultrace.peer"
  locked $U bench rpc-lat --transport tcp --iters 50000 --trace "$T/lat-tcp.ultrace" > "$OUT/rpc-lat-tcp-run.txt" 2>&1
  study rpc-lat-tcp "$T/lat-tcp.ultrace" "$T/lat-tcp.ultrace.peer"
  locked $U bench rpc-rate --transport shm --iters 500000 --trace "$T/rate.ultrace" > "$OUT/rpc-rate-run.txt" 2>&1
  study rpc-rate "$T/rate.ultrace" "$T/rate.ultrace.peer"
  tail_of tail-rpc-lat-rtt "$T/lat-shm.ultrace" rtt_ns
  tail_of tail-rpc-lat-tcp-rtt "$T/lat-tcp.ultrace" rtt_ns
  tail_of tail-rpc-rate-interarrival "$T/rate.ultrace" interarrival_ns
fi
if want sort; then
  # Each node names itself by its pid in its trace (ULNET_NODE_ID is not set per rank).
  $U gensort "${SORT_RECORDS:-400000}" "$T/sort-in.dat" >/dev/null
  ULNET_TRACE="$T/sort-%n.ultrace" ULNET_TRACE_SAMPLE=1 locked $U sort --input "$T/sort-in.dat" --output "$T/sort-out.dat" --nodes 4 \
    > "$OUT/sort-run.txt" 2>&1
  $U valsort "$T/sort-out.dat" >> "$OUT/sort-run.txt" 2>&1
  study sort "$T"/sort-*.ultrace
  first=$(ls "$T"/sort-*.ultrace | head -1)
  tail_of tail-sort-sizes "$first" size
fi
if want member; then
  # Membership datagrams name nodes by their UDP port: each node runs with ULNET_NODE_ID
  # equal to its port so the traces join up. Nodes are killed (no clean stop), so their
  # files lack the end block: --partial reads their intact blocks. Every record is timed
  # (ULNET_TRACE_SAMPLE=1): at 15 datagrams/s the clock reads cost nothing, and the default
  # 1 ms ticker would make most inter-arrival times within a burst zero.
  : > "$OUT/member-run.txt"
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$T/secret")
  base=$((40000 + RANDOM % 20000)); pids=()
  for i in $(seq 0 7); do
    port=$((base + i)); seeds=()
    [ "$i" -gt 0 ] && seeds=(--seeds "127.0.0.1:$base")
    ULNET_NODE_ID=$port ULNET_TRACE="$T/member-%n.ultrace" ULNET_TRACE_SAMPLE=1 \
      $U node --name "m$i" --listen "127.0.0.1:$port" --secret-file "$T/secret" "${seeds[@]}" 2>>"$OUT/member-run.txt" &
    pids+=($!)
  done
  half=$(( ${MEMBER_SECONDS:-30} / 2 ))
  sleep "$half"; kill "${pids[7]}"; echo "killed m7 (port $((base + 7))) after ${half} s" >> "$OUT/member-run.txt"
  sleep "$half"; kill "${pids[@]:0:7}"; wait || true
  $U trace analyze --partial "$T"/member-*.ultrace > "$OUT/member.txt" 2>>"$OUT/member-run.txt"
  $U trace analyze --partial "$T"/member-*.ultrace --json > "$OUT/member.json" 2>/dev/null
  $U trace analyze --partial "$T"/member-*.ultrace --plots "$T/plots-member" >/dev/null 2>&1
  rm -rf "${OUT:?}/member" && mkdir -p "$OUT/member" && cp "$T/plots-member"/*.svg "$OUT/member/"
  tail_of tail-member-interarrival "$T/member-$base.ultrace" interarrival_ns --partial
fi
rm -rf "$T"
echo "wrote $OUT"
