#!/usr/bin/env python3
"""A/B probe of `ulnet sort` builds on one input (issue 8): builds take turns, round after round.

usage: bench/sort-ab.py [--rounds N] --input FILE [--nodes N] [--memory SIZE] [--temp-dir DIR]
                        LABEL=BINARY ...

Takes /work/bench.lock itself, once per sort, if it exists (do not wrap it in flock). Each
round runs every build once, the order reversed every other round; before each sort the
output (FILE.ab.out) is removed and `sync` run (not timed), as bench/sort.py does. Prints, per
run, the wall time from the outside, the report's phases (slowest node) and the nodes' CPU,
then per build the medians and the fastest run. For the external case with `cp` beside it,
see bench/sort-external-ab.py.
"""
import argparse, json, os, statistics, subprocess, time

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=8)
ap.add_argument("--input", required=True)
ap.add_argument("--nodes", type=int, default=2)
ap.add_argument("--memory")
ap.add_argument("--temp-dir")
ap.add_argument("builds", nargs="+")
a = ap.parse_args()
builds = [b.split("=", 1) for b in a.builds]
out = a.input + ".ab.out"
extra = (["--memory", a.memory] if a.memory else []) + (["--temp-dir", a.temp_dir] if a.temp_dir else [])
lock = ["flock", "/work/bench.lock"] if os.path.exists("/work/bench.lock") else []
res = {label: [] for label, _ in builds}
for r in range(a.rounds):
    for label, binary in (builds if r % 2 == 0 else builds[::-1]):
        if os.path.exists(out):
            os.remove(out)
        subprocess.run(["sync"], check=True)
        cmd = [*lock, binary, "sort", "--input", a.input, "--output", out, "--nodes", str(a.nodes), "--json", *extra]
        t = time.perf_counter()
        stdout = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        wall = time.perf_counter() - t
        rep = json.loads(stdout.strip().splitlines()[-1])
        nodes = rep["per_node"]
        row = dict(wall=wall, p1=rep["read_distribute_s"], p2=rep["sort_s"],
                   cpu=sum(n["usage"]["user_s"] + n["usage"]["sys_s"] for n in nodes))
        res[label].append(row)
        print(f"round {r + 1} {label:10} wall {wall:.3f} p1 {row['p1']:.3f} p2 {row['p2']:.3f} "
              f"cpu {row['cpu']:.2f} mode {rep['mode']}", flush=True)
if os.path.exists(out):
    os.remove(out)
for label, rows in res.items():
    med = {k: statistics.median(x[k] for x in rows) for k in ("wall", "p1", "p2", "cpu")}
    print(f"MEDIAN {label:10} wall {med['wall']:.3f} p1 {med['p1']:.3f} p2 {med['p2']:.3f} cpu {med['cpu']:.2f} "
          f"fastest {min(x['wall'] for x in rows):.3f}")
