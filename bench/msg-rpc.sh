#!/usr/bin/env bash
# Issue 5 figures: RPC round trip through ulnet-msg against UCP tag matching
# (ucx_perftest -t tag_lat) over shared memory and TCP, alternating runs in one invocation,
# then the 128-byte call rate with 32 outstanding and the size curve.
# Writes bench/results/msg-rpc.md, rpc-curve.md and rpc-curve.svg.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p ulnet >/dev/null 2>&1
UCX=${UCX_REF:-../shared/peers/ucx-ref}
python3 bench/compare.py --rounds "${ROUNDS:-7}" --markdown bench/results/msg-rpc.md \
  "rpc-lat 128 B, shm|rpc-lat --transport shm --size 128 --iters 100000|$UCX rpc-lat shm 128 100000|p50_us|<=1.0" \
  "rpc-lat 128 B, tcp|rpc-lat --transport tcp --size 128 --iters 50000|$UCX rpc-lat tcp 128 50000|p50_us|<=1.0" || true
for i in 1 2 3; do ./target/release/ulnet bench rpc-rate --transport shm --size 128 --outstanding 32 --iters 2000000 --json; done | tee bench/results/rpc-rate-shm.jsonl
python3 bench/rpc-curve.py
