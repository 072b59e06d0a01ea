#!/usr/bin/env bash
# Build, test and time on the NVIDIA machine (run from the repository root there). Needs cffi and pycparser
# wheels in .whl/ (the machine has no package registry). Writes reports to $OUT.
#   bash bench/gpu/run_on_device.sh [tests] [hbm] [primary] [kernels] [split] [cpu] [weights] [costmodel]
#       [costmodel-primary] [overlap] [bridge]
#   (default: tests hbm primary split costmodel-primary)
set -euo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
steps=${*:-tests hbm primary split costmodel-primary}
HBM_GBS=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "cores: $(nproc)"
export EXPERTBENCH_CUDA_ARCHS=${EXPERTBENCH_CUDA_ARCHS:-90}
# the hip module for the NVIDIA platform beside the cuda module: two runtime modules owning experts on one card
export EXPERTBENCH_HIP_PLATFORM=${EXPERTBENCH_HIP_PLATFORM:-nvidia}
# EB_SKIP_BUILD=1: the modules an earlier call of this script built in this tree (a second call in one command)
# EB_GPU_MODULES=DIR: the cuda and hip modules built elsewhere for this card (nvcc compiles them anywhere; carried in
# DIR), copied beside the core built here without them: minutes of the lease saved
if [ -z "${EB_SKIP_BUILD:-}" ]; then
    if [ -n "${EB_GPU_MODULES:-}" ]; then
        EXPERTBENCH_NO_GPU=1 python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 ||
            { tail -30 "$OUT/build.log"; exit 1; }
        cp "$EB_GPU_MODULES"/expertbench_rt_*.so engine/
    else
        python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
    fi
fi
for step in $steps; do
    case $step in
    tests)
        # the fast lane's tests of these files and the gpu lane's (pyproject's default leaves the gpu lane out); every
        # failure reported (no -x: one call of the GPU machine should say all that differs), the whole log in $OUT
        # EB_TESTS: other pytest arguments (some files, a -k expression) where one call has time for part of them
        # shellcheck disable=SC2086
        python3 -m pytest -q -p no:cacheprovider -m "gpu or not (build or sanitize or bench)" \
            ${EB_TESTS:-tests/test_gpu_modules.py tests/test_gpu_quantized.py tests/test_precisions.py \
            tests/test_device_primary.py tests/test_placement.py tests/test_trace.py} > "$OUT/tests.log" 2>&1 ||
            echo "TESTS FAILED"
        tail -40 "$OUT/tests.log" ;;
    hbm)
        nvcc -O3 -gencode=arch=compute_90,code=sm_90 -o /tmp/hbm_read bench/gpu/hbm_read.cu
        HBM_GBS=$(/tmp/hbm_read | awk '/hbm_read_gbs/ {print $2}')
        echo "HBM read ceiling: $HBM_GBS GB/s" ;;
    primary)
        python3 bench/gpu_primary.py --size bench --tokens 128 --repeats 5 --hbm-gbs "$HBM_GBS" \
            --json "$OUT/gpu_primary_bench.json" || echo "gpu_primary: ids differ from the CPU-only run" ;;
    split) python3 bench/gpu_split.py --size bench --tokens 64 --repeats 3 --json "$OUT/gpu_split_bench.json" ;;
    cpu)
        for c in 1 2 4; do
            echo "CPU only, EXPERTBENCH_CHUNKS_PER_THREAD=$c"
            EXPERTBENCH_CHUNKS_PER_THREAD=$c python3 bench/decode.py --size bench --dtypes bf16 --repeats 3 \
                --json "$OUT/decode_h200_c$c.json" | tail -3
        done ;;
    weights)
        python3 bench/weights_ab.py --size bench --dtypes bf16 --rounds 4 --json "$OUT/weights_ab_h200.json" ;;
    costmodel) python3 bench/costmodel.py --size bench --peer cuda:0 --json "$OUT/costmodel_cuda.json" ;;
    kernels) # 6 decode steps less 2: the 4 steps alone, per kernel
        for n in 2 6; do
            ncu --clock-control none --metrics gpu__time_duration.sum --csv \
                python3 bench/gpu/kernel_times.py bench $n > "$OUT/ncu_kernels_$n.csv" 2> "$OUT/ncu.log" ||
                tail -5 "$OUT/ncu.log"
        done
        python3 bench/gpu/kernel_summary.py "$OUT/ncu_kernels_6.csv" 4 "$OUT/ncu_kernels_2.csv" ;;
    overlap) # every MoE layer split between the GPU primary and cpu:0: the owners' spans against max and sum
        python3 bench/overlap.py --primary cuda:0 --peer cpu:0 --size bench --tokens 64 --rounds 3 \
            --json "$OUT/overlap_cuda_bench.json" ;;
    bridge) # the cross-runtime bridge: every MoE layer split between cuda:0 and hip:0 (hip built for the NVIDIA
        # platform), each way round, and the CPU as the second owner for comparison, in one call
        for pair in "cuda:0 hip:0" "hip:0 cuda:0" "cuda:0 cpu:0"; do
            set -- $pair
            echo "== bridge: primary $1, peer $2"
            python3 bench/overlap.py --primary "$1" --peer "$2" --size bench --tokens 64 --rounds 3 \
                --json "$OUT/bridge_${1%%:*}_${2%%:*}.json" || echo "bridge $1 $2: ids differ or it failed"
        done ;;
    costmodel-primary)
        python3 bench/costmodel.py --size bench --primary cuda:0 --peer cpu:0 --repeats 3 \
            --json "$OUT/costmodel_cuda_primary.json" ;;
    esac
done
