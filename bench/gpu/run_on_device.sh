#!/usr/bin/env bash
# Build, test and time the cuda module on the NVIDIA machine (run from the repository root there).
# Needs cffi and pycparser wheels in .whl/ (the machine has no package registry). Writes reports to $OUT.
set -euo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nproc
export EXPERTBENCH_CUDA_ARCHS=${EXPERTBENCH_CUDA_ARCHS:-90}
python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
ls engine/*.so
python3 -m pytest -q -p no:cacheprovider tests/test_gpu_modules.py tests/test_placement.py tests/test_reference.py 2>&1 | tail -15
python3 bench/gpu_split.py --size default --tokens 64 --repeats 3 --json "$OUT/gpu_split_default.json"
python3 bench/gpu_split.py --size bench --tokens 64 --repeats 3 --json "$OUT/gpu_split_bench.json"
