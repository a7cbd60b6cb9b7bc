#!/usr/bin/env python3
"""MooseFS's master counters as one cumulative JSON object (moosefs.sh counts).

mfs-counts.py MASTER STATE_FILE [HOUR]: reads `mfscli -SMO` (each client mount's operation
counters of the current hour, and of the last hour), adds what changed since the previous
call (kept in STATE_FILE) to a running total, and prints the total in the shape of
gluster.sh counts. A mount whose counters went back is a new mount (a remount): all of its
count. Across an hour, the rest of the hour that ended is taken from the last hour's
counters. HOUR (hours since the epoch) stands for the clock, for tests.
"""
import json, os, subprocess, sys, time
srv, state_file = sys.argv[1], sys.argv[2]
fixed_hour = int(sys.argv[3]) if len(sys.argv) > 3 else None
OPS = ["STATFS", "GETATTR", "SETATTR", "LOOKUP", "MKDIR", "RMDIR", "SYMLINK", "READLINK",
       "MKNOD", "UNLINK", "RENAME", "LINK", "READDIR", "OPEN", "READ", "WRITE"]
def read(mode):
    out = subprocess.run(["mfscli", "-H", srv, "-SMO", "-m", str(mode)], check=True,
                         capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        f = line.split("	")
        if len(f) == 3 + len(OPS) + 1 and f[0].startswith("active mounts"):
            rows[f[1] + " " + f[2]] = [int(x) for x in f[3:3 + len(OPS)]]
    return rows
# The current hour's counters and the last hour's, read within one hour.
while True:
    hour = fixed_hour if fixed_hour is not None else int(time.time()) // 3600
    last, cur = read(0), read(1)
    if fixed_hour is not None or int(time.time()) // 3600 == hour:
        break
try:
    st = json.load(open(state_file))
except (OSError, ValueError):
    st = {"hour": hour, "seen": {}, "total": [0] * len(OPS)}
    st["seen"] = cur
    st["total"] = [sum(v[i] for v in cur.values()) for i in range(len(OPS))]
def since(now, before):
    # A mount's counters that went back are a new mount's (a remount): all of them count.
    if before is None or any(a < b for a, b in zip(now, before)):
        return now
    return [a - b for a, b in zip(now, before)]
zero = [0] * len(OPS)
for key, now in cur.items():
    if st["hour"] == hour:
        d = since(now, st["seen"].get(key))
    elif st["hour"] == hour - 1:
        # The rest of the hour that ended, then this hour's.
        d = [a + b for a, b in zip(since(last.get(key, zero), st["seen"].get(key)), now)]
    else:
        d = now
    st["total"] = [t + x for t, x in zip(st["total"], d)]
if st["hour"] == hour - 1:
    # A mount gone before the hour ended, counted up to its end.
    for key, before in st["seen"].items():
        if key not in cur and key in last:
            st["total"] = [t + x for t, x in zip(st["total"], since(last[key], before))]
st["hour"], st["seen"] = hour, cur
tmp = state_file + ".tmp"
json.dump(st, open(tmp, "w"))
os.replace(tmp, state_file)
print(json.dumps({"fops": {op: {"calls": n} for op, n in zip(OPS, st["total"]) if n}}, sort_keys=True))
