#!/usr/bin/env bash
# On the NVIDIA machine: the gpt-oss-shaped bench demo (`expertbench demo-model --family gpt-oss --size bench`, its
# experts in the released MXFP4 layout) converted by llama.cpp's own convert_hf_to_gguf.py to a GGUF (the MXFP4
# experts kept, BF16 elsewhere), decoded by our engine with the GPU as primary and by llama.cpp built for CUDA from
# the llama-cpp-python source (.llama/llama-src.tgz), on the same file: every expert on the GPU, the experts of the
# first half of the layers on the CPU (llama.cpp: -ncmoe N/2), every expert on the CPU (-ncmoe N). The same thread
# count on both sides (THREADS, default 8); 128 decoded tokens, 5 repetitions; llama-bench's KV cache is f16, ours
# f32. Needs the wheels of run_on_device.sh in .whl/. First the GPU tests of the gpt-oss family (and the rest of
# tests/test_gpu_modules.py).
#   bash bench/gpu/gpt_oss_vs_llamacpp.sh          writes $OUT/gpt_oss_vs_llamacpp.txt, ours.json, llama.md
set -uo pipefail
OUT=${OUT:-/tmp/out}
THREADS=${THREADS:-8}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD EXPERTBENCH_CUDA_ARCHS=${EXPERTBENCH_CUDA_ARCHS:-90}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# llama.cpp's CUDA build in the background while ours builds, is tested and runs
(mkdir -p /tmp/ll && tar xzf .llama/llama-src.tgz -C /tmp/ll && cd /tmp/ll/llama.cpp &&
    cmake -S . -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=ON > /tmp/ll.cfg 2>&1 &&
    cmake --build build -j "$(nproc)" --target llama-bench > /tmp/ll.build 2>&1
    echo "llama.cpp build: $?" > /tmp/ll.done) &
python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
python3 -m pytest -q -p no:cacheprovider -m "gpu or not (build or sanitize or bench)" tests/test_gpu_modules.py 2>&1 | tail -6
python3 -m engine demo-model --family gpt-oss --size bench | tail -1
GGUF=$(python3 -c "
import sys; from pathlib import Path; sys.path.insert(0, 'bench')
from checkpoints import demo_target
from vs_llamacpp import to_gguf
print(to_gguf(demo_target('bench', 'bf16', 'gpt-oss'), 'bf16', python=Path(sys.executable), src=Path('/tmp/ll/llama.cpp')))
" 2> "$OUT/convert.log" | tail -1)
[ -f "$GGUF" ] || { echo "conversion failed"; tail -20 "$OUT/convert.log"; exit 1; }
echo "file: $GGUF"
python3 - "$GGUF" "$THREADS" <<'PY' | tee "$OUT/ours.txt"
import json, pathlib, statistics, sys
sys.path.insert(0, "bench")
from measure import decode_speed
from engine.checkpoints.checkpoint import Checkpoint
from engine.checkpoints.demo import DEMO_PROMPTS
from engine.model import Engine
path, threads = sys.argv[1], int(sys.argv[2])
ck = Checkpoint.open(path)
prompt = ck.tokenizer.encode(DEMO_PROMPTS[0], add_special_tokens=False).ids
n = ck.config.num_layers
rows, ids0 = [], None
with Engine(runtimes=("cpu", "cuda"), cpu_threads=threads) as eng, eng.load(ck, device="cuda:0") as m:
    for name, placement in (("every expert on cuda:0", "*=cuda:0"),
                            (f"experts of layers 0-{n // 2 - 1} on cpu:0", f"*=cuda:0; 0-{n // 2 - 1}=cpu:0"),
                            ("every expert on cpu:0", "*=cpu:0")):
        m.set_placement(placement)
        for precision in ("f32", "q8"):
            speeds, ids = decode_speed(m, prompt, 128, 5, precision=precision)
            ids0 = ids0 or ids
            print(f"ours | {name} | {precision} | {statistics.median(speeds):.1f} tok/s "
                  f"(min {min(speeds):.1f}, max {max(speeds):.1f}); ids as the first row: {ids == ids0}", flush=True)
            rows.append({"placement": placement, "precision": precision, "decode": speeds, "file": path,
                         "bytes_per_token": m.info["bytes_per_token"], "threads": threads})
pathlib.Path(sys.argv[1] + ".ours.json").write_text(json.dumps(rows))
PY
cp "$GGUF.ours.json" "$OUT/ours.json" 2>/dev/null
for i in $(seq 1 90); do [ -f /tmp/ll.done ] && break; sleep 5; done
cat /tmp/ll.done 2>/dev/null || { echo "llama.cpp build not done"; tail -3 /tmp/ll.build; }
B=/tmp/ll/llama.cpp/build/bin/llama-bench
if [ -x $B ]; then
    n=$(python3 -c "from engine.checkpoints.checkpoint import Checkpoint; print(Checkpoint.open('$GGUF').config.num_layers)")
    $B -m "$GGUF" -ngl 99 -ncmoe "0,$((n / 2)),$n" -t "$THREADS" -p 0 -n 128 -r 5 -o md 2>&1 | tee "$OUT/llama.md"
fi
