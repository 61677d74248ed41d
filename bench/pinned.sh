#!/usr/bin/env bash
# Runs one two-process `ulnet bench` test with its processes pinned to separate CPUs: the
# passive side (`--server`) on SERVER_CPU (default 1), the active side on CLIENT_CPU
# (default 0). `ulnet bench` alone starts its peer itself, and the scheduler then places the
# two busy-polling processes (and, when tracing, their writer threads) as it likes, which
# moves a shared-memory latency by more than the few percent being compared.
#
# usage: bench/pinned.sh BIN TEST [OPTION ...]
#   BIN: a `ulnet` binary; TEST and OPTIONs as for `ulnet bench` (no --server/--connect).
#   `--trace FILE` traces the active side into FILE and the passive side into FILE.peer, as
#   `ulnet bench --trace` does; `--json` is given to the active side only.
# Example: bench/pinned.sh target/release/ulnet rpc-lat --transport shm --size 128 --json
set -euo pipefail
BIN=$1
TEST=$2
shift 2
client=() server=()
transport=shm
while [ $# -gt 0 ]; do
  case $1 in
    --trace) client+=(--trace "$2"); server+=(--trace "$2.peer"); shift 2 ;;
    --json) client+=(--json); shift ;;
    --transport) transport=$2; client+=("$1" "$2"); server+=("$1" "$2"); shift 2 ;;
    *) client+=("$1"); server+=("$1"); shift ;;
  esac
done
case $transport in
  shm) listen="pinned-$$-$TEST" ;;
  *) listen=127.0.0.1:0 ;;
esac
out=$(mktemp)
trap 'rm -f "$out"' EXIT
taskset -c "${SERVER_CPU:-1}" "$BIN" bench "$TEST" --server --listen "$listen" "${server[@]}" >"$out" &
server_pid=$!
for _ in $(seq 1000); do
  grep -q '^listening ' "$out" && break
  kill -0 "$server_pid" 2>/dev/null || { echo "pinned.sh: the server exited" >&2; exit 1; }
  sleep 0.01
done
addr=$(sed -n 's/^listening //p' "$out" | head -1)
[ -n "$addr" ] || { echo "pinned.sh: the server did not start listening" >&2; kill "$server_pid"; exit 1; }
status=0
taskset -c "${CLIENT_CPU:-0}" "$BIN" bench "$TEST" --connect "$addr" "${client[@]}" || status=$?
wait "$server_pid" || status=$?
exit "$status"
