#!/usr/bin/env bash
# Why one 32-node registry run is slow and the next fast: RUNS (default 6) runs of the
# bench/registry.sh load on NODES (default 32) local `ulnet node`s, each printing the
# rate and latency beside the registry's position 9 s into the 10 s load (`ulnet registry
# status`), so that positions per second and updates per position can be told apart.
# Run under `flock /work/bench.lock`. ULNET=<binary> selects the build.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib/registry-nodes.sh
ULNET=${ULNET:-target/release/ulnet}
NODES=${NODES:-32}
RUNS=${RUNS:-6}
W=${REGISTRY_PROBE_DIR:-/var/tmp/ulnet-registry-probe}   # on disk: fsync must mean it
for r in $(seq "$RUNS"); do
  rm -rf "$W" && mkdir -p "$W"
  pids=()
  start_registry_nodes "$ULNET" "$NODES" 25000 "$W"
  "$ULNET" registry load --connect "$registry_addrs" --clients 16 --value-bytes 64 --seconds 10 \
    --wait-members "$NODES" --json >"$W/load.json" 2>/dev/null &
  load=$!
  sleep 9
  status=$("$ULNET" registry status --connect 127.0.0.1:25005 2>/dev/null | grep -o 'applied [0-9]*' || true)
  wait "$load"
  echo "run $r: $(load_summary "$W/load.json"); at 9 s: ${status:-no status}"
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
done
rm -rf "$W"
