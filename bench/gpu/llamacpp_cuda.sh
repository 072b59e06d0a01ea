#!/usr/bin/env bash
# llama.cpp built for CUDA beside this engine on the same NVIDIA machine, the same demo checkpoint and session:
# decode tokens/s with every expert on the GPU, with the first 8 and all 16 expert layers' experts on the CPU,
# and on the CPU only. Run from the repository root on the GPU machine, after bench/gpu/run_on_device.sh has
# built the engine (it measures this engine's side: `bash bench/gpu/run_on_device.sh hbm primary`).
#
#   LLAMA_SRC=path/to/llama.cpp bash bench/gpu/llamacpp_cuda.sh
#
# LLAMA_SRC is a llama.cpp source tree (the one vendored in the llama-cpp-python sdist that bench/vs_llamacpp.py
# downloads: CMakeLists.txt, cmake, ggml, src, include, common, tools, vendor, gguf-py, conversion and
# convert_hf_to_gguf.py are what this needs). The machine needs cmake, ninja, nvcc, torch and transformers (the
# converter's). llama-bench decodes 128 tokens after an empty prompt (tg128), 5 repetitions, 16 threads; its KV
# cache is f16 (this engine's is f32).
set -euo pipefail
OUT=${OUT:-/tmp/out}
SRC=${LLAMA_SRC:?set LLAMA_SRC to a llama.cpp source tree}
BUILD=${LLAMA_BUILD:-/tmp/llama-cuda-build}
THREADS=${THREADS:-$(nproc)}
ARCH=${EXPERTBENCH_CUDA_ARCHS:-90}
WORK=${LLAMA_WORK:-/tmp/llama-cuda}
mkdir -p "$OUT" "$WORK"
# the engine (for the demo target) with cffi where run_on_device.sh installed it
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}

start=$(date +%s)
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF > "$OUT/llama_cmake.log" 2>&1 || { tail -30 "$OUT/llama_cmake.log"; exit 1; }
# the demo target converted meanwhile (one core), as bench/vs_llamacpp.py converts it
TARGET=$(python3 -c "import sys; sys.path.insert(0, 'bench'); from checkpoints import demo_target; print(demo_target('bench', 'bf16'))")
GGUF=$WORK/target-bf16.gguf
(python3 -c "import sys; sys.path.insert(0, 'bench'); from vs_llamacpp import CONVERTER; print(CONVERTER)" > "$WORK/convert.py" &&
    python3 "$WORK/convert.py" "$SRC" "$TARGET" --outtype bf16 --outfile "$GGUF" > "$OUT/llama_convert.log" 2>&1) &
convert=$!
trap 'kill $convert 2>/dev/null || true' EXIT # a failed build leaves no converter running
ninja -C "$BUILD" -j "$THREADS" llama-bench > "$OUT/llama_build.log" 2>&1 || { tail -30 "$OUT/llama_build.log"; exit 1; }
echo "llama.cpp built in $(( $(date +%s) - start )) s"
wait $convert || { tail -30 "$OUT/llama_convert.log"; exit 1; }

BENCH=("$BUILD/bin/llama-bench" -m "$GGUF" -p 0 -n 128 -r 5 -t "$THREADS")
echo "llama.cpp, every layer on cuda:0, experts of the first N layers on the CPU (-ncmoe N):"
"${BENCH[@]}" -ngl 99 -ncmoe 0,8,16 -o md | tee "$OUT/llama_bench_gpu.md"
echo "llama.cpp, CPU only:"
CUDA_VISIBLE_DEVICES= "${BENCH[@]}" -ngl 0 -o md | tee "$OUT/llama_bench_cpu.md"
