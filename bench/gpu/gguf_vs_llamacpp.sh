#!/usr/bin/env bash
# On the NVIDIA machine: the GGUF demo target (bench size, written by `expertbench demo-model --format gguf`) decoded
# by our engine with the GPU as primary (every expert on the GPU, then half of the expert layers on the CPU) and by
# llama.cpp built for CUDA from the llama-cpp-python source (.llama/llama-src.tgz, its vendor/llama.cpp trimmed to
# the CPU and CUDA backends and llama-bench), on the same file. Needs the wheels of run_on_device.sh in .whl/.
#   bash bench/gpu/gguf_vs_llamacpp.sh [q8_0|mxfp4 ...]     (default: q8_0 mxfp4); writes $OUT/gguf_vs_llamacpp.txt
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
quants=${*:-q8_0 mxfp4}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD EXPERTBENCH_CUDA_ARCHS=${EXPERTBENCH_CUDA_ARCHS:-90}
# llama.cpp's CUDA build in the background while ours builds and runs
(mkdir -p /tmp/ll && tar xzf .llama/llama-src.tgz -C /tmp/ll && cd /tmp/ll/llama.cpp &&
    cmake -S . -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=ON > /tmp/ll.cfg 2>&1 &&
    cmake --build build -j "$(nproc)" --target llama-bench > /tmp/ll.build 2>&1; echo "llama.cpp build: $?" > /tmp/ll.done) &
python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
python3 -m pytest -q -p no:cacheprovider -m "gpu or not (build or sanitize or bench)" tests/test_gpu_quantized.py tests/test_gpu_modules.py 2>&1 | tail -4
for q in $quants; do
    python3 -m engine demo-model --size bench --format gguf --quant "$q" | tail -1
done
python3 - "$quants" <<'PY' | tee "$OUT/ours.txt"  # the CPU's share in both precisions
import json, pathlib, statistics, sys
sys.path.insert(0, "bench")
from measure import decode_speed
from engine.checkpoints.checkpoint import Checkpoint
from engine.checkpoints.demo import DEMO_PROMPTS, ensure_demo_pair
from engine.model import Engine
rows = []
for q in sys.argv[1].split():
    pair = ensure_demo_pair("bench", format="gguf", quant=q)
    ck = Checkpoint.open(pair.target)
    prompt = ck.tokenizer.encode(DEMO_PROMPTS[0], add_special_tokens=False).ids
    with Engine(runtimes=("cpu", "cuda"), cpu_threads=8) as eng, eng.load(ck, device="cuda:0") as m:
        n = ck.config.num_layers
        half = f"*=cuda:0; 0-{n // 2 - 1}=cpu:0"
        for name, placement in (("all experts on cuda:0", "*=cuda:0"), (f"expert layers 0-{n // 2 - 1} on cpu:0", half)):
            m.set_placement(placement)
            for precision in ("f32", "q8"):
                speeds, ids = decode_speed(m, prompt, 128, 5, precision=precision)
                print(f"{q} | {name} | {precision} | {statistics.median(speeds):.1f} tok/s", flush=True)
                rows.append({"quant": q, "placement": placement, "precision": precision, "decode": speeds,
                             "file": str(pair.target)})
pathlib.Path("/tmp/ours.json").write_text(json.dumps(rows))
PY
for i in $(seq 1 60); do [ -f /tmp/ll.done ] && break; sleep 5; done
cat /tmp/ll.done 2>/dev/null || { echo "llama.cpp build not done"; tail -3 /tmp/ll.build; }
B=/tmp/ll/llama.cpp/build/bin/llama-bench
if [ -x $B ]; then
    for q in $quants; do
        f=$(python3 -c "from engine.checkpoints.demo import ensure_demo_pair; print(ensure_demo_pair('bench', format='gguf', quant='$q').target)")
        n=$(python3 -c "from engine.checkpoints.checkpoint import Checkpoint; print(Checkpoint.open('$f').config.num_layers)")
        $B -m "$f" -ngl 99 -p 0 -n 128 -r 5 -o md 2>&1 | grep -E "tg128|error" | sed "s/^/$q all on GPU: /"
        $B -m "$f" -ngl 99 -ncmoe $((n / 2)) -t 8 -p 0 -n 128 -r 5 -o md 2>&1 | grep -E "tg128|error" |
            sed "s/^/$q ncmoe $((n / 2)): /"
    done | tee "$OUT/llama.txt"
fi
cp /tmp/ours.json "$OUT/" 2>/dev/null
