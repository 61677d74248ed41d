#!/usr/bin/env bash
# Issue 4 figures: one-sided operations of ulnet against ucx_perftest, alternating runs in
# one invocation (bench/compare.py). Writes bench/results/rma.md and rma-shm-long.md.
#
# Over shm, ulnet maps the peer's segment (loads, stores, lock xadd), as UCX's sm/posix
# transports do. What each side measures:
#   put-lat  ping-pong of 8-byte puts, one-way = RTT/2      (UCX uct put_lat, the same)
#   get-lat  one whole 8-byte get, not halved               (UCX ucp_get, stream_uni, window 1)
#   faa-lat  ping-pong of fetch-and-adds, one-way = RTT/2   (UCX uct add_lat over shm: the same;
#            over tcp UCX runs ucp_add, which times *posting* a non-fetching add, not a
#            round trip: the tcp row compares unlike things and is kept for the record)
# UDP rows (the issue's goal: faa-lat and get-lat <= 1.0 x UCX tcp) join when the UDP
# transport lands: add them beside the tcp rows with --transport udp.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p ulnet >/dev/null 2>&1
UCX=${UCX_REF:-../shared/peers/ucx-ref}
mkdir -p bench/results
python3 bench/compare.py --rounds "${ROUNDS:-5}" --markdown bench/results/rma.md \
  "put-lat 8 B, shm|put-lat --transport shm --size 8 --iters 100000|$UCX put-lat shm 8 100000|p50_us|<=1.0" \
  "get-lat 8 B, shm|get-lat --transport shm --size 8 --iters 100000|$UCX get-lat shm 8 100000|p50_us|<=1.0" \
  "faa-lat 8 B, shm|faa-lat --transport shm --size 8 --iters 100000|$UCX faa-lat shm 8 100000|p50_us|<=1.0" \
  "faa-lat 8 B, tcp (ping-pong vs ucp_add posting)|faa-lat --transport tcp --size 8 --iters 20000|$UCX faa-lat tcp 8 20000|p50_us|<=1.0" \
  "get-lat 8 B, tcp|get-lat --transport tcp --size 8 --iters 20000|$UCX get-lat tcp 8 20000|p50_us|<=1.0" || true
# The shared-memory latencies are tens of nanoseconds and swing with vCPU placement: a
# longer latency-only pass of the three shm rows (as bench/core-shm.sh does for am-lat).
python3 bench/compare.py --rounds "${ROUNDS_LONG:-11}" --markdown bench/results/rma-shm-long.md \
  "put-lat 8 B, shm|put-lat --transport shm --size 8 --iters 100000|$UCX put-lat shm 8 100000|p50_us|<=1.0" \
  "get-lat 8 B, shm|get-lat --transport shm --size 8 --iters 100000|$UCX get-lat shm 8 100000|p50_us|<=1.0" \
  "faa-lat 8 B, shm|faa-lat --transport shm --size 8 --iters 100000|$UCX faa-lat shm 8 100000|p50_us|<=1.0" || true
