#!/usr/bin/env bash
# The GPU check, as one command for a lent GPU machine that has Python and torch and nothing
# of fedhmc's: it runs fedhmc from source (no install, no Flower, no Ray).
#
#   bash tools/gpu_check.sh              the check, in at most 8 minutes, each step under its
#                                        own time limit (seconds):
#                                          probe    45   versions, TF32 and cuDNN switches,
#                                                        determinism of ECE and a CNN gradient
#                                          matrix  240   pytest -m gpu: the same chain as the
#                                                        CPU, graphs on and off, determinism
#                                          speed    90   fedhmc's step against a plain
#                                                        captured step
#                                          authors  45   the paper's 200 Fashion-MNIST rounds
#                                        and one summary file, $OUT/gpu-check.md. fedhmc needs
#                                        NumPy and scikit-learn there (pytest for the matrix):
#                                        without them it stops at once, saying what to send.
#   bash tools/gpu_check.sh cnn [SECS]   fedhmc experiment fmnist-cnn --full for at most SECS
#                                        seconds (default 480), resuming from the run folders
#                                        in gpu-runs/fmnist-cnn.tgz when that file is there
#
# Results go to $OUT (default ./gpu-out). Environment: DEVICE (default cuda), SMOKE=1 for
# tiny sizes (a check of this script on a CPU: DEVICE=cpu SMOKE=1), TIME_SCALE=N to
# multiply the time limits (a slow CPU), PYTHON (default python3; tools/bare_env.py makes
# one that sees no Flower, no Ray and no fedhmc install, as on a lent machine). Send along the folders that tools/gpu_prepare.sh fills: .gpu-data
# (Fashion-MNIST's four .gz files) and .gpu-whl (wheels of what the machine may lack,
# installed to /tmp/site).
set -uo pipefail
stage=${1:-check}
secs=${2:-480}
device=${DEVICE:-cuda}
py=${PYTHON:-python3}
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-$root/gpu-out}
mkdir -p "$out"

# Running from source: the folders datasets/, server/ and clients/ under their package names.
mkdir -p /tmp/fedhmc-pp
for d in datasets server clients; do ln -sfn "$root/$d" "/tmp/fedhmc-pp/fedhmc_$d"; done
export PYTHONPATH="/tmp/fedhmc-pp:$root:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
if ls .gpu-whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .gpu-whl/*.whl \
    || echo "note: the wheels in .gpu-whl did not install; going on with what is here" >&2
fi
if ls .gpu-data/*.gz >/dev/null 2>&1; then
  export FEDHMC_DATA="$root/.gpu-data"
fi
export PYTHONUNBUFFERED=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
smoke=()
[ "${SMOKE:-0}" = 1 ] && smoke=(--smoke)

step() {  # step NAME LIMIT: tools/gpu_check.py NAME under its time limit, its status kept
  local name=$1 limit=$(($2 * ${TIME_SCALE:-1})) start rc=0
  start=$(date +%s)
  echo "== $name (at most $limit s)"
  timeout --kill-after=5 "$limit" "$py" tools/gpu_check.py "$name" --device "$device" \
    --out "$out" "${smoke[@]}" || rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - start))" "$limit" >>"$out/steps.tsv"
}

missing=$("$py" -c "import importlib.util as u
print(' '.join(m for m in ('torch', 'numpy', 'sklearn') if u.find_spec(m) is None))" 2>&1)
if [ -n "$missing" ]; then
  echo "tools/gpu_check.sh: $py lacks $missing; send their wheels in .gpu-whl (FULL=1 bash" \
    "tools/gpu_prepare.sh) or install them there" >&2
  exit 2
fi

case "$stage" in
  check)
    rm -f "$out/steps.tsv" "$out"/{probe,matrix,speed,authors}.json
    step probe 45
    step matrix 240
    step speed 90
    step authors 45
    "$py" tools/gpu_check.py summary --device "$device" --out "$out" "${smoke[@]}"
    cat "$out/gpu-check.md"
    ;;
  cnn)
    runs=gpu-runs/fmnist-cnn
    mkdir -p gpu-runs
    [ -f gpu-runs/fmnist-cnn.tgz ] && tar -xzf gpu-runs/fmnist-cnn.tgz -C gpu-runs
    budget=--${BUDGET:-full}  # --full; BUDGET=reduced or quick for a check on a CPU
    [ "${SMOKE:-0}" = 1 ] && budget=--quick
    [ "$budget" = --reduced ] && budget=
    # Stopped after SECS (rc 124): the cells keep their checkpoints and the next call resumes.
    rc=0
    timeout --signal=INT "$secs" "$py" -m fedhmc experiment fmnist-cnn $budget \
      --device "$device" --out "$runs" --quiet || rc=$?
    tar -czf "$out/fmnist-cnn.tgz" -C gpu-runs fmnist-cnn
    "$py" - "$runs" <<'PY'
import csv, pathlib, sys
for m in sorted(pathlib.Path(sys.argv[1]).glob("cells/*/metrics.csv")):
    rows = list(csv.DictReader(m.open()))
    last = rows[-1] if rows else {}
    print(m.parent.name, "rounds:", last.get("round", 0), "accuracy:", last.get("accuracy", "-"),
          "nll_sum:", last.get("nll_sum", "-"))
PY
    echo "fmnist-cnn: exit status $rc (124: stopped after $secs s, resume with another call)"
    ;;
  *)
    echo "tools/gpu_check.sh: unknown stage '$stage' (none for the check, or cnn [SECS])" >&2
    exit 2
    ;;
esac
