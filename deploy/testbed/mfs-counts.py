#!/usr/bin/env python3
"""MooseFS's master counters as one cumulative JSON object (moosefs.sh counts).

mfs-counts.py MASTER STATE_FILE [HOUR]: reads `mfscli -SMO` (each client session's
operation counters of the current hour, and of the last hour), adds what changed since the
previous call (kept in STATE_FILE) to a running total, and prints the total in the shape
of gluster.sh counts. HOUR (hours since the epoch) stands for the clock, for tests.

The rows name no session: a remount's new session shows with the same address and mount
point as the old one, which the master lists a while longer. So each row now is matched to
a row of the previous call: first one equal to it (a session that did nothing since, an
unmounted one among them), then one it has grown from; a row matched to none is a new
session, all of whose calls count. Across an hour, the rest of the hour that ended comes
from the last hour's rows, matched the same way, and the new hour's rows count whole.
"""
import json
import os
import subprocess
import sys
import time

OPS = ["STATFS", "GETATTR", "SETATTR", "LOOKUP", "MKDIR", "RMDIR", "SYMLINK", "READLINK",
       "MKNOD", "UNLINK", "RENAME", "LINK", "READDIR", "OPEN", "READ", "WRITE"]


def read(srv, mode):
    """The rows of `mfscli -SMO -m MODE` (0: the last hour, 1: the current one)."""
    out = subprocess.run(["mfscli", "-H", srv, "-SMO", "-m", str(mode)], check=True,
                         capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        f = line.split("\t")
        if len(f) == 3 + len(OPS) + 1 and f[0].startswith("active mounts"):
            rows.append([int(x) for x in f[3:3 + len(OPS)]])
    return rows


def grown(now, before):
    """The calls rows `now` made since rows `before` (both lists of counter rows)."""
    left = [list(b) for b in before]
    total = [0] * len(OPS)
    pending = []
    # Unchanged sessions first: an equal row is the same session, idle.
    for row in now:
        if row in left:
            left.remove(row)
        else:
            pending.append(row)
    # Then each row to the largest earlier row it has grown from; none: a new session.
    for row in sorted(pending, key=sum, reverse=True):
        olds = [b for b in left if all(a >= c for a, c in zip(row, b))]
        base = max(olds, key=sum) if olds else [0] * len(OPS)
        if olds:
            left.remove(base)
        total = [t + a - c for t, a, c in zip(total, row, base)]
    return total


def main():
    srv, state_file = sys.argv[1], sys.argv[2]
    fixed_hour = int(sys.argv[3]) if len(sys.argv) > 3 else None
    # The current hour's counters and the last hour's, read within one hour.
    while True:
        hour = fixed_hour if fixed_hour is not None else int(time.time()) // 3600
        last, cur = read(srv, 0), read(srv, 1)
        if fixed_hour is not None or int(time.time()) // 3600 == hour:
            break
    try:
        with open(state_file) as f:
            st = json.load(f)
        if st["hour"] == hour:
            d = grown(cur, st["seen"])
        elif st["hour"] == hour - 1:
            d = [a + b for a, b in zip(grown(last, st["seen"]), grown(cur, []))]
        else:
            d = grown(cur, [])
        st["total"] = [t + x for t, x in zip(st["total"], d)]
    except (OSError, ValueError, KeyError):
        st = {"total": grown(cur, [])}
    st["hour"], st["seen"] = hour, cur
    tmp = state_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump(st, f)
    os.replace(tmp, state_file)
    fops = {op: {"calls": n} for op, n in zip(OPS, st["total"]) if n}
    print(json.dumps({"fops": fops}, sort_keys=True))


main()
