#!/usr/bin/env bash
# Usage: deploy/make_certs.sh OUTDIR HOST_OR_IP [MORE_HOSTS_OR_IPS...]
#
# Creates a test certificate authority and a TLS certificate for the SuperLink:
#   OUTDIR/ca.crt      the CA certificate: copy it to every SuperNode and to the machine running `flwr run`
#   OUTDIR/ca.key      the CA private key: keep it secret (reused on the next call, so ca.crt stays valid)
#   OUTDIR/server.pem  the SuperLink certificate, signed by the CA
#   OUTDIR/server.key  the SuperLink private key: stays on the SuperLink machine
# The certificate's subjectAltName lists every HOST_OR_IP given (IP: for IPv4/IPv6 addresses, DNS: for
# names): give the name or address that SuperNodes and `flwr run` use to reach the SuperLink.
# 127.0.0.1, ::1 and localhost are always added, because the SuperLink's own SuperExec (which starts the
# ServerApp) connects to it over loopback with the same certificate.
# Env: CERT_DAYS (validity in days, default 365).
# Example: deploy/make_certs.sh ~/fedhmc-deploy/certs superlink.example.org 10.0.0.5
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

[[ $# -ge 2 ]] || usage
need_cmd openssl
out="$(abspath "$1")"
shift
days="${CERT_DAYS:-365}"

is_ip() {
    [[ "$1" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ || "$1" == *:* ]]
}

sans=()
add_san() {
    local entry s
    if is_ip "$1"; then entry="IP:$1"; else entry="DNS:$1"; fi
    for s in ${sans[@]+"${sans[@]}"}; do
        [[ "$s" == "$entry" ]] && return 0
    done
    sans+=("$entry")
}
for h in "$@" 127.0.0.1 ::1 localhost; do
    add_san "$h"
done
san="$(IFS=,; echo "${sans[*]}")"

mkdir -p "$out"
umask 077
if [[ -f "$out/ca.key" && -f "$out/ca.crt" ]]; then
    echo "reusing the CA in $out (ca.key, ca.crt)"
else
    openssl ecparam -name prime256v1 -genkey -noout -out "$out/ca.key"
    openssl req -x509 -new -key "$out/ca.key" -sha256 -days "$days" \
        -subj "/CN=fedhmc test CA" -out "$out/ca.crt"
fi

openssl ecparam -name prime256v1 -genkey -noout -out "$out/server.key"
openssl req -new -key "$out/server.key" -subj "/CN=$1" -out "$out/server.csr"
cat >"$out/server.ext" <<EOT
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$san
EOT
openssl x509 -req -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -CAcreateserial -out "$out/server.pem" -days "$days" -sha256 -extfile "$out/server.ext" 2>/dev/null
rm -f "$out/server.csr" "$out/server.ext"
chmod 644 "$out/ca.crt" "$out/server.pem"
openssl verify -CAfile "$out/ca.crt" "$out/server.pem" >/dev/null

echo "CA certificate:     $out/ca.crt"
echo "server certificate: $out/server.pem (subjectAltName=$san)"
echo "server key:         $out/server.key"
