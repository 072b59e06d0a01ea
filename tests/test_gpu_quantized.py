"""The GPU modules read the quantized weight formats (all but the scaled F8_E4M3_B128, refused by name; the i-quants
IQ2_XXS, IQ3_XXS, IQ2_XS, IQ3_S, IQ2_S, IQ1_S and IQ1_M too) in f32 precision: each weight value dequantized exactly
as eb_dequantize_chunk gives it (the cpu module's values), products and sums in f32. Against the cpu module:

- the module's operations directly (a C driver built here against the runtime ABI, run on both modules): matmul
  (every format, row counts and widths, 1-9 rows of x, a fused or separate norm, accumulation, several tasks of mixed
  formats, weights at every alignment), embed (the dequantized rows bit for bit), route, expert_ffn and moe (every
  phase, both reductions, owned and foreign experts, mixed formats per projection) within 1e-5 relative L2 (the GPU
  sums in another order: not the same bits), every product also within 1e-5 of the exact one;
- device_info reports the formats it reads, so the core places quantized weights on the GPU, and those it runs in the
  q8 precision (q8_formats: every format it reads; the core refuses a q8 step whose weight a device reads with f32
  activations only: tests/test_q8_formats.py);
- the quantized GGUF fixtures (Q8_0; Q4_K_M: Q4_K, Q5_K, Q6_K and Q8_0; MXFP4_MOE) with the GPU as the primary and as
  an expert owner: logits within 1e-4 of transformers on the dequantized weights, the 64 greedy tokens, recorded steps
  equal to steps queued anew; llama.cpp's Q4_0, Q2_K, Q3_K_M, IQ4_XS, IQ2_XXS and i-quant mix files the same way.
- the q8 precision (the cpu module's x86 q8 kernels' arithmetic, eb_q8.h's expert activation): in the driver, every
  product of a format with q8 kernels (Q8_0, Q4_0, Q4_1, IQ4_NL, MXFP4; Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS and the
  i-quants) memcmp-equal to the cpu module's for every shape
  above, on random and extreme blocks (largest quants, f16 scales 65504 and subnormal, E8M0 at both halving cases)
  and activations (+-1, spikes, far into exp's tails); Q5_0, Q5_1 and the float formats (f32 products in either
  precision) within 1e-5; expert_ffn's rows and moe's pair rows the cpu module's bits for experts of such formats
  (both reductions, gpt-oss's biases and clamped SwiGLU, widths not a multiple of 256), ALL the bits of EXPERTS then
  COMBINE; on the GGUF fixtures of three families and llama.cpp's Q4_0, Q2_K, Q3_K_M, IQ4_XS, IQ2_XXS and i-quant mix
  files, the same logits bits on every placement of a primary, and the CPU primary's greedy tokens on the GPU
  primary.

Every test skips on a machine without the GPU (runs on the GPU machine: bench/gpu/run_on_device.sh).
"""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fixture_paths import FIXTURES
from test_gpu_modules import gpu_engine  # the engine with a GPU runtime, or a skip saying why there is none

from engine.core import formats
from engine.core.native import core_location

MODULES = Path(core_location())
INCLUDE = Path(__file__).resolve().parent.parent / "native" / "include"
TEST_BLOCKS = INCLUDE.parent / "tests"  # eb_test_blocks.h, shared with the native tests
GGUF = FIXTURES / "qwen3moe-gguf"
QUANTS = ["q8_0", "q4_k_m", "mxfp4_moe"]
TOLERANCE = 1e-4  # against transformers, as tests/test_gguf_quantized.py
RUNTIMES = ["cuda", "hip"]
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_device_info_reports_every_format(runtime):
    with gpu_engine(runtime) as eng:
        gpu = next(d for d in eng.devices if d.name == f"{runtime}:0")
        # every format but those with a scale companion (F8_E4M3_B128), which have no GPU kernels yet
        expected = {n for n, f in formats.FORMATS.items() if not f.needs_scale}
        assert set(gpu.formats) == expected, gpu.formats
        assert gpu.precisions == ("f32", "q8"), gpu.precisions


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_module_operations_match_the_cpu_module_on_every_format(runtime, tmp_path):
    gpu_engine(runtime).close()  # skips without the GPU
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is needed to build the driver")
    source = tmp_path / "driver.c"
    source.write_text(DRIVER)
    exe = tmp_path / "driver"
    build = subprocess.run(
        [cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}", f"-I{TEST_BLOCKS}", "-o", str(exe),
         str(source), "-ldl", "-lm"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    # each launch finished before the next call returns, so that an error names the call that made it
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1", HIP_LAUNCH_BLOCKING="1")
    proc = subprocess.run(
        [str(exe), str(MODULES / "expertbench_rt_cpu.so"), str(MODULES / f"expertbench_rt_{runtime}.so")],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    if proc.returncode == 77:
        pytest.skip(f"no {runtime} GPU: {proc.stdout.strip()}")
    assert proc.returncode == 0 and ", 0 failed" in proc.stdout, (proc.stdout + proc.stderr)[-6000:]


def reference(quant, folder=GGUF):
    ref = np.load(folder / f"reference-{quant}.npz")
    return ref["prompt_ids"], ref["generated_ids"], ref["logits"]


def relative_error(ours, ref):
    return np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)


def run_all(model, prompt, generated, mode="reference", graphs=True):
    with model.context(len(prompt) + len(generated)) as ctx:
        ctx.mode, ctx.graphs = mode, graphs
        rows = np.concatenate([ctx.prefill(prompt)] + [ctx.decode([t]) for t in generated])
        ctx.truncate(0)
        ids = ctx.generate(prompt, len(generated)).ids
    return rows, ids


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_quantized_gguf_on_a_gpu_primary_matches_transformers_and_its_tokens(runtime, quant):
    """Embedding, attention, router and output products and the experts all read the quantized weights on the GPU
    (and, with experts in host memory, the cpu module reads them there): within 1e-4 of transformers at every
    position, the 64 greedy tokens, graph steps bit-identical to steps queued anew, and close to the CPU's run."""
    prompt, generated, ref = reference(quant)
    with gpu_engine(runtime) as eng:
        gpu = f"{runtime}:0"
        with eng.load(GGUF / f"model-{quant}.gguf") as cpu_model:
            cpu_rows, _ = run_all(cpu_model, prompt, generated)
        with eng.load(GGUF / f"model-{quant}.gguf", device=gpu) as model:
            for text in (f"*={gpu}", "*=cpu:0", f"*={gpu}; 0=cpu:0; 1.2-5=cpu:0"):
                model.set_placement(text)
                if text == f"*={gpu}":
                    assert model.counters()["devices"][gpu]["weight_bytes"] > 0, "no experts on the GPU"
                for mode in ("reference", "owner_local"):
                    decoded = {}
                    for graphs in (True, False):
                        rows, ids = run_all(model, prompt, generated, mode, graphs)
                        assert ids == generated.tolist(), f"{text} {mode} graphs={graphs}"
                        err = relative_error(rows, ref)
                        assert err.max() < TOLERANCE, f"{text} {mode}: worst position {err.argmax()}: {err.max():.2e}"
                        decoded[graphs] = rows
                    assert np.array_equal(decoded[True], decoded[False]), f"{text} {mode}: graph steps differ"
                    vs_cpu = relative_error(decoded[True], cpu_rows)
                    assert vs_cpu.max() < 1e-5, f"{text} {mode}: {vs_cpu.max():.2e} from the CPU's logits"


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_quantized_experts_on_a_gpu_owner_match_transformers_and_its_tokens(runtime, quant):
    """A CPU primary with experts on the GPU (its expert_ffn kernels): the same logits and tokens."""
    prompt, generated, ref = reference(quant)
    with gpu_engine(runtime) as eng:
        gpu = f"{runtime}:0"
        with eng.load(GGUF / f"model-{quant}.gguf") as model:
            for text in (f"*={gpu}", f"0={gpu}", f"*=cpu:0; 0.1-3={gpu}; 1.6={gpu}"):
                model.set_placement(text)
                for mode in ("reference", "owner_local"):
                    rows, ids = run_all(model, prompt, generated, mode)
                    assert ids == generated.tolist(), f"{text} {mode}"
                    err = relative_error(rows, ref)
                    assert err.max() < TOLERANCE, f"{text} {mode}: worst position {err.argmax()}: {err.max():.2e}"
            assert model.counters()["devices"][gpu]["rows"] > 0


LOWBIT = FIXTURES / "qwen3moe-gguf-lowbit"  # llama.cpp's llama-quantize (tests/fixtures/recipes/qwen3moe_lowbit.py)


@pytest.mark.parametrize("quant", ["q4_0", "q2_k", "q3_k_m", "iq4_xs", "iq2_xxs", "ud_mix"])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_small_types_and_i_quants_run_in_f32_on_the_gpu(runtime, quant):
    """llama.cpp's Q4_0, Q2_K, Q3_K and IQ4_XS files (with the Q4_K/Q5_K/Q6_K/Q8_0 tensors it keeps beside them), its
    IQ2_XXS file (Q2_K, Q4_K and Q5_K beside it) and the unsloth-style mix (IQ1_S, IQ1_M, IQ2_XS, IQ3_XXS and IQ3_S
    with IQ4_XS and K formats, an expert's three projections in three types) on a GPU primary and a GPU expert owner:
    the GPU reads every one of their tensors (none refused), transformers' logits within 1e-4 and the 64 tokens in
    f32 (their q8 precision: test_q8_logits_are_the_same_bits_on_every_placement)."""
    prompt, generated, ref = reference(quant, LOWBIT)
    with gpu_engine(runtime) as eng:
        gpu = f"{runtime}:0"
        for primary, text in ((gpu, f"*={gpu}"), ("cpu:0", f"*=cpu:0; 0={gpu}")):
            with eng.load(LOWBIT / f"model-{quant}.gguf", device=primary) as model:
                model.set_placement(text)
                rows, ids = run_all(model, prompt, generated)
                assert ids == generated.tolist(), text
                err = relative_error(rows, ref)
                assert err.max() < TOLERANCE, f"{text}: worst position {err.argmax()}: {err.max():.2e}"
                assert model.counters()["devices"][gpu]["weight_bytes"] > 0, f"{text}: no weights on the GPU"


# The q8 precision on the quantized files (the GGUF fixtures of three families: Q8_0, Q4_K_M's Q4_K/Q5_K/Q6_K/Q8_0,
# MXFP4 experts; gpt-oss's biased experts with the clamped SwiGLU; llama.cpp's own Q4_0, Q2_K, Q3_K_M, IQ4_XS and
# IQ2_XXS files and the i-quant mix): placements of each primary and the experts to try.
Q8_FILES = [("qwen3moe-gguf", "q8_0"), ("qwen3moe-gguf", "q4_k_m"), ("qwen3moe-gguf", "mxfp4_moe"),
            ("gpt-oss-gguf", "mxfp4_moe"), ("deepseek-gguf", "q8_0"), (LOWBIT.name, "q4_0"), (LOWBIT.name, "q2_k"),
            (LOWBIT.name, "q3_k_m"), (LOWBIT.name, "iq4_xs"), (LOWBIT.name, "iq2_xxs"),
            (LOWBIT.name, "ud_mix")]  # fmt: skip


def q8_placements(folder: str, gpu: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(placements with a CPU primary, placements with the GPU primary): all experts on the other device, and mixed."""
    if folder.startswith("qwen3moe-gguf"):  # 2 layers of 8 experts
        cpu_primary = (f"*={gpu}", f"0={gpu}", f"*=cpu:0; 0.1-3={gpu}; 1.6={gpu}")
        return cpu_primary, (f"*={gpu}", "*=cpu:0", f"*={gpu}; 0=cpu:0; 1.2-5=cpu:0")
    return (f"*={gpu}", f"*=cpu:0; 2={gpu}; 1.0-5={gpu}"), (f"*={gpu}", "*=cpu:0", f"*={gpu}; 1=cpu:0; 3.2-5=cpu:0")


def q8_run(model, prompt, generated, graphs=True):
    with model.context(len(prompt) + len(generated)) as ctx:
        ctx.precision, ctx.graphs = "q8", graphs
        rows = np.concatenate([ctx.prefill(prompt)] + [ctx.decode([t]) for t in generated])
        ctx.truncate(0)
        ids = ctx.generate(prompt, len(generated)).ids
    return rows, ids


@pytest.mark.parametrize(("folder", "quant"), Q8_FILES)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_q8_logits_are_the_same_bits_on_every_placement(runtime, folder, quant):
    """The q8 precision with the GPU as an expert owner and as the primary (its products the cpu module's bits, its
    experts' activation eb_q8.h's): a CPU primary's logits bit-identical whether its experts run on the CPU, the GPU
    or both; the GPU primary's bit-identical across its placements and between graphs and steps queued anew; the two
    primaries' greedy tokens the same (their logits differ a little: attention, norms and the router run in f32 on
    each, in its own order, and feed q8 quantization); and q8 really ran on the GPU (not its f32 logits)."""
    path = FIXTURES / folder / f"model-{quant}.gguf"
    ref = np.load(FIXTURES / folder / f"reference-{quant}.npz")
    prompt, generated = ref["prompt_ids"], ref["generated_ids"]
    with gpu_engine(runtime) as eng:
        gpu = f"{runtime}:0"
        on_cpu, on_gpu = q8_placements(folder, gpu)
        with eng.load(path) as model:
            cpu_rows, cpu_ids = q8_run(model, prompt, generated)
            for text in on_cpu:
                model.set_placement(text)
                rows, ids = q8_run(model, prompt, generated)
                worst = relative_error(rows, cpu_rows).max()
                assert np.array_equal(rows, cpu_rows), f"CPU primary, {text}: other bits (relative error {worst:.2e})"
                assert ids == cpu_ids, text
            assert model.counters()["devices"][gpu]["rows"] > 0
        with eng.load(path, device=gpu) as model:
            base = None
            for text in on_gpu:
                model.set_placement(text)
                for graphs in (True, False):
                    rows, ids = q8_run(model, prompt, generated, graphs)
                    base = base if base is not None else rows
                    assert np.array_equal(rows, base), f"GPU primary, {text}, graphs={graphs}"
                    assert ids == cpu_ids, f"GPU primary, {text}: tokens unlike the CPU primary's"
            err = relative_error(base, cpu_rows)
            assert np.median(err) < 1e-3, f"GPU primary against the CPU's: median relative error {np.median(err):.2e}"
            model.set_placement(f"*={gpu}")
            f32, _ = run_all(model, prompt, generated)
            assert not np.array_equal(base, f32), "the GPU's q8 logits are its f32 ones"


# The driver: both modules loaded with dlopen, every operation run on each with the same inputs.
DRIVER = r"""
/* The GPU module's reads of quantized weights against the cpu module's (f32 precision), op by op: matmul (alone,
 * accumulating, with a fused or separate norm, several tasks, unaligned weights), embed (bit for bit the
 * dequantized row), route, expert_ffn and moe (every phase, both reductions, owned and foreign experts), for every
 * format the GPU module reports (the i-quants among them).
 * usage: driver CPU_MODULE GPU_MODULE; prints one line per check, exits 1 on any failure, 77 if the GPU module
 * has no device. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eb_formats.h"
#include "eb_runtime.h"
#include "eb_test_blocks.h"

#define TOL 1e-5

typedef struct {
    const eb_runtime_table *T;
    void *rt;
    const char *name;
} mod;

static int failures, checks;
static char err[512];
static unsigned seed = 12345;
/* what the runs below ask for: the activation precision, and gpt-oss's experts (biases, the clamped SwiGLU) */
static int precision = EB_PRECISION_F32, oai = 0;

static unsigned rnd(void) { return seed = seed * 1664525u + 1013904223u; }
static float frand(void) { return (float)(rnd() >> 8) / (float)(1u << 24) - 0.5f; }

static void fail_if(int bad, const char *what) {
    checks++;
    if (bad) {
        failures++;
        printf("FAIL %s\n", what);
    }
}

static int load(mod *m, const char *path, const char *name) {
    m->name = name;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("FAIL dlopen %s: %s\n", path, dlerror());
        return -1;
    }
    const eb_runtime_table *(*entry)(void) = (const eb_runtime_table *(*)(void))dlsym(h, EB_RUNTIME_ENTRY);
    m->T = entry ? entry() : NULL;
    if (!m->T || m->T->abi_version != EB_RUNTIME_ABI_VERSION || m->T->table_size != sizeof(eb_runtime_table)) {
        printf("FAIL %s: no table of this ABI\n", path);
        return -1;
    }
    eb_runtime_options o;
    memset(&o, 0, sizeof o);
    o.n_devices = 1;
    o.threads_per_device = 2;
    if (m->T->init(&o, &m->rt, err, sizeof err)) {
        printf("init %s: %s\n", name, err);
        return 1;
    }
    return 0;
}

static void *dev_alloc(mod *m, size_t bytes) {
    void *p = NULL;
    if (m->T->mem_alloc(m->rt, 0, bytes, &p, err, sizeof err)) {
        printf("FAIL %s alloc %zu: %s\n", m->name, bytes, err);
        exit(1);
    }
    return p;
}

/* bytes at an offset into a fresh allocation (the allocation's base returned in *base for freeing) */
static void *up_at(mod *m, const void *src, size_t bytes, size_t off, void **base) {
    unsigned char *p = dev_alloc(m, bytes + off + 16);
    *base = p;
    if (src && m->T->copy_to_device(m->rt, 0, p + off, src, bytes, 0, err, sizeof err)) {
        printf("FAIL %s upload: %s\n", m->name, err);
        exit(1);
    }
    return p + off;
}

static void *up(mod *m, const void *src, size_t bytes) {
    void *base;
    return up_at(m, src, bytes, 0, &base);
}

static void down(mod *m, void *dst, const void *src, size_t bytes) {
    if (m->T->synchronize(m->rt, 0, err, sizeof err) ||
        m->T->copy_to_host(m->rt, 0, dst, src, bytes, 0, err, sizeof err)) {
        printf("FAIL %s download: %s\n", m->name, err);
        exit(1);
    }
}

static void done(mod *m, void *p) { m->T->mem_free(m->rt, 0, p); }

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* A finite half below 1 in magnitude, either sign. */
static uint16_t test_half(unsigned s) { return (uint16_t)(((s >> 16) & 0x3bffu) | ((s & 1u) << 15)); }

/* rows of dt: random bytes, every block's scales finite (MXFP4's exponent 100..150; IQ1_M's d in the top nibbles of
 * its scale words), float values in [-0.5, 0.5) */
static unsigned char *make_weights(int dt, int64_t rows, int64_t cols) {
    size_t bytes = (size_t)rows * eb_row_bytes(dt, cols);
    unsigned char *w = malloc(bytes + 1);
    for (size_t i = 0; i < bytes; i++) w[i] = (unsigned char)(rnd() >> 13);
    const eb_format_traits *f = eb_format(dt);
    for (size_t k = 0; k < bytes / (size_t)f->block_bytes; k++) {
        unsigned char *b = w + k * (size_t)f->block_bytes;
        unsigned s = rnd();
        uint16_t h = test_half(s), h2 = test_half(s * 747796405u);
        float v = frand();
        uint32_t bits;
        memcpy(&bits, &v, 4);
        switch (dt) {
        case EB_DTYPE_F32: memcpy(b, &v, 4); break;
        case EB_DTYPE_BF16: h = (uint16_t)(bits >> 16); memcpy(b, &h, 2); break;
        case EB_DTYPE_F16:
        case EB_DTYPE_Q8_0:
        case EB_DTYPE_Q5_0:
        case EB_DTYPE_Q4_0:
        case EB_DTYPE_IQ4_NL:
        case EB_DTYPE_IQ4_XS:
        case EB_DTYPE_IQ2_XXS:
        case EB_DTYPE_IQ3_XXS:
        case EB_DTYPE_IQ2_XS:
        case EB_DTYPE_IQ3_S:
        case EB_DTYPE_IQ1_S:
        case EB_DTYPE_IQ2_S: memcpy(b, &h, 2); break; /* (finite f16 scales: random bytes may be inf or NaN) */
        case EB_DTYPE_IQ1_M:
            for (int i = 0; i < 4; i++)
                b[49 + 2 * i] = (unsigned char)((b[49 + 2 * i] & 0x0F) | ((h >> (4 * i)) & 0xF) << 4);
            break;
        case EB_DTYPE_Q4_K:
        case EB_DTYPE_Q5_K:
        case EB_DTYPE_Q4_1:
        case EB_DTYPE_Q5_1: memcpy(b, &h, 2), memcpy(b + 2, &h2, 2); break;
        case EB_DTYPE_Q6_K: memcpy(b + 208, &h, 2); break;
        case EB_DTYPE_Q2_K: memcpy(b + 80, &h, 2), memcpy(b + 82, &h2, 2); break;
        case EB_DTYPE_Q3_K: memcpy(b + 108, &h, 2); break;
        case EB_DTYPE_MXFP4: b[0] = (unsigned char)(100 + s % 51); break;
        default: break;
        }
    }
    return w;
}

static float *randf(size_t n) {
    float *x = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) x[i] = frand();
    return x;
}

/* ---- matmul ------------------------------------------------------------------------------------------- */

typedef struct {
    int dt;
    int64_t rows, cols, n;
    size_t off; /* the weights' offset into their allocation (alignment) */
} mm_case;

/* y = w x (+ y0 when accumulate), with norm (x normalised first, fused on the GPU for n <= 4) when norm_w is given,
 * on module m; y returned in host memory */
static float *run_matmul(mod *m, int n_tasks, const mm_case *c, unsigned char *const *w, const float *x,
                         const float *norm_w, const float *y0, int accumulate) {
    eb_rt_matmul t[8];
    void *bases[8];
    float *y[8];
    size_t ytot = 0;
    for (int i = 0; i < n_tasks; i++) ytot += (size_t)c[i].n * (size_t)c[i].rows;
    float *out = malloc(ytot * sizeof(float) + 4);
    int64_t cols = c[0].cols, n = c[0].n;
    float *dx = up(m, x, (size_t)(n * cols) * sizeof(float));
    float *dnw = norm_w ? up(m, norm_w, (size_t)cols * sizeof(float)) : NULL;
    float *dxn = norm_w ? up(m, NULL, (size_t)(n * cols) * sizeof(float)) : NULL;
    size_t at = 0;
    for (int i = 0; i < n_tasks; i++) {
        size_t ny = (size_t)c[i].n * (size_t)c[i].rows;
        void *dw = up_at(m, w[i], (size_t)c[i].rows * eb_row_bytes(c[i].dt, c[i].cols), c[i].off, &bases[i]);
        y[i] = up(m, y0 ? y0 + at : NULL, ny * sizeof(float));
        memset(&t[i], 0, sizeof t[i]);
        t[i].w = dw;
        t[i].dtype = c[i].dt;
        t[i].rows = c[i].rows;
        t[i].cols = c[i].cols;
        t[i].x = norm_w ? dxn : dx;
        t[i].n = c[i].n;
        t[i].y = y[i];
        t[i].precision = precision;
        at += ny;
    }
    eb_rt_norm norm = {dx, dnw, dxn, n, cols, 1e-6f};
    if (m->T->forward->matmul(m->rt, 0, norm_w ? &norm : NULL, t, n_tasks, accumulate, err, sizeof err)) {
        printf("FAIL %s matmul (%s, %d tasks, the first %s %lld x %lld at offset %zu, n %lld, norm %d): %s\n",
               m->name, precision == EB_PRECISION_Q8 ? "q8" : "f32", n_tasks, eb_dtype_name(c[0].dt),
               (long long)c[0].rows, (long long)cols, c[0].off, (long long)n, norm_w != NULL, err);
        exit(1);
    }
    at = 0;
    for (int i = 0; i < n_tasks; i++) {
        size_t ny = (size_t)c[i].n * (size_t)c[i].rows;
        down(m, out + at, y[i], ny * sizeof(float));
        at += ny;
        done(m, bases[i]);
        done(m, y[i]);
    }
    done(m, dx);
    if (norm_w) done(m, dnw), done(m, dxn);
    return out;
}

/* the error against the exact product (doubles) of the dequantized rows with x, relative to the sums of the terms'
 * magnitudes (what a sum in f32 is accurate to, whatever the cancellation) */
static double exact_err(const float *y, const unsigned char *w, int dt, int64_t rows, int64_t cols, const float *x,
                        int64_t n) {
    float *row = malloc((size_t)cols * sizeof(float));
    double num = 0, den = 0;
    for (int64_t r = 0; r < rows; r++) {
        eb_dequantize_row(w + (size_t)r * eb_row_bytes(dt, cols), dt, cols, row);
        for (int64_t t = 0; t < n; t++) {
            double s = 0;
            for (int64_t c = 0; c < cols; c++) s += (double)row[c] * (double)x[t * cols + c];
            double a = 0;
            for (int64_t c = 0; c < cols; c++) a += fabs((double)row[c] * (double)x[t * cols + c]);
            double d = (double)y[t * rows + r] - s;
            num += d * d, den += a * a;
        }
    }
    free(row);
    return sqrt(num / den);
}

static void check_matmul(mod *cpu, mod *gpu, int n_tasks, const mm_case *c, int norm, int accumulate) {
    unsigned char *w[8];
    size_t ytot = 0;
    for (int i = 0; i < n_tasks; i++) w[i] = make_weights(c[i].dt, c[i].rows, c[i].cols), ytot += c[i].n * c[i].rows;
    int64_t cols = c[0].cols, n = c[0].n;
    float *x = randf((size_t)(n * cols)), *nw = norm ? randf((size_t)cols) : NULL, *y0 = randf(ytot);
    float *yc = run_matmul(cpu, n_tasks, c, w, x, nw, accumulate ? y0 : NULL, accumulate);
    float *yg = run_matmul(gpu, n_tasks, c, w, x, nw, accumulate ? y0 : NULL, accumulate);
    double e = rel_l2(yg, yc, ytot);
    double ex = norm || accumulate ? 0 : exact_err(yg, w[0], c[0].dt, c[0].rows, cols, x, n);
    char what[256];
    snprintf(what, sizeof what,
             "matmul %s rows %lld cols %lld n %lld off %zu tasks %d norm %d acc %d: rel %.2e exact %.2e",
             eb_dtype_name(c[0].dt), (long long)c[0].rows, (long long)cols, (long long)n, c[0].off, n_tasks, norm,
             accumulate, e, ex);
    fail_if(!(e < TOL) || !(ex < TOL), what);
    if (!(e < TOL) || !(ex < TOL) || getenv("VERBOSE")) printf("     %s\n", what);
    for (int i = 0; i < n_tasks; i++) free(w[i]);
    free(x), free(nw), free(y0), free(yc), free(yg);
}

/* ---- embed -------------------------------------------------------------------------------------------- */

static void check_embed(mod *gpu, int dt, int64_t hidden) {
    int64_t V = 9;
    unsigned char *table = make_weights(dt, V, hidden);
    int32_t ids[5] = {0, 8, 3, 3, 5};
    size_t rb = eb_row_bytes(dt, hidden);
    void *dt_ = up(gpu, table, (size_t)V * rb);
    int32_t *dids = up(gpu, ids, sizeof ids);
    float *dx = up(gpu, NULL, 5 * (size_t)hidden * sizeof(float));
    float *got = malloc(5 * (size_t)hidden * sizeof(float)), *want = malloc(5 * (size_t)hidden * sizeof(float));
    if (gpu->T->forward->embed(gpu->rt, 0, dt_, dt, NULL, hidden, dids, 5, dx, err, sizeof err)) {
        printf("FAIL embed: %s\n", err);
        exit(1);
    }
    down(gpu, got, dx, 5 * (size_t)hidden * sizeof(float));
    for (int t = 0; t < 5; t++) eb_dequantize_row(table + (size_t)ids[t] * rb, dt, hidden, want + t * hidden);
    char what[128];
    snprintf(what, sizeof what, "embed %s hidden %lld: the dequantized rows bit for bit", eb_dtype_name(dt),
             (long long)hidden);
    fail_if(memcmp(got, want, 5 * (size_t)hidden * sizeof(float)) != 0, what);
    done(gpu, dt_), done(gpu, dids), done(gpu, dx);
    free(table), free(got), free(want);
}

/* ---- route: the norm written, the experts chosen and their weights (the logits are scratch) ---------------- */

static void run_route(mod *m, int dt, const unsigned char *router, int E, int K, int64_t H, const float *x, int n,
                      const float *nw, float *xn, int32_t *ids, float *wts) {
    float *dx = up(m, x, (size_t)(n * H) * sizeof(float)), *dnw = up(m, nw, (size_t)H * sizeof(float));
    float *dxn = up(m, NULL, (size_t)(n * H) * sizeof(float)), *dl = up(m, NULL, (size_t)(n * E) * sizeof(float));
    int32_t *did = up(m, NULL, (size_t)(n * K) * sizeof(int32_t));
    float *dw = up(m, NULL, (size_t)(n * K) * sizeof(float));
    void *dr = up(m, router, (size_t)E * eb_row_bytes(dt, H));
    eb_rt_route r;
    memset(&r, 0, sizeof r);
    r.norm = (eb_rt_norm){dx, dnw, dxn, n, H, 1e-6f};
    r.router = dr, r.router_dtype = dt, r.n_experts = E, r.top_k = K, r.scoring = EB_ROUTE_SOFTMAX_TOPK;
    r.norm_topk = 1, r.logits = dl, r.topk_id = did, r.topk_w = dw;
    if (m->T->forward->route(m->rt, 0, &r, err, sizeof err)) {
        printf("FAIL %s route: %s\n", m->name, err);
        exit(1);
    }
    down(m, xn, dxn, (size_t)(n * H) * sizeof(float));
    down(m, ids, did, (size_t)(n * K) * sizeof(int32_t));
    down(m, wts, dw, (size_t)(n * K) * sizeof(float));
    done(m, dx), done(m, dnw), done(m, dxn), done(m, dl), done(m, did), done(m, dw), done(m, dr);
}

static void check_route(mod *cpu, mod *gpu, int dt) {
    enum { E = 64, K = 4, N = 3 };
    int64_t H = 512;
    unsigned char *router = make_weights(dt, E, H);
    float *x = randf((size_t)(N * H)), *nw = randf((size_t)H);
    float xc[N * 512], xg[N * 512], wc[N * K], wg[N * K];
    int32_t ic[N * K], ig[N * K];
    run_route(cpu, dt, router, E, K, H, x, N, nw, xc, ic, wc);
    run_route(gpu, dt, router, E, K, H, x, N, nw, xg, ig, wg);
    double el = rel_l2(xg, xc, N * H), ew = rel_l2(wg, wc, N * K);
    char what[160];
    snprintf(what, sizeof what, "route %s: xn rel %.2e, the same experts, weights rel %.2e", eb_dtype_name(dt), el,
             ew);
    fail_if(!(el < TOL) || memcmp(ic, ig, sizeof ic) != 0 || !(ew < TOL), what);
    free(router), free(x), free(nw);
}

/* ---- experts: expert_ffn and moe ---------------------------------------------------------------------- */

enum { NE = 4 };
typedef struct {
    int dt[NE][3]; /* gate, up, down per expert */
    int64_t H, I;
    unsigned char *w[NE][3];
    float *bias[NE]; /* 2 I + H per expert (used when oai) */
} experts;

static void make_experts(experts *x, const int (*dts)[3], int64_t H, int64_t I) {
    x->H = H, x->I = I;
    for (int e = 0; e < NE; e++)
        for (int p = 0; p < 3; p++) {
            x->dt[e][p] = dts[e][p];
            x->w[e][p] = make_weights(dts[e][p], p < 2 ? I : H, p < 2 ? H : I);
        }
    for (int e = 0; e < NE; e++) x->bias[e] = randf((size_t)(2 * I + H));
}

static void free_experts(experts *x) {
    for (int e = 0; e < NE; e++)
        for (int p = 0; p < 3; p++) free(x->w[e][p]);
    for (int e = 0; e < NE; e++) free(x->bias[e]);
}

/* the experts' weights on m (owned[e] = 0: gate NULL, another device's), and their biases when oai */
static void upload_experts(mod *m, const experts *x, const int *owned, eb_rt_expert *out, void *(*mem)[4]) {
    for (int e = 0; e < NE; e++) {
        memset(&out[e], 0, sizeof out[e]);
        out[e].expert_id = e;
        for (int p = 0; p < 3; p++) {
            int64_t rows = p < 2 ? x->I : x->H, cols = p < 2 ? x->H : x->I;
            mem[e][p] = owned[e] ? up(m, x->w[e][p], (size_t)rows * eb_row_bytes(x->dt[e][p], cols)) : NULL;
        }
        out[e].gate = mem[e][0], out[e].up = mem[e][1], out[e].down = mem[e][2];
        out[e].gate_dtype = x->dt[e][0], out[e].up_dtype = x->dt[e][1], out[e].down_dtype = x->dt[e][2];
        mem[e][3] = oai && owned[e] ? up(m, x->bias[e], (size_t)(2 * x->I + x->H) * sizeof(float)) : NULL;
        out[e].bias = mem[e][3];
    }
}

static void free_uploaded(mod *m, void *(*mem)[4]) {
    for (int e = 0; e < NE; e++)
        for (int p = 0; p < 4; p++)
            if (mem[e][p]) done(m, mem[e][p]);
}

/* expert_ffn: n_tok tokens, each pair (token t, expert e) where (t + e) % 3 != 0, grouped by expert (their first
 * pairs into start when given) */
static float *run_ffn(mod *m, const experts *x, int n_tok, const float *xs, int mode, int *n_out, int32_t *start_out) {
    int owned[NE] = {1, 1, 1, 1};
    eb_rt_expert ex[NE];
    void *mem[NE][4];
    upload_experts(m, x, owned, ex, mem);
    int32_t start[NE + 1], tok[64];
    float pw[64];
    int p = 0;
    for (int e = 0; e < NE; e++) {
        start[e] = p;
        for (int t = 0; t < n_tok; t++)
            if ((t + e) % 3 != 0) tok[p] = t, pw[p] = 0.25f + 0.1f * (float)e, p++;
    }
    start[NE] = p;
    if (start_out) memcpy(start_out, start, sizeof start);
    int64_t H = x->H, I = x->I;
    int rows = mode == EB_REDUCE_OWNER_LOCAL ? n_tok : p;
    float *dx = up(m, xs, (size_t)(n_tok * H) * sizeof(float));
    int32_t *dtok = up(m, tok, (size_t)p * sizeof(int32_t));
    float *dpw = up(m, pw, (size_t)p * sizeof(float));
    float *dy = up(m, NULL, (size_t)(rows * H) * sizeof(float));
    size_t sb = eb_rt_expert_scratch_bytes(p, H, I);
    void *scratch = up(m, NULL, sb);
    eb_rt_expert_batch b;
    memset(&b, 0, sizeof b);
    b.n_experts = NE, b.experts = ex, b.pair_start = start, b.n_pairs = p, b.n_tokens = n_tok;
    b.hidden = (int32_t)H, b.inter = (int32_t)I, b.mode = mode, b.x = dx, b.pair_token = dtok, b.pair_weight = dpw;
    b.y = dy, b.scratch = scratch, b.scratch_bytes = sb, b.precision = precision;
    if (oai) b.act = (eb_rt_act){EB_ACT_SWIGLU_OAI, 1.702f, 7.0f};
    if (m->T->expert_ffn(m->rt, 0, &b, 0, err, sizeof err)) {
        printf("FAIL %s expert_ffn: %s\n", m->name, err);
        exit(1);
    }
    float *y = malloc((size_t)(rows * H) * sizeof(float));
    down(m, y, dy, (size_t)(rows * H) * sizeof(float));
    done(m, dx), done(m, dtok), done(m, dpw), done(m, dy), done(m, scratch);
    free_uploaded(m, mem);
    *n_out = rows * (int)H;
    return y;
}

static void check_ffn(mod *cpu, mod *gpu, const experts *x, int n_tok, int mode, const char *label) {
    float *xs = randf((size_t)(n_tok * x->H));
    int nc, ng;
    float *yc = run_ffn(cpu, x, n_tok, xs, mode, &nc, NULL), *yg = run_ffn(gpu, x, n_tok, xs, mode, &ng, NULL);
    double e = rel_l2(yg, yc, (size_t)nc);
    char what[160];
    snprintf(what, sizeof what, "expert_ffn %s, %d tokens, %s: rel %.2e", label, n_tok,
             mode == EB_REDUCE_OWNER_LOCAL ? "owner_local" : "reference", e);
    fail_if(nc != ng || !(e < TOL), what);
    free(xs), free(yc), free(yg);
}

/* moe: n tokens, top_k 2 of NE experts; phases ALL or EXPERTS then COMBINE; x returned (and, split, pair_out as
 * EXPERTS left it into pair_out_host when given) */
static float *run_moe(mod *m, const experts *x, int n, const float *xs0, const float *xn, const int32_t *ids,
                      const float *tw, const int *owned, const float *foreign, int mode, int split,
                      float *pair_out_host) {
    enum { K = 2 };
    eb_rt_expert ex[NE];
    void *mem[NE][4];
    upload_experts(m, x, owned, ex, mem);
    int64_t H = x->H, I = x->I;
    eb_rt_expert *dex = up(m, ex, sizeof ex);
    float *dx = up(m, xs0, (size_t)(n * H) * sizeof(float)), *dxn = up(m, xn, (size_t)(n * H) * sizeof(float));
    int32_t *did = up(m, ids, (size_t)(n * K) * sizeof(int32_t));
    float *dtw = up(m, tw, (size_t)(n * K) * sizeof(float));
    size_t frows = mode == EB_REDUCE_OWNER_LOCAL ? (size_t)n : (size_t)(n * K);
    float *dfor = foreign ? up(m, foreign, frows * (size_t)H * sizeof(float)) : NULL;
    float *dpo = up(m, NULL, (size_t)(n * K * H) * sizeof(float));
    float *dh = up(m, NULL, (size_t)(n * K * I) * sizeof(float));
    eb_rt_moe b;
    memset(&b, 0, sizeof b);
    b.experts = dex, b.n_experts = NE, b.top_k = K, b.n = n, b.hidden = (int32_t)H, b.inter = (int32_t)I;
    b.mode = mode, b.xn = dxn, b.topk_id = did, b.topk_w = dtw, b.foreign = dfor, b.pair_out = dpo, b.h = dh;
    b.x = dx, b.precision = precision;
    if (oai) b.act = (eb_rt_act){EB_ACT_SWIGLU_OAI, 1.702f, 7.0f};
    int st = 0;
    if (split) {
        b.phase = EB_MOE_EXPERTS;
        st = m->T->forward->moe(m->rt, 0, &b, err, sizeof err);
        if (!st && pair_out_host) down(m, pair_out_host, dpo, (size_t)(n * K * H) * sizeof(float));
        b.phase = EB_MOE_COMBINE;
        if (!st) st = m->T->forward->moe(m->rt, 0, &b, err, sizeof err);
    } else {
        b.phase = EB_MOE_ALL;
        st = m->T->forward->moe(m->rt, 0, &b, err, sizeof err);
    }
    if (st) {
        printf("FAIL %s moe: %s\n", m->name, err);
        exit(1);
    }
    float *out = malloc((size_t)(n * H) * sizeof(float));
    down(m, out, dx, (size_t)(n * H) * sizeof(float));
    done(m, dex), done(m, dx), done(m, dxn), done(m, did), done(m, dtw), done(m, dpo), done(m, dh);
    if (dfor) done(m, dfor);
    free_uploaded(m, mem);
    return out;
}

static void check_moe(mod *cpu, mod *gpu, const experts *x, int n, int foreign_expert, int mode, int split,
                      const char *label) {
    enum { K = 2 };
    int64_t H = x->H;
    float *xs0 = randf((size_t)(n * H)), *xn = randf((size_t)(n * H));
    int32_t ids[64];
    float tw[64];
    for (int t = 0; t < n; t++) { /* two distinct experts per token, not in ascending order */
        int a = (3 * t + 1) % NE, b = (a + 1 + t % (NE - 1)) % NE;
        ids[t * K] = a, ids[t * K + 1] = b;
        tw[t * K] = 0.6f, tw[t * K + 1] = 0.4f;
    }
    int owned[NE] = {1, 1, 1, 1};
    float *foreign = NULL;
    if (foreign_expert >= 0) {
        owned[foreign_expert] = 0;
        foreign = randf((size_t)((mode == EB_REDUCE_OWNER_LOCAL ? n : n * K) * H));
    }
    float *yc = run_moe(cpu, x, n, xs0, xn, ids, tw, owned, foreign, mode, split, NULL);
    float *yg = run_moe(gpu, x, n, xs0, xn, ids, tw, owned, foreign, mode, split, NULL);
    /* the change of x, which is what the experts computed */
    for (int64_t i = 0; i < n * H; i++) yc[i] -= xs0[i], yg[i] -= xs0[i];
    double e = rel_l2(yg, yc, (size_t)(n * H));
    char what[200];
    snprintf(what, sizeof what, "moe %s, %d tokens, %s, %s%s: rel %.2e", label, n,
             mode == EB_REDUCE_OWNER_LOCAL ? "owner_local" : "reference", split ? "experts+combine" : "all",
             foreign_expert >= 0 ? ", one expert foreign" : "", e);
    fail_if(!(e < TOL), what);
    free(xs0), free(xn), free(foreign), free(yc), free(yg);
}

/* ---- the q8 precision: the cpu module's bits wherever the products are q8 ones ---------------------------- */

#define Q8_TOL 1e-2 /* where one module's f32 rows feed q8 products (a norm, an f32 gate or up): a few quants differ */

static int q8_format(int dt) { /* the formats with q8 integer products (the others: f32 products in either precision) */
    return eb_format(dt)->q8_block != 0;
}

static int q8_expert(const experts *x, int e) {
    return q8_format(x->dt[e][0]) && q8_format(x->dt[e][1]) && q8_format(x->dt[e][2]);
}

static const char *const x_kinds[] = {"random x", "x of +-1", "x with spikes", "x times 40"};

/* activations: random; every value +-1 (every quant +-127: the largest integer sums); random with every 64th value
 * 1000 times larger (the rest of its block quantized to few levels); random times 40 (the activation's exp far into
 * its tails) */
static float *q8_x(size_t n, int kind) {
    float *x = randf(n);
    for (size_t i = 0; i < n; i++) {
        if (kind == 1) x[i] = rnd() & 1 ? 1.0f : -1.0f;
        if (kind == 2 && i % 64 == 0) x[i] *= 1000.0f;
        if (kind == 3) x[i] *= 40.0f;
    }
    return x;
}

/* An i-quant block at its extreme quants (eb_test_blocks.h), its f16 d h. */
static void iq_extreme(unsigned char *b, int dt, uint16_t h) {
    (void)eb_test_extreme_iq(b, dt);
    eb_test_iq_set_d(b, dt, h);
}

/* weights for the q8 checks: random blocks, or every block's quants at their largest magnitudes (both signs) with
 * its f16 scales random, the largest (65504) or the smallest subnormal, and MXFP4's exponents at both cases of the
 * E8M0 halving and far from them */
static unsigned char *q8_weights(int dt, int64_t rows, int64_t cols, int extreme) {
    unsigned char *w = make_weights(dt, rows, cols);
    if (!extreme || !eb_dtype_quantized(dt)) return w;
    const eb_format_traits *f = eb_format(dt);
    size_t nb = (size_t)rows * eb_row_bytes(dt, cols) / (size_t)f->block_bytes;
    for (size_t k = 0; k < nb; k++) {
        unsigned char *b = w + k * (size_t)f->block_bytes;
        uint16_t big = 0x7bff, tiny = 0x0001, h = k % 3 == 1 ? big : tiny;
        static const unsigned char exps[] = {0, 1, 2, 127, 160};
        switch (dt) {
        case EB_DTYPE_Q8_0:
            for (int i = 2; i < 34; i++) b[i] = i & 1 ? 0x80 : 0x7F; /* -128, 127 */
            if (k % 3) memcpy(b, &h, 2);
            break;
        case EB_DTYPE_MXFP4:
            b[0] = exps[k % sizeof exps];
            for (int i = 1; i < 17; i++) b[i] = i & 1 ? 0xFF : 0x77; /* -12 and -12, 12 and 12 */
            break;
        case EB_DTYPE_Q4_K:
        case EB_DTYPE_Q5_K:
            memset(b + 4, 0xFF, (size_t)f->block_bytes - 4); /* scales and minima 63, quants 15 or 31 */
            if (k % 3) memcpy(b, &h, 2), memcpy(b + 2, k % 2 ? &big : &tiny, 2);
            break;
        case EB_DTYPE_Q6_K:
            memset(b, 0xFF, 192); /* quants 63 - 32 */
            for (int i = 192; i < 208; i++) b[i] = i & 1 ? 0x80 : 0x7F; /* scales -128, 127 */
            if (k % 3) memcpy(b + 208, &h, 2);
            break;
        case EB_DTYPE_IQ2_XXS:
        case EB_DTYPE_IQ3_XXS:
        case EB_DTYPE_IQ2_XS:
        case EB_DTYPE_IQ3_S:
        case EB_DTYPE_IQ2_S:
        case EB_DTYPE_IQ1_S:
        case EB_DTYPE_IQ1_M: iq_extreme(b, dt, k % 3 ? h : test_half((unsigned)k * 2654435761u)); break;
        default: break; /* Q5_0, Q5_1: f32 products either way */
        }
    }
    return w;
}

/* matmul in q8: a format's q8 products memcmp-equal to the cpu module's (without a norm: the modules normalise in
 * other orders), the others (Q5_0, Q5_1, the float formats: f32 products) within TOL */
static void check_matmul_q8(mod *cpu, mod *gpu, int n_tasks, const mm_case *c, int norm, int accumulate, int extreme,
                            int xkind) {
    unsigned char *w[8];
    size_t ytot = 0;
    for (int i = 0; i < n_tasks; i++)
        w[i] = q8_weights(c[i].dt, c[i].rows, c[i].cols, extreme), ytot += (size_t)(c[i].n * c[i].rows);
    int64_t cols = c[0].cols, n = c[0].n;
    float *x = q8_x((size_t)(n * cols), xkind), *nw = norm ? randf((size_t)cols) : NULL, *y0 = randf(ytot);
    precision = EB_PRECISION_Q8;
    float *yc = run_matmul(cpu, n_tasks, c, w, x, nw, accumulate ? y0 : NULL, accumulate);
    float *yg = run_matmul(gpu, n_tasks, c, w, x, nw, accumulate ? y0 : NULL, accumulate);
    precision = EB_PRECISION_F32;
    size_t at = 0;
    for (int i = 0; i < n_tasks; i++) {
        size_t ny = (size_t)(c[i].n * c[i].rows);
        int same = memcmp(yg + at, yc + at, ny * sizeof(float)) == 0;
        double e = rel_l2(yg + at, yc + at, ny);
        int bits = q8_format(c[i].dt) && !norm;
        char what[300];
        snprintf(what, sizeof what,
                 "q8 matmul %s rows %lld cols %lld n %lld off %zu task %d of %d norm %d acc %d %s%s: %s (rel %.2e)",
                 eb_dtype_name(c[i].dt), (long long)c[i].rows, (long long)cols, (long long)n, c[i].off, i, n_tasks,
                 norm, accumulate, extreme ? "extreme blocks, " : "", x_kinds[xkind],
                 same ? "the cpu module's bits" : "other bits", e);
        fail_if(bits ? !same : !(e < (norm ? Q8_TOL : TOL)), what);
        if ((bits && !same) || getenv("VERBOSE")) printf("     %s\n", what);
        at += ny;
    }
    for (int i = 0; i < n_tasks; i++) free(w[i]);
    free(x), free(nw), free(y0), free(yc), free(yg);
}

/* expert_ffn in q8: every pair's row of an expert whose products are all q8 ones the cpu module's bits (reference),
 * the rest within Q8_TOL; owner_local's sums the same bits where every expert is such */
static void check_ffn_q8(mod *cpu, mod *gpu, const experts *x, int n_tok, int mode, int xkind, const char *label) {
    float *xs = q8_x((size_t)(n_tok * x->H), xkind);
    int nc, ng;
    int32_t start[NE + 1];
    precision = EB_PRECISION_Q8;
    float *yc = run_ffn(cpu, x, n_tok, xs, mode, &nc, start), *yg = run_ffn(gpu, x, n_tok, xs, mode, &ng, NULL);
    precision = EB_PRECISION_F32;
    int all = 1, bad = 0, rows = 0;
    double worst = 0;
    for (int e = 0; e < NE; e++) all &= q8_expert(x, e);
    if (mode == EB_REDUCE_OWNER_LOCAL) {
        worst = rel_l2(yg, yc, (size_t)nc);
        bad = all ? memcmp(yg, yc, (size_t)nc * sizeof(float)) != 0 : !(worst < Q8_TOL);
    } else {
        for (int e = 0; e < NE; e++)
            for (int p = start[e]; p < start[e + 1]; p++, rows++) {
                const float *a = yg + (size_t)p * x->H, *b = yc + (size_t)p * x->H;
                double r = rel_l2(a, b, (size_t)x->H);
                worst = r > worst ? r : worst;
                bad += q8_expert(x, e) ? memcmp(a, b, (size_t)x->H * sizeof(float)) != 0 : !(r < Q8_TOL);
            }
    }
    char what[260];
    snprintf(what, sizeof what, "q8 expert_ffn %s%s, %d tokens, %s, %s: %d of %d rows unlike the cpu module's "
             "(rel %.2e)", label, oai ? " (biases, clamped SwiGLU)" : "", n_tok,
             mode == EB_REDUCE_OWNER_LOCAL ? "owner_local" : "reference", x_kinds[xkind], bad,
             mode == EB_REDUCE_OWNER_LOCAL ? 1 : rows, worst);
    fail_if(nc != ng || bad, what);
    if (bad || getenv("VERBOSE")) printf("     %s\n", what);
    free(xs), free(yc), free(yg);
}

/* moe in q8 on a primary: the rows EXPERTS writes for the owned experts whose products are all q8 ones the cpu
 * module's bits (the others within Q8_TOL), x after COMBINE within TOL (the modules add the weighted rows with other
 * roundings, the GPU's fused); ALL the bits of EXPERTS then COMBINE on the GPU */
static void check_moe_q8(mod *cpu, mod *gpu, const experts *x, int n, int foreign_expert, int mode, int xkind,
                         const char *label) {
    enum { K = 2 };
    int64_t H = x->H;
    float *xs0 = randf((size_t)(n * H)), *xn = q8_x((size_t)(n * H), xkind);
    int32_t ids[64];
    float tw[64];
    for (int t = 0; t < n; t++) {
        int a = (3 * t + 1) % NE, b = (a + 1 + t % (NE - 1)) % NE;
        ids[t * K] = a, ids[t * K + 1] = b;
        tw[t * K] = 0.6f, tw[t * K + 1] = 0.4f;
    }
    int owned[NE] = {1, 1, 1, 1};
    float *foreign = NULL;
    if (foreign_expert >= 0) {
        owned[foreign_expert] = 0;
        foreign = randf((size_t)((mode == EB_REDUCE_OWNER_LOCAL ? n : n * K) * H));
    }
    float *pc = malloc((size_t)(n * K * H) * sizeof(float)), *pg = malloc((size_t)(n * K * H) * sizeof(float));
    precision = EB_PRECISION_Q8;
    float *yc = run_moe(cpu, x, n, xs0, xn, ids, tw, owned, foreign, mode, 1, pc);
    float *yg = run_moe(gpu, x, n, xs0, xn, ids, tw, owned, foreign, mode, 1, pg);
    float *ya = run_moe(gpu, x, n, xs0, xn, ids, tw, owned, foreign, mode, 0, NULL);
    precision = EB_PRECISION_F32;
    int bad = 0, rows = 0;
    double worst = 0;
    for (int q = 0; q < n * K; q++) {
        if (!owned[ids[q]]) continue;
        const float *a = pg + (size_t)q * H, *b = pc + (size_t)q * H;
        double r = rel_l2(a, b, (size_t)H);
        worst = r > worst ? r : worst;
        bad += q8_expert(x, ids[q]) ? memcmp(a, b, (size_t)H * sizeof(float)) != 0 : !(r < Q8_TOL);
        rows++;
    }
    int all_same = memcmp(ya, yg, (size_t)(n * H) * sizeof(float)) == 0;
    for (int64_t i = 0; i < n * H; i++) yc[i] -= xs0[i], yg[i] -= xs0[i];
    double e = rel_l2(yg, yc, (size_t)(n * H));
    char what[300];
    snprintf(what, sizeof what, "q8 moe %s%s, %d tokens, %s%s, %s: %d of %d pair rows unlike the cpu module's (rel "
             "%.2e), x rel %.2e, ALL %s EXPERTS then COMBINE", label, oai ? " (biases, clamped SwiGLU)" : "", n,
             mode == EB_REDUCE_OWNER_LOCAL ? "owner_local" : "reference",
             foreign_expert >= 0 ? ", one expert foreign" : "", x_kinds[xkind], bad, rows, worst, e,
             all_same ? "==" : "!=");
    fail_if(bad || !(e < (worst > 0 ? Q8_TOL : TOL)) || !all_same, what);
    if (bad || !all_same || getenv("VERBOSE")) printf("     %s\n", what);
    free(xs0), free(xn), free(foreign), free(pc), free(pg), free(yc), free(yg), free(ya);
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    mod cpu, gpu;
    if (load(&cpu, argv[1], "cpu")) return 1;
    int st = load(&gpu, argv[2], "gpu");
    if (st > 0) return 77;
    if (st < 0) return 1;
    eb_rt_device_info info;
    memset(&info, 0, sizeof info);
    if (gpu.T->device_info(gpu.rt, 0, &info, err, sizeof err)) {
        printf("FAIL device_info: %s\n", err);
        return 1;
    }
    printf("device: %s, formats 0x%x\n", info.name, info.formats);
    /* every format but those with a scale companion (no GPU kernels yet), the i-quants among them; in q8 every one of
     * them: those with integer products and those read in f32 in either precision (no q8 block) */
    uint32_t expected = 0;
    for (int dt = 0; dt < EB_DTYPE_COUNT; dt++) {
        if (eb_format(dt)->scale_rows) continue;
        expected |= 1u << dt;
    }
    uint32_t expected_q8 = expected;
    printf("device: q8 formats 0x%x\n", info.q8_formats);
    fail_if(info.formats != expected, "device_info formats: every format but the scaled ones");
    fail_if(info.q8_formats != expected_q8, "device_info q8_formats: those with q8 products or no q8 block");
    fail_if(info.precisions != (1u << EB_PRECISION_F32 | 1u << EB_PRECISION_Q8), "device_info precisions: f32, q8");

    static const int64_t rows_list[] = {1, 7, 130};
    static const int64_t ns[] = {1, 2, 4, 5, 9};
    for (int dt = 0; dt < EB_DTYPE_COUNT; dt++) {
        if (!(info.formats & (1u << dt))) continue;
        int quant = eb_dtype_quantized(dt), big = eb_format(dt)->block == 256;
        int64_t cols_list[4] = {256, 512, 2048, big ? 1280 : 96};
        for (int ci = 0; ci < 4; ci++)
            for (int ri = 0; ri < 3; ri++)
                for (int ni = 0; ni < 5; ni++) {
                    if (rows_list[ri] * ns[ni] < 5) continue; /* the relative error of one sum: its cancellation's */
                    mm_case c = {dt, rows_list[ri], cols_list[ci], ns[ni], 0};
                    check_matmul(&cpu, &gpu, 1, &c, 0, 0);
                }
        if (quant) /* weights at every alignment: the word loads, and the 16-byte fallback of Q4_K / Q5_K */
            for (size_t off = 1; off <= 6; off++) {
                mm_case c = {dt, 37, 512, 3, off};
                check_matmul(&cpu, &gpu, 1, &c, 0, 0);
            }
        for (int ni = 0; ni < 5; ni++) {
            mm_case c = {dt, 37, 512, ns[ni], 0};
            check_matmul(&cpu, &gpu, 1, &c, 1, 0); /* norm: fused (n <= 4) or its own launch */
            check_matmul(&cpu, &gpu, 1, &c, 0, 1); /* accumulate */
        }
        check_embed(&gpu, dt, 512);
        check_embed(&gpu, dt, 2048);
        check_route(&cpu, &gpu, dt);
    }
    /* several tasks of mixed formats in one call (two launches of up to four) */
    for (int ni = 0; ni < 5; ni++) {
        mm_case c[6] = {{EB_DTYPE_Q4_K, 40, 512, ns[ni], 0}, {EB_DTYPE_Q8_0, 9, 512, ns[ni], 2},
                        {EB_DTYPE_MXFP4, 33, 512, ns[ni], 1}, {EB_DTYPE_Q6_K, 17, 512, ns[ni], 0},
                        {EB_DTYPE_BF16, 5, 512, ns[ni], 0}, {EB_DTYPE_Q5_K, 70, 512, ns[ni], 4}};
        check_matmul(&cpu, &gpu, 6, c, 0, 0);
        check_matmul(&cpu, &gpu, 6, c, 1, 0);
    }

    static const int same[NE][3] = {{EB_DTYPE_Q4_K, EB_DTYPE_Q4_K, EB_DTYPE_Q6_K},
                                    {EB_DTYPE_Q4_K, EB_DTYPE_Q4_K, EB_DTYPE_Q6_K},
                                    {EB_DTYPE_Q4_K, EB_DTYPE_Q4_K, EB_DTYPE_Q6_K},
                                    {EB_DTYPE_Q4_K, EB_DTYPE_Q4_K, EB_DTYPE_Q6_K}};
    static const int mixed[NE][3] = {{EB_DTYPE_Q4_K, EB_DTYPE_Q5_K, EB_DTYPE_Q6_K},
                                     {EB_DTYPE_Q8_0, EB_DTYPE_Q8_0, EB_DTYPE_Q8_0},
                                     {EB_DTYPE_MXFP4, EB_DTYPE_MXFP4, EB_DTYPE_Q5_K},
                                     {EB_DTYPE_Q6_K, EB_DTYPE_BF16, EB_DTYPE_MXFP4}};
    static const int small[NE][3] = {{EB_DTYPE_Q4_0, EB_DTYPE_Q4_1, EB_DTYPE_Q2_K},
                                     {EB_DTYPE_IQ4_XS, EB_DTYPE_IQ4_NL, EB_DTYPE_Q3_K},
                                     {EB_DTYPE_Q2_K, EB_DTYPE_Q2_K, EB_DTYPE_Q3_K},
                                     {EB_DTYPE_IQ4_NL, EB_DTYPE_Q4_0, EB_DTYPE_IQ4_XS}};
    static const int mx[NE][3] = {{EB_DTYPE_MXFP4, EB_DTYPE_MXFP4, EB_DTYPE_MXFP4},
                                  {EB_DTYPE_MXFP4, EB_DTYPE_MXFP4, EB_DTYPE_MXFP4},
                                  {EB_DTYPE_Q8_0, EB_DTYPE_Q8_0, EB_DTYPE_Q8_0},
                                  {EB_DTYPE_Q8_0, EB_DTYPE_Q8_0, EB_DTYPE_Q8_0}};
    static const int iq[NE][3] = {{EB_DTYPE_IQ2_XXS, EB_DTYPE_IQ2_XXS, EB_DTYPE_Q2_K},
                                  {EB_DTYPE_IQ3_XXS, EB_DTYPE_IQ2_XS, EB_DTYPE_IQ3_S},
                                  {EB_DTYPE_IQ1_S, EB_DTYPE_IQ1_M, EB_DTYPE_IQ2_S},
                                  {EB_DTYPE_IQ2_S, EB_DTYPE_IQ3_S, EB_DTYPE_IQ1_M}};
    struct {
        const int (*dts)[3];
        const char *label;
    } sets[4] = {{same, "Q4_K/Q4_K/Q6_K"}, {mixed, "mixed formats"}, {mx, "MXFP4 and Q8_0"}, {iq, "i-quants"}};
    for (int si = 0; si < 4; si++) {
        experts x;
        make_experts(&x, sets[si].dts, 512, 256);
        for (int mode = 0; mode <= 1; mode++) {
            check_ffn(&cpu, &gpu, &x, 1, mode, sets[si].label);
            check_ffn(&cpu, &gpu, &x, 5, mode, sets[si].label);
            for (int n = 1; n <= 6; n += (n == 2 ? 4 : 1)) /* 1, 2: a block column per pair; 6: per expert */
                for (int split = 0; split <= 1; split++)
                    for (int foreign = -1; foreign <= 2; foreign += 3)
                        check_moe(&cpu, &gpu, &x, n, foreign, mode, split, sets[si].label);
        }
        free_experts(&x);
    }

    /* the q8 precision: every format it runs in q8 and shape above, random and extreme blocks and activations */
    for (int dt = 0; dt < EB_DTYPE_COUNT; dt++) {
        if (!(info.q8_formats & (1u << dt))) continue;
        int big = eb_format(dt)->block == 256;
        int64_t cols_list[4] = {256, 512, 2048, big ? 1280 : 96};
        for (int ci = 0; ci < 4; ci++)
            for (int ri = 0; ri < 3; ri++)
                for (int ni = 0; ni < 5; ni++) {
                    /* the formats read with f32 activations: within a relative error, which for one or two sums
                     * is their cancellation's (as in the f32 cases above); the q8 products' bits on every shape */
                    if (!q8_format(dt) && rows_list[ri] * ns[ni] < 5) continue;
                    mm_case c = {dt, rows_list[ri], cols_list[ci], ns[ni], 0};
                    check_matmul_q8(&cpu, &gpu, 1, &c, 0, 0, 0, (ci + ri + ni) % 4);
                }
        /* quantized weights at any byte offset (their blocks lie at any alignment); float weights where the core
         * puts every weight, at an aligned address (eb_align), as in the f32 precision's cases */
        int quant = eb_dtype_quantized(dt);
        for (int extreme = 0; extreme <= 1; extreme++)
            for (int xkind = 0; xkind < 4; xkind++) {
                mm_case c = {dt, 37, big ? 768 : 544, 5, quant ? (size_t)xkind : 0};
                check_matmul_q8(&cpu, &gpu, 1, &c, 0, 0, extreme, xkind);
            }
        for (size_t off = 1; quant && off <= 6; off++) {
            mm_case c = {dt, 37, 512, 3, off};
            check_matmul_q8(&cpu, &gpu, 1, &c, 0, 0, 0, 0);
        }
        for (int ni = 0; ni < 5; ni++) {
            mm_case c = {dt, 37, 512, ns[ni], 0};
            check_matmul_q8(&cpu, &gpu, 1, &c, 1, 0, 0, 0); /* norm */
            check_matmul_q8(&cpu, &gpu, 1, &c, 0, 1, 0, 0); /* accumulate */
        }
    }
    for (int ni = 0; ni < 5; ni++) {
        mm_case c[6] = {{EB_DTYPE_Q4_K, 40, 512, ns[ni], 0}, {EB_DTYPE_Q8_0, 9, 512, ns[ni], 2},
                        {EB_DTYPE_MXFP4, 33, 512, ns[ni], 1}, {EB_DTYPE_Q6_K, 17, 512, ns[ni], 0},
                        {EB_DTYPE_BF16, 5, 512, ns[ni], 0}, {EB_DTYPE_Q5_K, 70, 512, ns[ni], 4}};
        check_matmul_q8(&cpu, &gpu, 6, c, 0, 0, 0, ni % 4);
        check_matmul_q8(&cpu, &gpu, 6, c, 1, 0, 0, 0);
    }
    struct {
        const int (*dts)[3];
        const char *label;
        int64_t H, I;
        int oai;
    } q8_sets[7] = {{same, "Q4_K/Q4_K/Q6_K", 512, 256, 0},
                    {mixed, "mixed formats", 512, 256, 0},
                    {mx, "MXFP4 and Q8_0", 512, 256, 0},
                    {mx, "MXFP4 and Q8_0", 544, 288, 1},
                    {same, "Q4_K/Q4_K/Q6_K wide", 2048, 768, 0},
                    {small, "Q4_0, Q4_1, IQ4_NL, IQ4_XS, Q2_K, Q3_K", 512, 256, 0},
                    {iq, "IQ2_XXS, IQ3_XXS, IQ2_XS, IQ3_S, IQ2_S, IQ1_S, IQ1_M", 512, 256, 0}};
    for (int si = 0; si < 7; si++) {
        experts x;
        make_experts(&x, q8_sets[si].dts, q8_sets[si].H, q8_sets[si].I);
        oai = q8_sets[si].oai;
        for (int mode = 0; mode <= 1; mode++)
            for (int xkind = 0; xkind < 4; xkind++) {
                check_ffn_q8(&cpu, &gpu, &x, 1, mode, xkind, q8_sets[si].label);
                check_ffn_q8(&cpu, &gpu, &x, 5, mode, xkind, q8_sets[si].label);
                for (int n = 1; n <= 6; n += (n == 2 ? 4 : 1))
                    for (int foreign = -1; foreign <= 2; foreign += 3)
                        check_moe_q8(&cpu, &gpu, &x, n, foreign, mode, xkind, q8_sets[si].label);
            }
        oai = 0;
        free_experts(&x);
    }
    printf("%d checks, %d failed\n", checks, failures);
    cpu.T->shutdown(cpu.rt);
    gpu.T->shutdown(gpu.rt);
    return failures ? 1 : 0;
}
"""
