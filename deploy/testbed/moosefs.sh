#!/usr/bin/env bash
# MooseFS 3.0 (standing in for LizardFS, its fork, which Debian does not package): a master
# and three chunkservers in a network namespace of their own (chunkservers refuse a master
# on 127.0.0.0/8), joined to this host by a veth pair, and the FUSE client mfsmount here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
STATE=$(state_dir moosefs)
NS=ccfs-mfs
SRV=10.250.0.1
HOST=10.250.0.2
MNT=$STATE/mnt

up() {
  need_packages moosefs-master moosefs-chunkserver moosefs-client moosefs-cli iproute2
  check_server_disk
  if mountpoint -q "$MNT" 2>/dev/null; then
    echo "$MNT"
    return 0
  fi
  mkdir -p "$STATE"/{mnt,log}
  # The master's metadata and the chunkservers' chunks on the server's disk (lib.sh).
  mount_server_disk "$STATE/disk" 8G
  mkdir -p "$STATE/disk/master"
  if ! ip netns list | grep -qw "$NS"; then
    ip netns add "$NS"
    ip link add ccfs-mfs0 type veth peer name ccfs-mfs1
    ip link set ccfs-mfs1 netns "$NS"
    ip addr add "$HOST/30" dev ccfs-mfs0
    ip link set ccfs-mfs0 up
    ip netns exec "$NS" ip addr add "$SRV/30" dev ccfs-mfs1
    ip netns exec "$NS" ip link set ccfs-mfs1 up
    ip netns exec "$NS" ip link set lo up
  fi
  # The test hosts (hosts.sh, 10.251.N.2) reach the master through this host (mount-on).
  ip netns exec "$NS" ip route replace 10.251.0.0/16 via "$HOST"
  echo "* / rw,alldirs,maproot=0" > "$STATE/mfsexports.cfg"
  cat > "$STATE/mfsmaster.cfg" <<CFG
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $STATE/disk/master
EXPORTS_FILENAME = $STATE/mfsexports.cfg
MATOML_LISTEN_HOST = $SRV
MATOCS_LISTEN_HOST = $SRV
MATOCL_LISTEN_HOST = $SRV
CFG
  [ -f "$STATE/disk/master/metadata.mfs" ] || cp /var/lib/mfs/metadata.mfs.empty "$STATE/disk/master/metadata.mfs"
  ip netns exec "$NS" mfsmaster -f -c "$STATE/mfsmaster.cfg" > "$STATE/log/master.log" 2>&1 &
  record $!
  for i in 1 2 3; do
    mkdir -p "$STATE/cs$i/data" "$STATE/disk/cs$i"
    echo "$STATE/disk/cs$i" > "$STATE/cs$i/mfshdd.cfg"
    cat > "$STATE/cs$i/mfschunkserver.cfg" <<CFG
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $STATE/cs$i/data
HDD_CONF_FILENAME = $STATE/cs$i/mfshdd.cfg
HDD_LEAVE_SPACE_DEFAULT = 64MiB
MASTER_HOST = $SRV
CSSERV_LISTEN_HOST = $SRV
CSSERV_LISTEN_PORT = $((9422 + 10 * i))
CFG
    ip netns exec "$NS" mfschunkserver -f -c "$STATE/cs$i/mfschunkserver.cfg" > "$STATE/log/cs$i.log" 2>&1 &
    record $!
  done
  wait_for 30 bash -c "exec 3<>/dev/tcp/$SRV/9421" || { echo "testbed: mfsmaster did not listen; see $STATE/log" >&2; exit 1; }
  mfsmount -f -H "$SRV" -P 9421 "$MNT" > "$STATE/log/client.log" 2>&1 &
  record $!
  wait_for 30 mountpoint -q "$MNT" || { echo "testbed: mfsmount did not mount; see $STATE/log/client.log" >&2; exit 1; }
  # A new MooseFS root is writable by everyone without the sticky bit: any user could
  # rename what root makes there (loadgen refuses such a place as root). As /tmp instead.
  chmod 1777 "$MNT"
  # Writing before the chunkservers report their space fails: wait for a usable size.
  wait_for 60 sh -c "[ \$(stat -f -c %b '$MNT') -gt 0 ] && dd if=/dev/zero of='$MNT/.probe' bs=4k count=1 status=none && rm -f '$MNT/.probe'" ||
    { echo "testbed: chunkservers did not come up; see $STATE/log" >&2; exit 1; }
  echo "$MNT"
}

# mount-on HOST: the volume mounted by a client of HOST's own (test host HOST of hosts.sh:
# mfsmount runs in that host's network namespace and reaches the master through this host,
# which forwards between the two links, and only those), at STATE/hosts/HOST/mnt, its pid
# in STATE/hosts/HOST/client.pid; prints the mount point. remount-on HOST: afresh.
mount-on() {
  local host=${1:?give a test host, for instance h1}
  local i=${host#h} ns dir=$STATE/hosts/$host
  ns=$(test_host_ns "$host")
  mountpoint -q "$MNT" || { echo "testbed: moosefs is not up (deploy/testbed/up moosefs)" >&2; exit 1; }
  # From this host's own namespace (a remount from the test host finds it done already).
  if [ -e /proc/sys/net/ipv4/conf/ccfs-mfs0 ]; then
    sysctl -q -w "net.ipv4.conf.ccfs-h${i}a.forwarding=1" "net.ipv4.conf.ccfs-mfs0.forwarding=1"
  fi
  nsenter --net="$ns" ip route replace "$SRV/32" via "10.251.$i.1"
  if ! mountpoint -q "$dir/mnt" 2>/dev/null; then
    ready_mount_point "$dir"
    nsenter --net="$ns" mfsmount -f -H "$SRV" -P 9421 "$dir/mnt" > "$dir/client.log" 2>&1 &
    echo $! > "$dir/client.pid"
    record "$(cat "$dir/client.pid")"
    wait_for 30 mountpoint -q "$dir/mnt" || { echo "testbed: $host's client did not mount; see $dir/client.log" >&2; exit 1; }
  fi
  echo "$dir/mnt"
}

# The server's processes (the master and the chunkservers), one pid a line: what a study
# measures the server's CPU by (no client, this host's or a test host's).
server-pids() {
  [ -f "$STATE/pids" ] || { echo "testbed: moosefs is not up (deploy/testbed/up moosefs)" >&2; exit 1; }
  local pid
  for pid in $(live_recorded); do
    case "$({ tr '\0' ' ' < "/proc/$pid/cmdline"; } 2>/dev/null)" in
      mfsmaster*|mfschunkserver*) echo "$pid" ;;
    esac
  done
}

# What the master served since the testbed came up, as one JSON object in the shape of
# gluster.sh counts: {"fops": {"LOOKUP": {"calls": N}, ...}}, the metadata operations of
# every client mount (mfscli -SMO: its counters of the current hour, carried over the hour
# and a client's remount in STATE/counts.json by mfs-counts.py). READ and WRITE are the
# clients' asking the master where a chunk is, not each read or write. MooseFS tells no
# latencies here, and its chunkservers' bytes only as charts by the minute: both are left
# out (unknown).
counts() {
  command -v mfscli >/dev/null || need_packages moosefs-cli
  mountpoint -q "$MNT" || { echo "testbed: moosefs is not up (deploy/testbed/up moosefs)" >&2; exit 1; }
  exec 9>"$STATE/counts.lock"
  flock 9
  python3 "$here/mfs-counts.py" "$SRV" "$STATE/counts.json"
}

down() {
  if [ -d "$STATE" ]; then
    unmount_dir "$MNT"
    for d in "$STATE"/hosts/*/mnt; do [ -d "$d" ] && unmount_dir "$d"; done
    stop_recorded
    unmount_server_disk "$STATE/disk"
  fi
  if ip netns list 2>/dev/null | grep -qw "$NS"; then
    ip netns del "$NS"
  fi
  ip link del ccfs-mfs0 2>/dev/null || true
  rm -rf "$STATE"
}

"$@"
