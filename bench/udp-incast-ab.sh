#!/usr/bin/env bash
# Issue 3 incast, builds side by side: alternates the binaries of BINS round by round
# (A/B/A/B), so that a change of the host's load weighs on all. Per round and build:
#   - `ulnet bench incast --transport udp --senders 8 --flow-control on --json`, the issue's
#     figure (aggregate of 8 sender processes / one stream, fairness);
#   - `bench/udp-incast-cpu.sh 1` and `8`: CPU per byte on the senders' CPU (perf), with the
#     kernel's copy into the socket, the user copy into the send slots, finish_data and the
#     context switches per MB.
# Usage: BINS="base=/path/to/old/ulnet new=target/release/ulnet" [ROUNDS=3] \
#          flock /work/bench.lock bench/udp-incast-ab.sh
# Appends every run to bench/results/udp.md. Needs perf and two CPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
BINS=${BINS:?BINS="label=path label=path ..." of the ulnet binaries to compare}
ROUNDS=${ROUNDS:-3}
out=bench/results/udp.md
log=$(mktemp); trap 'rm -f "$log"' EXIT
{
  echo
  echo "Incast A/B, $(date -u '+%Y-%m-%d %H:%M') UTC, load $(cut -d' ' -f1-3 /proc/loadavg), worktree at $(git rev-parse --short HEAD), $ROUNDS alternating rounds:"
  echo "\`ROUNDS=$ROUNDS BINS=\"$BINS\" flock /work/bench.lock bench/udp-incast-ab.sh\`"
  echo
  echo '```'
} >"$log"
for r in $(seq "$ROUNDS"); do
  for spec in $BINS; do
    label=${spec%%=*} bin=${spec#*=}
    "$bin" bench incast --transport udp --senders 8 --flow-control on --json | grep '^{' | python3 -c "
import json, sys
o = json.loads(sys.stdin.read()); u = o.get('udp', {})
print(f\"round $r $label incast: aggregate {o['mb_per_s']:7.1f} MB/s, one stream {o['single_stream_mb_per_s']:7.1f}, ratio {o['aggregate_ratio']:.3f}, fairness {o['fairness']:.3f}, senders blocked on credit {u.get('sender_credit_blocked_fraction', 0):.2f}\")
" | tee -a "$log"
  done
  for n in 1 8; do
    for spec in $BINS; do
      label=${spec%%=*} bin=${spec#*=}
      BIN=$bin bench/udp-incast-cpu.sh "$n" "round $r $label" | tee -a "$log"
    done
  done
done
echo '```' >>"$log"
cat "$log" >>"$out"
