# The native source manifest: which files make each library, and the instruction-set flags of the CPU module's
# vector kernels. The one list: native/Makefile includes it, setup.py, engine/_build_native.py and bench/ read it
# through native/manifest.py. Paths are relative to native/. Plain `NAME = words` lines only.

# the core (engine/_native through cffi, libexpertbench.so through the Makefile)
CORE_SRC = src/engine.c src/model.c src/mapping.c src/context.c src/forward.c src/primary.c src/scheduler.c src/weight_check.c \
	src/models/qwen3_moe.c src/models/deepseek_v3.c src/models/gpt_oss.c src/models/deepseek_v4.c

# the cpu runtime module (and the hostsim module: the same sources with EB_CPU_HOSTSIM): the runtime (devices and the
# table; the worker pools; products and expert batches; the primary's operations), its portable kernels (which
# bench/'s kernel programs link alone) and its vector kernels
CPU_RUNTIME_SRC = runtime/cpu/cpu_runtime.c runtime/cpu/cpu_pool.c runtime/cpu/cpu_products.c runtime/cpu/cpu_forward.c
CPU_KERNELS_SRC = runtime/cpu/cpu_kernels_portable.c
# its vector kernels, each compiled with its own flags on x86-64 (called only where the CPU has them)
CPU_AVX2_SRC = runtime/cpu/cpu_kernels_avx2.c
CPU_AVX512_SRC = runtime/cpu/cpu_kernels_avx512.c
AVX2_FLAGS = -mavx2 -mfma -mf16c
AVX512_FLAGS = -mavx2 -mfma -mf16c -mbmi2 -mavx512f -mavx512bw -mavx512vl -mavx512vnni

# the cuda and hip modules, one translation unit: gpu_runtime.cu (devices, memory, events, launches, the table) and
# the parts it includes (gpu_platform.h, gpu_blocks.cuh, gpu_formats.cuh, gpu_forward.cuh, gpu_mla.cuh, gpu_q8.cuh)
GPU_SRC = runtime/gpu/gpu_runtime.cu

