# Sourced by the registry bench scripts (registry.sh, registry-probe.sh, registry-timing.sh,
# registry-cost.sh), which all start the same local cluster.
#
# start_registry_nodes ULNET N BASE_PORT DIR: starts N local `ulnet node`s on 127.0.0.1 ports
# BASE_PORT.., node 0 the seed of the others, data directories and logs under DIR (on disk,
# not tmpfs: fsync must mean it). Appends their pids to the caller's array `pids` and sets
# `registry_addrs` to their comma-separated addresses (for `ulnet registry load --connect`).
# NODE_ENV (e.g. "ULNET_LOG=gup_timing=info") is extra environment for the nodes. The
# cluster's secret is a new one in DIR/secret (make_cluster_secret).
start_registry_nodes() {
  local ulnet=$1 n=$2 base=$3 dir=$4 seeds="" i
  make_cluster_secret "$dir"
  for i in $(seq 0 $((n - 1))); do
    # shellcheck disable=SC2086 # NODE_ENV is a list of NAME=VALUE words
    env ${NODE_ENV:-} "$ulnet" node --name "n$i" --listen "127.0.0.1:$((base + i))" \
      ${seeds:+--seeds "$seeds"} --data-dir "$dir/n$i" --secret-file "$dir/secret" >"$dir/n$i.log" 2>&1 &
    pids+=($!)
    seeds=${seeds:-127.0.0.1:$base}
  done
  registry_addrs=$(seq -s, "$base" $((base + n - 1)) | sed 's/\([0-9]*\)/127.0.0.1:\1/g')
}

# make_cluster_secret DIR: a new random cluster secret in DIR/secret, readable by its owner
# only, exported as ULNET_SECRET_FILE so that every `ulnet` client command after it (registry
# load, registry status) uses it too.
make_cluster_secret() {
  (umask 077 && head -c 32 /dev/urandom >"$1/secret")
  export ULNET_SECRET_FILE="$1/secret"
}

# load_summary FILE: one line from a `ulnet registry load --json` result.
load_summary() {
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"{d['updates_per_s']:.0f} updates/s, p50 {d['p50_ms']:.2f} ms, p99 {d['p99_ms']:.2f} ms\")" "$1"
}
