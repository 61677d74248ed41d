#!/usr/bin/env bash
# Issue 4 figures: one-sided operations of ulnet against ucx_perftest, alternating runs in
# one invocation (bench/compare.py). Three passes, each short enough to hold the bench lock:
#
#   bench/rma.sh                  all three                        ROUNDS=N (5), ROUNDS_LONG=N (11)
#   PASS=shm  bench/rma.sh        shm rows          -> bench/results/rma.md
#   PASS=net  bench/rma.sh        udp and tcp rows  -> bench/results/rma-net.md
#   PASS=long bench/rma.sh        longer shm pass   -> bench/results/rma-shm-long.md
#
# Over shm, ulnet maps the peer's segment (loads, stores, lock xadd), as UCX's sm/posix
# transports do; over udp and tcp every operation goes through the target's engine.
# What each side measures:
#   put-lat  ping-pong of 8-byte puts, one-way = RTT/2      (UCX uct put_lat, the same)
#   get-lat  one whole 8-byte get, not halved               (UCX ucp_get, the same)
#   faa-lat  ping-pong of fetch-and-adds, one-way = RTT/2   (UCX uct add_lat over shm: the same)
#   faa-lat --whole-op  one whole fetch-and-add, not halved (UCX ucp_fadd, the same)
#   faa-lat --overhead  each iteration of a back-to-back stream of posted fetch-and-adds
#                       (post + one progress call; UCX ucp_add's "overhead")
# The issue's udp goal names UCX's `ucp_add` over tcp (`ucx-ref faa-lat tcp`), which times
# *posting* non-fetching adds back to back (no round trip in it); those rows are run as the
# issue words them, and beside them the like-for-like peers (ucp_add against posting
# overhead, ucp_fadd, ucp_get).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p ulnet >/dev/null 2>&1
UCX=${UCX_REF:-../shared/peers/ucx-ref}
FADD=bench/peers/ucx-fadd-ref
PASS=${PASS:-all}
mkdir -p bench/results
SHM_ROWS=(
  "put-lat 8 B, shm|put-lat --transport shm --size 8 --iters 100000|$UCX put-lat shm 8 100000|p50_us|<=1.0"
  "get-lat 8 B, shm|get-lat --transport shm --size 8 --iters 100000|$UCX get-lat shm 8 100000|p50_us|<=1.0"
  "faa-lat 8 B, shm|faa-lat --transport shm --size 8 --iters 100000|$UCX faa-lat shm 8 100000|p50_us|<=1.0"
)
if [ "$PASS" = all ] || [ "$PASS" = shm ]; then
  python3 bench/compare.py --rounds "${ROUNDS:-5}" --markdown bench/results/rma.md "${SHM_ROWS[@]}" || true
fi
if [ "$PASS" = all ] || [ "$PASS" = net ]; then
  python3 bench/compare.py --rounds "${ROUNDS:-5}" --markdown bench/results/rma-net.md \
    "faa-lat 8 B, udp vs ucp_add tcp (issue goal; ucp_add times posting)|faa-lat --transport udp --size 8 --iters 20000|$UCX faa-lat tcp 8 20000|p50_us|<=1.0" \
    "get-lat 8 B, udp vs ucp_add tcp (issue goal; ucp_add times posting)|get-lat --transport udp --size 8 --iters 20000|$UCX faa-lat tcp 8 20000|p50_us|<=1.0" \
    "faa 8 B posting overhead, udp vs ucp_add tcp (like for like)|faa-lat --overhead --transport udp --size 8 --iters 20000|$UCX faa-lat tcp 8 20000|p50_us|<=1.0" \
    "faa 8 B whole op, udp vs ucp_fadd tcp (like for like)|faa-lat --whole-op --transport udp --size 8 --iters 20000|$FADD tcp 20000|p50_us|<=1.0" \
    "get-lat 8 B, udp vs ucp_get tcp (like for like)|get-lat --transport udp --size 8 --iters 20000|$UCX get-lat tcp 8 2000|p50_us|<=1.0" \
    "faa 8 B posting overhead, tcp vs ucp_add tcp|faa-lat --overhead --transport tcp --size 8 --iters 20000|$UCX faa-lat tcp 8 20000|p50_us|<=1.0" \
    "faa 8 B whole op, tcp vs ucp_fadd tcp|faa-lat --whole-op --transport tcp --size 8 --iters 20000|$FADD tcp 20000|p50_us|<=1.0" \
    "get-lat 8 B, tcp vs ucp_get tcp|get-lat --transport tcp --size 8 --iters 20000|$UCX get-lat tcp 8 2000|p50_us|<=1.0" || true
fi
# The shared-memory latencies are tens of nanoseconds and swing with vCPU placement: a
# longer latency-only pass of the three shm rows (as bench/core-shm.sh does for am-lat).
if [ "$PASS" = all ] || [ "$PASS" = long ]; then
  python3 bench/compare.py --rounds "${ROUNDS_LONG:-11}" --markdown bench/results/rma-shm-long.md "${SHM_ROWS[@]}" || true
fi
