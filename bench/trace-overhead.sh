#!/usr/bin/env bash
# Issue 10 figures: the cost of per-message tracing on `ulnet bench msg-rate` and `rpc-lat`.
#   on  vs off:      the same build, with and without --trace, alternating in one run
#                    (goal: tracing on costs at most 5%); the last row puts the untraced
#                    run first, so its ratio is untraced / traced (goal >= 0.95);
#   off vs baseline: this build with tracing off against a build of the commit before
#                    tracing existed (BASE, default: the merge base with main), alternating
#                    (goal: no measurable cost, ratio within the run-to-run noise).
# Writes bench/results/trace-on-off.md and bench/results/trace-off-baseline.md; the
# summary with the busy-machine caveat is bench/results/trace.md.
# Environment: ROUNDS (default 7), BASE (a commit), TRACE_DIR (default: a temporary dir).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
cargo build --release --locked -p ulnet >/dev/null 2>&1
BASE=${BASE:-$(git merge-base HEAD main)}
BASE_SRC=$ROOT/target/trace-baseline-src
rm -rf "$BASE_SRC" && mkdir -p "$BASE_SRC"
git archive "$BASE" | tar -x -C "$BASE_SRC"
echo "building the baseline ($BASE) ..." >&2
(cd "$BASE_SRC" && CARGO_TARGET_DIR="$ROOT/target/trace-baseline" cargo build --release --locked -p ulnet >/dev/null 2>&1)
BASELINE=$ROOT/target/trace-baseline/release/ulnet
NOW=$ROOT/target/release/ulnet
TRACE_DIR=${TRACE_DIR:-$(mktemp -d)}
R=${ROUNDS:-7}
MSG="msg-rate --transport shm --size 8 --iters 5000000"
RPC="rpc-lat --transport shm --size 128 --iters 100000"
RPCT="rpc-lat --transport tcp --size 128 --iters 20000"
export ULNET="$NOW"
python3 bench/compare.py --rounds "$R" --markdown bench/results/trace-on-off.md \
  "msg-rate 8 B shm, traced vs not|$MSG --trace $TRACE_DIR/msg.ultrace|$NOW bench $MSG --json|msgs_per_s|>=0.95" \
  "rpc-lat 128 B shm, traced vs not|$RPC --trace $TRACE_DIR/rpc.ultrace|$NOW bench $RPC --json|p50_us|<=1.05" \
  "rpc-lat 128 B tcp, traced vs not|$RPCT --trace $TRACE_DIR/rpct.ultrace|$NOW bench $RPCT --json|p50_us|<=1.05" \
  "rpc-lat 128 B shm, NOT traced vs traced without handler times|$RPC|ULNET_TRACE_HANDLERS=0 $NOW bench $RPC --trace $TRACE_DIR/rpcl.ultrace --json|p50_us|>=0.95" || true
python3 bench/compare.py --rounds "$R" --markdown bench/results/trace-off-baseline.md \
  "msg-rate 8 B shm, off vs baseline|$MSG|$BASELINE bench $MSG --json|msgs_per_s|>=0.97" \
  "rpc-lat 128 B shm, off vs baseline|$RPC|$BASELINE bench $RPC --json|p50_us|<=1.03" \
  "rpc-lat 128 B tcp, off vs baseline|$RPCT|$BASELINE bench $RPCT --json|p50_us|<=1.03" || true
# What one traced run recorded (records and drops), for the write-up.
"$NOW" bench $MSG --trace "$TRACE_DIR/msg.ultrace" --json 2>&1 | grep -E "traced|msgs_per_s" || true
"$NOW" bench $RPC --trace "$TRACE_DIR/rpc.ultrace" --json 2>&1 | grep -E "traced|p50_us" || true
rm -rf "$TRACE_DIR"
