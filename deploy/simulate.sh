#!/usr/bin/env bash
# Usage: deploy/simulate.sh NUM_CLIENTS [KEY=VALUE ...]
#
# Flower's own local simulation through `flwr run`: Flower starts a managed local SuperLink
# (a `:local:` connection) that runs the ServerApp and NUM_CLIENTS virtual SuperNodes with the
# simulation runtime. KEY=VALUE pairs override the run config (any `fedhmc run` option, in
# kebab-case), e.g. `deploy/simulate.sh 10 rounds=20 local-steps=50`.
#
# What it takes care of:
# - no runtime dependency installation, no telemetry, no update check, a writable FLWR_HOME
#   (default $FEDHMC_DEPLOY_DIR/flwr-sim, its own, so the local SuperLink it stops is its own);
# - the output directory: out=... must be absolute (the ServerApp runs elsewhere); by default
#   $FEDHMC_DEPLOY_DIR/runs/<time>;
# - the detached local SuperLink that `flwr run` leaves behind: stopped by its PID at the end,
#   also on error or Ctrl-C;
# - the exit code: `flwr run` returns 0 even when the ServerApp failed, so this script checks
#   the run's summary.json and exits 1 unless it says "completed";
# - GPUs: with device=cuda (or cuda:N), each virtual SuperNode asks Flower's runtime for
#   client-gpus=X of a GPU (default 1), e.g. `deploy/simulate.sh 8 device=cuda client-gpus=0.25`.
#
# `fedhmc run --backend flower` runs the same apps through Flower's in-process simulation
# entry point, with no SuperLink at all; this script is for those who want `flwr run`.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

usage() {
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}
[[ $# -ge 1 && "$1" =~ ^[0-9]+$ && "$1" -ge 1 ]] || usage
need_cmd flwr
n="$1"
shift

export FLWR_HOME="${FEDHMC_SIM_FLWR_HOME:-$DEPLOY_DIR/flwr-sim}"
mkdir -p "$FLWR_HOME"
if [[ ! -f "$FLWR_HOME/config.toml" ]]; then
    printf '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n' \
        >"$FLWR_HOME/config.toml"
fi

out=""
device=""
gpus=""
overrides=()
for kv in "$@"; do
    [[ "$kv" == *=* ]] || die "expected KEY=VALUE, got '$kv'"
    key="${kv%%=*}"
    value="${kv#*=}"
    if [[ "$key" == out ]]; then
        out="$(abspath "$value")"
        continue
    fi
    [[ "$key" != device ]] || device="$value"
    [[ "$key" != client-gpus ]] || gpus="$value"
    # Quote text values for TOML; numbers and booleans go as they are.
    if [[ "$value" =~ ^-?[0-9.eE+-]+$ || "$value" == true || "$value" == false ]]; then
        overrides+=("$key=$value")
    else
        overrides+=("$key=\"$value\"")
    fi
done
out="${out:-$DEPLOY_DIR/runs/$(date +%Y%m%d-%H%M%S)-sim}"
mkdir -p "$(dirname "$out")"

stop_local_superlink() {
    local pid
    for pid in $(pgrep -f "flower-superlink.*$FLWR_HOME/local-superlink" 2>/dev/null || true); do
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        kill -9 "$pid" 2>/dev/null || true
        echo "stopped the local SuperLink (pid $pid)"
    done
}

app="$(python "$(dirname "${BASH_SOURCE[0]}")/stage_app.py")"  # see run.sh
trap 'rm -rf "$app"; stop_local_superlink' EXIT
federation="num-supernodes=$n"
if [[ "$device" == cuda* ]]; then  # each virtual SuperNode's share of a GPU
    federation+=" client-resources-num-gpus=${gpus:-1.0}"
fi
flwr run "$app" local --stream \
    --federation-config "$federation" \
    --run-config "num-clients=$n out=\"$out\" ${overrides[*]}"

status="$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' \
    "$out/summary.json" 2>/dev/null || echo missing)"
echo "run status: $status; files in $out"
[[ "$status" == completed ]]
