#!/usr/bin/env bash
# A/B of two versions of the GPU module on the NVIDIA machine, interleaved (A B A B) in one session, since speeds
# drift between machines and over minutes. From the repository root there, with the .whl/ wheels of
# run_on_device.sh and the two sources carried in (e.g. git show REV:native/runtime/gpu/gpu_runtime.cu > .ab/a.cu):
#   bash bench/gpu/ab_module.sh .ab/a.cu .ab/b.cu
# Prints the all-GPU and half-CPU rows of bench/gpu_primary.py for each; leaves the second version built and the
# checkout's own source file in place.
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: $0 A.cu B.cu" >&2; exit 2; }
SOURCE=native/runtime/gpu/gpu_runtime.cu
cp "$SOURCE" /tmp/gpu_runtime.cu.orig
trap 'cp /tmp/gpu_runtime.cu.orig "$SOURCE"' EXIT # the checkout's own source comes back whatever happens
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD EXPERTBENCH_CUDA_ARCHS=${EXPERTBENCH_CUDA_ARCHS:-90}
nvcc -O3 -gencode=arch=compute_90,code=sm_90 -o /tmp/hbm_read bench/gpu/hbm_read.cu
HBM=$(/tmp/hbm_read | awk '{print $2}')
for source in "$1" "$2" "$1" "$2"; do
    cp "$source" "$SOURCE"
    python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
    echo "== $source"
    python3 bench/gpu_primary.py --size bench --tokens 128 --repeats 5 --hbm-gbs "$HBM" |
        grep "^| every expert on the GPU, graphs\|^| first 8"
done
