#!/usr/bin/env bash
# The GPU checks, as one command for a lent GPU machine that runs fedhmc from source.
#
#   bash tools/gpu_check.sh bench        python -m benchmarks --only gpu: the same-chain matrix,
#                                        the speed report against a plain captured step and the
#                                        authors' 200 Fashion-MNIST rounds (under 8 minutes)
#   bash tools/gpu_check.sh cnn [SECS]   fedhmc experiment fmnist-cnn --full for at most SECS
#                                        seconds (default 480), resuming from the run folders
#                                        in gpu-runs/fmnist-cnn.tgz when that file is there
#
# Results go to $OUT (default ./gpu-out): the benchmark report, and the experiment's folder
# as one fmnist-cnn.tgz (copy it to gpu-runs/ to resume there; commit the results page once
# the 200 rounds are done). Environment: DEVICE (default cuda), SMOKE=1 for tiny sizes (a
# check of this script on a CPU: DEVICE=cpu SMOKE=1), BUDGET=reduced for the experiment's
# smaller budget. Where the machine lacks fedhmc's
# dependencies, the folders .gpu-whl (wheels, installed to /tmp/site) and .gpu-data
# (Fashion-MNIST's four .gz files) are used when present.
set -euo pipefail
stage=${1:?usage: tools/gpu_check.sh bench|cnn [SECS]}
secs=${2:-480}
device=${DEVICE:-cuda}
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
cd "$(dirname "$0")/.."
root=$PWD

if ! python3 -c "import fedhmc_server" 2>/dev/null; then  # running from source: the packages
  mkdir -p /tmp/pp
  for d in datasets server clients; do ln -sfn "$root/$d" "/tmp/pp/fedhmc_$d"; done
  export PYTHONPATH="/tmp/pp:$root:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ls .gpu-whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-whl/*.whl
fi
if ls .gpu-data/*.gz >/dev/null 2>&1; then
  export FEDHMC_DATA="$root/.gpu-data"
fi
export PYTHONUNBUFFERED=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
smoke=()
[ "${SMOKE:-0}" = 1 ] && smoke=(--smoke)

case "$stage" in
  bench)
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
    python3 -m benchmarks --only gpu --device "$device" "${smoke[@]}" --out "$out"
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
    timeout --signal=INT "$secs" python3 -m fedhmc experiment fmnist-cnn $budget \
      --device "$device" --out "$runs" --quiet || rc=$?
    tar -czf "$out/fmnist-cnn.tgz" -C gpu-runs fmnist-cnn
    python3 - "$runs" <<'PY'
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
    echo "tools/gpu_check.sh: unknown stage '$stage' (bench or cnn)" >&2
    exit 2
    ;;
esac
