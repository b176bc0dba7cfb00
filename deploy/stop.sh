#!/usr/bin/env bash
# Usage: deploy/stop.sh PIDFILE [PIDFILE...]
#
# Stops the processes recorded by deploy/superlink.sh and deploy/supernode.sh, and every process they
# started (flower-superexec, flwr-serverapp, flwr-clientapp): SIGTERM, up to STOP_TIMEOUT seconds
# (default 10) to exit, then SIGKILL. A PID that is no longer a Flower process is left alone.
# Removes the pid files once their processes are gone. Exit code 1 if something survived.
# Example: deploy/stop.sh ~/fedhmc-deploy/*.pid
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

[[ $# -ge 1 ]] || usage
timeout="${STOP_TIMEOUT:-10}"

descendants() {
    local c
    for c in $(pgrep -P "$1" 2>/dev/null || true); do
        echo "$c"
        descendants "$c"
    done
}

roots=()
for f in "$@"; do
    if [[ ! -f "$f" ]]; then
        echo "no pid file $f (already stopped?)"
        continue
    fi
    for p in $(pids_in "$f"); do
        if is_flower_pid "$p"; then
            roots+=("$p")
        else
            echo "PID $p from $f is not running (or not a Flower process); skipped"
        fi
    done
done

all=()
for p in ${roots[@]+"${roots[@]}"}; do
    all+=("$p")
    for c in $(descendants "$p"); do all+=("$c"); done
done

alive() {
    local p out=()
    for p in "$@"; do
        if kill -0 "$p" 2>/dev/null && [[ "$(ps -o stat= -p "$p" 2>/dev/null)" != Z* ]]; then
            out+=("$p")
        fi
    done
    echo ${out[@]+"${out[@]}"}
}

if [[ ${#roots[@]} -gt 0 ]]; then
    echo "stopping PIDs ${roots[*]} (with their children: ${all[*]})"
    kill -TERM "${roots[@]}" 2>/dev/null || true
    deadline=$((SECONDS + timeout))
    while read -r -a left <<<"$(alive "${all[@]}")" && [[ ${#left[@]} -gt 0 ]] &&
        ((SECONDS < deadline)); do
        # Once its parent is gone, a child that lingers gets its own SIGTERM.
        if [[ -z "$(alive "${roots[@]}")" ]]; then
            kill -TERM "${left[@]}" 2>/dev/null || true
        fi
        sleep 0.2
    done
    read -r -a left <<<"$(alive "${all[@]}")"
    if [[ ${#left[@]} -gt 0 ]]; then
        echo "still running after ${timeout} s, sending SIGKILL: ${left[*]}"
        kill -KILL "${left[@]}" 2>/dev/null || true
        sleep 0.5
    fi
    read -r -a left <<<"$(alive "${all[@]}")"
    if [[ ${#left[@]} -gt 0 ]]; then
        echo "error: could not stop ${left[*]}" >&2
        exit 1
    fi
fi
for f in "$@"; do rm -f "$f"; done
echo "stopped"
