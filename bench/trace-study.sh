#!/usr/bin/env bash
# The data and figures of docs/trace-study.md: ulnet's own workloads traced and studied.
# Re-runnable with one command; writes docs/trace-study/ (tables as .txt, JSON, SVG figures).
# Workloads: `ulnet demo` (4 processes, full mesh over shm), `ulnet bench rpc-lat` over shm
# and tcp (one call at a time), `ulnet bench rpc-rate` (32 calls in flight).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p ulnet >/dev/null 2>&1
U=./target/release/ulnet
OUT=docs/trace-study
T=$(mktemp -d)
rm -rf "$OUT" && mkdir -p "$OUT"
study() { # NAME FILES...: tables, JSON and SVG figures of a traced workload
  local name=$1; shift
  $U trace analyze "$@" > "$OUT/$name.txt"
  $U trace analyze "$@" --json > "$OUT/$name.json"
  $U trace analyze "$@" --plots "$T/plots-$name" >/dev/null
  mkdir -p "$OUT/$name" && cp "$T/plots-$name"/*.svg "$OUT/$name/"
}
tail_of() { # NAME FILE COLUMN: heavy-tail report and figures of one column
  local name=$1 file=$2 column=$3
  $U trace tail "$file" --column "$column" > "$OUT/$name.txt"
  $U trace tail "$file" --column "$column" --json > "$OUT/$name.json"
  $U trace tail "$file" --column "$column" --plots "$T/plots-$name" >/dev/null
  mkdir -p "$OUT/$name" && cp "$T/plots-$name"/*.svg "$OUT/$name/"
}
ULNET_TRACE="$T/demo-%n.ultrace" $U demo --messages 5000 > "$OUT/demo-run.txt" 2>&1
study demo "$T"/demo-*.ultrace
$U bench rpc-lat --transport shm --iters 100000 --trace "$T/lat-shm.ultrace" > "$OUT/rpc-lat-shm-run.txt" 2>&1
study rpc-lat-shm "$T/lat-shm.ultrace" "$T/lat-shm.ultrace.peer"
$U bench rpc-lat --transport tcp --iters 50000 --trace "$T/lat-tcp.ultrace" > "$OUT/rpc-lat-tcp-run.txt" 2>&1
study rpc-lat-tcp "$T/lat-tcp.ultrace" "$T/lat-tcp.ultrace.peer"
$U bench rpc-rate --transport shm --iters 500000 --trace "$T/rate.ultrace" > "$OUT/rpc-rate-run.txt" 2>&1
study rpc-rate "$T/rate.ultrace" "$T/rate.ultrace.peer"
tail_of tail-rpc-lat-rtt "$T/lat-shm.ultrace" rtt_ns
tail_of tail-rpc-lat-tcp-rtt "$T/lat-tcp.ultrace" rtt_ns
tail_of tail-rpc-rate-interarrival "$T/rate.ultrace" interarrival_ns
tail_of tail-demo-sizes "$T/demo-0.ultrace" size
tail_of tail-demo-interarrival "$T/demo-0.ultrace" interarrival_ns
rm -rf "$T"
echo "wrote $OUT"
