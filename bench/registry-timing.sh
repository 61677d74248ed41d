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
ULNET=${ULNET:-target/release/ulnet}
NODES=${NODES:-32}
RUNS=${RUNS:-4}
CLIENTS=${CLIENTS:-16}
W=${REGISTRY_TIMING_DIR:-/var/tmp/ulnet-registry-timing}   # on disk: fsync must mean it
KEEP=${KEEP:-}   # a directory to copy each run's node logs to
for r in $(seq "$RUNS"); do
  rm -rf "$W" && mkdir -p "$W"
  pids=()
  seeds=""
  for i in $(seq 0 $((NODES - 1))); do
    ULNET_LOG=gup_timing=info "$ULNET" node --name "n$i" --listen "127.0.0.1:$((26000 + i))" ${seeds:+--seeds "$seeds"} \
      --data-dir "$W/n$i" >"$W/n$i.log" 2>&1 &
    pids+=($!)
    seeds=${seeds:-127.0.0.1:26000}
  done
  addrs=$(seq -s, 26000 $((26000 + NODES - 1)) | sed 's/\([0-9]*\)/127.0.0.1:\1/g')
  "$ULNET" registry load --connect "$addrs" --clients "$CLIENTS" --value-bytes 64 --seconds 10 \
    --wait-members "$NODES" --json >"$W/load.json" 2>/dev/null
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  echo "run $r: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"{d['updates_per_s']:.0f} updates/s, p50 {d['p50_ms']:.2f} ms, p99 {d['p99_ms']:.2f} ms\")" "$W/load.json")"
  python3 bench/registry-timing.py "$W" "$NODES" "$CLIENTS"
  if [ -n "$KEEP" ]; then mkdir -p "$KEEP/run$r" && cp "$W"/*.log "$W/load.json" "$KEEP/run$r/"; fi
done
rm -rf "$W"
