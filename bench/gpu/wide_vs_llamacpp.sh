#!/usr/bin/env bash
# On the NVIDIA machine: the wide demo target (`expertbench demo-model --size wide`: Qwen3-30B-A3B's layer shape in 8
# layers, 10 GB of bf16) converted by llama.cpp's own convert_hf_to_gguf.py to a BF16 GGUF, then decoded from that
# one file by our engine (bench/gpu_primary.py: the GPU as primary) and by llama.cpp built for CUDA from the
# llama-cpp-python source (.llama/llama-src.tgz): every expert on the GPU, the experts of the first half of the
# layers on the CPU (llama.cpp: -ncmoe N/2), every expert on the CPU (-ncmoe N), and the CPU alone. The same thread
# count on both sides (THREADS, default all cores), 128 decoded tokens, 5 repetitions; llama-bench's KV cache is
# f16, ours f32. Also the HBM read ceiling (bench/gpu/hbm_read.cu) and the all-GPU step's kernel times (ncu).
# Needs the wheels of run_on_device.sh in .whl/.
#   bash bench/gpu/wide_vs_llamacpp.sh [build] [gpu] [cpu] [kernels] [tests] [quick] [quant] [mixed] [ab]
#   (default: the first four)
# or, on a short lease, the build in parts with ours measured first (the pip install done before the second starts):
#   bash S llama > $OUT/llama_build.txt 2>&1 & L=$!; sleep 15; bash S gguf ours-gpu; wait $L; bash S llama-gpu
# quick: for trying a kernel change, ours alone on two layers of the wide shape (2.6 GB, built in /tmp in seconds
# rather than the 10 GB demo): every expert on the GPU, decode tok/s and the step's kernel times.
# quant: the wide target as our demo's own GGUF files (`demo-model --size wide --format gguf --quant Q`, written as
# llama.cpp quantizes: Q8_0 everywhere, or MXFP4 experts and Q8_0 elsewhere = MXFP4_MOE), for each Q of $QUANTS
# (default "q8_0 mxfp4"; each file takes some 4 minutes to write): ours (gpu_primary.py) and llama-bench on that
# one file, the four rows of the BF16 table. Needs llama.cpp's build (the llama or build step) for its side.
# mixed: experts split within layers between cuda:0 and cpu:0 on two wide layers: the per-token trace's overlap of
# the two owners (bench/overlap.py) and the cost model's prediction against the measured speed for every placement
# of bench/costmodel.py (the aim: within 10 % for each).
# ab: the GPU module built from $A_SOURCE (default .ab/a.cu, e.g. `git show HEAD:native/runtime/gpu/gpu_runtime.cu`,
# carried in) against the checkout's, on the two wide layers of quick and on the bench checkpoint: decode speeds in
# turns and whether the logits are the same bits (bench/gpu/ab_modules.py), then the all-GPU step's kernel times of
# each (ncu with the caches left as the step before leaves them: the figures of kernels inside a step).
# Each step keeps what it made (the builds, the demo, the GGUF) for the next call on a machine still warm.
set -uo pipefail
OUT=${OUT:-/tmp/out}
THREADS=${THREADS:-$(nproc)}
steps=${*:-build gpu cpu kernels}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD EXPERTBENCH_CUDA_ARCHS=${EXPERTBENCH_CUDA_ARCHS:-90}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "cores: $(nproc), threads: $THREADS"
LL=/tmp/ll/llama.cpp
B=$LL/build/bin
GGUF_NAME=target-bf16.gguf

build_llama() { # llama-bench, CUDA, from the packed source
    [ -x $B/llama-bench ] && return 0
    mkdir -p /tmp/ll && tar xzf .llama/llama-src.tgz -C /tmp/ll &&
        cmake -S $LL -B $LL/build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_SERVER=OFF \
            -DGGML_NATIVE=ON > /tmp/ll.cfg 2>&1 &&
        cmake --build $LL/build -j "$(nproc)" --target llama-bench > /tmp/ll.build 2>&1
}

build_ours() { # skipped when the native sources are those of the last build here
    local sum
    sum=$(find native setup.py engine/_build_native.py -type f 2>/dev/null | sort | xargs cat | sha1sum)
    [ -f /tmp/eb_built ] && [ "$(cat /tmp/eb_built)" = "$sum" ] && return 0
    python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; return 1; }
    echo "$sum" > /tmp/eb_built
}

wide_gguf() { # the demo target converted by llama.cpp's converter (the source tree is enough for it)
    [ -d $LL ] || { mkdir -p /tmp/ll && tar xzf .llama/llama-src.tgz -C /tmp/ll; }
    python3 -m engine demo-model --size wide | tail -1 >&2
    python3 -c "
import sys; from pathlib import Path; sys.path.insert(0, 'bench')
from checkpoints import demo_target
from vs_llamacpp import to_gguf
print(to_gguf(demo_target('wide', 'bf16'), 'bf16', python=Path(sys.executable), src=Path('$LL')))
" 2> "$OUT/convert.log" | tail -1
}

wide2() { # two layers of the wide shape (2.6 GB), built in /tmp in seconds
    python3 -c "
import dataclasses; from pathlib import Path
from engine.checkpoints.demo import SIZES, build_pair
if not Path('/tmp/wide2/manifest.json').exists():
    build_pair(Path('/tmp/wide2'), dataclasses.replace(SIZES['wide'], name='wide2', num_layers=2, draft_layers=1))
"
}

hbm() {
    [ -x /tmp/hbm_read ] || nvcc -O3 -gencode=arch=compute_90,code=sm_90 -o /tmp/hbm_read bench/gpu/hbm_read.cu
    /tmp/hbm_read | awk '/hbm_read_gbs/ {print $2}'
}

for step in $steps; do
    start=$(date +%s)
    case $step in
    build) # llama.cpp's build beside ours, then the demo (it needs ours) and its conversion
        (build_llama; echo "llama.cpp build: $?" > /tmp/ll.done) &
        build_ours || exit 1
        wide_gguf > /tmp/gguf.path
        wait
        cat /tmp/ll.done; [ -x $B/llama-bench ] || tail -5 /tmp/ll.build
        GGUF=$(cat /tmp/gguf.path)
        [ -f "$GGUF" ] || { echo "conversion failed"; tail -20 "$OUT/convert.log"; exit 1; }
        ls -l "$GGUF" ;;
    tests) build_ours || exit 1; python3 -m pytest -q -p no:cacheprovider -m "gpu or not (build or sanitize or bench)" tests/test_gpu_modules.py 2>&1 | tail -6 ;;
    quick)
        build_ours || exit 1
        wide2
        python3 - <<'PY'
import statistics, sys
from pathlib import Path
sys.path.insert(0, "bench")
from measure import decode_speed
from engine.checkpoints.demo import DEMO_PROMPTS
from engine.model import Engine
folder = Path("/tmp/wide2")
with Engine(runtimes=("cpu", "cuda")) as eng, eng.load(folder / "target", device="cuda:0") as m:
    m.set_placement("*=cuda:0")
    speeds, _ = decode_speed(m, m.encode(DEMO_PROMPTS[0]), 128, 5)
    print(f"ours, 2 wide layers, every expert on cuda:0: {statistics.median(speeds):.1f} tok/s "
          f"({m.info['bytes_per_token'] / 1e6:.1f} MB/token)")
PY
        for n in 2 6; do
            ncu --clock-control none --metrics gpu__time_duration.sum --csv \
                python3 bench/gpu/kernel_times.py /tmp/wide2/target $n > "$OUT/ncu_wide2_$n.csv" 2> "$OUT/ncu.log" ||
                tail -5 "$OUT/ncu.log"
        done
        python3 bench/gpu/kernel_summary.py "$OUT/ncu_wide2_6.csv" 4 "$OUT/ncu_wide2_2.csv" | tee "$OUT/kernels2.md" ;;
    ab)
        build_ours || exit 1
        cp engine/expertbench_rt_cuda.so /tmp/b.so
        nvcc -O3 -std=c++20 -shared -Inative/include -Xcompiler -fPIC,-fvisibility=hidden \
            -gencode=arch=compute_90,code=sm_90 -o /tmp/a.so "${A_SOURCE:-.ab/a.cu}" || exit 1
        wide2
        BENCH=$(python3 -c "from engine.checkpoints.demo import ensure_demo_pair; print(ensure_demo_pair('bench').target)")
        for m in /tmp/wide2/target "$BENCH"; do
            python3 bench/gpu/ab_modules.py --model "$m" --module A=/tmp/a.so --module B=/tmp/b.so --tokens 128 \
                --repeats 3 --rounds 2 --threads "$THREADS" --json "$OUT/ab_$(basename "$(dirname "$m")").json" |
                grep "^|"
        done
        for v in a b; do
            for n in 2 6; do
                ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
                    python3 bench/gpu/kernel_times.py /tmp/wide2/target $n /tmp/$v.so > "/tmp/ncu_${v}_$n.csv" \
                    2> "$OUT/ncu.log" || tail -5 "$OUT/ncu.log"
            done
            echo "== $v (two wide layers, caches not flushed)"
            python3 bench/gpu/kernel_summary.py "/tmp/ncu_${v}_6.csv" 4 "/tmp/ncu_${v}_2.csv" | tee "$OUT/kernels_ab_$v.md"
        done ;;
    llama) build_llama || tail -5 /tmp/ll.build ;;
    gguf) # ours and the demo's conversion alone (with llama: llama.cpp's build meanwhile, on other cores)
        build_ours || exit 1
        wide_gguf > /tmp/gguf.path
        GGUF=$(cat /tmp/gguf.path)
        [ -f "$GGUF" ] || { echo "conversion failed"; tail -20 "$OUT/convert.log"; exit 1; } ;;
    gpu | ours-gpu) # every expert on the GPU: ours, then llama.cpp (gpu)
        GGUF=$(cat /tmp/gguf.path)
        HBM=$(hbm); echo "HBM read ceiling: $HBM GB/s"
        python3 - "$GGUF" "$HBM" <<'PY' | tee "$OUT/ours_gpu.txt"
import statistics, sys
sys.path.insert(0, "bench")
from measure import decode_speed
from engine.checkpoints.checkpoint import Checkpoint
from engine.checkpoints.demo import DEMO_PROMPTS
from engine.model import Engine
ck = Checkpoint.open(sys.argv[1])
prompt = ck.tokenizer.encode(DEMO_PROMPTS[0], add_special_tokens=False).ids
with Engine(runtimes=("cpu", "cuda")) as eng, eng.load(ck, device="cuda:0") as m:
    m.set_placement("*=cuda:0")
    speeds, _ = decode_speed(m, prompt, 128, 5)
    tps, per_token = statistics.median(speeds), m.info["bytes_per_token"]
    print(f"ours | every expert on cuda:0 | {tps:.1f} tok/s (min {min(speeds):.1f}, max {max(speeds):.1f}) | "
          f"{per_token / 1e6:.1f} MB/token | {per_token * tps / 1e9:.0f} GB/s = "
          f"{100 * per_token * tps / 1e9 / float(sys.argv[2]):.1f} % of the HBM read ceiling")
PY
        [ "$step" = gpu ] && [ -x $B/llama-bench ] && $B/llama-bench -m "$GGUF" -ngl 99 -p 0 -n 128 -r 5 -o md 2>&1 |
            tee "$OUT/llama_gpu.md" ;;
    llama-gpu) $B/llama-bench -m "$(cat /tmp/gguf.path)" -ngl 99 -p 0 -n 128 -r 5 -o md 2>&1 | tee "$OUT/llama_gpu.md" ;;
    cpu) # experts on the CPU, and the CPU alone
        GGUF=$(cat /tmp/gguf.path)
        python3 bench/gpu_primary.py --model "$GGUF" --tokens 128 --repeats 5 --threads "$THREADS" \
            --json "$OUT/gpu_primary_wide.json" | tail -8
        n=$(python3 -c "from engine.checkpoints.checkpoint import Checkpoint; print(Checkpoint.open('$GGUF').config.num_layers)")
        if [ -x $B/llama-bench ]; then
            $B/llama-bench -m "$GGUF" -ngl 99 -ncmoe "$((n / 2)),$n" -t "$THREADS" -p 0 -n 128 -r 5 -o md 2>&1 |
                tee "$OUT/llama_cpu_experts.md"
            CUDA_VISIBLE_DEVICES= $B/llama-bench -m "$GGUF" -ngl 0 -t "$THREADS" -p 0 -n 128 -r 5 -o md 2>&1 |
                tee "$OUT/llama_cpu_only.md"
        fi ;;
    quant)
        build_ours || exit 1
        for q in ${QUANTS:-q8_0 mxfp4}; do
            python3 -m engine demo-model --size wide --format gguf --quant "$q" | tail -1
            Q=$(python3 -c "from engine.checkpoints.demo import ensure_demo_pair; print(ensure_demo_pair('wide', format='gguf', quant='$q').target)")
            [ -f "$Q" ] || { echo "no wide $q GGUF"; continue; }
            python3 bench/gpu_primary.py --model "$Q" --tokens 128 --repeats 5 --threads "$THREADS" \
                --json "$OUT/gpu_primary_wide_$q.json" | tail -8
            n=$(python3 -c "from engine.checkpoints.checkpoint import Checkpoint; print(Checkpoint.open('$Q').config.num_layers)")
            [ -x $B/llama-bench ] || { echo "llama-bench not built: run the llama step first"; continue; }
            $B/llama-bench -m "$Q" -ngl 99 -ncmoe "0,$((n / 2)),$n" -t "$THREADS" -p 0 -n 128 -r 5 -o md 2>&1 |
                tee "$OUT/llama_wide_$q.md"
            CUDA_VISIBLE_DEVICES= $B/llama-bench -m "$Q" -ngl 0 -t "$THREADS" -p 0 -n 128 -r 5 -o md 2>&1 |
                tee -a "$OUT/llama_wide_$q.md"
        done ;;
    mixed) # on the two wide layers of quick: a layer's split is the same in 2 layers as in 8
        build_ours || exit 1
        wide2
        python3 bench/overlap.py --primary cuda:0 --peer cpu:0 --model /tmp/wide2/target --threads "$THREADS" \
            --tokens 64 --rounds 3 --json "$OUT/overlap_cuda_wide2.json" | tail -12
        python3 bench/costmodel.py --model /tmp/wide2/target --primary cuda:0 --peer cpu:0 --threads "$THREADS" \
            --repeats 3 --json "$OUT/costmodel_cuda_wide2.json" | tail -16 ;;
    kernels) # the all-GPU decode step per kernel: 6 steps less 2
        GGUF=$(cat /tmp/gguf.path)
        for n in 2 6; do
            ncu --clock-control none --metrics gpu__time_duration.sum --csv \
                python3 bench/gpu/kernel_times.py "$GGUF" $n > "$OUT/ncu_wide_$n.csv" 2> "$OUT/ncu.log" ||
                tail -5 "$OUT/ncu.log"
        done
        python3 bench/gpu/kernel_summary.py "$OUT/ncu_wide_6.csv" 4 "$OUT/ncu_wide_2.csv" | tee "$OUT/kernels.md" ;;
    esac
    echo "[$step: $(( $(date +%s) - start )) s]"
done
