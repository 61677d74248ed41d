#!/usr/bin/env python3
"""Runs several commands alternately (one round = each command once, in order) and compares
the medians of one JSON metric, each against the first command's, and the median of the
per-round ratios (each run against the first command's run of the same round: on a guest whose
host moves its CPUs, runs of one round share a placement that runs of other rounds may not).

Shared, noisy machines make single runs meaningless and make figures taken minutes apart
incomparable: variants run back to back, round after round, see the same machine.

usage: bench/alternate.py [--rounds N] [--metric p50_us[,avg_us...]] [--markdown FILE] [--title T]
                          NAME=COMMAND ...
  COMMAND runs in a shell and prints a JSON line holding METRIC (as `ulnet bench --json`).
"""
import argparse, statistics, sys

from compare import run_json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--metric", default="p50_us", help="one JSON field, or several separated by commas")
    ap.add_argument("--markdown")
    ap.add_argument("--title", default="")
    ap.add_argument("variants", nargs="+")
    a = ap.parse_args()
    variants = [v.split("=", 1) for v in a.variants]
    metrics = a.metric.split(",")
    runs = {(name, m): [] for name, _ in variants for m in metrics}
    for _ in range(a.rounds):
        for name, cmd in variants:
            report = run_json(cmd)
            for m in metrics:
                runs[(name, m)].append(report[m])
    tables = []
    for metric in metrics:
        base = runs[(variants[0][0], metric)]
        first = statistics.median(base)
        lines = [
            f"| variant | {metric} median | vs {variants[0][0]} | per-round ratio: median (quartiles) | runs |",
            "|---|---|---|---|---|",
        ]
        for name, _ in variants:
            values = runs[(name, metric)]
            m = statistics.median(values)
            ratios = sorted(v / b for v, b in zip(values, base))
            q = lambda p: ratios[round((len(ratios) - 1) * p)]
            paired = f"{statistics.median(ratios):.3f} ({q(0.25):.3f}–{q(0.75):.3f})"
            lines.append(f"| {name} | {m:.4g} | {m / first:.3f} | {paired} | {', '.join(f'{v:.4g}' for v in values)} |")
        tables.append("\n".join(lines))
    text = "\n\n".join(tables)
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
