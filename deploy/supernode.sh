#!/usr/bin/env bash
# Usage: deploy/supernode.sh --superlink HOST:PORT --ca CA_CRT --key PRIVATE_KEY
#                            --partition-id I --num-partitions N [--port PORT] [--name NAME]
#                            [--device DEV] [--node-config 'k=v ...'] [--log FILE] [--pidfile FILE]
#                            [--wait SECONDS] [--no-worker] [--launcher fork|flower]
#                            [-- EXTRA flower-supernode ARGS]
#
# Starts one Flower SuperNode (one federated client) in the background: TLS to the SuperLink, verified
# with the CA certificate, and authenticated with a private key whose public key was registered
# (deploy/register.sh). Waits until the SuperLink has accepted it, and records its PID in the pid file.
#   --superlink       SuperLink address, as in the server certificate (env SUPERLINK_ADDRESS)
#   --ca              ca.crt from deploy/make_certs.sh (env SUPERNODE_CA)
#   --key             private key from deploy/make_keys.sh (env SUPERNODE_KEY)
#   --partition-id    this client's data partition, 0..N-1 (env PARTITION_ID)
#   --num-partitions  N, the number of clients of the run (env NUM_PARTITIONS)
#   --port            local port of this SuperNode's own runtime API; every SuperNode on the same
#                     machine needs a different one (env SUPERNODE_PORT, default 9094)
#   --name            name for the log and pid files (default supernode-I)
#   --device          the device this node computes on (cpu, cuda, cuda:1, ...), whatever the run's
#                     device: node config device (default: the run's `device`)
#   --node-config     more node settings, e.g. 'private-seed=1234'
#   --log, --pidfile  default $FEDHMC_DEPLOY_DIR/NAME.log and NAME.pid ($FEDHMC_DEPLOY_DIR: ~/fedhmc-deploy)
#   --wait            seconds to wait for the SuperLink to accept the node (default 60); the script
#                     fails if the SuperNode exits (e.g. its key is not registered: exit code 305)
#   --no-worker       compute in each ClientApp process instead of the node's warm worker
#   --launcher        how each message's ClientApp process starts (env SUPERNODE_LAUNCHER): fork
#                     (default) forks it from a process that imported Flower once
#                     (python -m fedhmc_clients.launcher beside a SuperNode started with
#                     --isolation process: milliseconds); flower: Flower's own SuperExec starts a
#                     fresh flwr-clientapp (--isolation subprocess: it imports Flower each time,
#                     1.5-2 s of CPU a message). Either way each message runs in a process of its own.
# By default a warm worker (python -m fedhmc_clients.worker) starts first, beside the SuperNode:
# it keeps torch, the data partition and the target loaded across rounds, and each ClientApp
# forwards its message to it over a Unix socket that only this user can open
# (${TMPDIR:-/tmp}/fedhmc-UID/worker-PORT-TAG.sock, TAG a hash of the deployment's folder and
# the node's name, passed as node config worker-socket). Its PID goes
# into the same pid file, so deploy/stop.sh stops both; its log is NAME-worker.log.
# FLWR_SUPEREXEC_TASK_POLL_INTERVAL (default here 0.05 s, Flower's own is 1 s) shortens each round.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
export FLWR_SUPEREXEC_TASK_POLL_INTERVAL="${FLWR_SUPEREXEC_TASK_POLL_INTERVAL:-0.05}"

superlink="${SUPERLINK_ADDRESS:-}"
ca="${SUPERNODE_CA:-}"
key="${SUPERNODE_KEY:-}"
pid_="${PARTITION_ID:-}"
nparts="${NUM_PARTITIONS:-}"
port="${SUPERNODE_PORT:-9094}"
name=""
node_config=""
device=""
log=""
pidfile=""
wait_s=60
worker=1
launcher="${SUPERNODE_LAUNCHER:-fork}"
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --superlink) superlink="$2"; shift 2 ;;
        --ca) ca="$2"; shift 2 ;;
        --key) key="$2"; shift 2 ;;
        --partition-id) pid_="$2"; shift 2 ;;
        --num-partitions) nparts="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --name) name="$2"; shift 2 ;;
        --node-config) node_config="$2"; shift 2 ;;
        --device) device="$2"; shift 2 ;;
        --log) log="$2"; shift 2 ;;
        --pidfile) pidfile="$2"; shift 2 ;;
        --wait) wait_s="$2"; shift 2 ;;
        --no-worker) worker=0; shift ;;
        --launcher) launcher="$2"; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        -h | --help) usage ;;
        *) echo "unknown option: $1" >&2; usage ;;
    esac
done
[[ -n "$superlink" && -n "$ca" && -n "$key" && -n "$pid_" && -n "$nparts" ]] ||
    { echo "--superlink, --ca, --key, --partition-id and --num-partitions are required" >&2; usage; }
[[ "$pid_" =~ ^[0-9]+$ && "$nparts" =~ ^[0-9]+$ && "$pid_" -lt "$nparts" ]] ||
    die "need 0 <= partition-id < num-partitions (got $pid_ and $nparts)"
[[ -z "$device" || "$device" =~ ^[a-z]+(:[0-9]+)?$ ]] ||
    die "--device takes cpu, cuda or cuda:N (got '$device')"
[[ -z "$device" ]] || node_config="device=\"$device\"${node_config:+ $node_config}"
[[ "$launcher" == fork || "$launcher" == flower ]] ||
    die "--launcher takes fork or flower (got '$launcher')"
isolation=()
[[ "$launcher" == flower ]] || isolation=(--isolation process)

need_cmd flower-supernode flower-superexec flwr-clientapp
ca="$(abspath "$ca")"
key="$(abspath "$key")"
[[ -f "$ca" ]] || die "CA certificate $ca not found"
[[ -f "$key" ]] || die "private key $key not found"
name="${name:-supernode-$pid_}"
log="$(abspath "${log:-$DEPLOY_DIR/$name.log}")"
pidfile="$(abspath "${pidfile:-$DEPLOY_DIR/$name.pid}")"
mkdir -p "$(dirname "$log")" "$(dirname "$pidfile")"
check_pidfile_free "$pidfile"
if port_open 127.0.0.1 "$port"; then
    die "local port $port is already in use (another SuperNode?); pick another with --port"
fi

echo "=== $(date '+%F %T') deploy/supernode.sh: $name -> $superlink" >>"$log"
start_line=$(($(wc -l <"$log")))
: >"$pidfile"
if ((worker)); then
    need_cmd python
    sockdir="${TMPDIR:-/tmp}/fedhmc-$(id -u)"
    mkdir -p -m 700 "$sockdir"
    [[ -O "$sockdir" && "$(stat -c %a "$sockdir")" == 700 ]] ||
        die "$sockdir must be yours with mode 700 (it holds the workers' sockets)"
    sock=$(worker_socket "$sockdir" "$port" "$name")
    wlog="${log%.log}-worker.log"
    nohup python -m fedhmc_clients.worker --socket "$sock" >>"$wlog" 2>&1 </dev/null &
    wpid=$!
    echo "worker $wpid" >>"$pidfile"
    until [[ -S "$sock" ]]; do
        if ! kill -0 "$wpid" 2>/dev/null; then
            log_tail "$wlog" 12
            die "the worker for $name exited (log: $wlog); start without it: --no-worker"
        fi
        if ((SECONDS >= wait_s)); then
            die "the worker for $name (PID $wpid) has no socket after ${wait_s} s; log: $wlog"
        fi
        sleep 0.2
    done
    node_config="worker-socket=\"$sock\"${node_config:+ $node_config}"
fi
nohup flower-supernode \
    --superlink "$superlink" \
    --root-certificates "$ca" \
    --auth-supernode-private-key "$key" \
    --port "$port" \
    --node-config "partition-id=$pid_ num-partitions=$nparts${node_config:+ $node_config}" \
    ${isolation[@]+"${isolation[@]}"} ${extra[@]+"${extra[@]}"} >>"$log" 2>&1 </dev/null &
pid=$!
if [[ "$launcher" == fork ]]; then
    # In the SuperExec's place: it ends with the SuperNode (--parent-pid), its fork server with it.
    nohup python -m fedhmc_clients.launcher --runtime-api-address "127.0.0.1:$port" --insecure \
        --parent-pid "$pid" >>"$log" 2>&1 </dev/null &
    lpid=$!
    echo "launcher $lpid" >>"$pidfile"
fi
echo "$pid" >>"$pidfile"  # (the SuperNode's PID comes last)

# Accepted once the SuperLink hands out the node id ("SuperNode ID: ..." in the log).
deadline=$((SECONDS + wait_s))
until tail -n "+$((start_line + 1))" "$log" | grep -q "SuperNode ID:"; do
    if ! kill -0 "$pid" 2>/dev/null; then
        rc=0; wait "$pid" || rc=$?
        [[ -z "${wpid:-}" ]] || kill "$wpid" 2>/dev/null || true
        [[ -z "${lpid:-}" ]] || kill "$lpid" 2>/dev/null || true
        rm -f "$pidfile"
        log_tail "$log" 12
        flwr_code="$(tail -n "+$((start_line + 1))" "$log" | grep -o "Exit Code: [0-9]*" | tail -n1 || true)"
        die "flower-supernode $name exited with code $rc${flwr_code:+ ($flwr_code)}; 305 means the SuperLink refused it: is its public key registered (deploy/register.sh)? log: $log"
    fi
    if ((SECONDS >= deadline)); then
        log_tail "$log" 12
        die "SuperNode $name (PID $pid) not accepted after ${wait_s} s; it keeps retrying; stop it: deploy/stop.sh $pidfile"
    fi
    sleep 0.2
done
node_id="$(tail -n "+$((start_line + 1))" "$log" | grep -o "SuperNode ID: [0-9]*" | head -n1 | awk '{print $3}')"
echo "SuperNode $name PID $pid online (node id $node_id, partition $pid_ of $nparts, local port $port)"
echo "  pid file: $pidfile   log: $log"
