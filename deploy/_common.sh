# Shared helpers for the deploy/*.sh scripts; sourced, never run directly.
# shellcheck shell=bash

# Quiet, offline-friendly Flower defaults (an explicit value in the caller's environment wins).
export FLWR_TELEMETRY_ENABLED="${FLWR_TELEMETRY_ENABLED:-0}"
export FLWR_DISABLE_UPDATE_CHECK="${FLWR_DISABLE_UPDATE_CHECK:-1}"
export RAY_USAGE_STATS_ENABLED="${RAY_USAGE_STATS_ENABLED:-0}"
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="${FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION:-1}"
export FLWR_HOME="${FLWR_HOME:-$HOME/.flwr}"

# Where pid, log and database files go unless a script is given explicit paths.
# shellcheck disable=SC2034  # used by the scripts that source this file
DEPLOY_DIR="${FEDHMC_DEPLOY_DIR:-$HOME/fedhmc-deploy}"

die() {
    echo "error: $*" >&2
    exit 1
}

# Absolute form of a path (the file need not exist).
abspath() {
    case "$1" in
        /*) printf '%s\n' "$1" ;;
        *) printf '%s\n' "$PWD/$1" ;;
    esac
}

need_cmd() {
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null 2>&1 ||
            die "'$c' not found on PATH (activate the environment where fedhmc and flwr are installed)"
    done
}

# The Unix socket of a SuperNode's warm worker: SOCKDIR PORT NAME. Named by the port and by
# a hash of this deployment's folder and the node's name, so that two deployments of one
# account (or a stale socket of another) never share it.
worker_socket() {
    local tag
    tag=$(printf '%s' "$DEPLOY_DIR/$3" | sha1sum | cut -c1-12)
    printf '%s/worker-%s-%s.sock\n' "$1" "$2" "$tag"
}

# True when something accepts TCP connections on HOST:PORT.
port_open() {
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

# True when PID is alive (not a zombie) and is a Flower process (guards against recycled PIDs).
is_flower_pid() {
    local args
    kill -0 "$1" 2>/dev/null || return 1
    case "$(ps -o stat= -p "$1" 2>/dev/null)" in Z*) return 1 ;; esac  # dead, not yet reaped
    args="$(ps -o args= -p "$1" 2>/dev/null)" || return 1
    case "$args" in
        *flower-super* | *flwr-* | *fedhmc_clients.worker* | *fedhmc_clients.launcher*) return 0 ;;
        *) return 1 ;;
    esac
}

# The PIDs recorded in a pid file (last numeric field of each line).
pids_in() {
    awk '{ if ($NF ~ /^[0-9]+$/) print $NF }' "$1"
}

# Refuse to start when PIDFILE names a live Flower process.
check_pidfile_free() {
    local pid
    if [[ -f "$1" ]]; then
        for pid in $(pids_in "$1"); do
            if is_flower_pid "$pid"; then
                die "$1 names running PID $pid; stop it first: deploy/stop.sh $1"
            fi
        done
    fi
}

# Print the last lines of a log file to stderr.
log_tail() {
    echo "---- last lines of $1 ----" >&2
    tail -n "${2:-20}" "$1" >&2 || true
    echo "----" >&2
}

# Print the script's leading comment block (its usage) and exit 2.
usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
    exit 2
}

case "${1:-}" in
    -h | --help) usage ;;
esac
