"""Sums the `gup_timing` log lines of a registry-timing.sh run (see there)."""
import re, sys, pathlib

w, nodes, clients = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ansi = re.compile(r"\x1b\[[0-9;]*m")
field = re.compile(r"(\w+) n=(\d+) mean=([\d.]+)ms \[([^\]]*)\]")

def merge(acc, name, n, mean, buckets):
    a = acc.setdefault(name, {"n": 0, "sum": 0.0, "b": {}})
    a["n"] += n
    a["sum"] += n * mean
    for tok in buckets.split():
        k, v = tok.rsplit(":", 1)
        a["b"][k] = a["b"].get(k, 0) + int(v)

def show(acc, names):
    for name in names:
        a = acc.get(name)
        if not a or not a["n"]:
            continue
        order = sorted(a["b"], key=lambda k: float(k.lstrip("<>=")) + (1e6 if k.startswith(">") else 0))
        print(f"    {name:14} n={a['n']:6} mean={a['sum']/a['n']:6.2f} ms  " + " ".join(f"{k}:{a['b'][k]}" for k in order))

locker, members, owed, hole = {}, {}, 0, 0
who = None
for i in range(nodes):
    for line in (w / f"n{i}.log").read_text(errors="replace").splitlines():
        line = ansi.sub("", line)
        if "gup_timing" not in line:
            continue
        is_locker = "locker=true" in line
        if is_locker:
            who = i
            m = re.search(r"quorum_by_owed (\d+)", line)
            owed += int(m.group(1)) if m else 0
        m = re.search(r"own_over_hole (\d+)", line)
        hole += int(m.group(1)) if m else 0
        for name, n, mean, b in field.findall(line):
            if name == "own_apply":
                merge(members, name, int(n), float(mean), b)
            elif name == "ack_delay":
                merge(members, f"ack_delay{'(locker)' if is_locker else ('(sender)' if i < clients else '')}", int(n), float(mean), b)
            elif is_locker:
                merge(locker, name, int(n), float(mean), b)
print(f"  locker n{who} ({'hosts a client' if who is not None and who < clients else 'no client'}), quorums completed by an owed member: {owed}, senders' grants over a hole: {hole}")
show(locker, ["commit", "first_ack", "quorum_ack", "gap", "sender_return", "hold"])
show(members, ["own_apply", "ack_delay(locker)", "ack_delay(sender)", "ack_delay"])
