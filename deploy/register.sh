#!/usr/bin/env bash
# Usage: deploy/register.sh CONNECTION PUBKEY [PUBKEY...]
#
# Registers SuperNode public keys (OUTDIR/NAME.pub from deploy/make_keys.sh) with the SuperLink
# reached through the `flwr` connection CONNECTION (deploy/connection.sh). Only SuperNodes whose key is
# registered are let in; each gets a fixed node id. The node's name is the key's file name without .pub.
# Run it wherever the connection is defined (the SuperLink machine or the one running `flwr run`).
# Check with: flwr supernode list CONNECTION   (remove one: flwr supernode unregister NODE_ID CONNECTION)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

[[ $# -ge 2 ]] || usage
need_cmd flwr
conn="$1"
shift
[[ "$conn" =~ ^[A-Za-z0-9_-]+$ ]] || die "bad connection name '$conn'"
keys=()
for k in "$@"; do
    [[ -f "$k" ]] || die "public key $k not found"
    keys+=("$(abspath "$k")")
done
# Run outside any Flower app folder, so that flwr never migrates (rewrites) a pyproject.toml.
mkdir -p "$FLWR_HOME"
cd "$FLWR_HOME"
for k in "${keys[@]}"; do
    name="$(basename "$k" .pub)"
    if out="$(flwr supernode register "$k" "$conn" --name "$name" 2>&1)"; then
        echo "$out" | grep -v "^Using SuperLink" || true
    elif [[ "$out" == *"already in use"* ]]; then
        echo "$k ('$name') is already registered"
    else
        echo "$out" >&2
        die "could not register $k"
    fi
done
echo "registered SuperNodes: flwr supernode list $conn"
