#!/usr/bin/env bash
# Usage: deploy/run.sh CONNECTION [flwr run options ...]
#
# Submit fedhmc to the SuperLink behind CONNECTION: `flwr run APP CONNECTION ...`, where APP
# is a copy of what the run ships (pyproject.toml and the files its `fab-include` names),
# staged in a temporary folder and removed afterwards. The app is the same as with
# `flwr run . CONNECTION` from the repository root, but `flwr run .` first walks every file
# under the root, a virtual environment kept there included: seconds on each submission.
#
# Example:
#   deploy/run.sh fedhmc --stream --run-config "num-clients=2 rounds=200 out=\"$HOME/run1\""
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

usage() {
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}
[[ $# -ge 1 && "$1" != -* ]] || usage
need_cmd flwr python
app="$(python "$(dirname "${BASH_SOURCE[0]}")/stage_app.py")"
trap 'rm -rf "$app"' EXIT
flwr run "$app" "$@"
