#!/usr/bin/env python3
"""Membership figures: ulnet node against HashiCorp memberlist, side by side in one run.

For each profile (local, lan) and each system: 32 nodes on loopback, then
  - steady-state membership datagrams per node per second (10 s window),
  - join of a 33rd node until all 33 agree,
  - kill -9 of one node until all survivors agree on a view without it.
ulnet times come from the nodes' --events-json files (each view event has ts_ms), so the
figure is "the last survivor installed the view", not a polling artefact. memberlist runs
in one Go process (bench/peers/memberlist) and reports the same three figures.

usage: bench/membership.py [--profiles local,lan] [--soak SECONDS] [--markdown FILE]
  --profiles: which profiles to compare (default local,lan; "" for none, e.g. a soak alone).
  --soak: additionally run 32 ulnet nodes (local profile) for SECONDS with 5% of
          loopback UDP datagrams to their ports dropped by iptables (statistic match),
          and count deaths (must be zero).
"""
import argparse, json, os, signal, subprocess, sys, tempfile, time, urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ULNET = os.environ.get("ULNET", os.path.join(HERE, "..", "target", "release", "ulnet"))
MEMBERLIST = os.environ.get("MEMBERLIST_REF", "/tmp/memberlist-ref")
N = 32


def events(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return out


class Cluster:
    def __init__(self, profile, base_port, workdir):
        self.profile, self.base, self.dir = profile, base_port, workdir
        self.procs = {}
        self.secret = os.path.join(workdir, "secret")
        with open(os.open(self.secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write("bench-secret\n")

    def addr(self, i):
        return f"127.0.0.1:{self.base + i}"

    def ev(self, i):
        return os.path.join(self.dir, f"{self.profile}-p{i}.jsonl")

    def start(self, i):
        cmd = [ULNET, "node", "--name", f"p{i}", "--listen", self.addr(i), "--secret-file", self.secret,
               "--events-json", self.ev(i), "--profile", self.profile,
               "--metrics", f"127.0.0.1:{self.base + 500 + i}"]
        if i > 0:
            cmd += ["--seeds", ",".join(self.addr(j) for j in sorted({0, i // 2, i - 1}))]
        self.procs[i] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def last_view(self, i):
        views = [e for e in events(self.ev(i)) if e["kind"] == "view"]
        return views[-1] if views else None

    def wait_agreed(self, nodes, pred, limit):
        deadline = time.time() + limit
        while time.time() < deadline:
            views = [self.last_view(i) for i in nodes]
            if all(v is not None and pred(v) for v in views) and len({v["view"] for v in views}) == 1:
                return views
            time.sleep(0.02)
        raise SystemExit(f"{self.profile}: nodes did not agree within {limit}s")

    def first_ts(self, i, pred):
        for e in events(self.ev(i)):
            if e["kind"] == "view" and pred(e):
                return e["ts_ms"] / 1000.0
        return None

    def packets_sent(self):
        total = 0
        for i in range(N):
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.base + 500 + i}/metrics", timeout=2).read().decode()
            for line in text.splitlines():
                if line.startswith("ulnet_membership_packets_sent_total "):
                    total += int(line.split()[1])
        return total

    def stop(self):
        for p in self.procs.values():
            p.kill()
            p.wait()


def run_ulnet(profile, base, workdir):
    c = Cluster(profile, base, workdir)
    try:
        for i in range(N):
            c.start(i)
        c.wait_agreed(range(N), lambda v: len(v["members"]) == N, 60)
        time.sleep(2)
        window = 10
        a = c.packets_sent()
        time.sleep(window)
        b = c.packets_sent()
        pps = (b - a) / window / N
        t0 = time.time()
        c.start(N)
        c.wait_agreed(range(N + 1), lambda v: "p32" in v["members"], 30)
        join = max(c.first_ts(i, lambda v: "p32" in v["members"]) for i in range(N + 1)) - t0
        time.sleep(2)
        victim = N // 2
        t1 = time.time()
        c.procs[victim].send_signal(signal.SIGKILL)
        c.procs[victim].wait()
        survivors = [i for i in range(N + 1) if i != victim]
        name = f"p{victim}"
        c.wait_agreed(survivors, lambda v: name not in v["members"], 120)
        kill = max(c.first_ts(i, lambda v: name not in v["members"] and v["view"] > 0 and len(v["members"]) == N) for i in survivors) - t1
        return {"peer": "ulnet", "profile": profile, "nodes": N, "packets_per_node_s": pps, "join_s": join, "kill_to_view_s": kill}
    finally:
        c.stop()


def run_memberlist(profile, base):
    out = subprocess.run([MEMBERLIST, "-nodes", str(N), "-profile", profile, "-port", str(base)],
                         check=True, capture_output=True, text=True, timeout=400).stdout
    return json.loads([l for l in out.splitlines() if l.startswith("{")][-1])


def soak(seconds, base, workdir):
    c = Cluster("local", base, workdir)
    rule = ["INPUT", "-i", "lo", "-p", "udp", "--dport", f"{base}:{base + N}", "-m", "statistic",
            "--mode", "random", "--probability", "0.05", "-j", "DROP"]
    try:
        for i in range(N):
            c.start(i)
        views = c.wait_agreed(range(N), lambda v: len(v["members"]) == N, 60)
        formed = views[0]["view"]
        subprocess.run(["iptables", "-I"] + rule, check=True)
        time.sleep(seconds)
        subprocess.run(["iptables", "-D"] + rule, check=True)
        kinds = {}
        for i in range(N):
            for e in events(c.ev(i)):
                kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
        later = [c.last_view(i)["view"] for i in range(N)]
        deaths = kinds.get("dead", 0) + kinds.get("removed", 0) + kinds.get("no_quorum", 0)
        return {"seconds": seconds, "loss": 0.05, "nodes": N, "formed_view": formed, "final_views": sorted(set(later)),
                "deaths": deaths, "suspect_events": kinds.get("suspect", 0)}
    finally:
        subprocess.run(["iptables", "-D"] + rule, capture_output=True)
        c.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--soak", type=int, default=0)
    ap.add_argument("--markdown")
    ap.add_argument("--profiles", default="local,lan")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ulnet-membership-")
    rows = []
    for k, profile in enumerate(p for p in a.profiles.split(",") if p):
        ours = run_ulnet(profile, 21000 + 1000 * k, work)
        print(json.dumps(ours), flush=True)
        peer = run_memberlist(profile, 27000 + 100 * k)
        print(json.dumps(peer), flush=True)
        rows.append((profile, ours, peer))
    soak_dir = os.path.join(work, "soak")
    os.makedirs(soak_dir, exist_ok=True)
    soak_result = soak(a.soak, 25000, soak_dir) if a.soak else None
    if soak_result:
        print(json.dumps(soak_result), flush=True)
    lines = ["| profile | figure | ulnet | memberlist | ratio | goal | met |", "|---|---|---|---|---|---|---|"]
    for profile, o, p in rows:
        for key, label, goal in [("kill_to_view_s", "kill -9 of 1 of 32 → agreed view (s)", None),
                                 ("join_s", "join of the 33rd → all 33 agree (s)", 0.5),
                                 ("packets_per_node_s", "steady-state datagrams / node / s", None)]:
            ratio = o[key] / p[key] if p[key] else float("nan")
            if key == "kill_to_view_s":
                g = "≤ 1.0 s" if profile == "local" else "≤ 0.5 × memberlist"
                met = o[key] <= 1.0 if profile == "local" else ratio <= 0.5
            elif key == "join_s":
                g, met = "≤ 0.5 s", o[key] <= 0.5
            else:
                g = "≤ 15" if profile == "local" else "(reported)"
                met = o[key] <= 15 if profile == "local" else True
            lines.append(f"| {profile} | {label} | {o[key]:.3f} | {p[key]:.3f} | {ratio:.2f} | {g} | {'yes' if met else 'no'} |")
    if soak_result:
        lines.append("")
        lines.append(f"Soak: {soak_result['nodes']} ulnet nodes (local), {soak_result['seconds']} s at 5% loss "
                     f"(iptables statistic DROP on their UDP ports): {soak_result['deaths']} deaths, "
                     f"{soak_result['suspect_events']} suspect events (false suspicions resolved by regroup), "
                     f"views formed {soak_result['formed_view']}, final {soak_result['final_views']}.")
    table = "\n".join(lines)
    print(table)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
