#!/usr/bin/env bash
# UDP transport figures (issue 3): ulnet over UDP against ucx_perftest over -x tcp -d lo
# (am_lat, am_bw message rate, UCP tag_bw and tag_lat), against iperf3 for bulk
# throughput (TCP, the goal; and UDP goodput, the kernel's ceiling for any UDP
# transport), and the incast run (8 sender processes to one receiver, flow control on
# and off). Writes bench/results/udp.md. ROUNDS=N sets the alternating rounds (default 5).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p ulnet >/dev/null 2>&1
UCX=${UCX_REF:-../shared/peers/ucx-ref}
ROUNDS=${ROUNDS:-5}
out=bench/results/udp.md
python3 bench/compare.py --rounds "$ROUNDS" --markdown "$out" \
  "am-lat 64 B, udp|am-lat --transport udp --size 64 --iters 50000|$UCX am-lat tcp 64 50000|p50_us|<=1.0" \
  "msg-rate 8 B, udp (UCX am_bw)|msg-rate --transport udp --size 8 --iters 2000000|$UCX msg-rate tcp 8 200000|msgs_per_s|>=2.0" \
  "msg-rate 8 B, udp (UCX tag_bw)|msg-rate --transport udp --size 8 --iters 2000000|$UCX am-bw tcp 8 200000|msgs_per_s|>=2.0" \
  "am-bw 1 MiB, udp|am-bw --transport udp --size 1048576 --iters 5000|bench/peers/iperf3-ref 5|mb_per_s|>=0.7" \
  "am-bw 1 MiB, udp, blocking mode|am-bw --transport udp --size 1048576 --iters 5000 --blocking|bench/peers/iperf3-ref 5|mb_per_s|>=0.7" \
  "am-bw 1 MiB, udp, adaptive mode|am-bw --transport udp --size 1048576 --iters 5000 --adaptive|bench/peers/iperf3-ref 5|mb_per_s|>=0.7" \
  "am-bw 1 MiB, udp vs kernel UDP goodput (context)|am-bw --transport udp --size 1048576 --iters 5000|bench/peers/iperf3-udp-ref 5|mb_per_s|>=0.7" \
  "rpc-lat 128 B, udp|rpc-lat --transport udp --size 128 --iters 50000|$UCX rpc-lat tcp 128 50000|p50_us|<=1.0" || true
python3 - "$ROUNDS" "$out" <<'PY'
import json, statistics, subprocess, sys
rounds, out = int(sys.argv[1]), sys.argv[2]
ulnet = "target/release/ulnet"
rows = []
for fc in ("on", "off"):
    cmd = [ulnet, "bench", "incast", "--transport", "udp", "--senders", "8", "--flow-control", fc, "--json"]
    runs = []
    for _ in range(rounds):
        line = [l for l in subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines() if l.startswith("{")][-1]
        runs.append(json.loads(line))
    med = lambda k: statistics.median(r[k] for r in runs)
    ok = med("aggregate_ratio") >= 0.9 and med("fairness") >= 0.95
    rows.append((fc, med("mb_per_s"), med("single_stream_mb_per_s"), med("aggregate_ratio"), med("fairness"), ok, " ".join(cmd[1:]).replace(ulnet, "ulnet"), runs))
    print(f"incast 8 senders, flow control {fc:3}: aggregate {med('mb_per_s'):8.1f} MB/s  one stream {med('single_stream_mb_per_s'):8.1f}  ratio {med('aggregate_ratio'):.3f}  fairness {med('fairness'):.3f}  {'PASS' if ok else 'MISS'} (goal with flow control: ratio >= 0.9, fairness >= 0.95)", flush=True)
with open(out, "a") as f:
    f.write("\nIncast, 8 sender processes to one receiver, 64 KiB messages, 2 s measured (medians over the rounds; goal with flow control: aggregate >= 0.9 x one stream, fairness >= 0.95):\n\n")
    f.write("| flow control | aggregate MB/s | one stream MB/s | ratio | Jain fairness | goal met |\n|---|---|---|---|---|---|\n")
    for fc, agg, single, ratio, fair, ok, cmd, runs in rows:
        met = ("yes" if ok else "no") if fc == "on" else "(no goal)"
        f.write(f"| {fc} | {agg:.1f} | {single:.1f} | {ratio:.3f} | {fair:.3f} | {met} |\n")
    f.write("\n")
    for fc, agg, single, ratio, fair, ok, cmd, runs in rows:
        f.write(f"- `{cmd}`: ratios {[round(r['aggregate_ratio'], 3) for r in runs]}, fairness {[round(r['fairness'], 3) for r in runs]}\n")
PY
