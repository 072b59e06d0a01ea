#!/usr/bin/env bash
# Build, test and time on the NVIDIA machine (run from the repository root there). Needs cffi and pycparser
# wheels in .whl/ (the machine has no package registry). Writes reports to $OUT.
#   bash bench/gpu/run_on_device.sh [tests] [split] [cpu] [costmodel]     (default: all four)
set -euo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
steps=${*:-tests split cpu costmodel}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "cores: $(nproc)"
export EXPERTBENCH_CUDA_ARCHS=${EXPERTBENCH_CUDA_ARCHS:-90}
python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
for step in $steps; do
    case $step in
    tests) python3 -m pytest -q -p no:cacheprovider tests/test_gpu_modules.py tests/test_placement.py 2>&1 | tail -4 ;;
    split) python3 bench/gpu_split.py --size bench --tokens 64 --repeats 3 --json "$OUT/gpu_split_bench.json" ;;
    cpu)
        for c in 1 2 4; do
            echo "CPU only, EXPERTBENCH_CHUNKS_PER_THREAD=$c"
            EXPERTBENCH_CHUNKS_PER_THREAD=$c python3 bench/decode.py --size bench --dtypes bf16 --repeats 3 \
                --json "$OUT/decode_h200_c$c.json" | tail -3
        done ;;
    costmodel) python3 bench/costmodel.py --size bench --peer cuda:0 --json "$OUT/costmodel_cuda.json" ;;
    esac
done
