# Shared helpers for the testbed scripts (sourced).

state_dir() { echo "${CCFS_TESTBED_DIR:-/var/tmp/ccfs-testbed}/$1"; }

need_packages() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "testbed: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }
  fi
}

# record PID: remember a process we started, with its command line to check it later.
record() {
  local pid=$1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 0
  grep -q "^$pid " "$STATE/pids" 2>/dev/null && return 0
  echo "$pid $(tr '\0' ' ' < "/proc/$pid/cmdline" | cut -c1-200)" >> "$STATE/pids"
}

# Stops every recorded process whose command line still matches (a reused PID is left alone).
stop_recorded() {
  [ -f "$STATE/pids" ] || return 0
  local pid cmd live
  while read -r pid cmd; do
    live=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-200 || true)
    [ -n "$live" ] && [ "$live" = "$cmd" ] && kill -TERM "$pid" 2>/dev/null || true
  done < "$STATE/pids"
  for _ in $(seq 1 50); do
    local any=0
    while read -r pid cmd; do
      live=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-200 || true)
      [ -n "$live" ] && [ "$live" = "$cmd" ] && any=1
    done < "$STATE/pids"
    [ $any = 0 ] && break
    sleep 0.1
  done
  while read -r pid cmd; do
    live=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-200 || true)
    [ -n "$live" ] && [ "$live" = "$cmd" ] && kill -KILL "$pid" 2>/dev/null || true
  done < "$STATE/pids"
  rm -f "$STATE/pids"
}

wait_for() { # wait_for SECONDS CMD...
  local t=$1; shift
  for _ in $(seq 1 $((t * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}
