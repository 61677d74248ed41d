#!/usr/bin/env bash
# TCP transport figures (issue 3 asks these of UDP; TCP is shown for reference): ulnet over
# TCP against ucx_perftest over -x tcp -d lo, and against iperf3 for bulk throughput.
# Writes bench/results/tcp.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p ulnet >/dev/null 2>&1
UCX=${UCX_REF:-../shared/peers/ucx-ref}
python3 bench/compare.py --rounds "${ROUNDS:-5}" --markdown bench/results/tcp.md \
  "am-lat 64 B, tcp|am-lat --transport tcp --size 64 --iters 50000|$UCX am-lat tcp 64 50000|p50_us|<=1.0" \
  "msg-rate 8 B, tcp|msg-rate --transport tcp --size 8 --iters 2000000|$UCX msg-rate tcp 8 200000|msgs_per_s|>=2.0" \
  "am-bw 1 MiB, tcp|am-bw --transport tcp --size 1048576 --iters 5000|bench/peers/iperf3-ref 5|mb_per_s|>=0.7" || true
