#!/usr/bin/env bash
# Figures of the self-reconfiguring data center (issue 9) on a 7-node center: in each
# experiment the best rigid split (found by a search over every split, or the thesis'
# over-provisioned split for two websites) and `reconf` run on the same trace, one after
# the other, in this one invocation. Writes bench/results/dc.md, the JSON of every run and
# SVG plots of throughput and tier sizes over time.
#
#   bench/dc.sh                                  # everything (about 30 minutes)
#   QUICK=1 bench/dc.sh                          # shorter bursts, a smoke run (about 6 minutes)
#   EXPERIMENTS="sites zipf" bench/dc.sh         # only these (the report reuses the others' JSON)
#
# Settings (environment): BURST (65536), GUARANTEE (1100 TPS, single site), TWO_BURST
# (16384: the two-site rigid run serves site 1 on one node per tier, so longer bursts make
# it a ten-minute run), TWO_GUARANTEE (900 TPS, high-priority site), MIX_BURST (16384, zipf and the
# worldcup period scale), DURATION (900 s, the cap on one run),
# WORLDCUP_REQUESTS (200000). BENCH_LOCK=FILE: take `flock FILE` around each run (not the
# whole script), so on a shared machine no other benchmark runs beside a measurement and
# none waits for the whole script.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${ULNET:-}" ]]; then
    cargo build --release --quiet -p ulnet
    ULNET=target/release/ulnet
fi
OUT=bench/results/dc
mkdir -p "$OUT"
if [[ -n "${QUICK:-}" ]]; then
    BURST=${BURST:-8192}; TWO_BURST=${TWO_BURST:-4096}; MIX_BURST=${MIX_BURST:-4096}; WORLDCUP_REQUESTS=${WORLDCUP_REQUESTS:-40000}
fi
BURST=${BURST:-65536}
GUARANTEE=${GUARANTEE:-1100}
TWO_BURST=${TWO_BURST:-16384}
TWO_GUARANTEE=${TWO_GUARANTEE:-900}
MIX_BURST=${MIX_BURST:-16384}
WORLDCUP_REQUESTS=${WORLDCUP_REQUESTS:-200000}
DURATION=${DURATION:-900}
EXPERIMENTS=${EXPERIMENTS:-burst sites zipf worldcup}

# A run with failed requests exits 1; its JSON still counts them and the report flags it,
# so the script goes on to the next run.
run() { # name, args...
    local name=$1; shift
    echo "== $name: ulnet dc run $*" >&2
    ${BENCH_LOCK:+flock "$BENCH_LOCK"} "$ULNET" dc run "$@" --duration "$DURATION" --json --save "$OUT/$name.run.json" > "$OUT/$name.json" \
        || echo "== $name: exit $? (failed requests are in its JSON)" >&2
}
wanted() { [[ " $EXPERIMENTS " == *" $1 "* ]]; }

# 1. Single-file bursts, with a throughput guarantee for the QoS figure.
if wanted burst; then
    run burst-rigid  --trace burst --burst "$BURST" --policy rigid  --guarantee "$GUARANTEE"
    run burst-reconf --trace burst --burst "$BURST" --policy reconf --guarantee "$GUARANTEE"
fi
# 2. Two websites: site 0 has priority and a guarantee; rigid gives it 5 nodes (2:3), site 1 gets 1:1.
if wanted sites; then
    run sites-rigid  --trace burst --burst "$TWO_BURST" --websites 2 --split 2:3 --policy rigid  --guarantee "$TWO_GUARANTEE"
    run sites-reconf --trace burst --burst "$TWO_BURST" --websites 2 --split 2:3 --policy reconf --guarantee "$TWO_GUARANTEE"
fi
# 3. Zipf popularity and the World-Cup-like trace.
if wanted zipf; then
    run zipf-rigid  --trace zipf --burst "$MIX_BURST" --policy rigid
    run zipf-reconf --trace zipf --burst "$MIX_BURST" --policy reconf
fi
if wanted worldcup; then
    run worldcup-rigid  --trace worldcup --burst "$MIX_BURST" --requests "$WORLDCUP_REQUESTS" --policy rigid
    run worldcup-reconf --trace worldcup --burst "$MIX_BURST" --requests "$WORLDCUP_REQUESTS" --policy reconf
fi

for e in $EXPERIMENTS; do
    "$ULNET" dc plot --out "$OUT/$e.svg" --title "$e: best rigid split vs reconf" "$OUT/$e-rigid.run.json" "$OUT/$e-reconf.run.json"
done
python3 bench/dc-report.py "$OUT" > bench/results/dc.md
cat bench/results/dc.md
