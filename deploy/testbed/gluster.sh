#!/usr/bin/env bash
# GlusterFS 10: a replica-3 volume of three bricks on this host, glusterd kept private
# (working, run and log directories under the state dir), and a FUSE client mount. The
# server's address is 10.251.0.1 on this host's loopback device: the CLI refuses
# 127.0.0.1/localhost in brick names, and the test hosts (hosts.sh, network namespaces
# joined by veth pairs) reach it through their link, so each can mount the volume with a
# client of its own (`mount-on HOST`). The bricks live on
# the server's disk (lib.sh, server_disk: one disk for the three, as one server's array);
# on `hdd` the bricks' delay-gen translator delays every fsync and fsyncdir HDD_FSYNC_MS.
# The volume's profile (the bricks' own per-call counts) is on from the start: `counts`
# prints it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
STATE=$(state_dir gluster)
ADDR=10.251.0.1
VOL=ccfsvol
MNT=$STATE/mnt
G=(gluster --glusterd-sock=/var/run/glusterd.socket --mode=script)

up() {
  need_packages glusterfs-server glusterfs-client
  check_server_disk
  if mountpoint -q "$MNT" 2>/dev/null; then
    echo "$MNT"
    return 0
  fi
  mkdir -p "$STATE"/{wd,run,log,mnt}
  ip addr show dev lo | grep -q " $ADDR/" || ip addr add "$ADDR/32" dev lo
  mount_server_disk "$STATE/bricks" 8G
  mkdir -p "$STATE"/bricks/{b1,b2,b3}
  if [ ! -f "$STATE/glusterd.pid" ] || ! kill -0 "$(cat "$STATE/glusterd.pid")" 2>/dev/null; then
    glusterd --xlator-option "management.working-directory=$STATE/wd" \
      --xlator-option "management.run-directory=$STATE/run" \
      --xlator-option "management.logging-directory=$STATE/log" \
      --xlator-option "management.transport.socket.bind-address=$ADDR" \
      -p "$STATE/glusterd.pid" -l "$STATE/log/glusterd.log"
    wait_for 30 "${G[@]}" volume list || { echo "testbed: glusterd did not answer; see $STATE/log" >&2; exit 1; }
  fi
  record "$(cat "$STATE/glusterd.pid")"
  if ! "${G[@]}" volume info "$VOL" >/dev/null 2>&1; then
    "${G[@]}" volume create "$VOL" replica 3 "$ADDR:$STATE/bricks/b1" "$ADDR:$STATE/bricks/b2" "$ADDR:$STATE/bricks/b3" force >/dev/null
  fi
  if [ "$(server_disk)" = hdd ]; then
    # The value names the translator the delays go above: the bricks' posix, their disk.
    "${G[@]}" volume set "$VOL" delay-gen posix >/dev/null
    "${G[@]}" volume set "$VOL" delay-gen.enable fsync,fsyncdir >/dev/null
    "${G[@]}" volume set "$VOL" delay-gen.delay-percentage 100 >/dev/null
    "${G[@]}" volume set "$VOL" delay-gen.delay-duration $((HDD_FSYNC_MS * 1000)) >/dev/null
  fi
  "${G[@]}" volume start "$VOL" force >/dev/null
  "${G[@]}" volume profile "$VOL" start >/dev/null 2>&1 || true
  # Every process glusterd started for the volume wrote a pid file below the run directory.
  wait_for 30 sh -c "ls '$STATE'/run/vols/$VOL/*.pid | wc -l | grep -q 3"
  for f in "$STATE"/run/vols/"$VOL"/*.pid "$STATE"/run/shd/*/*.pid "$STATE"/run/*.pid; do
    [ -f "$f" ] && record "$(cat "$f")"
  done
  glusterfs --volfile-server="$ADDR" --volfile-id="$VOL" --log-file="$STATE/log/client.log" \
    -p "$STATE/client.pid" "$MNT"
  wait_for 30 mountpoint -q "$MNT" || { echo "testbed: the client did not mount; see $STATE/log/client.log" >&2; exit 1; }
  record "$(cat "$STATE/client.pid")"
  # The self-heal daemon is started lazily: record it if it is there by now.
  for f in "$STATE"/run/shd/*/*.pid "$STATE"/run/*.pid; do [ -f "$f" ] && record "$(cat "$f")"; done
  echo "$MNT"
}

# The FUSE client mounted afresh (a cold client: no cached inodes, pages or attributes),
# as loadgen login-storm --remount asks before every run; prints the mount point.
remount() {
  mountpoint -q "$MNT" || { echo "testbed: gluster is not up (deploy/testbed/up gluster)" >&2; exit 1; }
  umount "$MNT" 2>/dev/null || { echo "testbed: $MNT is busy; cannot remount" >&2; exit 1; }
  # The old client, gone with its mount or not (it would hold its pid file locked).
  stop_client "$STATE/client.pid" "$MNT"
  glusterfs --volfile-server="$ADDR" --volfile-id="$VOL" --log-file="$STATE/log/client.log" \
    -p "$STATE/client.pid" "$MNT"
  wait_for 30 mountpoint -q "$MNT" || { echo "testbed: the client did not mount again; see $STATE/log/client.log" >&2; exit 1; }
  record "$(cat "$STATE/client.pid")"
  echo "$MNT"
}

# mount-on HOST: the volume mounted by a client of HOST's own (test host HOST of hosts.sh:
# the client runs in that host's network namespace and reaches the server over its link),
# at STATE/hosts/HOST/mnt, its pid in STATE/hosts/HOST/client.pid; prints the mount point.
# Mounted already, it is left as it is. remount-on HOST: the same afresh (a cold client).
mount-on() {
  local host=${1:?give a test host, for instance h1}
  local ns dir=$STATE/hosts/$host
  ns=$(test_host_ns "$host")
  mountpoint -q "$MNT" || { echo "testbed: gluster is not up (deploy/testbed/up gluster)" >&2; exit 1; }
  if ! mountpoint -q "$dir/mnt" 2>/dev/null; then
    ready_mount_point "$dir"
    nsenter --net="$ns" glusterfs --volfile-server="$ADDR" --volfile-id="$VOL" \
      --log-file="$dir/client.log" -p "$dir/client.pid" "$dir/mnt"
    wait_for 30 mountpoint -q "$dir/mnt" || { echo "testbed: $host's client did not mount; see $dir/client.log" >&2; exit 1; }
    record "$(cat "$dir/client.pid")"
  fi
  echo "$dir/mnt"
}

# The server's processes (glusterd, the bricks, the self-heal daemon), one pid a line:
# what a study measures the server's CPU by (no client, this host's or a test host's).
server-pids() {
  [ -f "$STATE/glusterd.pid" ] || { echo "testbed: gluster is not up (deploy/testbed/up gluster)" >&2; exit 1; }
  { cat "$STATE/glusterd.pid"
    for f in "$STATE"/run/vols/*/*.pid "$STATE"/run/shd/*/*.pid; do [ -f "$f" ] && cat "$f"; done
  } | sort -u
}

# What the bricks served since the volume started, summed over the three bricks, as one
# JSON object: {"fops": {"LOOKUP": {"calls": N, "latency_us": TOTAL}, ...},
# "bytes_read": N, "bytes_written": N} (`gluster volume profile VOL info cumulative`; a
# replicated write is served by every brick, so it counts three times). A run's share is
# the difference of two of these.
counts() {
  "${G[@]}" volume profile "$VOL" info cumulative | python3 -c '
import json, re, sys
fops, read, written = {}, 0, 0
# Latencies are printed in ns (GlusterFS 10) or us (older): kept in us.
row = re.compile(r"^\s*[\d.]+\s+([\d.]+) (ns|us|ms)\s+[\d.]+ \w+\s+[\d.]+ \w+\s+(\d+)\s+([A-Z_]+)\s*$")
unit = {"ns": 1e-3, "us": 1.0, "ms": 1e3}
for line in sys.stdin:
    m = row.match(line)
    if m:
        avg = float(m.group(1)) * unit[m.group(2)]
        calls, fop = int(m.group(3)), m.group(4)
        f = fops.setdefault(fop, {"calls": 0, "latency_us": 0.0})
        f["calls"] += calls
        f["latency_us"] += avg * calls
        continue
    m = re.match(r"^\s*Data (Read|Written): (\d+) bytes", line)
    if m:
        if m.group(1) == "Read":
            read += int(m.group(2))
        else:
            written += int(m.group(2))
print(json.dumps({"fops": fops, "bytes_read": read, "bytes_written": written}, sort_keys=True))
'
}

down() {
  [ -d "$STATE" ] || return 0
  unmount_dir "$MNT"
  for d in "$STATE"/hosts/*/mnt; do [ -d "$d" ] && unmount_dir "$d"; done
  # Processes glusterd started after `up` recorded (self-heal) are still listed in pid files.
  for f in "$STATE"/run/shd/*/*.pid "$STATE"/run/vols/*/*.pid; do [ -f "$f" ] && record "$(cat "$f")"; done
  stop_recorded
  unmount_server_disk "$STATE/bricks"
  rm -rf "$STATE"
  ip addr del "$ADDR/32" dev lo 2>/dev/null || true
}

"$@"
