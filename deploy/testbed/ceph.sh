#!/usr/bin/env bash
# CephFS (Ceph 16): one monitor, one manager, one OSD on memstore (RAM, 2 GiB), one MDS,
# cephx off, pools of size 1, and the ceph-fuse client; all on 10.251.0.3, an address on
# this host's loopback device that the test hosts (hosts.sh) reach through their links
# (`mount-on HOST` mounts the file system for one with a client of its own); all state,
# sockets, logs and pid files in the state directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
STATE=$(state_dir ceph)
MNT=$STATE/mnt
CONF=$STATE/ceph.conf
ADDR=10.251.0.3

# The ceph tool, tried again (up to 5 times) when the monitor refused a command for a zero
# fsid ("Error EPERM: problem getting command descriptions", "wrong fsid"; see the
# configuration below): a refused command was not run, and none here is refused otherwise.
ceph_() {
  local err=$STATE/run/ceph-tool.err try
  for try in 1 2 3 4 5; do
    if timeout 30 ceph -c "$CONF" "$@" 2> "$err"; then
      return 0
    fi
    grep -q "wrong fsid\|EPERM" "$err" || break
    sleep 1
  done
  cat "$err" >&2
  return 1
}

port_free() { ! ss -ltn | grep -q "$ADDR:6789 "; }

up() {
  "$0" up_once || {
    # Keep the failed attempt's logs (down removes the state) for a look at why.
    rm -rf "$STATE.failed-logs" && cp -r "$STATE/log" "$STATE.failed-logs" 2>/dev/null || true
    echo "testbed: ceph did not come up (logs kept in $STATE.failed-logs)" >&2
    "$0" down
    exit 1
  }
}

up_once() {
  need_packages ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse ceph-common
  if mountpoint -q "$MNT" 2>/dev/null; then
    echo "$MNT"
    return 0
  fi
  # A half-started earlier attempt: stop what it recorded before starting afresh.
  [ -f "$STATE/pids" ] && stop_recorded
  rm -rf "$STATE"
  mkdir -p "$STATE"/{run,log,mon/a,mgr/x,mds/a,osd,mnt}
  ip addr show dev lo | grep -q " $ADDR/" || ip addr add "$ADDR/32" dev lo
  local fsid osd_uuid id
  fsid=$(cat /proc/sys/kernel/random/uuid)
  cat > "$CONF" <<CFG
[global]
fsid = $fsid
mon host = v1:$ADDR:6789
public network = $ADDR/32
cluster network = $ADDR/32
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 1
run dir = $STATE/run
admin socket = $STATE/run/\$cluster-\$name.asok
log file = $STATE/log/\$cluster-\$name.log
pid file = $STATE/run/\$name.pid
ms bind ipv6 = false
ms bind msgr2 = false
mon data = $STATE/mon/\$id
mgr data = $STATE/mgr/\$id
mds data = $STATE/mds/\$id
osd data = $STATE/osd/\$id
osd objectstore = memstore
memstore device bytes = 2147483648
osd memory target = 1073741824
# A monitor client's first commands can go out before it has the monitor's map, with a
# zero cluster fsid, and the monitor refuses them ("wrong fsid"); Ceph 16 does so now and
# then at start, most often while the monitor is busy with a new OSD. The OSD exited at
# start on its own crush commands (about one start in two after a quick down and up): they
# are off, and the ceph tool places it below, before it starts; the tool's own commands
# are tried again when refused so (ceph_).
osd class update on start = false
osd crush update on start = false
[client]
# ceph-fuse holds client.admin's socket: the ceph tool run meanwhile makes its own.
admin socket = $STATE/run/\$cluster-\$name.\$pid.asok
CFG
  # A monitor of an earlier instance may still be going away: its port must be free.
  wait_for 30 port_free ||
    { echo "testbed: something still listens on $ADDR:6789 (an earlier ceph-mon?); stop it first" >&2; exit 1; }
  monmaptool --create --add a $ADDR:6789 --fsid "$fsid" "$STATE/monmap" >/dev/null
  ceph-authtool --create-keyring "$STATE/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-mon -c "$CONF" --mkfs -i a --monmap "$STATE/monmap" --keyring "$STATE/mon.keyring"
  ceph-mon -c "$CONF" -i a
  wait_for 30 test -s "$STATE/run/mon.a.pid" && record "$(cat "$STATE/run/mon.a.pid")"
  wait_for 30 ceph_ mon stat || { echo "testbed: ceph-mon did not answer; see $STATE/log" >&2; exit 1; }
  ceph-mgr -c "$CONF" -i x
  wait_for 30 test -s "$STATE/run/mgr.x.pid" && record "$(cat "$STATE/run/mgr.x.pid")"
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  id=$(ceph_ osd new "$osd_uuid") || { echo "testbed: ceph osd new failed; see $STATE/log" >&2; exit 1; }
  mkdir -p "$STATE/osd/$id"
  ceph_ osd crush add "osd.$id" 1.0 root=default host=testbed >/dev/null ||
    { echo "testbed: cannot place osd.$id in the crush map; see $STATE/log" >&2; exit 1; }
  ceph-osd -c "$CONF" -i "$id" --mkfs --osd-uuid "$osd_uuid" > "$STATE/log/osd-mkfs.out" 2>&1 ||
    { echo "testbed: ceph-osd --mkfs failed:" >&2; tail -5 "$STATE/log/osd-mkfs.out" >&2; exit 1; }
  # ceph-osd's own exit status is unreliable here (it sometimes answers 250 while the
  # daemon runs fine): its pid file and the MDS becoming active below are the checks.
  ceph-osd -c "$CONF" -i "$id" > "$STATE/log/osd-start.out" 2>&1 || true
  wait_for 30 test -s "$STATE/run/osd.$id.pid" ||
    { echo "testbed: ceph-osd did not start; see $STATE/log" >&2; exit 1; }
  record "$(cat "$STATE/run/osd.$id.pid")"
  local pool
  for pool in cephfs_data cephfs_meta; do
    { ceph_ osd pool create "$pool" 8 && ceph_ osd pool set "$pool" size 1 --yes-i-really-mean-it; } >/dev/null ||
      { echo "testbed: ceph could not make the pool $pool; see $STATE/log" >&2; exit 1; }
  done
  ceph_ fs new cephfs cephfs_meta cephfs_data >/dev/null ||
    { echo "testbed: ceph could not make the file system; see $STATE/log" >&2; exit 1; }
  ceph-mds -c "$CONF" -i a >/dev/null 2>&1
  wait_for 30 test -s "$STATE/run/mds.a.pid" && record "$(cat "$STATE/run/mds.a.pid")"
  wait_for 60 sh -c "timeout 10 ceph -c '$CONF' mds stat | grep -q up:active" ||
    { echo "testbed: the MDS did not become active; see $STATE/log" >&2; exit 1; }
  # ceph-fuse too can be refused at start (a zero fsid): it is started again.
  local try
  for try in 1 2 3; do
    ceph-fuse -c "$CONF" "$MNT" >/dev/null 2>&1 || true
    wait_for 20 mountpoint -q "$MNT" && break
  done
  mountpoint -q "$MNT" || { echo "testbed: ceph-fuse did not mount; see $STATE/log" >&2; exit 1; }
  wait_for 10 test -s "$STATE/run/client.admin.pid" && record "$(cat "$STATE/run/client.admin.pid")"
  echo "$MNT"
}

# mount-on HOST: the file system mounted by a client of HOST's own (test host HOST of
# hosts.sh: ceph-fuse runs in that host's network namespace), at STATE/hosts/HOST/mnt,
# its pid in STATE/hosts/HOST/client.pid; prints the mount point. remount-on HOST: afresh.
mount-on() {
  local host=${1:?give a test host, for instance h1}
  local ns dir=$STATE/hosts/$host
  ns=$(test_host_ns "$host")
  mountpoint -q "$MNT" || { echo "testbed: ceph is not up (deploy/testbed/up ceph)" >&2; exit 1; }
  if ! mountpoint -q "$dir/mnt" 2>/dev/null; then
    ready_mount_point "$dir"
    local try
    for try in 1 2 3; do
      nsenter --net="$ns" ceph-fuse -c "$CONF" --pid-file "$dir/client.pid" \
        --log-file "$dir/client.log" "$dir/mnt" >/dev/null 2>&1 || true
      wait_for 20 mountpoint -q "$dir/mnt" && break
    done
    mountpoint -q "$dir/mnt" || { echo "testbed: $host's client did not mount; see $dir/client.log" >&2; exit 1; }
    wait_for 10 test -s "$dir/client.pid" && record "$(cat "$dir/client.pid")"
  fi
  echo "$dir/mnt"
}

# What the servers served since they started, as one JSON object in the shape of
# gluster.sh counts: the MDS's requests by kind with their latencies (perf dump,
# mds_server.req_*_latency: LOOKUP, GETATTR, CREATE, ...), the OSD's object reads and
# writes as READ and WRITE (the MDS's journal included) with theirs, and the OSD's bytes
# in and out as bytes written and read.
counts() {
  [ -S "$STATE/run/ceph-mds.a.asok" ] || { echo "testbed: ceph is not up (deploy/testbed/up ceph)" >&2; exit 1; }
  python3 - "$STATE/run" <<'PY'
import json, subprocess, sys
run = sys.argv[1]
def dump(name):
    out = subprocess.run(["ceph", "--admin-daemon", f"{run}/ceph-{name}.asok", "perf", "dump"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)
fops = {}
def add(op, lat):
    if lat.get("avgcount"):
        f = fops.setdefault(op, {"calls": 0, "latency_us": 0.0})
        f["calls"] += lat["avgcount"]
        f["latency_us"] += lat["sum"] * 1e6
for key, lat in dump("mds.a")["mds_server"].items():
    if key.startswith("req_") and key.endswith("_latency") and isinstance(lat, dict):
        op = key[4:-8].upper()
        add({"RMXATTR": "REMOVEXATTR"}.get(op, op), lat)
osd = dump("osd.0")["osd"]
add("READ", osd["op_r_latency"])
add("WRITE", osd["op_w_latency"])
add("READ_WRITE", osd.get("op_rw_latency", {}))
print(json.dumps({"fops": fops, "bytes_read": osd["op_out_bytes"],
                  "bytes_written": osd["op_in_bytes"]}, sort_keys=True))
PY
}

down() {
  [ -d "$STATE" ] || return 0
  unmount_dir "$MNT"
  for d in "$STATE"/hosts/*/mnt; do [ -d "$d" ] && unmount_dir "$d"; done
  # The MDS may hang on shutdown: stop_recorded escalates to SIGKILL after 5 s.
  stop_recorded
  wait_for 30 port_free || true
  rm -rf "$STATE"
  ip addr del "$ADDR/32" dev lo 2>/dev/null || true
}

"$@"
