#!/usr/bin/env bash
# Usage: deploy/connection.sh NAME ADDRESS CA_CRT
#
# Adds (or replaces) the SuperLink connection NAME in $FLWR_HOME/config.toml (default ~/.flwr), used as
# `flwr run . NAME`, `flwr ls NAME`, `flwr supernode list NAME`, deploy/register.sh NAME ...:
#   [superlink.NAME]
#   address = "ADDRESS"                    # HOST:PORT of the SuperLink, as in its certificate
#   root-certificates = "/abs/path/ca.crt" # the CA that signed the SuperLink certificate (TLS)
# Example: deploy/connection.sh fedhmc superlink.example.org:9091 ~/fedhmc-deploy/certs/ca.crt
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

[[ $# -eq 3 ]] || usage
name="$1"
address="$2"
ca="$(abspath "$3")"
[[ "$name" =~ ^[A-Za-z0-9_-]+$ ]] || die "bad connection name '$name' (letters, digits, _ and - only)"
[[ "$address" == *:* && "$address" != *'"'* ]] || die "ADDRESS must be HOST:PORT (got '$address')"
[[ -f "$ca" ]] || die "CA certificate $ca not found"
[[ "$ca" != *'"'* && "$ca" != *\\* ]] || die "unsupported characters in path $ca"

cfg="$FLWR_HOME/config.toml"
mkdir -p "$FLWR_HOME"
if [[ ! -f "$cfg" ]]; then
    need_cmd flwr
    # Let flwr write its default configuration first (run outside any app folder).
    (cd "$FLWR_HOME" && flwr config list >/dev/null)
fi

# Drop an existing [superlink.NAME] table (and its sub-tables), then append the new one.
tmp="$(mktemp "$cfg.XXXXXX")"
awk -v name="$name" '
    /^[ \t]*\[/ {
        h = $0
        gsub(/[ \t]/, "", h)
        skip = (h == "[superlink." name "]" || h == "[superlink.\"" name "\"]" ||
                index(h, "[superlink." name ".") == 1 || index(h, "[superlink.\"" name "\".") == 1)
    }
    !skip { print }
' "$cfg" | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}' >"$tmp"
{
    echo
    echo "[superlink.$name]"
    echo "address = \"$address\""
    echo "root-certificates = \"$ca\""
} >>"$tmp"
mv "$tmp" "$cfg"
echo "connection '$name' -> $address (CA $ca) in $cfg"
