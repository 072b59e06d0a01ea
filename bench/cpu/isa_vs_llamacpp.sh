#!/usr/bin/env bash
# On a CPU machine without network (AVX-512 where it has it): our CPU kernels against llama.cpp's llama-bench on the
# bench demo target as GGUF files (Q8_0 and MXFP4 experts as `expertbench demo-model --format gguf` writes them,
# Q4_K_M by llama.cpp's own converter and quantizer), both pinned to the same two CPUs with two threads, beside the
# memory read ceiling of those two CPUs. In one call, from the repository root:
#   1. the wheels in .whl/ (cffi, pycparser, gguf) into /tmp/site; the CPU's model and its AVX-512 / AMX flags
#   2. our build (setup.py build_ext --inplace, no GPU modules) and the native tests
#   3. meanwhile llama.cpp from .llama/llama-src.tgz (bench/cpu/pack_llama_src.py makes it), CPU only, llama-bench
#      and llama-quantize: AVX2, and each AVX-512 extension (F, VNNI, VBMI, BF16) this CPU has; never AMX
#   4. the files: demo-model --format gguf --quant q8_0 and mxfp4; the safetensors demo converted to an F32 GGUF by
#      convert_hf_to_gguf.py (bench/cpu/isa_bench.py convert), then llama-quantize F32 -> Q4_K_M
#   5-7. bench/cpu/isa_bench.py run under taskset: per file ours in q8 (default kernels, then
#      EXPERTBENCH_CPU_KERNELS=avx2) and f32, llama-bench -t 2 -p 128 -n 64 -r 3, each decode against a read of
#      the memory on the same CPUs (bench/membw/readpass.c) just before and after; the table last
#   OUT=/tmp/out bash bench/cpu/isa_vs_llamacpp.sh
# FAMILY=deepseek: the DeepSeek-V3-shaped bench demo instead (demo-model --family deepseek; no GGUF demo files): its
# safetensors converted by llama.cpp's converter to BF16 and F32 GGUFs, the F32 one quantized to Q4_K_M; measured:
# BF16 and Q4_K_M. FAMILY=gpt-oss: the gpt-oss-shaped bench demo (its experts in the released MXFP4 layout), converted
# the same way (the converter keeps the MXFP4 experts: "BF16" is MXFP4 experts with BF16 elsewhere), the F32 one
# quantized to MXFP4_MOE (MXFP4 experts, Q8_0 elsewhere: what llama.cpp's gpt-oss GGUFs hold); QUANT overrides the
# quantization (default Q4_K_M, MXFP4_MOE for gpt-oss), or several: QUANT="Q2_K Q3_K_M IQ4_XS IQ2_XXS" (the i-quants
# that llama-quantize refuses without an importance matrix get one from llama-imatrix over README.md).
# Writes under $OUT: isa_vs_llamacpp.json, the table (isa_vs_llamacpp.md), build and run logs. A failed step is
# reported and the others go on. CORES (default 0,1) and THREADS (default 2) choose the CPUs; JOBS (default nproc)
# and NICE (default 0) the builds' parallelism and priority; WHEELS (default .whl) the wheels' folder; LLAMA_WAIT
# (default 330) until how many seconds from the start llama.cpp's build is waited for (then stopped: ours only).
set -uo pipefail
OUT=${OUT:-/tmp/out}
CORES=${CORES:-0,1}
THREADS=${THREADS:-2}
JOBS=${JOBS:-$(nproc)}
NICE=${NICE:-0}
WHEELS=${WHEELS:-.whl}
LLAMA_WAIT=${LLAMA_WAIT:-330}
FAMILY=${FAMILY:-qwen3}
if [ "$FAMILY" = gpt-oss ]; then QUANT=${QUANT:-MXFP4_MOE}; else QUANT=${QUANT:-Q4_K_M}; fi
LL=/tmp/ll
mkdir -p "$OUT"
start=$SECONDS
step() { echo "== [$((SECONDS - start)) s] $*"; }
fail() { echo "!! [$((SECONDS - start)) s] FAILED: $*"; }

step "wheels from $WHEELS"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl || fail "pip install of $WHEELS/*.whl"
export PYTHONPATH=/tmp/site:$PWD

step "machine"
lscpu | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core|Socket\(s\)|NUMA node\(s\)):' || fail "lscpu"
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { [[ $flags == *" $1 "* ]]; }
for f in avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512vbmi avx512_bf16 amx_tile amx_int8 amx_bf16; do
    if has "$f"; then echo "  $f yes"; else echo "  $f no"; fi
done
echo "nproc $(nproc)"
for c in ${CORES//,/ }; do
    echo "cpu$c: thread siblings $(cat "/sys/devices/system/cpu/cpu$c/topology/thread_siblings_list" 2>/dev/null)"
done

# llama.cpp's CPU build options (its ggml/CMakeLists.txt spells them GGML_*): no native tuning, AVX2, every AVX-512
# extension this CPU has, AMX off (its AMX path crashed on quantized files on such a machine).
llama_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AMX_TILE=OFF
    -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_CUDA=OFF -DGGML_CCACHE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF)
llama_label="AVX2"
if has avx512f; then
    llama_flags+=(-DGGML_AVX512=ON)
    llama_label="AVX-512F"
    for pair in avx512_vnni:VNNI avx512vbmi:VBMI avx512_bf16:BF16; do
        if has "${pair%%:*}"; then
            llama_flags+=("-DGGML_AVX512_${pair#*:}=ON")
            llama_label+=" ${pair#*:}"
        fi
    done
fi
llama_label+=", no AMX"

build_llama() {
    cd "$LL/llama.cpp" &&
        nice -n "$NICE" cmake -S . -B build "${llama_flags[@]}" > "$OUT/llama-cmake.log" 2>&1 &&
        nice -n "$NICE" cmake --build build -j "$JOBS" --target llama-bench llama-quantize llama-imatrix > "$OUT/llama-build.log" 2>&1
    echo $? > "$LL/done"
}
step "llama.cpp: unpack, then configure and build in the background ($llama_label)"
rm -f "$LL/done"
mkdir -p "$LL"
llama_pid=
if tar xzf .llama/llama-src.tgz -C "$LL"; then
    # a process group of its own, so that a build still running when the measurements start can be stopped
    setsid bash -c "$(declare -p llama_flags LL OUT NICE JOBS); $(declare -f build_llama); build_llama" &
    llama_pid=$!
else
    fail "unpacking .llama/llama-src.tgz"
    echo 1 > "$LL/done"
fi

step "our build"
built=1
EXPERTBENCH_NO_GPU=1 nice -n "$NICE" python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 ||
    { built=0; fail "our build (the end of $OUT/build.log:)"; tail -30 "$OUT/build.log"; }

pids=()
if [ "$built" = 1 ]; then
    if [ "$FAMILY" = qwen3 ]; then
        step "the demo files in the background: bench safetensors (then its F32 GGUF), GGUF q8_0, GGUF mxfp4"
        (python3 -m engine demo-model --size bench > "$OUT/demo-bench.log" 2>&1 &&
            python3 bench/cpu/isa_bench.py convert --src "$LL/llama.cpp" > "$OUT/convert.log" 2>&1) &
        pids+=($!)
        for q in q8_0 mxfp4; do
            python3 -m engine demo-model --size bench --format gguf --quant "$q" > "$OUT/demo-$q.log" 2>&1 &
            pids+=($!)
        done
    else
        step "the $FAMILY demo files in the background: bench safetensors, then its F32 and BF16 GGUFs"
        (python3 -m engine demo-model --family "$FAMILY" --size bench > "$OUT/demo-bench.log" 2>&1 &&
            python3 bench/cpu/isa_bench.py convert --family "$FAMILY" --src "$LL/llama.cpp" > "$OUT/convert.log" \
                2>&1 &&
            python3 bench/cpu/isa_bench.py convert --family "$FAMILY" --outtype bf16 --src "$LL/llama.cpp" \
                > "$OUT/convert-bf16.log" 2>&1) &
        pids+=($!)
    fi
fi

step "native tests"
nice -n "$NICE" make -C native -j "$JOBS" test > "$OUT/native-test.log" 2>&1 || fail "make -C native test"
tail -5 "$OUT/native-test.log"

step "waiting for the demo files"
for p in "${pids[@]}"; do
    wait "$p" || fail "a demo file or the F32 conversion (logs: $OUT/demo-*.log, convert.log)"
done
for log in demo-bench demo-q8_0 demo-mxfp4 convert convert-bf16; do
    [ -f "$OUT/$log.log" ] && tail -3 "$OUT/$log.log" | sed "s/^/  $log: /"
done

step "waiting for llama.cpp's build (until $LLAMA_WAIT s from the start)"
while [ ! -f "$LL/done" ] && [ $((SECONDS - start)) -lt "$LLAMA_WAIT" ]; do sleep 5; done
B=$LL/llama.cpp/build/bin
if [ "$(cat "$LL/done" 2>/dev/null)" = 0 ]; then
    grep -E "Adding CPU backend variant" "$OUT/llama-cmake.log"
else
    fail "llama.cpp's build (not done, or failed): the end of its logs:"
    tail -5 "$OUT/llama-cmake.log" "$OUT/llama-build.log" 2>/dev/null
    if [ -n "$llama_pid" ] && [ ! -f "$LL/done" ]; then
        echo "stopping it, so that it does not run beside the measurements"
        kill -- -"$llama_pid" 2>/dev/null
    fi
    B=/nonexistent
fi

files=()
gguf() { python3 -c "from engine.checkpoints.demo import demo_folder; print(demo_folder('bench', format='gguf', quant='$1') \
/ 'target.gguf')"; }
if [ "$FAMILY" = qwen3 ]; then
    f=$(gguf q8_0) && [ -f "$f" ] && files+=("Q8_0=$f")
else
    f=$(tail -1 "$OUT/convert-bf16.log" 2>/dev/null) && [ -f "$f" ] && files+=("BF16=$f")
fi
f32=$(tail -1 "$OUT/convert.log" 2>/dev/null)
needs_imatrix() { case $1 in IQ1_* | IQ2_XXS | IQ2_XS | IQ2_S | IQ2_M) return 0 ;; *) return 1 ;; esac; }
for quant in $QUANT; do
    if [ ! -x "$B/llama-quantize" ] || [ ! -f "$f32" ]; then
        fail "no $quant file: llama-quantize or the F32 GGUF is missing ($f32)"
        continue
    fi
    step "llama-quantize $f32 -> $quant"
    qf=${f32%-f32.gguf}-${quant,,}.gguf
    imatrix=()
    if needs_imatrix "$quant"; then # llama-quantize refuses these types without one
        im=${f32%-f32.gguf}-imatrix.gguf
        if [ ! -f "$im" ]; then
            step "llama-imatrix of $f32 over README.md (the importance matrix $quant needs)"
            nice -n "$NICE" "$B/llama-imatrix" -m "$f32" -f README.md -o "$im" -c 128 -t "$(nproc)" --no-ppl \
                > "$OUT/imatrix.log" 2>&1 || { fail "llama-imatrix (the end of $OUT/imatrix.log:)"; tail -5 "$OUT/imatrix.log"; }
        fi
        imatrix=(--imatrix "$im")
    fi
    if [ -f "$qf" ] || nice -n "$NICE" "$B/llama-quantize" "${imatrix[@]}" "$f32" "$qf.partial" "$quant" "$(nproc)" \
        > "$OUT/quantize-$quant.log" 2>&1; then
        [ -f "$qf.partial" ] && mv "$qf.partial" "$qf"
        files+=("$quant=$qf")
        grep -E "model size|quant size" "$OUT/quantize-$quant.log" 2>/dev/null
    else
        fail "llama-quantize to $quant (the end of $OUT/quantize-$quant.log:)"
        tail -5 "$OUT/quantize-$quant.log"
    fi
done
[ "$FAMILY" = qwen3 ] && f=$(gguf mxfp4) && [ -f "$f" ] && files+=("MXFP4=$f")

step "measuring on CPUs $CORES, $THREADS threads: ${files[*]}"
bench=()
[ -x "$B/llama-bench" ] && bench=(--llama-bench "$B/llama-bench" --llama-label "$llama_label")
taskset -c "$CORES" python3 bench/cpu/isa_bench.py run --threads "$THREADS" --tokens 64 --prefill 128 \
    --repeats 3 --timeout 150 --file "${files[@]}" "${bench[@]}" --json "$OUT/isa_vs_llamacpp.json" 2>&1 |
    tee "$OUT/isa_vs_llamacpp.md" || fail "bench/cpu/isa_bench.py run"
