#!/usr/bin/env bash
# Usage: deploy/make_keys.sh OUTDIR NAME [NAME...]
#
# Creates one SuperNode authentication key pair per NAME (ECDSA P-384, OpenSSH format, no passphrase):
#   OUTDIR/NAME      private key: copy it to the SuperNode machine only (flower-supernode --auth-supernode-private-key)
#   OUTDIR/NAME.pub  public key: register it on the SuperLink (deploy/register.sh CONNECTION OUTDIR/NAME.pub)
# An existing key pair is kept, never overwritten (its public key may already be registered).
# (ed25519 keys are rejected by `flwr supernode register`; use these ECDSA keys.)
# Example: deploy/make_keys.sh ~/fedhmc-deploy/keys client0 client1
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

[[ $# -ge 2 ]] || usage
need_cmd ssh-keygen
out="$(abspath "$1")"
shift
mkdir -p "$out"
for name in "$@"; do
    [[ "$name" =~ ^[A-Za-z0-9._-]+$ ]] || die "bad key name '$name' (letters, digits, . _ - only)"
    if [[ -f "$out/$name" && -f "$out/$name.pub" ]]; then
        echo "kept existing key pair $out/$name(.pub)"
        continue
    fi
    rm -f "$out/$name" "$out/$name.pub"
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "$name" -f "$out/$name"
    echo "private key: $out/$name   public key: $out/$name.pub"
done
