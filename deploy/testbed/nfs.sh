#!/usr/bin/env bash
# NFS: nfs-ganesha 4.3 with FSAL_VFS exporting a directory on 10.251.0.4 (an address on
# this host's loopback device, which the test hosts of hosts.sh reach through their links;
# v3 and v4, Graceless), and rpcbind for v3. This machine has no kernel NFS client: `up`
# prints the nfs:// URL for a client that speaks NFS itself (loadgen), the same for every
# test host (`url-for HOST` checks that HOST reaches it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
STATE=$(state_dir nfs)
ADDR=10.251.0.4
URL=nfs://$ADDR/export

up() {
  need_packages nfs-ganesha nfs-ganesha-vfs rpcbind
  if [ -f "$STATE/pids" ] && [ -n "$(live_recorded)" ] && rpcinfo -t $ADDR nfs 3 >/dev/null 2>&1; then
    echo "$URL"
    return 0
  fi
  check_server_disk
  mkdir -p "$STATE"/{run,log}
  ip addr show dev lo | grep -q " $ADDR/" || ip addr add "$ADDR/32" dev lo
  # The export on the server's disk (lib.sh).
  mount_server_disk "$STATE/disk" 8G
  mkdir -p "$STATE/disk/export"
  chmod 777 "$STATE/disk/export"
  cat > "$STATE/ganesha.conf" <<CFG
NFS_CORE_PARAM {
    Bind_addr = $ADDR;
    Protocols = 3, 4;
    Enable_RQUOTA = false;
    # NFSv3 clients mount the pseudo path too (nfs://$ADDR/export), as v4 ones do.
    Mount_Path_Pseudo = true;
}
NFSV4 { Graceless = true; RecoveryBackend = fs; }
NFS_KRB5 { Active_krb5 = false; }
EXPORT {
    Export_Id = 1;
    Path = $STATE/disk/export;
    Pseudo = /export;
    Access_Type = RW;
    Squash = No_Root_Squash;
    SecType = sys;
    Protocols = 3, 4;
    Transports = TCP;
    FSAL { Name = VFS; }
}
LOG { Default_Log_Level = EVENT; }
CFG
  # rpcbind is shared by nature (one portmapper a host): start one only if none runs,
  # and then it is ours to stop.
  if ! rpcinfo -p 127.0.0.1 >/dev/null 2>&1; then
    rpcbind -f > "$STATE/log/rpcbind.log" 2>&1 &
    record $!
    wait_for 10 rpcinfo -p 127.0.0.1 || { echo "testbed: rpcbind did not start" >&2; exit 1; }
  fi
  ganesha.nfsd -F -f "$STATE/ganesha.conf" -L "$STATE/log/ganesha.log" -p "$STATE/run/ganesha.pid" \
    -N NIV_EVENT > "$STATE/log/ganesha.out" 2>&1 &
  record $!
  wait_for 30 rpcinfo -t $ADDR nfs 3 ||
    { echo "testbed: ganesha did not register NFS v3; see $STATE/log" >&2; exit 1; }
  echo "$URL"
}

# url-for HOST: the export's URL for test host HOST (hosts.sh), once HOST reached its
# server (NFS v3 over TCP).
url-for() {
  local host=${1:?give a test host, for instance h1} ns
  ns=$(test_host_ns "$host")
  nsenter --net="$ns" rpcinfo -t "$ADDR" nfs 3 >/dev/null ||
    { echo "testbed: $host does not reach the NFS server at $ADDR (deploy/testbed/up nfs)" >&2; exit 1; }
  echo "$URL"
}

down() {
  [ -d "$STATE" ] || return 0
  stop_recorded
  unmount_server_disk "$STATE/disk"
  rm -rf "$STATE"
  ip addr del "$ADDR/32" dev lo 2>/dev/null || true
}

"$@"
