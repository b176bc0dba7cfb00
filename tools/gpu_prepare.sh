#!/usr/bin/env bash
# Prepare this checkout for tools/gpu_check.sh on a lent GPU machine (Python 3.12 and torch,
# nothing of fedhmc's): two folders that git ignores, to send along with the checkout.
#   .gpu-data   Fashion-MNIST's four .gz files (from Debian's dataset-fashion-mnist)
#   .gpu-whl    pytest's wheels (the matrix needs it); with FULL=1 also NumPy, SciPy,
#               scikit-learn and tqdm, for a machine without them (about 60 MB more: mind
#               the 64 MiB a transfer carries)
# Usage, from the project's root: bash tools/gpu_prepare.sh
set -eu
cd "$(dirname "$0")/.."
mkdir -p .gpu-data .gpu-whl
if ls /usr/share/datasets/fashion-mnist/*.gz >/dev/null 2>&1; then
  cp /usr/share/datasets/fashion-mnist/*.gz .gpu-data/
else
  echo "Fashion-MNIST is not installed here (apt-get install -y dataset-fashion-mnist):" \
    "the authors' rounds will be skipped there" >&2
fi
wheels=(pytest pluggy iniconfig packaging)
[ "${FULL:-0}" = 1 ] && wheels+=(numpy scipy scikit-learn joblib threadpoolctl tqdm)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .gpu-whl "${wheels[@]}"
du -sh .gpu-data .gpu-whl
echo "Send the checkout with .gpu-data and .gpu-whl, and run there: bash tools/gpu_check.sh"
