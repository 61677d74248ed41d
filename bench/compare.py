#!/usr/bin/env python3
"""Side-by-side runs of `ulnet bench` and a peer, alternating, on this host.

Shared, noisy machines make single runs meaningless: each pair of commands is run
ROUNDS times, alternating ours and the peer's, and the medians are compared.

usage: bench/compare.py [--rounds N] [--markdown FILE] SPEC...
  SPEC = name|ulnet-args|peer-command|metric|goal
    metric: p50_us (lower is better) or msgs_per_s / mb_per_s (higher is better)
    goal:   e.g. "<=0.8" or ">=1.2" (ratio ours/peer)
"""
import argparse, json, shlex, statistics, subprocess, sys, os

HERE = os.path.dirname(os.path.abspath(__file__))
ULNET = os.environ.get("ULNET", os.path.join(HERE, "..", "target", "release", "ulnet"))


def run_json(cmd):
    out = subprocess.run(cmd, shell=True, check=True, capture_output=True, text=True).stdout
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if not lines:
        raise SystemExit(f"no JSON from: {cmd}\n{out}")
    return json.loads(lines[-1])


def fmt(values):
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--markdown")
    ap.add_argument("specs", nargs="+")
    a = ap.parse_args()
    rows = []
    for spec in a.specs:
        name, ours_args, peer_cmd, metric, goal = spec.split("|")
        ours_cmd = f"{shlex.quote(ULNET)} bench {ours_args} --json"
        ours, peer = [], []
        for _ in range(a.rounds):
            ours.append(run_json(ours_cmd)[metric])
            peer.append(run_json(peer_cmd)[metric])
        mo, mp = statistics.median(ours), statistics.median(peer)
        ratio = mo / mp
        op, bound = goal[:2], float(goal[2:])
        ok = ratio <= bound if op == "<=" else ratio >= bound
        rows.append((name, metric, mo, mp, ratio, goal, ok, ours_cmd, peer_cmd, ours, peer))
        print(f"{name:28} {metric:10} ulnet {mo:12.4g}  peer {mp:12.4g}  ratio {ratio:6.3f}  goal {goal:6}  {'PASS' if ok else 'MISS'}", flush=True)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("| benchmark | metric | ulnet (median) | peer (median) | ratio | goal | met |\n|---|---|---|---|---|---|---|\n")
            for (name, metric, mo, mp, ratio, goal, ok, *_rest) in rows:
                f.write(f"| {name} | {metric} | {mo:.4g} | {mp:.4g} | {ratio:.3f} | {goal} | {'yes' if ok else 'no'} |\n")
            f.write("\nCommands (each run alternately, medians over the rounds):\n\n")
            for (name, *_mid, ours_cmd, peer_cmd, ours, peer) in rows:
                f.write(f"- {name}: `{ours_cmd.replace(ULNET, 'ulnet')}` vs `{peer_cmd}`; ulnet runs {fmt(ours)}; peer runs {fmt(peer)}\n")
    sys.exit(0 if all(r[6] for r in rows) else 1)


if __name__ == "__main__":
    main()
