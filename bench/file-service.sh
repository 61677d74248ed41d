#!/usr/bin/env bash
# Issue 4: the paper's file-service comparison — pure data transfer (DX, one-sided reads of
# the server's cache) against RPC — for GetAttribute, LookupName, ReadFile 1K/4K/8K.
# Client latency (p50) and server CPU per operation, by server thread, medians over
# ROUNDS runs of each configuration. Writes bench/results/file-service.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p ulnet >/dev/null 2>&1
ULNET=${ULNET:-target/release/ulnet}
ITERS=${ITERS:-20000}
ROUNDS=${ROUNDS:-3}
mkdir -p bench/results
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
configs=("tcp|--transport tcp" "shm, mapped|--transport shm" "shm, through the engine|--transport shm --no-map")
for c in "${configs[@]}"; do
  name=${c%%|*}; flags=${c#*|}
  for r in $(seq "$ROUNDS"); do
    # shellcheck disable=SC2086
    "$ULNET" bench file-service $flags --iters "$ITERS" --json >>"$tmp/$name.jsonl"
  done
done
python3 - "$tmp" "$ITERS" "$ROUNDS" "${configs[@]}" >bench/results/file-service.md <<'PY'
import json, statistics, sys
tmp, iters, rounds, configs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
print(f"# File service: pure data transfer (DX) against RPC\n")
print(f"`bench/file-service.sh` (ITERS={iters}, ROUNDS={rounds}): `ulnet bench file-service <flags> --iters {iters} --json`, "
      "medians over the rounds. Latency is the client's p50 per operation (one whole operation, not halved); "
      "server CPU is the CPU time of every server thread during the phase, per operation "
      "(`/proc/self/task/*/schedstat`), with both servers sleeping in the kernel as soon as they are idle.\n")
for c in configs:
    name, flags = c.split("|", 1)
    runs = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")]
    print(f"## {name} (`{flags.strip()}`, DX path: {runs[0]['dx_path']})\n")
    print("| operation | DX p50 µs | RPC p50 µs | DX server CPU µs/op | RPC server CPU µs/op | DX/RPC server load | DX CPU engine / server thread | RPC CPU engine / server thread |")
    print("|---|---|---|---|---|---|---|---|")
    for i, row in enumerate(runs[0]["rows"]):
        med = lambda f: statistics.median(f(r["rows"][i]) for r in runs)
        dx, rpc = med(lambda x: x["dx_server_cpu_us"]), med(lambda x: x["rpc_server_cpu_us"])
        print(f"| {row['op']} | {med(lambda x: x['dx_p50_us']):.2f} | {med(lambda x: x['rpc_p50_us']):.2f} | {dx:.2f} | {rpc:.2f} | "
              f"{dx / rpc if rpc else float('nan'):.2f} | "
              f"{med(lambda x: x['dx_cpu_by_thread']['engine_us']):.2f} / {med(lambda x: x['dx_cpu_by_thread']['server_thread_us']):.2f} | "
              f"{med(lambda x: x['rpc_cpu_by_thread']['engine_us']):.2f} / {med(lambda x: x['rpc_cpu_by_thread']['server_thread_us']):.2f} |")
    print()
PY
cat bench/results/file-service.md
