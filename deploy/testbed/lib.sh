# Shared helpers for the testbed scripts (sourced).

# The state directory of testbed $1, below ${CCFS_TESTBED_DIR:-/var/tmp/ccfs-testbed}. Both
# must be root's own real directories that nobody else can write in (the default sits in
# world-writable /var/tmp, where anyone could make the name first and plant keys, pid
# files or links for root to use): anything else is refused, and nothing is done.
state_dir() {
  local base=${CCFS_TESTBED_DIR:-/var/tmp/ccfs-testbed} d
  [ -e "$base" ] || [ -L "$base" ] || mkdir -m 755 "$base" 2>/dev/null || true
  for d in "$base" "$base/$1"; do
    [ -e "$d" ] || [ -L "$d" ] || continue
    if [ -L "$d" ] || [ ! -d "$d" ] || [ "$(stat -c %u "$d")" != "$(id -u)" ] ||
      [ $(( 0$(stat -c %a "$d") & 022 )) -ne 0 ]; then
      echo "testbed: $d is not a directory of $(id -un)'s that only it can write in (made by someone else?); remove it, or set CCFS_TESTBED_DIR to one that is" >&2
      exit 2
    fi
  done
  echo "$base/$1"
}

# Whether $1 is a process id (a number): pid files are read, never run.
is_pid() { case "$1" in ''|*[!0-9]*) return 1 ;; *) return 0 ;; esac; }

need_packages() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "testbed: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }
  fi
}

# The start time of a process (clock ticks since boot): with the PID it names the process
# for good, across exec, and a reused PID never matches.
start_time() { awk '{ sub(/^.*\) /, ""); print $20 }' "/proc/$1/stat" 2>/dev/null || true; }

# record PID: remember a process we started.
record() {
  local pid=$1
  is_pid "$pid" && [ -r "/proc/$pid/stat" ] || return 0
  grep -q "^$pid " "$STATE/pids" 2>/dev/null && return 0
  echo "$pid $(start_time "$pid") $(tr '\0' ' ' < "/proc/$pid/cmdline" | cut -c1-120)" >> "$STATE/pids"
}

# The recorded processes that are still the same processes.
live_recorded() {
  [ -f "$STATE/pids" ] || return 0
  local pid st rest
  while read -r pid st rest; do
    if is_pid "$pid" && [ -n "$st" ] && [ "$(start_time "$pid")" = "$st" ]; then echo "$pid"; fi
  done < "$STATE/pids"
  return 0
}

# Stops every recorded process (TERM, then KILL after 5 s); never anything else.
stop_recorded() {
  local pids
  pids=$(live_recorded)
  if [ -n "$pids" ]; then kill -TERM $pids 2>/dev/null || true; fi
  for _ in $(seq 1 50); do
    [ -z "$(live_recorded)" ] && break
    sleep 0.1
  done
  pids=$(live_recorded)
  if [ -n "$pids" ]; then kill -KILL $pids 2>/dev/null || true; fi
  rm -f "$STATE/pids"
}

wait_for() { # wait_for SECONDS CMD...
  local t=$1; shift
  for _ in $(seq 1 $((t * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}

# Unmounts DIR if anything is mounted there, a client that died included (its mount point
# answers "Transport endpoint is not connected", which `mountpoint` does not call a mount).
unmount_dir() {
  local dir=$1
  while awk -v d="$dir" '$5 == d { found = 1 } END { exit !found }' /proc/self/mountinfo; do
    umount "$dir" 2>/dev/null || umount -l "$dir" || return 1
  done
}

# stop_client PIDFILE MNT: stops the share client PIDFILE names if it is still running for
# MNT (a client unmounted can linger, holding its pid file locked, and a client whose mount
# died leaves it dead); nothing else.
stop_client() {
  local pid
  pid=$(cat "$1" 2>/dev/null || true)
  is_pid "$pid" && { tr '\0' ' ' < "/proc/$pid/cmdline"; } 2>/dev/null | grep -qF "$2" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  wait_for 5 sh -c "! kill -0 $pid" || kill -KILL "$pid" 2>/dev/null || true
  wait_for 5 sh -c "! kill -0 $pid" || true
}

# test_host_ns HOST: the network namespace of test host HOST (hosts.sh: h1, h2, ...),
# which must be up.
test_host_ns() {
  case "$1" in h[0-9]|h[0-9][0-9]) ;; *) echo "testbed: no test host '$1' (h1, h2, h3)" >&2; exit 2 ;; esac
  [ -e "/run/netns/ccfs-$1" ] || { echo "testbed: no test host $1 (deploy/testbed/up hosts)" >&2; exit 2; }
  echo "/run/netns/ccfs-$1"
}

# ready_mount_point DIR: DIR/mnt made ready for a test host's client: a client that died
# left it dead ("not connected"): detached; a client left without a mount: stopped.
ready_mount_point() {
  unmount_dir "$1/mnt"
  stop_client "$1/client.pid" "$1/mnt"
  mkdir -p "$1/mnt"
}

# remount-on HOST, for the servers' scripts that define `mount-on HOST`: the test host's
# client mounted afresh (a cold client), as loadgen login-storm --remount asks.
remount-on() {
  local host=${1:?give a test host, for instance h1}
  local dir=$STATE/hosts/$host
  mountpoint -q "$dir/mnt" || { echo "testbed: $host has no client mount (mount-on $host)" >&2; exit 1; }
  umount "$dir/mnt" 2>/dev/null || { echo "testbed: $dir/mnt is busy; cannot remount" >&2; exit 1; }
  # The old client, gone with its mount or not (it would hold its pid file locked).
  stop_client "$dir/client.pid" "$dir/mnt"
  mount-on "$host"
}

# The server's disk, CCFS_SERVER_DISK (deploy/testbed/up NAME --server-disk KIND sets it):
#   memory  a tmpfs: a server fsync costs nothing (the cheapest server there is);
#   ssd     a journaled ext4 of its own, a loop image on this machine's disk (the default):
#           a server fsync commits the journal and reaches the disk, as on a real server;
#   hdd     ssd, and where the server can delay each fsync it does (GlusterFS: its own
#           delay-gen translator on the bricks' fsync and fsyncdir, HDD_FSYNC_MS each), a
#           model of a busy rotating disk or a loaded array.
HDD_FSYNC_MS=8
server_disk() {
  local kind=${CCFS_SERVER_DISK:-ssd}
  case "$kind" in
    memory|ssd|hdd) echo "$kind" ;;
    *) echo "testbed: the server disk '$kind' is not one of memory, ssd, hdd (--server-disk)" >&2; exit 2 ;;
  esac
}

# mount_server_disk DIR SIZE: DIR (below $STATE) becomes the server's disk of the kind
# server_disk names; the kind is kept in $STATE/server-disk. A server already up on
# another kind is refused: `down` first.
mount_server_disk() {
  local dir=$1 size=$2 kind
  kind=$(server_disk)
  check_server_disk
  mkdir -p "$dir"
  # The server's data is the server's: no other local user reads or changes it there, and
  # nothing on it runs setuid or as a device (the servers trust the uid their clients
  # state: a client could leave a setuid-root file in it).
  if ! mountpoint -q "$dir"; then
    case "$kind" in
      memory) mount -t tmpfs -o "size=$size,mode=0700,nosuid,nodev" tmpfs "$dir" ;;
      ssd|hdd)
        # A fresh image each time (the server's data lives and dies with the testbed).
        rm -f "$STATE/disk.img"
        truncate -s "$size" "$STATE/disk.img"
        mkfs.ext4 -q -F -j "$STATE/disk.img"
        mount -o loop,nosuid,nodev "$STATE/disk.img" "$dir" ;;
    esac
  fi
  chmod 700 "$dir"
  echo "$kind" > "$STATE/server-disk"
}

# Refuses a testbed already up on another disk than the one asked for.
check_server_disk() {
  local kind
  kind=$(server_disk)
  if [ -f "$STATE/server-disk" ] && [ "$(cat "$STATE/server-disk")" != "$kind" ]; then
    echo "testbed: $(basename "$STATE") runs on the '$(cat "$STATE/server-disk")' disk, not '$kind'; run deploy/testbed/down $(basename "$STATE") first" >&2
    exit 2
  fi
}

# unmount_server_disk DIR: after the server stopped; the image goes with $STATE.
unmount_server_disk() {
  unmount_dir "$1" || true
}
