# Sourced by the registry bench scripts (registry.sh, registry-probe.sh, registry-timing.sh,
# registry-cost.sh), which all start the same local cluster.
#
# start_registry_nodes ULNET N BASE_PORT DIR: starts N local `ulnet node`s on 127.0.0.1 ports
# BASE_PORT.., node 0 the seed of the others, data directories and logs under DIR (on disk,
# not tmpfs: fsync must mean it). Appends their pids to the caller's array `pids` and sets
# `registry_addrs` to their comma-separated addresses (for `ulnet registry load --connect`).
# NODE_ENV (e.g. "ULNET_LOG=gup_timing=info") is extra environment for the nodes.
start_registry_nodes() {
  local ulnet=$1 n=$2 base=$3 dir=$4 seeds="" i
  for i in $(seq 0 $((n - 1))); do
    # shellcheck disable=SC2086 # NODE_ENV is a list of NAME=VALUE words
    env ${NODE_ENV:-} "$ulnet" node --name "n$i" --listen "127.0.0.1:$((base + i))" \
      ${seeds:+--seeds "$seeds"} --data-dir "$dir/n$i" >"$dir/n$i.log" 2>&1 &
    pids+=($!)
    seeds=${seeds:-127.0.0.1:$base}
  done
  registry_addrs=$(seq -s, "$base" $((base + n - 1)) | sed 's/\([0-9]*\)/127.0.0.1:\1/g')
}

# load_summary FILE: one line from a `ulnet registry load --json` result.
load_summary() {
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"{d['updates_per_s']:.0f} updates/s, p50 {d['p50_ms']:.2f} ms, p99 {d['p99_ms']:.2f} ms\")" "$1"
}
