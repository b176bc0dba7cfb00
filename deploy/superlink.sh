#!/usr/bin/env bash
# Usage: deploy/superlink.sh [--host HOST] [--port PORT] [--certs DIR] [--db FILE] [--log FILE]
#                            [--pidfile FILE] [--wait SECONDS] [-- EXTRA flower-superlink ARGS]
#
# Starts a Flower SuperLink in the background with TLS and SuperNode authentication, waits until its
# port accepts connections, and records its PID in the pid file (stop it with deploy/stop.sh PIDFILE).
# Its one port serves SuperNodes (Fleet API), `flwr` commands (Control API) and the ServerApp.
#   --host     address to listen on: 0.0.0.0 for other machines, 127.0.0.1 for this machine only
#              (env SUPERLINK_HOST, default 127.0.0.1)
#   --port     TCP port (env SUPERLINK_PORT, default 9091)
#   --certs    folder with ca.crt, server.pem, server.key from deploy/make_certs.sh
#              (env SUPERLINK_CERTS, default $FEDHMC_DEPLOY_DIR/certs)
#   --db       SQLite database; it keeps the registered SuperNode keys and the runs across restarts
#              (env SUPERLINK_DB, default $FEDHMC_DEPLOY_DIR/superlink.db)
#   --log      log file (env SUPERLINK_LOG, default $FEDHMC_DEPLOY_DIR/superlink.log)
#   --pidfile  pid file (env SUPERLINK_PIDFILE, default $FEDHMC_DEPLOY_DIR/superlink.pid)
#   --wait     seconds to wait for the port (default 60)
# $FEDHMC_DEPLOY_DIR defaults to ~/fedhmc-deploy. flower-superlink must be on PATH (activate the venv);
# the ServerApp inherits this script's environment (PATH, PYTHONPATH, ...).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

host="${SUPERLINK_HOST:-127.0.0.1}"
port="${SUPERLINK_PORT:-9091}"
certs="${SUPERLINK_CERTS:-$DEPLOY_DIR/certs}"
db="${SUPERLINK_DB:-$DEPLOY_DIR/superlink.db}"
log="${SUPERLINK_LOG:-$DEPLOY_DIR/superlink.log}"
pidfile="${SUPERLINK_PIDFILE:-$DEPLOY_DIR/superlink.pid}"
wait_s=60
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --host) host="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --certs) certs="$2"; shift 2 ;;
        --db) db="$2"; shift 2 ;;
        --log) log="$2"; shift 2 ;;
        --pidfile) pidfile="$2"; shift 2 ;;
        --wait) wait_s="$2"; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        -h | --help) usage ;;
        *) echo "unknown option: $1" >&2; usage ;;
    esac
done

need_cmd flower-superlink flower-superexec flwr-serverapp
certs="$(abspath "$certs")"
db="$(abspath "$db")"
log="$(abspath "$log")"
pidfile="$(abspath "$pidfile")"
for f in ca.crt server.pem server.key; do
    [[ -f "$certs/$f" ]] || die "$certs/$f not found (create it with deploy/make_certs.sh $certs HOST)"
done
mkdir -p "$(dirname "$db")" "$(dirname "$log")" "$(dirname "$pidfile")"
check_pidfile_free "$pidfile"

case "$host" in
    0.0.0.0) probe=127.0.0.1 ;;
    :: | "[::]") probe=::1 ;;
    *) probe="${host#[}"; probe="${probe%]}" ;;
esac
if port_open "$probe" "$port"; then
    die "port $port on $probe is already in use"
fi

echo "=== $(date '+%F %T') deploy/superlink.sh: $host:$port" >>"$log"
nohup flower-superlink \
    --host "$host" --port "$port" \
    --ssl-ca-certfile "$certs/ca.crt" --ssl-certfile "$certs/server.pem" --ssl-keyfile "$certs/server.key" \
    --enable-supernode-auth \
    --database "$db" \
    ${extra[@]+"${extra[@]}"} >>"$log" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$pidfile"

deadline=$((SECONDS + wait_s))
until port_open "$probe" "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then
        rc=0; wait "$pid" || rc=$?
        rm -f "$pidfile"
        log_tail "$log"
        die "flower-superlink exited with code $rc (log: $log)"
    fi
    if ((SECONDS >= deadline)); then
        log_tail "$log"
        die "flower-superlink (PID $pid) is not listening on $probe:$port after ${wait_s} s; stop it: deploy/stop.sh $pidfile"
    fi
    sleep 0.2
done
echo "SuperLink PID $pid listening on $host:$port (TLS, SuperNode authentication)"
echo "  pid file: $pidfile   log: $log   database: $db"
