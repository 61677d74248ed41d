#!/usr/bin/env bash
# Why one 32-node registry run is slow and the next fast: RUNS (default 6) runs of the
# bench/registry.sh load on NODES (default 32) local `ulnet node`s, each printing the
# rate and latency beside the registry's position 9 s into the 10 s load (`ulnet registry
# status`), so that positions per second and updates per position can be told apart.
# Run under `flock /work/bench.lock`. ULNET=<binary> selects the build.
set -euo pipefail
cd "$(dirname "$0")/.."
ULNET=${ULNET:-target/release/ulnet}
NODES=${NODES:-32}
RUNS=${RUNS:-6}
W=${REGISTRY_PROBE_DIR:-/var/tmp/ulnet-registry-probe}   # on disk: fsync must mean it
for r in $(seq "$RUNS"); do
  rm -rf "$W" && mkdir -p "$W"
  pids=()
  seeds=""
  for i in $(seq 0 $((NODES - 1))); do
    "$ULNET" node --name "n$i" --listen "127.0.0.1:$((25000 + i))" ${seeds:+--seeds "$seeds"} \
      --data-dir "$W/n$i" >"$W/n$i.log" 2>&1 &
    pids+=($!)
    seeds=${seeds:-127.0.0.1:25000}
  done
  addrs=$(seq -s, 25000 $((25000 + NODES - 1)) | sed 's/\([0-9]*\)/127.0.0.1:\1/g')
  "$ULNET" registry load --connect "$addrs" --clients 16 --value-bytes 64 --seconds 10 \
    --wait-members "$NODES" --json >"$W/load.json" 2>/dev/null &
  load=$!
  sleep 9
  status=$("$ULNET" registry status --connect 127.0.0.1:25005 2>/dev/null | grep -o 'applied [0-9]*' || true)
  wait "$load"
  echo "run $r: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"{d['updates_per_s']:.0f} updates/s, p50 {d['p50_ms']:.2f} ms, p99 {d['p99_ms']:.2f} ms\")" "$W/load.json"); at 9 s: ${status:-no status}"
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
done
rm -rf "$W"
