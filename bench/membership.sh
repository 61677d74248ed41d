#!/usr/bin/env bash
# Membership figures against HashiCorp memberlist (one command): builds ulnet and the Go
# harness, runs both side by side for the local and lan profiles, then a soak of 32 nodes
# at 5% loss (SOAK seconds, default 600; needs root for iptables). Writes
# bench/results/membership-latest.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p ulnet >/dev/null 2>&1
(cd bench/peers/memberlist && go build -o /tmp/memberlist-ref .)
python3 bench/membership.py --soak "${SOAK:-600}" --markdown bench/results/membership-latest.md
