#!/usr/bin/env bash
# Test hosts for multi-host loadgen runs: three network namespaces ccfs-h1..3, each joined
# to this host by a veth pair (10.251.N.1 here, 10.251.N.2 there) and running its own sshd
# on that address with a generated host key; a generated client key and ssh config let
# `ssh -F STATE/ssh_config h1` in without a password. `up` prints the ssh command to use.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
STATE=$(state_dir hosts)
N=3

up() {
  need_packages openssh-server openssh-client iproute2
  mkdir -p "$STATE"
  [ -f "$STATE/id" ] || ssh-keygen -q -t ed25519 -N '' -f "$STATE/id"
  [ -f "$STATE/host_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$STATE/host_key"
  cp "$STATE/id.pub" "$STATE/authorized_keys"
  chmod 700 "$STATE"; chmod 600 "$STATE/authorized_keys"
  mkdir -p /run/sshd
  : > "$STATE/ssh_config"
  for i in $(seq 1 $N); do
    local ns=ccfs-h$i
    if ! ip netns list | grep -qw "$ns"; then
      ip netns add "$ns"
      ip link add "ccfs-h${i}a" type veth peer name "ccfs-h${i}b"
      ip link set "ccfs-h${i}b" netns "$ns"
      ip addr add "10.251.$i.1/30" dev "ccfs-h${i}a"
      ip link set "ccfs-h${i}a" up
      ip netns exec "$ns" ip addr add "10.251.$i.2/30" dev "ccfs-h${i}b"
      ip netns exec "$ns" ip link set "ccfs-h${i}b" up
      ip netns exec "$ns" ip link set lo up
    fi
    # The testbed's servers on this host's loopback device (gluster.sh) through the link.
    ip netns exec "$ns" ip route replace 10.251.0.0/24 via "10.251.$i.1"

    cat > "$STATE/sshd_$i.conf" <<CFG
ListenAddress 10.251.$i.2
Port 22
HostKey $STATE/host_key
PidFile $STATE/sshd_$i.pid
AuthorizedKeysFile $STATE/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
CFG
    if [ -z "$(live_recorded | head -1)" ] || ! grep -q "sshd_$i.conf" "$STATE/pids" 2>/dev/null; then
      # nsenter --net keeps our mount namespace (ip netns exec would take a private one and
      # not see filesystems mounted later).
      nsenter --net="/run/netns/$ns" /usr/sbin/sshd -D -e -f "$STATE/sshd_$i.conf" > "$STATE/sshd_$i.log" 2>&1 &
      record $!
    fi
    cat >> "$STATE/ssh_config" <<CFG
Host h$i
  HostName 10.251.$i.2
  User root
  IdentityFile $STATE/id
  UserKnownHostsFile /dev/null
  StrictHostKeyChecking no
  BatchMode yes
  LogLevel ERROR
CFG
  done
  for i in $(seq 1 $N); do
    wait_for 20 ssh -F "$STATE/ssh_config" "h$i" true ||
      { echo "testbed: sshd on h$i does not answer; see $STATE/sshd_$i.log" >&2; exit 1; }
  done
  echo "ssh -F $STATE/ssh_config"
}

down() {
  if [ -d "$STATE" ]; then
    stop_recorded
  fi
  for i in $(seq 1 $N); do
    ip netns del "ccfs-h$i" 2>/dev/null || true
    ip link del "ccfs-h${i}a" 2>/dev/null || true
  done
  rm -rf "$STATE"
}

"$@"
