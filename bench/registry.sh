#!/usr/bin/env bash
# Registry figures, side by side in one run: updates/s and p50/p99 put latency with
# 16 concurrent closed-loop clients and 64-byte values, every acknowledged update fsynced on
# a majority, for
#   - etcd: a 3-member cluster from Debian's etcd-server on loopback (installed if missing),
#     driven by bench/peers/etcd-load (etcd's own Go client, gRPC);
#   - ulnet: 3, 8 and 32 local `ulnet node` processes driven by `ulnet registry load`
#     (same load and JSON shape).
# Writes bench/results/registry.jsonl (one JSON object per system and size) and prints a
# table. Re-run with: bench/registry.sh   (SECONDS_PER_RUN=10 CLIENTS=16 VALUE_BYTES=64)
# Only some sizes, without etcd: NODES=32 ETCD=0 bench/registry.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib/registry-nodes.sh
SECS=${SECONDS_PER_RUN:-10}
CLIENTS=${CLIENTS:-16}
VALUE=${VALUE_BYTES:-64}
NODES=${NODES:-3 8 32}   # ulnet cluster sizes measured
ETCD=${ETCD:-1}          # 0: skip the etcd row
WORK=${REGISTRY_BENCH_DIR:-/var/tmp/ulnet-registry-bench}   # on disk, not tmpfs: fsync must mean it
OUT=${OUT:-bench/results/registry.jsonl}
ULNET=${ULNET:-}         # a prebuilt ulnet binary to measure (default: build this checkout)
mkdir -p bench/results
: >"$OUT"

pids=()
cleanup() { for p in "${pids[@]:-}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

if [ "$ETCD" != 0 ]; then
if ! command -v etcd >/dev/null; then
  apt-get install -y etcd-server >/dev/null || { apt-get update >/dev/null && apt-get install -y etcd-server >/dev/null; }
fi
(cd bench/peers/etcd-load && go build -o "$WORK/etcd-load" . ) 2>/dev/null || {
  mkdir -p "$WORK" && (cd bench/peers/etcd-load && go build -o "$WORK/etcd-load" .); }

# --- etcd, 3 members on loopback ---------------------------------------------------------
rm -rf "$WORK/etcd" && mkdir -p "$WORK/etcd"
cluster="e1=http://127.0.0.1:23801,e2=http://127.0.0.1:23802,e3=http://127.0.0.1:23803"
for i in 1 2 3; do
  etcd --name "e$i" --data-dir "$WORK/etcd/e$i" \
    --listen-client-urls "http://127.0.0.1:2379$i" --advertise-client-urls "http://127.0.0.1:2379$i" \
    --listen-peer-urls "http://127.0.0.1:2380$i" --initial-advertise-peer-urls "http://127.0.0.1:2380$i" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token ulnet-bench \
    >"$WORK/etcd/e$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 100); do
  curl -fs http://127.0.0.1:23791/health 2>/dev/null | grep -q true && break
  sleep 0.2
done
"$WORK/etcd-load" --endpoints 127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793 \
  --clients "$CLIENTS" --value-bytes "$VALUE" --seconds "$SECS" | sed 's/}$/,"nodes":3}/' >>"$OUT"
cleanup; pids=()
fi

# --- ulnet, 3, 8 and 32 nodes (NODES) ----------------------------------------------------------
if [ -z "$ULNET" ]; then
  cargo build --release --locked -p ulnet >/dev/null 2>&1 || true
  ULNET=target/release/ulnet
fi
if "$ULNET" registry --help 2>/dev/null | grep -q load; then
  for n in $NODES; do
    rm -rf "$WORK/ulnet" && mkdir -p "$WORK/ulnet"
    start_registry_nodes "$ULNET" "$n" 24000 "$WORK/ulnet"
    "$ULNET" registry load --connect "$registry_addrs" --clients "$CLIENTS" --value-bytes "$VALUE" \
      --seconds "$SECS" --wait-members "$n" --json | sed "s/}\$/,\"nodes\":$n}/" >>"$OUT"
    cleanup; pids=()
  done
else
  echo "registry.sh: this build has no 'ulnet registry load' yet (the registry is not mounted in 'ulnet node'); etcd side only" >&2
fi

python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
etcd = next((r for r in rows if r["system"] == "etcd"), None)
print(f"{'system':8} {'nodes':>5} {'updates/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'vs etcd':>8}")
for r in rows:
    ratio = r["updates_per_s"] / etcd["updates_per_s"] if etcd else float("nan")
    print(f"{r['system']:8} {r['nodes']:5} {r['updates_per_s']:10.0f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {ratio:8.2f}")
PY
