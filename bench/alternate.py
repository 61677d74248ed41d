#!/usr/bin/env python3
"""Runs several commands alternately (one round = each command once, in order) and compares
the medians of one JSON metric, each against the first command's.

Shared, noisy machines make single runs meaningless and make figures taken minutes apart
incomparable: variants run back to back, round after round, see the same machine.

usage: bench/alternate.py [--rounds N] [--metric p50_us] [--markdown FILE] [--title T]
                          NAME=COMMAND ...
  COMMAND runs in a shell and prints a JSON line holding METRIC (as `ulnet bench --json`).
"""
import argparse, statistics, sys

from compare import run_json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--metric", default="p50_us")
    ap.add_argument("--markdown")
    ap.add_argument("--title", default="")
    ap.add_argument("variants", nargs="+")
    a = ap.parse_args()
    variants = [v.split("=", 1) for v in a.variants]
    runs = {name: [] for name, _ in variants}
    for _ in range(a.rounds):
        for name, cmd in variants:
            runs[name].append(run_json(cmd)[a.metric])
    first = statistics.median(runs[variants[0][0]])
    lines = [f"| variant | {a.metric} median | vs {variants[0][0]} | runs |", "|---|---|---|---|"]
    for name, _ in variants:
        m = statistics.median(runs[name])
        lines.append(f"| {name} | {m:.4g} | {m / first:.3f} | {', '.join(f'{v:.4g}' for v in runs[name])} |")
    text = "\n".join(lines)
    print(text, flush=True)
    if a.markdown:
        with open(a.markdown, "a") as f:
            if a.title:
                f.write(f"\n{a.title}\n\n")
            f.write(text + "\n\nCommands:\n\n")
            for name, cmd in variants:
                f.write(f"- {name}: `{cmd}`\n")


if __name__ == "__main__":
    sys.exit(main())
