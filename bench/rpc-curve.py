#!/usr/bin/env python3
"""RPC latency curve and call rate across message sizes, 16 B - 64 KiB.

Runs `ulnet bench rpc-lat` and `ulnet bench rpc-rate` for each size and transport and
writes bench/results/rpc-curve.md (table) and bench/results/rpc-curve.svg (plot).
usage: bench/rpc-curve.py [--transports shm,tcp] [--iters N]
"""
import argparse, json, math, os, subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ULNET = os.environ.get("ULNET", os.path.join(HERE, "..", "target", "release", "ulnet"))
SIZES = [16, 64, 128, 256, 1024, 4096, 16384, 65536]


def bench(test, transport, size, iters):
    cmd = [ULNET, "bench", test, "--transport", transport, "--size", str(size), "--iters", str(iters), "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def svg(series, path):
    w, h, left, bottom, top, right = 720, 420, 70, 50, 30, 150
    xs = [math.log2(s) for s in SIZES]
    ys = [v for pts in series.values() for (_, v) in pts]
    ymax = max(ys) * 1.1
    def px(s):
        return left + (math.log2(s) - xs[0]) / (xs[-1] - xs[0]) * (w - left - right)
    def py(v):
        return h - bottom - v / ymax * (h - top - bottom)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{w/2}" y="18" text-anchor="middle" font-size="14">ulnet RPC one-way latency (p50) by message size</text>',
             f'<line x1="{left}" y1="{h-bottom}" x2="{w-right}" y2="{h-bottom}" stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h-bottom}" stroke="black"/>',
             f'<text x="{(left + w - right)/2}" y="{h-12}" text-anchor="middle">payload bytes (log scale)</text>',
             f'<text x="16" y="{h/2}" text-anchor="middle" transform="rotate(-90 16 {h/2})">microseconds</text>']
    for s in SIZES:
        parts.append(f'<text x="{px(s)}" y="{h-bottom+16}" text-anchor="middle">{s if s < 1024 else str(s//1024)+"K"}</text>')
    for i in range(6):
        v = ymax * i / 5
        parts.append(f'<text x="{left-6}" y="{py(v)+4}" text-anchor="end">{v:.2f}</text>')
        parts.append(f'<line x1="{left}" y1="{py(v)}" x2="{w-right}" y2="{py(v)}" stroke="#ddd"/>')
    for k, (name, pts) in enumerate(series.items()):
        c = colors[k % len(colors)]
        d = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in pts)
        parts.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"/>')
        for s, v in pts:
            parts.append(f'<circle cx="{px(s):.1f}" cy="{py(v):.1f}" r="3" fill="{c}"/>')
        parts.append(f'<text x="{w-right+10}" y="{top+20+18*k}" fill="{c}">{name}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--iters", type=int, default=20000)
    a = ap.parse_args()
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    rows, series = [], {}
    for t in a.transports.split(","):
        for s in SIZES:
            lat = bench("rpc-lat", t, s, a.iters)
            rate = bench("rpc-rate", t, s, a.iters * 10)
            rows.append((t, s, lat["p50_us"], lat["p99_us"], rate["msgs_per_s"], rate["mb_per_s"]))
            series.setdefault(f"rpc-lat {t}", []).append((s, lat["p50_us"]))
            print(f"{t} {s:>6} B  p50 {lat['p50_us']:.3f} us  p99 {lat['p99_us']:.3f} us  {rate['msgs_per_s']:.0f} calls/s", flush=True)
    with open(os.path.join(HERE, "results", "rpc-curve.md"), "w") as f:
        f.write("| transport | payload B | p50 us (one-way) | p99 us | calls/s (32 outstanding) | MB/s |\n|---|---|---|---|---|---|\n")
        for t, s, p50, p99, r, mb in rows:
            f.write(f"| {t} | {s} | {p50:.3f} | {p99:.3f} | {r:,.0f} | {mb:.1f} |\n")
    svg(series, os.path.join(HERE, "results", "rpc-curve.svg"))


if __name__ == "__main__":
    main()
