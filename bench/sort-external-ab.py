#!/usr/bin/env python3
"""A/B probe of the external sort (issue 8): 4 x 10^7 records, 2 nodes x 512 MiB.

usage: bench/sort-external-ab.py [--rounds N] [--dir DIR] [--cold] [--floor PROGRAM] LABEL=BINARY ...

Takes /work/bench.lock itself, once per run (do not wrap it in flock). DIR (default
/var/tmp/sortx) must hold ext.in (`ulnet gensort 40000000 DIR/ext.in`). Each round runs
every build once, the order reversed every other round; before each sort it copies the
input with `cp` and removes the copy, as bench/sort.py does (the sort starts on the memory
that copy freed), and reports the `cp` time beside the sort's. With --cold, it sleeps 10 s
before the `cp` and again before the sort, so that the sort starts on memory the VM has
handed back to its host (see BENCHMARKS.md, issue 8). Prints wall time, the slowest node's
phases, the nodes' CPU, peak RSS and temporary bytes per run, then medians.

With --floor, each round also runs PROGRAM, bench/external-floor.c built (`gcc -O2 -pthread
-o PROGRAM bench/external-floor.c`), as the build labelled "floor": the same two passes of
I/O with the sorts' resident share (the first build's, from its first run; 668 MiB before
that) and no sorting, under the same protocol.
"""
import argparse, json, os, statistics, subprocess

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=4)
ap.add_argument("--dir", default="/var/tmp/sortx")
ap.add_argument("--cold", action="store_true")
ap.add_argument("--floor")
ap.add_argument("builds", nargs="+")
a = ap.parse_args()
d = a.dir
builds = [b.split("=", 1) for b in a.builds]
if a.floor:
    builds.append(["floor", a.floor])
resident_mib = 668
res = {label: [] for label, _ in builds}
pause = "sleep 10; " if a.cold else ""
for r in range(a.rounds):
    for label, binary in (builds if r % 2 == 0 else builds[::-1]):
        for f in ("ext.out", "ext.cp"):
            if os.path.exists(f"{d}/{f}"):
                os.remove(f"{d}/{f}")
        if label == "floor":
            run = f"{binary} {d}/ext.in {d} {d}/ext.out {resident_mib}"
        else:
            run = (f"{binary} sort --input {d}/ext.in --output {d}/ext.out --nodes 2 --memory 512MiB "
                   f"--temp-dir {d} --json")
        cmd = (f"{pause}t=$(date +%s.%N); cp {d}/ext.in {d}/ext.cp; c=$(date +%s.%N); rm {d}/ext.cp; {pause}"
               f"s=$(date +%s.%N); {run}; e=$(date +%s.%N); echo TIMES $c $t $e $s")
        out = subprocess.run(["flock", "/work/bench.lock", "bash", "-c", cmd], capture_output=True, text=True,
                             check=True).stdout
        c, t, e, s = map(float, [l for l in out.splitlines() if l.startswith("TIMES")][0].split()[1:])
        rep = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
        if label == "floor":
            row = dict(cp=c - t, wall=e - s, p1=rep["pass1_s"], p2=rep["pass2_s"], user=rep["user_s"],
                       sys=rep["sys_s"], rss=rep["max_rss_kib"] / 1024, temp=rep["temp_bytes"] / 1e9,
                       load=os.getloadavg()[0])
        else:
            nodes = rep["per_node"]
            row = dict(cp=c - t, wall=e - s, p1=rep["read_distribute_s"], p2=rep["sort_s"],
                       user=sum(n["usage"]["user_s"] for n in nodes), sys=sum(n["usage"]["sys_s"] for n in nodes),
                       rss=max(n["usage"]["max_rss_kib"] for n in nodes) / 1024,
                       temp=sum(n["temp_bytes"] for n in nodes) / 1e9, load=os.getloadavg()[0])
            if label == builds[0][0] and not res[label]:
                resident_mib = int((rep["bytes"] - sum(n["temp_bytes"] for n in nodes)) / 2**20)
        res[label].append(row)
        print(f"round {r + 1} {label:8} cp {row['cp']:.2f} sort {row['wall']:.2f} ratio {row['wall'] / row['cp']:.2f} "
              f"p1 {row['p1']:.2f} p2 {row['p2']:.2f} cpu {row['user']:.2f}+{row['sys']:.2f} "
              f"rss {row['rss']:.0f} MiB temp {row['temp']:.2f} GB load {row['load']:.1f}", flush=True)
for label, rows in res.items():
    def med(k):
        return statistics.median(x[k] for x in rows)
    print(f"MEDIAN {label:8} sort {med('wall'):.2f} cp {med('cp'):.2f} "
          f"ratio {statistics.median(x['wall'] / x['cp'] for x in rows):.2f} p1 {med('p1'):.2f} p2 {med('p2'):.2f} "
          f"cpu {med('user'):.2f}+{med('sys'):.2f}")
