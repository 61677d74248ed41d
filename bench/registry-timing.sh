#!/usr/bin/env bash
# Where a 32-node registry position's time goes: RUNS (default 4) runs of the
# bench/registry.sh load on NODES (default 32) local `ulnet node`s with the machine's own
# `gup_timing` histograms logged every 2 s (ULNET_LOG=gup_timing=info). For each run: the
# rate, which node locked and whether it hosts a client (client c uses node c mod N), the
# locker's histograms (grant → commit, → first acknowledgement, commit → next grant, the
# senders' return, the grant hold) summed over the measured 10 s, and every member's entry
# arrival → acknowledgement. Run under `flock /work/bench.lock`. ULNET=<binary>.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib/registry-nodes.sh
ULNET=${ULNET:-target/release/ulnet}
NODES=${NODES:-32}
RUNS=${RUNS:-4}
CLIENTS=${CLIENTS:-16}
W=${REGISTRY_TIMING_DIR:-/var/tmp/ulnet-registry-timing}   # on disk: fsync must mean it
KEEP=${KEEP:-}   # a directory to copy each run's node logs to
for r in $(seq "$RUNS"); do
  rm -rf "$W" && mkdir -p "$W"
  pids=()
  NODE_ENV="ULNET_LOG=gup_timing=info" start_registry_nodes "$ULNET" "$NODES" 26000 "$W"
  "$ULNET" registry load --connect "$registry_addrs" --clients "$CLIENTS" --value-bytes 64 --seconds 10 \
    --wait-members "$NODES" --json >"$W/load.json" 2>/dev/null
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  echo "run $r: $(load_summary "$W/load.json")"
  python3 bench/registry-timing.py "$W" "$NODES" "$CLIENTS"
  if [ -n "$KEEP" ]; then mkdir -p "$KEEP/run$r" && cp "$W"/*.log "$W/load.json" "$KEEP/run$r/"; fi
done
rm -rf "$W"
