#!/usr/bin/env bash
# Issue 2 figures: ulnet over shared memory against ucx_perftest over posix/sm, alternating
# runs in one invocation. Writes bench/results/core-shm.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p ulnet >/dev/null
UCX=${UCX_REF:-../shared/peers/ucx-ref}
mkdir -p bench/results
python3 bench/compare.py --rounds "${ROUNDS:-7}" --markdown bench/results/core-shm.md \
  "am-lat 64 B, shm|am-lat --transport shm --size 64 --iters 100000|$UCX am-lat shm 64 100000|p50_us|<=0.8" \
  "msg-rate 8 B, shm|msg-rate --transport shm --size 8 --iters 5000000|$UCX msg-rate shm 8 5000000|msgs_per_s|>=1.2" \
  "am-bw 1 MiB, shm|am-bw --transport shm --size 1048576 --iters 20000|$UCX am-bw shm 1048576 20000|mb_per_s|>=0.8" \
  "am-bw 1 MiB, shm, receiver copies out|am-bw --transport shm --size 1048576 --iters 20000 --recv-copy|$UCX am-bw shm 1048576 20000|mb_per_s|>=0.8"
