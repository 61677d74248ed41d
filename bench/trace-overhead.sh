#!/usr/bin/env bash
# Issue 10 figures: the cost of per-message tracing on `ulnet bench msg-rate` and `rpc-lat`.
#   on  vs off:      the same build, with and without --trace, alternating in one run, each
#                    pair of processes pinned to two CPUs (bench/pinned.sh; goal: tracing on
#                    costs at most 5%), into bench/results/trace-on-off.md; for rpc-lat shm
#                    also tracing into a 2-record ring and with every record timed
#                    (ULNET_TRACE_SAMPLE=1, not the default: for latency studies);
#   on  vs off in one run (`ulnet bench TEST --trace FILE --trace-ab`): both processes
#                    switch tracing every 2^24 TSC ticks (~6 ms), and each traced block is
#                    compared with the untraced block before it (rpc-lat: by median and by
#                    trimmed mean; msg-rate: messages per second); rpc-lat shm, msg-rate shm
#                    and rpc-lat tcp, pinned, AB_RUNS runs (default 3) of AB_SECONDS (default
#                    5) each, then one control run of each (`--trace-ab control`: every block
#                    untraced, the comparison's own bias), into bench/results/trace-ab.md;
#   before vs after: rpc-lat 128 B shm, untraced and traced with this build and traced (and
#                    untraced) with an older binary BEFORE (default
#                    /var/tmp/ulnet-base-trace-542c17a, main before the compact format v4;
#                    skipped when missing), and this build traced into a 2-record ring (every
#                    record dropped and counted: the hooks without ring writes, writer work or
#                    file), the five alternating round after round
#                    (bench/alternate.py), BA_ROUNDS rounds (default 15; 0 skips), into
#                    bench/results/trace-before-after.md, with the file bytes per record of each;
#   off vs baseline: this build with tracing off against the same commit built with every
#                    hook compiled out (RUSTFLAGS="--cfg ulnet_untraced", target/untraced)
#                    and, unless BASELINE=0, a build of the commit before tracing existed
#                    (BASE, default 5b66311; everything else that changed since differs
#                    too), alternating and pinned (goal: no measurable cost, ratio within
#                    the run-to-run noise).
# Every build and comparison runs under `flock /work/bench.lock` (one CPU-heavy command at a
# time on the shared machine). Writes bench/results/trace-on-off.md,
# trace-ab.md, trace-before-after.md and trace-off-baseline.md; the summary is
# bench/results/trace.md.
# Environment: ROUNDS (default 9), BEFORE, BA_ROUNDS (15), AB_RUNS (3; 0 skips), AB_SECONDS (5), BASE, BASELINE (1), LOCK (default /work/bench.lock; empty:
# no lock), TRACE_DIR (default: a temporary dir).
# The script takes the lock itself, per comparison: do not wrap it in `flock /work/bench.lock`
# (the inner flock would wait for the outer forever) unless with LOCK= (one lock for all).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
LOCK=${LOCK-/work/bench.lock}
locked() { if [ -n "$LOCK" ]; then flock "$LOCK" "$@"; else "$@"; fi; }
locked cargo build --release --locked -p ulnet >/dev/null 2>&1
NOW=$ROOT/target/release/ulnet
UNTRACED_BIN=$ROOT/target/untraced/release/ulnet
CARGO_TARGET_DIR="$ROOT/target/untraced" RUSTFLAGS="--cfg ulnet_untraced" locked cargo build --release --locked -p ulnet >/dev/null 2>&1
BASE=${BASE:-5b66311}
if [ "${BASELINE:-1}" = 1 ]; then
  BASE_SRC=$ROOT/target/trace-baseline-src
  BASELINE_BIN=$ROOT/target/trace-baseline/release/ulnet
  # Rebuilt only when BASE changes (the stamp names the commit the binary was built from).
  if [ "$(cat "$ROOT/target/trace-baseline/base" 2>/dev/null)" != "$(git rev-parse "$BASE")" ] || [ ! -x "$BASELINE_BIN" ]; then
    rm -rf "$BASE_SRC" && mkdir -p "$BASE_SRC" "$ROOT/target/trace-baseline"
    git archive "$BASE" | tar -x -C "$BASE_SRC"
    echo "building the baseline ($BASE) ..." >&2
    (cd "$BASE_SRC" && CARGO_TARGET_DIR="$ROOT/target/trace-baseline" locked cargo build --release --locked -p ulnet >/dev/null 2>&1)
    git rev-parse "$BASE" >"$ROOT/target/trace-baseline/base"
  fi
fi
TRACE_DIR=${TRACE_DIR:-$(mktemp -d)}
R=${ROUNDS:-9}
MSG="msg-rate --transport shm --size 8 --iters 5000000"
RPC="rpc-lat --transport shm --size 128 --iters 100000"
RPCT="rpc-lat --transport tcp --size 128 --iters 20000"
export ULNET="$NOW"
echo "load before: $(uptime)"
# Each process of a pair pinned to a CPU of its own (bench/pinned.sh); every variant once per
# round, rounds alternating; the per-round ratios compare runs that shared a placement of the
# guest's CPUs on the host. p50 moves in 5 ns steps (the pollers' loop); avg also counts the
# round trips the trace writer's CPU time (on this host, taken from a busy poller) delays.
PIN="bench/pinned.sh $NOW"
# One alternating comparison (bench/alternate.py) under the lock; a failed one is reported
# in its own output and does not stop the others.
alt() { locked python3 bench/alternate.py --rounds "$R" "$@" || true; }
{
  echo "# Tracing on vs off, same build, alternating (bench/alternate.py, bench/pinned.sh)"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD), $R rounds; load before: $(uptime | sed 's/.*load/load/')."
} >bench/results/trace-on-off.md
alt --metric p50_us,avg_us --markdown bench/results/trace-on-off.md \
  --title "## rpc-lat 128 B shm" \
  "off=$PIN $RPC --json" \
  "traced=$PIN $RPC --trace $TRACE_DIR/rpc.ultrace --json" \
  "traced, 2-record ring (every record dropped)=ULNET_TRACE_RING=2 $PIN $RPC --trace $TRACE_DIR/ring2.ultrace --json" \
  "traced, every record exact (sample 1)=ULNET_TRACE_SAMPLE=1 $PIN $RPC --trace $TRACE_DIR/rpcx.ultrace --json"
alt --metric msgs_per_s --markdown bench/results/trace-on-off.md \
  --title "## msg-rate 8 B shm" \
  "off=$PIN $MSG --json" "traced=$PIN $MSG --trace $TRACE_DIR/msg.ultrace --json"
alt --metric p50_us,avg_us --markdown bench/results/trace-on-off.md \
  --title "## rpc-lat 128 B tcp" \
  "off=$PIN $RPCT --json" "traced=$PIN $RPCT --trace $TRACE_DIR/rpct.ultrace --json"
BEFORE=${BEFORE:-/var/tmp/ulnet-base-trace-542c17a}
if [ "${BA_ROUNDS:-15}" -gt 0 ] && [ -x "$BEFORE" ]; then
  {
    echo "# rpc-lat 128 B shm: tracing before and after, alternating (bench/alternate.py)"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD) against \`$BEFORE\`; load before: $(uptime | sed 's/.*load/load/')."
  } >bench/results/trace-before-after.md
  locked python3 bench/alternate.py --rounds "${BA_ROUNDS:-15}" --markdown bench/results/trace-before-after.md \
    "off=$NOW bench $RPC --json" \
    "before traced=$BEFORE bench $RPC --trace $TRACE_DIR/before.ultrace --json" \
    "after traced=$NOW bench $RPC --trace $TRACE_DIR/after.ultrace --json" \
    "before off=$BEFORE bench $RPC --json" \
    "after traced, 2-record ring=ULNET_TRACE_RING=2 $NOW bench $RPC --trace $TRACE_DIR/ring2.ultrace --json" || true
  for f in before after; do
    records=$("$NOW" trace analyze "$TRACE_DIR/$f.ultrace" --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["messages"])' 2>/dev/null || echo "?")
    echo "- $f: trace file $(stat -c %s "$TRACE_DIR/$f.ultrace") bytes for $records messages (a pair record is 2 messages)" | tee -a bench/results/trace-before-after.md
  done
fi
if [ "${AB_RUNS:-3}" -gt 0 ]; then
  AB="--trace $TRACE_DIR/ab.ultrace --duration-ms $((${AB_SECONDS:-5} * 1000))"
  {
    echo "# Tracing on vs off in one run (ulnet bench --trace-ab)"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD); load before: $(uptime | sed 's/.*load/load/')."
    echo "Each run: \`bench/pinned.sh target/release/ulnet TEST $AB --trace-ab [control]\`; the ratio is traced / untraced of adjacent blocks (median, quartiles)."
    for test in "rpc-lat --transport shm --size 128" "msg-rate --transport shm --size 8" "rpc-lat --transport tcp --size 128"; do
      echo
      echo "## $test"
      echo
      echo '```'
      for run in $(seq "${AB_RUNS:-3}") control; do
        mode=traced
        [ "$run" = control ] && mode=control
        # shellcheck disable=SC2086
        locked $PIN $test $AB --trace-ab $mode 2>/dev/null | sed "s/^/$mode: /" || echo "$mode: failed"
      done
      echo '```'
    done
  } >bench/results/trace-ab.md
  cat bench/results/trace-ab.md
fi
# Pinned and alternating like the on/off runs: unpinned whole runs of two builds differ by
# ±10% with where the scheduler puts them.
{
  echo "# Tracing off against the hooks compiled out (same commit) and the build before tracing existed ($BASE), alternating, pinned"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD), $R rounds; load before: $(uptime | sed 's/.*load/load/')."
} >bench/results/trace-off-baseline.md
for test in "msgs_per_s|msg-rate 8 B shm|$MSG" "p50_us,avg_us|rpc-lat 128 B shm|$RPC" "p50_us,avg_us|rpc-lat 128 B tcp|$RPCT"; do
  IFS='|' read -r metric title cmd <<<"$test"
  variants=("off=$PIN $cmd --json" "hooks compiled out=bench/pinned.sh $UNTRACED_BIN $cmd --json")
  if [ "${BASELINE:-1}" = 1 ]; then
    variants+=("baseline $BASE=bench/pinned.sh $BASELINE_BIN $cmd --json")
  fi
  alt --metric "$metric" --markdown bench/results/trace-off-baseline.md --title "## $title" "${variants[@]}"
done
echo "load after: $(uptime)"
# What one traced run recorded (records and drops), for the write-up.
locked sh -c "'$NOW' bench $MSG --trace '$TRACE_DIR/msg.ultrace' --json 2>&1; '$NOW' bench $RPC --trace '$TRACE_DIR/rpc.ultrace' --json 2>&1" | grep -E "traced|msgs_per_s|p50_us" || true
# The sampled exact breakdowns the default keeps (request-response stages).
"$NOW" trace analyze "$TRACE_DIR/rpc.ultrace" "$TRACE_DIR/rpc.ultrace.peer" 2>&1 | sed -n '/Request-response/,$p' | head -20 || true
rm -rf "$TRACE_DIR"
