#!/usr/bin/env bash
# Where the time of UDP incast goes (issue 3): runs the incast receiver pinned to CPU 0 and
# N sender processes pinned to CPU 1 (the placement `ulnet bench incast` uses), under
# `perf record -a`, and prints the throughput and the CPU milliseconds per GB delivered of
# the receiver and of the senders, with the kernel's copy out of / into the socket buffers,
# the senders' user-space copy into the send slots (libc memmove), `finish_data` (the
# header and ack written into a slot as it goes out: its cost per byte tells whether the
# slot is still in the cache), and the context switches on the senders' CPU per MB.
# Usage: bench/udp-incast-cpu.sh N [LABEL]   (K=streams per sender process, default 1;
# BIN=ulnet binary, default target/release/ulnet). Needs perf and two CPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:?streams}; LABEL=${2:-incast}; K=${K:-1}; PORT=$((47100 + RANDOM % 800))
B=${BIN:-$PWD/target/release/ulnet}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
perf record -q -a -F 1999 -o "$tmp/perf.data" -- bash -c "
taskset -c 0 $B bench incast --transport udp --server --senders $N --listen 127.0.0.1:$PORT --flow-control on --duration-ms 3000 --json > $tmp/out.json &
R=\$!; sleep 0.3
for i in \$(seq $((N / K))); do ULNET_INCAST_CPU=1 $B bench incast --transport udp --connect 127.0.0.1:$PORT --streams-per-sender $K --flow-control on >/dev/null & done
sleep 0.5; perf stat -C 1 -e context-switches -x, -o $tmp/cs.txt -- sleep 2 &
wait \$R; wait" 2>/dev/null
comm=$(basename "$B" | cut -c1-15)  # the kernel keeps 15 characters of a command name
# (Not `--comm`: it drops samples of processes that exec'ed from a shell; filter below.)
perf report -i "$tmp/perf.data" -n --no-children -g none --sort comm,cpu,sym --stdio 2>/dev/null | grep -v "^#" > "$tmp/syms.txt" || true
perf report -i "$tmp/perf.data" -n --no-children --sort cpu,comm --stdio 2>/dev/null | grep -v "^#" > "$tmp/comms.txt" || true
python3 - "$tmp" "$LABEL" "$N" "$comm" <<'PY'
import json, sys
tmp, lab, n, comm = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
mb = json.loads([l for l in open(f"{tmp}/out.json") if l.startswith("{")][-1])["mb_per_s"]
gb = mb * 3.3 / 1000  # 3 s measured + 0.3 s warm-up at about the same rate
def rows(f):
    for l in open(f):
        p = l.split()
        if len(p) >= 4 and p[0].endswith("%"):
            yield p
c = {(p[2], p[3]): int(p[1]) for p in rows(f"{tmp}/comms.txt")}
s = {(p[3], p[-1]): int(p[1]) for p in rows(f"{tmp}/syms.txt") if p[2] == comm}
ms = lambda samples: samples / 1.999 / gb
sender = lambda prefix: sum(v for (cpu, sym), v in s.items() if cpu == '001' and sym.startswith(prefix))
cs = [float(l.split(",")[0]) for l in open(f"{tmp}/cs.txt") if l.split(",")[0].replace(".", "").isdigit()]
print(f"{lab:14} n={n} {mb:7.1f} MB/s | receiver {ms(c.get(('000', comm), 0)):4.0f} ms/GB, copy out {ms(s.get(('000', '_copy_to_iter'), 0)):4.0f}"
      f" | senders {ms(c.get(('001', comm), 0)):4.0f} ms/GB, copy in {ms(s.get(('001', '_copy_from_iter'), 0)):4.0f},"
      f" user copy {ms(sender('__memmove')):4.0f}, finish_data {ms(sender('ulnet_core::transport::udp::conn::Connection::finish_data')):4.1f},"
      f" {(cs[0] if cs else 0) / (mb * 2):.2f} switches/MB", flush=True)
PY
