#!/usr/bin/env bash
# CPU time and thread context switches per update summed over 32 `ulnet node` processes
# (registry load: 16 clients, 64-byte values, 5 s), from /proc, and updates per log position
# (node n0's applied position before and after). Usage:
#   flock /work/bench.lock bench/registry-cost.sh target/release/ulnet
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib/registry-nodes.sh
BIN=$1; n=32; WORK=/var/tmp/ulnet-registry-bench-prof
rm -rf $WORK && mkdir -p $WORK
pids=()
start_registry_nodes "$BIN" "$n" 24000 "$WORK"
sample() { python3 - "${pids[@]}" <<'PY'
import sys, glob
cpu=0; cs=0
for p in sys.argv[1:]:
    f=open(f"/proc/{p}/stat").read().rsplit(")",1)[1].split()
    cpu+=int(f[11])+int(f[12])
    for t in glob.glob(f"/proc/{p}/task/*/status"):
        for l in open(t):
            if "ctxt_switches" in l: cs+=int(l.split()[1])
print(cpu, cs)
PY
}
# warm-up run (waits for members), then the measured one
$BIN registry load --connect "$registry_addrs" --clients 16 --value-bytes 64 --seconds 2 --wait-members $n --json >/dev/null 2>&1
applied() { $BIN registry status --connect 127.0.0.1:24000 --json 2>/dev/null | python3 -c 'import sys, json; print(json.load(sys.stdin)["applied"])'; }
a=$(sample); pa=$(applied)
out=$($BIN registry load --connect "$registry_addrs" --clients 16 --value-bytes 64 --seconds 5 --warmup 0 --json 2>/dev/null)
b=$(sample); pb=$(applied)
for p in "${pids[@]}"; do kill "$p"; done; wait 2>/dev/null || true
python3 - "$a" "$b" "$out" "$pa" "$pb" <<'PY'
import sys, json
a=list(map(int,sys.argv[1].split())); b=list(map(int,sys.argv[2].split())); r=json.loads(sys.argv[3])
ups=r["updates_per_s"]; secs=r.get("seconds",5); total=r["ops"]
positions=int(sys.argv[5])-int(sys.argv[4])
print(f"updates/s {ups:.0f}  cpu ms/update {(b[0]-a[0])*10/total:.3f}  ctxt switches/update {(b[1]-a[1])/total:.1f}"
      f"  updates/position {total/max(positions,1):.1f}")
PY
