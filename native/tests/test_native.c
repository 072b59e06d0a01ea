/* Native tests of the core and the cpu module, without Python: built plain and under ASan + UBSan
 * (make -C native test / sanitize). A synthetic Qwen3-MoE checkpoint with mixed dtypes is written to a
 * temporary file; the tests check batch == single steps, truncation, kernel variants and every bad-input
 * path the core validates. Usage: test_native BUILD_DIR
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eb_formats.h"
#include "eb_internal.h" /* eb_weights_choose: internal to the core, exported by this build of it */
#include "eb_ops.h"
#include "eb_q8.h"
#include "eb_runtime.h"
#include "eb_test_blocks.h"
#include "expertbench.h"

static int failures = 0, checks = 0;

#define CHECK(cond, ...)                                                                                        \
    do {                                                                                                        \
        checks++;                                                                                               \
        if (!(cond)) {                                                                                          \
            failures++;                                                                                         \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                \
            fprintf(stderr, __VA_ARGS__);                                                                       \
            fprintf(stderr, " [last error: %s]\n", eb_last_error());                                            \
        }                                                                                                       \
    } while (0)

#define CHECK_ERR(call, status, needle)                                                                         \
    do {                                                                                                        \
        int st_ = (call);                                                                                       \
        CHECK(st_ == (status), "%s returned %d, expected %d", #call, st_, (int)(status));                       \
        CHECK(strstr(eb_last_error(), (needle)) != NULL, "message of %s lacks '%s'", #call, (needle));           \
    } while (0)

enum { V = 64, H = 32, NH = 2, NKV = 1, HD = 16, E = 4, K = 2, IM = 24, ID = 40, L = 2, MAXT = 64 };

typedef struct {
    eb_tensor_desc d[MAXT];
    char names[MAXT][96];
    int n;
    uint64_t offset;
    FILE *f;
    unsigned seed;
} builder;

static float rnd(builder *b) {
    b->seed = b->seed * 1664525u + 1013904223u;
    return ((float)(b->seed >> 8) / (float)(1u << 24) - 0.5f) * 0.4f;
}

static void add(builder *b, const char *name, int dtype, int64_t d0, int64_t d1, int norm) {
    eb_tensor_desc *t = &b->d[b->n];
    snprintf(b->names[b->n], sizeof b->names[0], "%s", name);
    t->name = b->names[b->n];
    t->file_index = 0;
    t->dtype = dtype;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    int64_t count = d0 * (d1 ? d1 : 1);
    t->offset = b->offset;
    t->nbytes = (uint64_t)(d1 ? d0 : 1) * eb_row_bytes(dtype, d1 ? d1 : d0);
    for (int64_t i = 0; i < count; i++) {
        float v = norm ? 1.0f + rnd(b) : rnd(b);
        if (dtype == EB_DTYPE_F32) {
            fwrite(&v, 4, 1, b->f);
        } else if (dtype == EB_DTYPE_BF16) {
            uint32_t u;
            memcpy(&u, &v, 4);
            uint16_t h = (uint16_t)(u >> 16);
            fwrite(&h, 2, 1, b->f);
        } else { /* f16: values here are small and normal; plain truncating conversion is enough */
            uint32_t u;
            memcpy(&u, &v, 4);
            uint32_t sign = (u >> 16) & 0x8000u;
            int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
            uint16_t h = (uint16_t)(exp <= 0 ? sign : sign | (uint32_t)exp << 10 | ((u >> 13) & 0x3ffu));
            fwrite(&h, 2, 1, b->f);
        }
    }
    b->offset += t->nbytes;
    b->n++;
}

/* An E4M3FN code's value from its definition (ldexp of the integer significand), NaN for 0x7F / 0xFF: computed here
 * apart from the core's bit moves. */
static float e4m3_reference(unsigned code) {
    unsigned e = (code >> 3) & 15, m = code & 7;
    if ((code & 0x7F) == 0x7F) return NAN;
    double v = e ? ldexp(8.0 + m, (int)e - 10) : ldexp((double)m, -9);
    return (float)(code & 0x80 ? -v : v);
}

/* A random E4M3 code of magnitude below 2 (no NaN), for the small model's weights. */
static unsigned char small_e4m3(builder *b) {
    b->seed = b->seed * 1664525u + 1013904223u;
    unsigned code = (b->seed >> 11) & 0xBF; /* exponent at most 7: |value| < 2 */
    return (unsigned char)code;
}

/* A weight in F8_E4M3_B128 with its scale companion '<name>_scale_inv' (as_f32: the same weight dequantized, one F32
 * tensor, the same random draws). */
static void add_scaled(builder *b, const char *name, int64_t d0, int64_t d1, int as_f32) {
    int64_t gr = (d0 + 127) / 128, gc = (d1 + 127) / 128;
    float grid[64];
    unsigned char *codes = malloc((size_t)(d0 * d1));
    for (int64_t i = 0; i < gr * gc; i++) grid[i] = 0.05f + 0.1f * (rnd(b) + 0.2f);
    for (int64_t i = 0; i < d0 * d1; i++) codes[i] = small_e4m3(b);
    eb_tensor_desc *t = &b->d[b->n];
    snprintf(b->names[b->n], sizeof b->names[0], "%s", name);
    *t = (eb_tensor_desc){.name = b->names[b->n], .dtype = as_f32 ? EB_DTYPE_F32 : EB_DTYPE_F8_E4M3_B128, .ndim = 2,
                          .shape = {d0, d1}, .offset = b->offset};
    if (as_f32) {
        for (int64_t i = 0; i < d0 * d1; i++) {
            float v = e4m3_reference(codes[i]) * grid[(i / d1 / 128) * gc + (i % d1) / 128];
            fwrite(&v, 4, 1, b->f);
        }
        t->nbytes = (uint64_t)(d0 * d1) * 4;
    } else {
        fwrite(codes, 1, (size_t)(d0 * d1), b->f);
        t->nbytes = (uint64_t)(d0 * d1);
    }
    b->offset += t->nbytes;
    b->n++;
    free(codes);
    if (as_f32) return;
    eb_tensor_desc *s = &b->d[b->n];
    snprintf(b->names[b->n], sizeof b->names[0], "%s_scale_inv", name);
    *s = (eb_tensor_desc){.name = b->names[b->n], .dtype = EB_DTYPE_F32, .ndim = 2, .shape = {gr, gc},
                          .offset = b->offset, .nbytes = (uint64_t)(gr * gc) * 4};
    fwrite(grid, 4, (size_t)(gr * gc), b->f);
    b->offset += s->nbytes;
    b->n++;
}

/* A matrix of the test model: in its dtype, or (mode SCALED_FP8 / SCALED_AS_F32, and `scaled`) in F8_E4M3_B128 with
 * its scale companion / the same weight dequantized to F32. */
enum { PLAIN = 0, SCALED_FP8 = 1, SCALED_AS_F32 = 2 };
static void matrix(builder *b, const char *name, int dtype, int64_t d0, int64_t d1, int mode, int scaled) {
    if (mode != PLAIN && scaled) add_scaled(b, name, d0, d1, mode == SCALED_AS_F32);
    else add(b, name, dtype, d0, d1, 0);
}

/* The test model; mode (matrix): its lm_head, q, k, o, dense FFN and experts 1 and 3 scaled, or not. */
static void write_model(const char *path, eb_model_config *cfg, builder *b, int32_t *mlp_only, int mode) {
    memset(b, 0, sizeof *b);
    b->seed = 12345;
    b->f = fopen(path, "wb");
    char n[96];
    add(b, "model.embed_tokens.weight", EB_DTYPE_BF16, V, H, 0);
    add(b, "model.norm.weight", EB_DTYPE_F32, H, 0, 1);
    matrix(b, "lm_head.weight", EB_DTYPE_F16, V, H, mode, 1);
    for (int l = 0; l < L; l++) {
        int wt = l == 0 ? EB_DTYPE_BF16 : EB_DTYPE_F32;
#define ADD(fmt, ...) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), add(b, n, __VA_ARGS__))
#define MATRIX(fmt, ...) (snprintf(n, sizeof n, "model.layers.%d." fmt, l), matrix(b, n, __VA_ARGS__))
        ADD("input_layernorm.weight", EB_DTYPE_BF16, H, 0, 1);
        ADD("post_attention_layernorm.weight", EB_DTYPE_F32, H, 0, 1);
        MATRIX("self_attn.q_proj.weight", wt, NH * HD, H, mode, 1);
        MATRIX("self_attn.k_proj.weight", wt, NKV * HD, H, mode, 1);
        ADD("self_attn.v_proj.weight", wt, NKV * HD, H, 0);
        MATRIX("self_attn.o_proj.weight", wt, H, NH * HD, mode, 1);
        ADD("self_attn.q_norm.weight", EB_DTYPE_F32, HD, 0, 1);
        ADD("self_attn.k_norm.weight", EB_DTYPE_F32, HD, 0, 1);
        if (l == 0) {
            ADD("mlp.gate.weight", EB_DTYPE_F32, E, H, 0);
            for (int e = 0; e < E; e++) {
                int et = e % 3 == 0 ? EB_DTYPE_BF16 : (e % 3 == 1 ? EB_DTYPE_F16 : EB_DTYPE_F32);
                snprintf(n, sizeof n, "model.layers.0.mlp.experts.%d.gate_proj.weight", e);
                matrix(b, n, et, IM, H, mode, e % 2);
                snprintf(n, sizeof n, "model.layers.0.mlp.experts.%d.up_proj.weight", e);
                matrix(b, n, et, IM, H, mode, e % 2);
                snprintf(n, sizeof n, "model.layers.0.mlp.experts.%d.down_proj.weight", e);
                matrix(b, n, et, H, IM, mode, e % 2);
            }
        } else {
            MATRIX("mlp.gate_proj.weight", wt, ID, H, mode, 1);
            MATRIX("mlp.up_proj.weight", wt, ID, H, mode, 1);
            MATRIX("mlp.down_proj.weight", wt, H, ID, mode, 1);
        }
#undef ADD
#undef MATRIX
    }
    fclose(b->f);
    b->f = NULL;
    mlp_only[0] = 1;
    *cfg = (eb_model_config){.arch = EB_ARCH_QWEN3_MOE, .vocab_size = V, .hidden_size = H, .intermediate_size = ID,
                             .moe_intermediate_size = IM, .num_layers = L, .num_heads = NH, .num_kv_heads = NKV,
                             .head_dim = HD, .num_experts = E, .top_k = K, .norm_topk_prob = 1,
                             .decoder_sparse_step = 1, .tie_word_embeddings = 0, .attention_bias = 0,
                             .max_position_embeddings = 32, .rope_theta = 10000.0, .rms_norm_eps = 1e-6,
                             .mlp_only_layers = mlp_only, .n_mlp_only_layers = 1};
}

static int find(builder *b, const char *name) {
    for (int i = 0; i < b->n; i++)
        if (strcmp(b->names[i], name) == 0) return i;
    return -1;
}

static eb_engine *new_engine(const char *module, int portable, int threads) {
    eb_engine *e = NULL;
    CHECK(eb_engine_create(&e) == EB_OK, "engine create");
    eb_runtime_options o = {.n_devices = 2, .threads_per_device = threads,
                            .kernels = portable ? EB_CPU_KERNELS_PORTABLE : EB_CPU_KERNELS_BEST};
    CHECK(eb_engine_load_runtime(e, "cpu", module, &o) == EB_OK, "load cpu runtime %s", module ? module : "(default)");
    return e;
}

static float max_abs_diff(const float *a, const float *b, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(a[i] - b[i]));
    return m;
}

static void test_forward(const char *module, const char *file, eb_model_config *cfg, builder *b) {
    const char *files[] = {file};
    float ref[8 * V];
    for (int variant = 0; variant < 2; variant++) {
        eb_engine *e = new_engine(module, variant, 2);
        eb_runtime_info ri;
        CHECK(eb_engine_runtime_info(e, 0, &ri) == EB_OK, "runtime info");
        eb_model *m = NULL;
        CHECK(eb_model_load(e, cfg, files, 1, b->d, b->n, 1, NULL, &m) == EB_OK, "model load on cpu:1");
        eb_context *c = NULL;
        CHECK(eb_context_create(m, 16, 4, &c) == EB_OK, "context");
        int32_t prompt[5] = {3, 17, 42, 5, 63}, next[3] = {9, 1, 30};
        float batch[8 * V], single[3 * V], last[V];
        CHECK(eb_context_eval(c, prompt, 5, batch, 1) == EB_OK, "prefill");
        CHECK(eb_context_eval(c, next, 3, batch + 5 * V, 1) == EB_OK, "batch of 3");
        CHECK(eb_context_position(c) == 8, "position after 8");
        CHECK(eb_context_truncate(c, 5) == EB_OK, "truncate");
        for (int i = 0; i < 3; i++) CHECK(eb_context_eval(c, next + i, 1, single + i * V, 1) == EB_OK, "single");
        CHECK(memcmp(single, batch + 5 * V, sizeof single) == 0, "batch rows differ from single steps (%s)",
              ri.kernel_variant);
        CHECK(eb_context_truncate(c, 0) == EB_OK, "truncate 0");
        CHECK(eb_context_eval(c, prompt, 5, last, 0) == EB_OK, "prefill last row");
        CHECK(memcmp(last, batch + 4 * V, sizeof last) == 0, "last-row prefill differs");
        float finite = 0.0f;
        for (int i = 0; i < 8 * V; i++) finite += batch[i];
        CHECK(isfinite(finite), "non-finite logits");
        if (variant == 0) memcpy(ref, batch, sizeof ref);
        else CHECK(max_abs_diff(ref, batch, 8 * V) < 1e-4f, "portable and SIMD kernels disagree");
        /* bad inputs leave the context where it was */
        int32_t bad[2] = {1, V};
        CHECK_ERR(eb_context_eval(c, bad, 2, NULL, 0), EB_ERR_RANGE, "token id 64");
        int32_t neg = -1;
        CHECK_ERR(eb_context_eval(c, &neg, 1, NULL, 0), EB_ERR_RANGE, "out of range");
        int32_t many[12] = {0};
        CHECK_ERR(eb_context_eval(c, many, 12, NULL, 0), EB_ERR_RANGE, "longer than the KV cache");
        CHECK_ERR(eb_context_truncate(c, 6), EB_ERR_RANGE, "expected 0..5");
        CHECK(eb_context_position(c) == 5, "position unchanged after errors");
        eb_context *too_long = NULL;
        CHECK_ERR(eb_context_create(m, 33, 4, &too_long), EB_ERR_RANGE, "max_position_embeddings");
        CHECK(too_long == NULL, "no context on failure");
        eb_context_free(c);
        eb_model_free(m);
        eb_engine_destroy(e);
    }
}

/* An engine of `threads` threads per cpu device, the test model loaded on cpu:0 and a context of n_ctx positions on
 * it; *e and *m are set for the caller to free. */
static eb_context *open_context(const char *module, const char *file, eb_model_config *cfg, builder *b, int threads,
                                int32_t n_ctx, int32_t n_batch, eb_engine **e, eb_model **m) {
    const char *files[] = {file};
    *e = new_engine(module, 0, threads);
    *m = NULL;
    CHECK(eb_model_load(*e, cfg, files, 1, b->d, b->n, 0, NULL, m) == EB_OK, "model load, %d threads", threads);
    eb_context *c = NULL;
    CHECK(eb_context_create(*m, n_ctx, n_batch, &c) == EB_OK, "context of %d positions", n_ctx);
    return c;
}

/* eb_attend_group over g heads (blocks of EB_ATTEND_HEADS and a partial one, a head size that is not a multiple of
 * eight, more positions than are requested ahead) gives each head the bits of eb_attend on that head alone. */
static void test_attend_group_blocks(void) {
    enum { HD = 20, KVD = 3 * HD, P = 29, SSTRIDE = 40, G = 2 * EB_ATTEND_HEADS + 3 };
    static float q[G * HD], kc[(P + 1) * KVD], vc[(P + 1) * KVD], scores[G * SSTRIDE], one[P + 1];
    static float group[G * HD], single[G * HD];
    unsigned r = 7;
    for (int i = 0; i < G * HD; i++) q[i] = (float)((r = r * 1103515245u + 12345u) >> 16) / 65536.0f - 0.5f;
    for (int i = 0; i < (P + 1) * KVD; i++) {
        kc[i] = (float)((r = r * 1103515245u + 12345u) >> 16) / 32768.0f - 1.0f;
        vc[i] = (float)((r = r * 1103515245u + 12345u) >> 16) / 32768.0f - 1.0f;
    }
    int sizes[] = {1, 3, EB_ATTEND_HEADS, G};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int g = sizes[k];
        memset(group, 0xff, sizeof group);
        eb_attend_group(q, g, kc + HD, vc + HD, P, KVD, HD, scores, SSTRIDE, group);
        for (int h = 0; h < g; h++) eb_attend(q + h * HD, kc + HD, vc + HD, P, KVD, HD, one, single + h * HD);
        CHECK(memcmp(group, single, (size_t)(g * HD) * sizeof(float)) == 0,
              "a group of %d heads differs from its heads attended alone", g);
    }
}

/* Attention's work items are a whole GQA group's heads (threads <= groups: one thread here) or single heads (more
 * threads): the logits are the same bits either way, over more positions than are requested ahead. */
static void test_attention_items(const char *module, const char *file, eb_model_config *cfg, builder *b) {
    enum { N = 24 };
    static float ref[N * V], got[N * V];
    int32_t prompt[N];
    for (int i = 0; i < N; i++) prompt[i] = (i * 37 + 11) % V;
    for (int threads = 1; threads <= 3; threads++) {
        eb_engine *e;
        eb_model *m;
        eb_context *c = open_context(module, file, cfg, b, threads, 32, N, &e, &m);
        float *out = threads == 1 ? ref : got;
        CHECK(eb_context_eval(c, prompt, N - 4, out, 1) == EB_OK, "prefill");
        for (int i = N - 4; i < N; i++) CHECK(eb_context_eval(c, prompt + i, 1, out + i * V, 1) == EB_OK, "step");
        if (threads > 1)
            CHECK(memcmp(ref, got, sizeof ref) == 0, "%d threads (one head per item) differ from 1 (a group per item)",
                  threads);
        eb_context_free(c);
        eb_model_free(m);
        eb_engine_destroy(e);
    }
}

/* Whether v appears among the first n of a. */
static int memchr_i32(const int32_t *a, int n, int32_t v) {
    for (int i = 0; i < n; i++)
        if (a[i] == v) return 1;
    return 0;
}

/* The core's greedy loop chooses what evaluating one token at a time and taking the argmax chooses. */
static void test_greedy(const char *module, const char *file, eb_model_config *cfg, builder *b) {
    eb_engine *e;
    eb_model *m;
    eb_context *c = open_context(module, file, cfg, b, 2, 32, 4, &e, &m);
    int32_t want[8] = {7}, got[8] = {0}, n = 0;
    float row[V];
    for (int i = 1; i < 8; i++) {
        CHECK(eb_context_eval(c, want + i - 1, 1, row, 0) == EB_OK, "step");
        int best = 0;
        for (int j = 1; j < V; j++)
            if (row[j] > row[best]) best = j;
        want[i] = best;
    }
    CHECK(eb_context_truncate(c, 0) == EB_OK, "truncate");
    CHECK(eb_context_greedy(c, 7, 8, NULL, 0, got, &n) == EB_OK && n == 8, "greedy: %d tokens", n);
    CHECK(memcmp(want, got, sizeof want) == 0 && eb_context_position(c) == 7, "greedy differs from single steps");
    CHECK(eb_context_truncate(c, 0) == EB_OK, "truncate");
    int at = 1; /* a token first chosen mid-loop: the loop ends there */
    while (at < 8 && memchr_i32(want, at, want[at])) at++;
    CHECK(at < 8, "the test model chooses no new token after the first: pick another start");
    if (at < 8)
        CHECK(eb_context_greedy(c, 7, 8, want + at, 1, got, &n) == EB_OK && n == at + 1, "stop id: %d tokens", n);
    CHECK_ERR(eb_context_greedy(c, V, 8, NULL, 0, got, &n), EB_ERR_RANGE, "first token id 64 out of range");
    eb_context_free(c);
    eb_model_free(m);
    eb_engine_destroy(e);
}

/* The files mapped or copied into private memory: the same logits bits either way. What EB_WEIGHTS_AUTO becomes,
 * and the requests refused. */
static void test_weights_modes(const char *module, const char *file, eb_model_config *cfg, builder *b) {
    const char *files[] = {file};
    static float logits[2][4 * V];
    int modes[2] = {EB_WEIGHTS_MAP, EB_WEIGHTS_COPY};
    for (int k = 0; k < 2; k++) {
        eb_engine *e = new_engine(module, 0, 2);
        eb_model *m = NULL;
        eb_load_options o = {modes[k], EB_CHECK_WEIGHTS_ON, NULL};
        CHECK(eb_model_load(e, cfg, files, 1, b->d, b->n, 0, &o, &m) == EB_OK, "load, weights mode %d", modes[k]);
        eb_model_info info;
        CHECK(eb_model_get_info(m, &info) == EB_OK && info.weights == modes[k], "weights held as %d, asked %d",
              info.weights, modes[k]);
        CHECK(info.file_bytes >= info.weight_bytes, "file bytes %llu, weights %llu",
              (unsigned long long)info.file_bytes, (unsigned long long)info.weight_bytes);
        CHECK(k == 1 || info.huge_page_bytes == 0, "huge-page bytes %llu of a mapping",
              (unsigned long long)info.huge_page_bytes);
        eb_context *c = NULL;
        CHECK(eb_context_create(m, 8, 4, &c) == EB_OK, "context");
        int32_t ids[4] = {3, 17, 42, 5};
        CHECK(eb_context_eval(c, ids, 4, logits[k], 1) == EB_OK, "eval, weights mode %d", modes[k]);
        eb_context_free(c);
        eb_model_free(m);
        eb_engine_destroy(e);
    }
    CHECK(memcmp(logits[0], logits[1], sizeof logits[0]) == 0, "copied weights give other logits than mapped ones");
    { /* the copy read by several threads, in parts of 4 KiB units (a file of the real sizes has 2 MiB ones) */
        eb_set_copy_min_part(4096);
        eb_engine *e = new_engine(module, 0, 2);
        eb_model *m = NULL;
        eb_load_options o = {EB_WEIGHTS_COPY, EB_CHECK_WEIGHTS_ON, NULL};
        static float parted[4 * V];
        CHECK(eb_model_load(e, cfg, files, 1, b->d, b->n, 0, &o, &m) == EB_OK, "load, copy in parts");
        cpu_set_t set;
        int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
        CHECK(eb_copy_threads_used() == (cpus < 16 ? cpus : 16), "the copy read by %d threads, %d CPUs",
              eb_copy_threads_used(), cpus);
        eb_context *c = NULL;
        int32_t ids[4] = {3, 17, 42, 5};
        CHECK(m && eb_context_create(m, 8, 4, &c) == EB_OK && eb_context_eval(c, ids, 4, parted, 1) == EB_OK,
              "eval, copy in parts");
        CHECK(memcmp(logits[0], parted, sizeof parted) == 0, "a copy read in parts gives other logits");
        eb_context_free(c);
        eb_model_free(m);
        eb_engine_destroy(e);
        eb_set_copy_min_part(0);
    }
    eb_engine *e = new_engine(module, 0, 1);
    eb_model *m = NULL;
    eb_load_options bad = {7, EB_CHECK_WEIGHTS_ON, NULL};
    CHECK_ERR(eb_model_load(e, cfg, files, 1, b->d, b->n, 0, &bad, &m), EB_ERR_ARGUMENT, "weights mode 7");
    CHECK(m == NULL, "no model from a bad weights mode");
    eb_engine_destroy(e);
    int mode = -1;
    CHECK(eb_weights_choose(EB_WEIGHTS_AUTO, 100, 1000, 1, &mode) == EB_OK && mode == EB_WEIGHTS_COPY, "auto, fits");
    CHECK(eb_weights_choose(EB_WEIGHTS_AUTO, 501, 1000, 1, &mode) == EB_OK && mode == EB_WEIGHTS_MAP,
          "auto, more than half of the memory available");
    CHECK(eb_weights_choose(EB_WEIGHTS_AUTO, 100, 1000, 0, &mode) == EB_OK && mode == EB_WEIGHTS_MAP,
          "auto, huge pages disabled");
    CHECK(eb_weights_choose(EB_WEIGHTS_AUTO, 100, 0, 1, &mode) == EB_OK && mode == EB_WEIGHTS_MAP,
          "auto, memory available unknown");
    CHECK(eb_weights_choose(EB_WEIGHTS_COPY, 100, 0, 0, &mode) == EB_OK && mode == EB_WEIGHTS_COPY,
          "copy asked, nothing known against it");
    CHECK(eb_weights_choose(EB_WEIGHTS_MAP, 100, 1000, 1, &mode) == EB_OK && mode == EB_WEIGHTS_MAP, "map asked");
    CHECK_ERR(eb_weights_choose(EB_WEIGHTS_COPY, 3u << 20, 2u << 20, 1, &mode), EB_ERR_MEMORY,
              "needs 3.0 MiB, and 2.0 MiB of memory is available");
    CHECK_ERR(eb_weights_choose(-1, 100, 1000, 1, &mode), EB_ERR_ARGUMENT, "weights mode -1 is not one of");
}

static void expect_load_error(const char *module, const char *file, const eb_model_config *cfg, builder *b,
                              int status, const char *needle, const char *what) {
    const char *files[] = {file};
    eb_engine *e = new_engine(module, 0, 1);
    eb_model *m = NULL;
    int st = eb_model_load(e, cfg, files, 1, b->d, b->n, 0, NULL, &m);
    CHECK(st == status && m == NULL, "%s: status %d, expected %d", what, st, status);
    CHECK(strstr(eb_last_error(), needle) != NULL, "%s: message lacks '%s'", what, needle);
    eb_model_free(m);
    eb_engine_destroy(e);
}

/* A load refused with EB_ERR_FORMAT whose message holds the tensor's name followed by `at`, and what was expected. */
static void expect_refusal(const char *module, const char *file, const eb_model_config *cfg, builder *b,
                           const char *tensor, const char *at, const char *expected) {
    char names[256];
    snprintf(names, sizeof names, "%s%s", tensor, at);
    expect_load_error(module, file, cfg, b, EB_ERR_FORMAT, names, tensor);
    expect_load_error(module, file, cfg, b, EB_ERR_FORMAT, expected, tensor);
}

/* A copy of the file at `path` with 4-byte values written over it: each at a tensor's byte offset + at. */
typedef struct {
    const char *tensor;
    uint64_t at;
    float value;
} patch;
static void damaged_copy(const char *file, builder *b, const char *path, const patch *p, int n) {
    FILE *in = fopen(file, "rb"), *out = fopen(path, "wb");
    CHECK(in && out, "copy %s", file);
    char buf[4096];
    size_t got;
    while (in && out && (got = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, got, out);
    for (int i = 0; out && i < n; i++) {
        int t = find(b, p[i].tensor);
        CHECK(t >= 0 && b->d[t].dtype == EB_DTYPE_F32, "%s: an F32 tensor of the test model", p[i].tensor);
        fseek(out, (long)(b->d[t].offset + p[i].at), SEEK_SET);
        fwrite(&p[i].value, 4, 1, out);
    }
    if (in) fclose(in);
    if (out) fclose(out);
}

static int load_checked(const char *module, const char *file, const eb_model_config *cfg, builder *b, int check,
                        eb_engine **e, eb_model **m) {
    const char *files[] = {file};
    *e = new_engine(module, 0, 1);
    *m = NULL;
    eb_load_options o = {EB_WEIGHTS_MAP, check, NULL};
    return eb_model_load(*e, cfg, files, 1, b->d, b->n, 0, &o, m);
}

/* Weights that are not numbers refused at load: the file, the tensor (the first bad one in binding order) and the
 * first bad value's index in it, the same whatever the threads do; loaded with EB_CHECK_WEIGHTS_OFF, their NaN
 * logits refused by greedy decoding naming the step. */
static void test_weight_check(const char *module, const char *file, eb_model_config *cfg, builder *b) {
    char path[] = "/tmp/eb_native_damaged_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    eb_engine *e;
    eb_model *m;
    const char *down1 = "model.layers.1.mlp.down_proj.weight"; /* F32 [H, ID] */
    const char *down0 = "model.layers.0.mlp.experts.2.down_proj.weight"; /* F32 [H, IM], bound before layer 1 */
    char want[512];
    static const struct {
        float value;
        const char *holds;
    } bad[] = {{NAN, "holds NaN at row 3, column 5 "},
               {INFINITY, "holds inf at row 3, column 5 "},
               {-INFINITY, "holds -inf at row 3, column 5 "},
               {1e30f, "holds 1e+30 (a magnitude past 2^64, which no weight has) at row 3, column 5 "}};
    for (int k = 0; k < 4; k++) {
        patch p[] = {{down1, (3 * ID + 5) * 4, bad[k].value}, {down1, (7 * ID + 1) * 4, NAN}};
        damaged_copy(file, b, path, p, 2);
        snprintf(want, sizeof want, "'%s': tensor '%s' %s", path, down1, bad[k].holds);
        CHECK_ERR(load_checked(module, path, cfg, b, EB_CHECK_WEIGHTS_ON, &e, &m), EB_ERR_FORMAT, want);
        CHECK(strstr(eb_last_error(), "; --no-check-weights (check_weights=False) loads it anyway"), "the way out");
        CHECK(m == NULL, "a model from damaged weights");
        eb_engine_destroy(e);
    }
    /* a vector: its index */
    patch norm[] = {{"model.layers.1.post_attention_layernorm.weight", 7 * 4, INFINITY}};
    damaged_copy(file, b, path, norm, 1);
    CHECK_ERR(load_checked(module, path, cfg, b, EB_CHECK_WEIGHTS_ON, &e, &m), EB_ERR_FORMAT,
              "tensor 'model.layers.1.post_attention_layernorm.weight' holds inf at index 7 (a damaged file)");
    eb_engine_destroy(e);

    /* in many small parts over every thread: always the first bad weight in binding order, and its first value */
    patch two[] = {{down1, 0, NAN}, {down0, (H - 1) * IM * 4 + 4 * 3, NAN}, {down0, (H - 1) * IM * 4 + 4 * 9, NAN}};
    damaged_copy(file, b, path, two, 3);
    snprintf(want, sizeof want, "tensor '%s' holds NaN at row %d, column 3 ", down0, H - 1);
    eb_set_check_part(64);
    for (int rep = 0; rep < 20; rep++) {
        CHECK_ERR(load_checked(module, path, cfg, b, EB_CHECK_WEIGHTS_ON, &e, &m), EB_ERR_FORMAT, want);
        eb_engine_destroy(e);
    }
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    CHECK(eb_check_threads_used() == (cpus < 32 ? cpus : 32), "the check ran on %d threads, %d CPUs",
          eb_check_threads_used(), cpus);
    CHECK(load_checked(module, file, cfg, b, EB_CHECK_WEIGHTS_ON, &e, &m) == EB_OK, "the intact file in small parts");
    eb_model_free(m);
    eb_engine_destroy(e);
    eb_set_check_part(0);

    /* unchecked: it loads, and greedy decoding refuses the NaN logits rather than choose token 0 */
    patch final[] = {{"model.norm.weight", 2 * 4, NAN}};
    damaged_copy(file, b, path, final, 1);
    CHECK(load_checked(module, path, cfg, b, EB_CHECK_WEIGHTS_OFF, &e, &m) == EB_OK, "an unchecked load");
    eb_context *c = NULL;
    int32_t out[8] = {0}, n = -1;
    CHECK(m && eb_context_create(m, 16, 4, &c) == EB_OK, "context");
    int32_t prompt[3] = {3, 17, 42};
    CHECK(c && eb_context_eval(c, prompt, 3, NULL, 0) == EB_OK, "prefill");
    if (c)
        CHECK_ERR(eb_context_greedy(c, 5, 8, NULL, 0, out, &n), EB_ERR_NUMERIC,
                  "step 1 (position 3): the logits hold NaN at token id 0: the model's numbers overflowed or a "
                  "weight is damaged");
    CHECK(n == 1 && out[0] == 5, "greedy chose %d tokens (%d) from NaN logits", n, out[1]);
    eb_context_free(c);
    eb_model_free(m);
    eb_engine_destroy(e);
    CHECK_ERR(load_checked(module, file, cfg, b, 5, &e, &m), EB_ERR_ARGUMENT, "check_weights 5 is not one of");
    eb_engine_destroy(e);
    unlink(path);
}

/* DeepSeek-V4's own config fields, each bad one named before a tensor is read (the file is Qwen3-MoE's: a valid V4
 * config would then miss its tensors, named). */
static void test_v4_config(const char *module, const char *file, const eb_model_config *base, builder *b) {
    static const int32_t kinds[4] = {EB_V4_SLIDING, EB_V4_CSA, EB_V4_HCA, EB_V4_CSA}, hash[4] = {1, 1, 0, 0};
    static const int32_t bad_kind[4] = {EB_V4_SLIDING, 7, EB_V4_HCA, EB_V4_CSA};
    static const float inv[8] = {1.0f, 0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.015625f, 0.0078125f};
    static const float bad_inv[8] = {1.0f, 0.5f, -0.25f, 0.125f, 0.0625f, 0.03125f, 0.015625f, 0.0078125f};
    eb_model_config v4 = *base;
    v4.arch = EB_ARCH_DEEPSEEK_V4, v4.num_kv_heads = 1, v4.num_layers = 4, v4.n_mlp_only_layers = 0;
    v4.mlp_only_layers = NULL, v4.n_shared_experts = 1, v4.q_lora_rank = 8, v4.routed_scaling_factor = 1.5;
    v4.swiglu_limit = 10.0, v4.rope_dim = 16, v4.rope_interleave = 1, v4.rope_inv_freq = inv;
    v4.compress_inv_freq = inv, v4.hc_mult = 4, v4.hc_sinkhorn_iters = 20, v4.hc_eps = 1e-6, v4.o_groups = 2;
    v4.o_lora_rank = 8, v4.sliding_window = 8, v4.layer_kind = kinds, v4.layer_hash = hash, v4.n_layer_kind = 4;
    v4.csa_rate = 4, v4.hca_rate = 128, v4.index_n_heads = 2, v4.index_head_dim = 16, v4.index_topk = 4;
    expect_load_error(module, file, &v4, b, EB_ERR_FORMAT, "tensor 'model.hc_head.hc_fn' is missing",
                      "a valid V4 config");
    eb_model_config c = v4;
    c.hc_mult = 0;
    expect_load_error(module, file, &c, b, EB_ERR_FORMAT, "config: hc_mult = 0, expected 1..64", "hc_mult 0");
    c = v4, c.o_groups = 3;
    expect_load_error(module, file, &c, b, EB_ERR_FORMAT, "o_groups = 3 does not divide", "o_groups");
    c = v4, c.layer_kind = bad_kind;
    expect_load_error(module, file, &c, b, EB_ERR_FORMAT, "layer 1's kind is 7, expected 0 (sliding window), 1 (CSA)",
                      "layer kind");
    c = v4, c.n_layer_kind = 3;
    expect_load_error(module, file, &c, b, EB_ERR_FORMAT, "3 layer kinds, expected one per layer (4)", "kinds");
    c = v4, c.csa_rate = 0;
    expect_load_error(module, file, &c, b, EB_ERR_FORMAT, "layer 1 is compressed sparse attention with a compress "
                      "rate of 0", "csa rate");
    c = v4, c.compress_inv_freq = bad_inv;
    expect_load_error(module, file, &c, b, EB_ERR_FORMAT, "compress RoPE frequency 2 = -0.25", "compress RoPE");
    c = v4, c.compress_inv_freq = NULL;
    expect_load_error(module, file, &c, b, EB_ERR_FORMAT, "its two RoPEs' frequencies", "no compress RoPE");
    c = v4, c.index_head_dim = 8;
    expect_load_error(module, file, &c, b, EB_ERR_FORMAT, "index_head_dim = 8", "indexer narrower than the RoPE");
    c = v4, c.swiglu_limit = 0.0;
    expect_load_error(module, file, &c, b, EB_ERR_FORMAT, "swiglu_limit for gpt-oss and DeepSeek-V4", "no clamp");
}

static void test_bad_checkpoints(const char *module, const char *file, eb_model_config *cfg, builder *b) {
    builder saved = *b;
    int i = find(b, "model.layers.0.mlp.experts.2.up_proj.weight");
    for (int k = 0; k < b->n; k++) b->d[k].name = b->names[k];

    b->d[i].offset = saved.offset; /* past the end */
    expect_load_error(module, file, cfg, b, EB_ERR_FORMAT, "past the end of the file", "offset past end");
    *b = saved;
    for (int k = 0; k < b->n; k++) b->d[k].name = b->names[k];
    b->d[i].nbytes -= 2;
    char counts[96];
    snprintf(counts, sizeof counts, "%llu bytes, expected %llu", (unsigned long long)b->d[i].nbytes,
             (unsigned long long)b->d[i].nbytes + 2);
    expect_load_error(module, file, cfg, b, EB_ERR_FORMAT, counts, "wrong byte count");
    b->d[i].nbytes += 2;
    /* the first code after the formats that the raw bytes (EB_DTYPE_U8) do not take */
    int unknown = EB_DTYPE_COUNT == EB_DTYPE_U8 ? EB_DTYPE_U8 + 1 : EB_DTYPE_COUNT;
    b->d[i].dtype = unknown;
    char code[32];
    snprintf(code, sizeof code, "dtype code %d", unknown);
    expect_load_error(module, file, cfg, b, EB_ERR_UNSUPPORTED, code, "unknown dtype");
    b->d[i].dtype = EB_DTYPE_Q4_K; /* rows of 32 values: not whole 256-value blocks */
    expect_load_error(module, file, cfg, b, EB_ERR_FORMAT, "rows of 32 values are not a whole number of Q4_K blocks",
                      "partial block");
    b->d[i].dtype = EB_DTYPE_Q8_0; /* one 34-byte block per row: the byte count differs */
    expect_load_error(module, file, cfg, b, EB_ERR_FORMAT, "expected 816 for Q8_0 with 24 rows of 32 values",
                      "quantized byte count");
    b->d[i].dtype = saved.d[i].dtype;
    b->d[i].shape[0] = H, b->d[i].shape[1] = IM; /* transposed, same byte count */
    expect_load_error(module, file, cfg, b, EB_ERR_FORMAT, "expected [24, 32]", "mis-shaped");
    b->d[i].shape[0] = IM, b->d[i].shape[1] = H;
    snprintf(b->names[i], sizeof b->names[i], "model.layers.0.mlp.experts.2.up_proj.weightX");
    expect_load_error(module, file, cfg, b, EB_ERR_FORMAT, "'model.layers.0.mlp.experts.2.up_proj.weight' is missing",
                      "missing tensor");
    snprintf(b->names[i], sizeof b->names[i], "model.layers.0.mlp.experts.1.up_proj.weight");
    expect_load_error(module, file, cfg, b, EB_ERR_FORMAT, "appears twice", "duplicate tensor");
    *b = saved;
    for (int k = 0; k < b->n; k++) b->d[k].name = b->names[k];

    eb_model_config bad = *cfg;
    bad.arch = 99;
    expect_load_error(module, file, &bad, b, EB_ERR_UNSUPPORTED, "architecture code 99", "architecture");
    bad = *cfg;
    bad.top_k = E + 1;
    expect_load_error(module, file, &bad, b, EB_ERR_FORMAT, "num_experts_per_tok = 5", "top_k");
    bad = *cfg;
    bad.num_kv_heads = 3;
    expect_load_error(module, file, &bad, b, EB_ERR_FORMAT, "not a multiple of num_key_value_heads", "heads");
    const double thetas[] = {1e-300, INFINITY, NAN, 1e300}, epsilons[] = {INFINITY, NAN, 2.0, 0.0};
    for (int k = 0; k < 4; k++) {
        bad = *cfg;
        bad.rope_theta = thetas[k];
        expect_load_error(module, file, &bad, b, EB_ERR_FORMAT, "rope_theta", "rope_theta out of range");
        bad = *cfg;
        bad.rms_norm_eps = epsilons[k];
        expect_load_error(module, file, &bad, b, EB_ERR_FORMAT, "rms_norm_eps", "rms_norm_eps out of range");
    }
    expect_load_error(module, "/nonexistent/model.safetensors", cfg, b, EB_ERR_IO, "cannot open", "missing file");

    /* a truncated copy of the file */
    char small[] = "/tmp/eb_native_small_XXXXXX";
    int fd = mkstemp(small);
    CHECK(fd >= 0, "mkstemp");
    CHECK(write(fd, "\0\0\0\0\0\0\0\0", 8) == 8, "write");
    close(fd);
    expect_load_error(module, small, cfg, b, EB_ERR_FORMAT, "past the end of the file", "truncated file");
    unlink(small);
}

/* Seeded mutations of the tensor descriptors and the config (what a caller of the C API could pass): every load
 * either fails with a status, a message and no model, or succeeds and evaluates (a descriptor that lies about where
 * its bytes are inside the file reads other bytes: the Python reader checks that against the safetensors header);
 * under the sanitizer builds no read strays outside the file and nothing leaks. */
static void test_descriptor_fuzz(const char *module, const char *file, eb_model_config *cfg, builder *b) {
    const char *files[] = {file};
    eb_engine *e = new_engine(module, 0, 1);
    builder saved = *b;
    unsigned seed = 12345;
    int refused = 0, loaded = 0, bad = 0;
    for (int round = 0; round < 2000; round++) {
        *b = saved;
        for (int k = 0; k < b->n; k++) b->d[k].name = b->names[k];
        eb_model_config c = *cfg;
        int changes = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 3;
        for (int j = 0; j < changes; j++) {
            seed = seed * 1103515245u + 12345u;
            unsigned r = seed >> 8;
            eb_tensor_desc *t = &b->d[r % (unsigned)b->n];
            uint64_t big[] = {0, 1, 2, 7, 8, 4096, (uint64_t)1 << 31, (uint64_t)1 << 62, UINT64_MAX, saved.offset};
            switch ((r >> 12) % 8) {
            case 0: t->offset = big[(r >> 16) % 10]; break;
            case 1: t->offset += (r >> 16) % 16; break;
            case 2: t->nbytes = big[(r >> 16) % 10]; break;
            case 3: t->dtype = (int32_t)((r >> 16) % 6) - 1; break;
            case 4: t->ndim = (int32_t)((r >> 16) % 7) - 1; break;
            case 5: t->shape[(r >> 16) % 4] = (int64_t)big[(r >> 18) % 10]; break;
            case 6: t->file_index = (int32_t)((r >> 16) % 3) - 1; break;
            default: {
                int32_t *fields[] = {&c.hidden_size, &c.num_heads, &c.num_kv_heads, &c.head_dim, &c.num_experts,
                                     &c.top_k, &c.num_layers, &c.vocab_size, &c.moe_intermediate_size};
                int32_t values[] = {0, -1, 1, 3, 7, 1 << 30, INT32_MAX};
                *fields[(r >> 16) % 9] = values[(r >> 20) % 7];
            }
            }
        }
        eb_model *m = NULL;
        int st = eb_model_load(e, &c, files, 1, b->d, b->n, 0, NULL, &m);
        if (st != EB_OK) {
            refused++;
            bad += m != NULL || eb_last_error()[0] == 0; /* a failure always says why, and returns no model */
            continue;
        }
        loaded++;
        eb_context *ctx = NULL;
        int32_t ids[2] = {1, 2};
        float logits[V];
        if (eb_context_create(m, 8, 2, &ctx) == EB_OK)
            bad += eb_context_eval(ctx, ids, 2, logits, 0) != EB_OK && eb_last_error()[0] == 0;
        eb_context_free(ctx);
        eb_model_free(m);
    }
    *b = saved;
    for (int k = 0; k < b->n; k++) b->d[k].name = b->names[k];
    CHECK(bad == 0, "descriptor fuzz: %d calls failed without a message or returned a model", bad);
    CHECK(refused > 1000 && loaded > 0, "descriptor fuzz: %d refused, %d loaded (expected most refused, some not)",
          refused, loaded);
    eb_engine_destroy(e);
}

static void test_modules(const char *build) {
    eb_engine *e = NULL;
    CHECK(eb_engine_create(&e) == EB_OK, "create");
    CHECK_ERR(eb_engine_load_runtime(e, "cpu", "/nonexistent/expertbench_rt_cpu.so", NULL), EB_ERR_MODULE,
              "does not exist");
    char notlib[] = "/tmp/eb_native_notlib_XXXXXX";
    int fd = mkstemp(notlib);
    CHECK(write(fd, "garbage", 7) == 7, "write");
    close(fd);
    CHECK_ERR(eb_engine_load_runtime(e, "cpu", notlib, NULL), EB_ERR_MODULE, "could not load");
    unlink(notlib);
    char path[1024];
    snprintf(path, sizeof path, "%s/libexpertbench.so", build); /* a library without the entry symbol */
    CHECK_ERR(eb_engine_load_runtime(e, "cpu", path, NULL), EB_ERR_MODULE, "does not export");
    snprintf(path, sizeof path, "%s/expertbench_rt_cpu.so", build);
    CHECK_ERR(eb_engine_load_runtime(e, "cuda", path, NULL), EB_ERR_MODULE, "identifies itself as 'cpu'");
    CHECK_ERR(eb_engine_load_runtime(e, "Bad/Name", NULL, NULL), EB_ERR_ARGUMENT, "not a runtime name");
    /* the default location is the core library's folder */
    CHECK(eb_engine_load_runtime(e, "cpu", NULL, NULL) == EB_OK, "default load");
    eb_runtime_info ri;
    CHECK(eb_engine_runtime_info(e, 0, &ri) == EB_OK && strstr(ri.path, build) != NULL, "module from %s", ri.path);
    CHECK_ERR(eb_engine_load_runtime(e, "cpu", NULL, NULL), EB_ERR_STATE, "already loaded");
    eb_device_info di;
    CHECK(eb_engine_device_info(e, 0, &di) == EB_OK && strcmp(di.name, "cpu:0") == 0, "device name");
    CHECK_ERR(eb_engine_device_info(e, 5, &di), EB_ERR_RANGE, "out of range");
    int32_t idx;
    CHECK_ERR(eb_engine_find_device(e, "hip:0", &idx), EB_ERR_RANGE, "no device named 'hip:0'");
    eb_engine_destroy(e);
}

/* Experts across cpu:0, cpu:1 and the host-staged hostsim:0; the scheduler's threads and queues run here. */
static void test_placement(const char *build, const char *file, eb_model_config *cfg, builder *b) {
    char cpu[1024], sim[1024];
    snprintf(cpu, sizeof cpu, "%s/expertbench_rt_cpu.so", build);
    snprintf(sim, sizeof sim, "%s/expertbench_rt_hostsim.so", build);
    eb_engine *e = new_engine(cpu, 0, 2); /* two threads per device: pool workers run beside the peer branches */
    /* room for two 16-bit experts and a staging arena, not for all four experts */
    eb_runtime_options so = {.n_devices = 1, .threads_per_device = 1, .memory_limit = 24 * 1024};
    CHECK(eb_engine_load_runtime(e, "hostsim", sim, &so) == EB_OK, "load hostsim");
    CHECK(eb_engine_device_count(e) == 3, "three devices");
    const char *files[] = {file};
    eb_model *m = NULL;
    CHECK(eb_model_load(e, cfg, files, 1, b->d, b->n, 0, NULL, &m) == EB_OK, "load");
    eb_context *c = NULL;
    CHECK(eb_context_create(m, 16, 8, &c) == EB_OK, "context");
    int32_t prompt[6] = {3, 17, 42, 5, 63, 8}, next[2] = {9, 1};
    float base[8 * V], out[8 * V];
    CHECK(eb_context_eval(c, prompt, 6, base, 1) == EB_OK && eb_context_eval(c, next, 2, base + 6 * V, 1) == EB_OK,
          "base");
    /* layer 0: experts 0,1 on hostsim, 2 on cpu:1, 3 on cpu:0; layer 1 is dense */
    int32_t owners[L * E] = {2, 2, 1, 0, -1, -1, -1, -1};
    for (int round = 0; round < 20; round++) {
        int32_t home[L * E] = {0, 0, 0, 0, -1, -1, -1, -1};
        CHECK(eb_model_set_placement(m, round % 2 ? home : owners, L * E) == EB_OK, "set placement %d", round);
        for (int mode = 0; mode < 2; mode++) {
            CHECK(eb_context_set_mode(c, mode) == EB_OK, "mode");
            CHECK(eb_context_truncate(c, 0) == EB_OK, "truncate");
            CHECK(eb_context_eval(c, prompt, 6, out, 1) == EB_OK && eb_context_eval(c, next, 2, out + 6 * V, 1) == EB_OK,
                  "eval");
            if (mode == 0) CHECK(memcmp(out, base, sizeof out) == 0, "reference mode differs (round %d)", round);
            else CHECK(max_abs_diff(out, base, 8 * V) < 1e-4f, "owner_local too far (round %d)", round);
        }
    }
    CHECK(eb_context_set_mode(c, 7) == EB_ERR_ARGUMENT, "bad mode");
    CHECK(eb_context_set_mode(c, 0) == EB_OK, "mode back");
    CHECK(eb_model_set_placement(m, owners, L * E) == EB_OK, "placement");
    eb_device_counters dc;
    CHECK(eb_model_device_counters(m, 2, &dc) == EB_OK, "counters");
    /* experts 0 (bf16) and 1 (f16) of layer 0: 2 bytes per weight */
    CHECK(dc.weight_bytes == (uint64_t)2 * 3 * IM * H * 2, "hostsim owns %llu bytes", (unsigned long long)dc.weight_bytes);
    CHECK(dc.allocated_bytes >= dc.weight_bytes && dc.rows > 0 && dc.bytes_to_device > 0, "hostsim counters");
    /* bad placements leave the current one in force */
    int32_t bad[L * E];
    memcpy(bad, owners, sizeof bad);
    bad[1] = 3;
    CHECK_ERR(eb_model_set_placement(m, bad, L * E), EB_ERR_RANGE, "expected 0..2");
    bad[1] = 2;
    bad[5] = 0;
    CHECK_ERR(eb_model_set_placement(m, bad, L * E), EB_ERR_ARGUMENT, "layer 1 is not an MoE layer");
    CHECK_ERR(eb_model_set_placement(m, owners, L * E - 1), EB_ERR_ARGUMENT, "expected 2 layers x 4 experts");
    int32_t all_sim[L * E] = {2, 2, 2, 2, -1, -1, -1, -1};
    CHECK_ERR(eb_model_set_placement(m, all_sim, L * E), EB_ERR_MEMORY, "more on hostsim:0");
    int32_t now[L * E];
    CHECK(eb_model_get_placement(m, now, L * E) == EB_OK && memcmp(now, owners, sizeof now) == 0, "placement kept");
    CHECK(eb_context_truncate(c, 0) == EB_OK && eb_context_eval(c, prompt, 6, out, 1) == EB_OK, "still runs");
    CHECK(memcmp(out, base, 6 * V * sizeof(float)) == 0, "still identical after refused placements");
    eb_context_free(c);
    eb_model_free(m);
    eb_engine_destroy(e);
}

/* hostsim:0 as the primary (the path of a GPU primary): the same bits as a cpu primary for every placement, the
 * primary's own experts without host round trips, its weights and KV cache in its memory. */
static void test_device_primary(const char *build, const char *file, eb_model_config *cfg, builder *b) {
    char cpu[1024], sim[1024];
    snprintf(cpu, sizeof cpu, "%s/expertbench_rt_cpu.so", build);
    snprintf(sim, sizeof sim, "%s/expertbench_rt_hostsim.so", build);
    const char *files[] = {file};
    eb_runtime_options so = {.n_devices = 1, .threads_per_device = 2, .memory_limit = 0};
    /* no CPU device: experts have nowhere to start */
    eb_engine *lone = NULL;
    CHECK(eb_engine_create(&lone) == EB_OK && eb_engine_load_runtime(lone, "hostsim", sim, &so) == EB_OK, "hostsim alone");
    eb_model *m = NULL;
    CHECK_ERR(eb_model_load(lone, cfg, files, 1, b->d, b->n, 0, NULL, &m), EB_ERR_UNSUPPORTED, "no CPU device is loaded");
    eb_engine_destroy(lone);
    /* too little device memory for the weights */
    eb_engine *small = new_engine(cpu, 0, 1);
    eb_runtime_options tiny = {.n_devices = 1, .threads_per_device = 1, .memory_limit = 256};
    CHECK(eb_engine_load_runtime(small, "hostsim", sim, &tiny) == EB_OK, "hostsim small");
    CHECK_ERR(eb_model_load(small, cfg, files, 1, b->d, b->n, 2, NULL, &m), EB_ERR_MEMORY, "the model's weights");
    CHECK(m == NULL, "no model");
    eb_engine_destroy(small);

    eb_engine *e = new_engine(cpu, 0, 2);
    CHECK(eb_engine_load_runtime(e, "hostsim", sim, &so) == EB_OK, "load hostsim");
    eb_model *host = NULL, *dev = NULL;
    CHECK(eb_model_load(e, cfg, files, 1, b->d, b->n, 0, NULL, &host) == EB_OK, "load on cpu:0");
    CHECK(eb_model_load(e, cfg, files, 1, b->d, b->n, 2, NULL, &dev) == EB_OK, "load on hostsim:0");
    int32_t now[L * E];
    CHECK(eb_model_get_placement(dev, now, L * E) == EB_OK && now[0] == 0 && now[3] == 0, "experts start on cpu:0");
    eb_context *hc = NULL, *dc = NULL;
    CHECK(eb_context_create(host, 16, 8, &hc) == EB_OK && eb_context_create(dev, 16, 8, &dc) == EB_OK, "contexts");
    CHECK_ERR(eb_context_set_graphs(dc, 2), EB_ERR_ARGUMENT, "expected 0 or 1");
    int32_t prompt[6] = {3, 17, 42, 5, 63, 8}, next[2] = {9, 1};
    float base[8 * V], out[8 * V];
    int32_t placements[3][L * E] = {{0, 0, 0, 0, -1, -1, -1, -1}, {2, 2, 2, 2, -1, -1, -1, -1}, {2, 2, 1, 0, -1, -1, -1, -1}};
    for (int i = 0; i < 3; i++) {
        CHECK(eb_model_set_placement(host, placements[i], L * E) == EB_OK, "placement %d on the cpu model", i);
        CHECK(eb_model_set_placement(dev, placements[i], L * E) == EB_OK, "placement %d on the hostsim model", i);
        for (int mode = 0; mode < 2; mode++) {
            eb_model_counters before, after;
            CHECK(eb_model_get_counters(dev, &before) == EB_OK, "counters");
            CHECK(eb_context_set_mode(hc, mode) == EB_OK && eb_context_set_mode(dc, mode) == EB_OK, "mode");
            CHECK(eb_context_truncate(hc, 0) == EB_OK && eb_context_truncate(dc, 0) == EB_OK, "truncate");
            CHECK(eb_context_eval(hc, prompt, 6, base, 1) == EB_OK && eb_context_eval(hc, next, 2, base + 6 * V, 1) == EB_OK,
                  "cpu primary");
            CHECK(eb_context_eval(dc, prompt, 6, out, 1) == EB_OK && eb_context_eval(dc, next, 1, out + 6 * V, 1) == EB_OK &&
                      eb_context_eval(dc, next + 1, 1, out + 7 * V, 1) == EB_OK,
                  "hostsim primary");
            CHECK(eb_model_get_counters(dev, &after) == EB_OK, "counters");
            uint64_t trips = after.host_round_trips - before.host_round_trips;
            CHECK(memcmp(out, base, sizeof out) == 0, "placement %d, mode %d: hostsim primary differs", i, mode);
            /* three evals, one MoE layer: a round trip per eval unless every expert is the primary's */
            CHECK(trips == (i == 1 ? 0u : 3u), "placement %d: %llu host round trips", i, (unsigned long long)trips);
        }
    }
    eb_device_counters hd, dd;
    CHECK(eb_model_device_counters(dev, 2, &dd) == EB_OK && eb_model_device_counters(host, 0, &hd) == EB_OK, "device counters");
    CHECK(dd.rows > 0 && dd.allocated_bytes > dd.weight_bytes, "the primary's rows and weights are counted");
    uint64_t hits_h[L * E], hits_d[L * E];
    CHECK(eb_model_routing_counts(host, hits_h, L * E, NULL, 0) == EB_OK &&
              eb_model_routing_counts(dev, hits_d, L * E, NULL, 0) == EB_OK,
          "routing counts");
    CHECK(memcmp(hits_h, hits_d, sizeof hits_h) == 0, "routing counted on the device equals the cpu's");
    eb_model_reset_routing(dev);
    CHECK(eb_model_routing_counts(dev, hits_d, L * E, NULL, 0) == EB_OK && hits_d[0] + hits_d[1] + hits_d[2] + hits_d[3] == 0,
          "routing reset on the device");
    int32_t bad[1] = {V};
    CHECK_ERR(eb_context_eval(dc, bad, 1, out, 1), EB_ERR_RANGE, "out of range");
    eb_context_free(hc);
    eb_model_free(host);
    eb_model_free(dev); /* deferred: its context is alive */
    CHECK(eb_context_truncate(dc, 0) == EB_OK && eb_context_eval(dc, prompt, 6, out, 1) == EB_OK, "after its model was freed");
    eb_context_free(dc);
    eb_engine_destroy(e);
}

/* Freeing in the "wrong" order is safe: the engine outlives its models and a model its contexts. */
static void test_lifetimes(const char *module, const char *file, eb_model_config *cfg, builder *b) {
    eb_engine *e;
    eb_model *m;
    eb_context *c = open_context(module, file, cfg, b, 1, 8, 4, &e, &m);
    eb_engine_destroy(e); /* deferred: the model is alive */
    eb_model_free(m);     /* deferred: the context is alive */
    int32_t ids[3] = {1, 2, 3};
    float last[V];
    CHECK(eb_context_eval(c, ids, 3, last, 0) == EB_OK, "context still runs after its model and engine were freed");
    eb_context_free(c); /* frees the model, then the engine */
}

/* A finite half below 1 in magnitude, either sign (bf16: the top half of an f32). */
static uint16_t test_half(unsigned seed) { return (uint16_t)(((seed >> 16) & 0x3bffu) | ((seed & 1u) << 15)); }

/* count values of a row-major matrix in format dt: random, the scales of quantized blocks finite (MXFP4's exponent
 * 100..150) so that no product overflows. */
static void fill_weights(unsigned char *w, int dt, int rows, int cols, unsigned *seed) {
    size_t bytes = (size_t)rows * eb_row_bytes(dt, cols);
    for (size_t i = 0; i < bytes; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        w[i] = (unsigned char)(*seed >> 13);
    }
    const eb_format_traits *f = eb_format(dt);
    size_t blocks = bytes / (size_t)f->block_bytes;
    for (size_t k = 0; k < blocks; k++) {
        unsigned char *b = w + k * (size_t)f->block_bytes;
        *seed = *seed * 1664525u + 1013904223u;
        uint16_t h = test_half(*seed), h2 = test_half(*seed * 747796405u);
        switch (dt) {
        case EB_DTYPE_F32: {
            float v = (float)(*seed >> 8) / (float)(1u << 24) - 0.5f;
            memcpy(b, &v, 4);
            break;
        }
        case EB_DTYPE_BF16: {
            float v = (float)(*seed >> 8) / (float)(1u << 24) - 0.5f;
            uint32_t bits;
            memcpy(&bits, &v, 4);
            h = (uint16_t)(bits >> 16);
            memcpy(b, &h, 2);
            break;
        }
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
        case EB_DTYPE_IQ2_S: memcpy(b, &h, 2); break;
        case EB_DTYPE_Q5_1:
        case EB_DTYPE_Q4_1: memcpy(b, &h, 2), memcpy(b + 2, &h2, 2); break;
        case EB_DTYPE_Q4_K:
        case EB_DTYPE_Q5_K: memcpy(b, &h, 2), memcpy(b + 2, &h2, 2); break;
        case EB_DTYPE_Q6_K: memcpy(b + 208, &h, 2); break;
        case EB_DTYPE_Q2_K: memcpy(b + 80, &h, 2), memcpy(b + 82, &h2, 2); break;
        case EB_DTYPE_Q3_K: memcpy(b + 108, &h, 2); break;
        case EB_DTYPE_IQ1_M: /* d in the top nibbles of the scale words */
            for (int k = 0; k < 4; k++) b[49 + 2 * k] = (unsigned char)((b[49 + 2 * k] & 0x0F) | ((h >> (4 * k)) & 0xF) << 4);
            break;
        case EB_DTYPE_MXFP4: b[0] = (unsigned char)(100 + *seed % 51); break;
        case EB_DTYPE_F8_E4M3_B128: b[0] = (b[0] & 0x7F) == 0x7F ? b[0] ^ 1 : b[0]; break; /* no NaN */
        default: break;
        }
    }
}

/* The activations as the q8 precision sees them: per block (32 values against Q8_0 and MXFP4, 256 against the K
 * formats), d = max |x| / 127, x / d rounded to nearest even. */
static void q8_reference(const float *x, int count, int block, double *out) {
    for (int b = 0; b + block <= count; b += block) {
        float amax = 0.0f;
        for (int i = 0; i < block; i++) amax = fabsf(x[b + i]) > amax ? fabsf(x[b + i]) : amax;
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        for (int i = 0; i < block; i++) out[b + i] = (double)nearbyintf(x[b + i] * id) * (double)d;
    }
}

/* The cpu module's table, dlopen-ed directly (NULL after a failed check); *h to dlclose. */
static const eb_runtime_table *open_module(const char *module, void **h) {
    *h = dlopen(module, RTLD_NOW | RTLD_LOCAL);
    CHECK(*h != NULL, "dlopen %s: %s", module, dlerror());
    if (!*h) return NULL;
    const eb_runtime_table *(*entry)(void) = (const eb_runtime_table *(*)(void))dlsym(*h, EB_RUNTIME_ENTRY);
    const eb_runtime_table *T = entry ? entry() : NULL;
    CHECK(T != NULL, "no %s in %s", EB_RUNTIME_ENTRY, module);
    if (!T) dlclose(*h);
    return T;
}

static void *init_kernels(const eb_runtime_table *T, int kernels, int threads) {
    void *rt = NULL;
    char err[256] = "";
    eb_runtime_options o;
    memset(&o, 0, sizeof o);
    o.n_devices = 1;
    o.threads_per_device = threads;
    o.kernels = kernels;
    CHECK(T->init(&o, &rt, err, sizeof err) == 0, "init with kernels %d: %s", kernels, err);
    return rt;
}

static const char *kernels_name(int kernels) {
    return kernels == EB_CPU_KERNELS_PORTABLE ? "portable" : kernels == EB_CPU_KERNELS_AVX2 ? "avx2" : "best";
}

/* The cpu module's products directly: n tokens at once give, row for row, the bits of n single tokens, for
 * row counts that split unevenly into the kernels' tiles and segments, every format, every kernel choice (the best
 * the CPU runs, at most AVX2, portable), 1-3 threads, alone and in a multi-product run; and a quantized matrix gives
 * the bits of its dequantized f32 matrix. Rows of an odd number of 32-value blocks too (Q8_0 and MXFP4). */
static void test_kernels(const char *module) {
    void *h;
    const eb_runtime_table *T = open_module(module, &h);
    if (!T) return;
    enum { MAXN = 7 };
    static const int rows_list[] = {1, 3, 4, 5, 9, 37, 130, 1030}, cols_float[] = {7, 64, 100};
    static const int cols_quant[] = {256, 512, 96};
    static const int cols_scaled[] = {7, 200, 300}; /* in scale blocks of 128: within one, partial, several */
    unsigned seed = 7;
    for (int threads = 1; threads <= 3; threads++)
        for (int kernels = 0; kernels < EB_CPU_KERNELS_COUNT; kernels++) {
            char err[256] = "";
            void *rt = init_kernels(T, kernels, threads);
            if (!rt) continue;
            int mismatches = 0, unlike_f32 = 0, q8_far = 0;
            for (int dt = 0; dt < EB_DTYPE_COUNT; dt++)
                for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++)
                    for (size_t ci = 0; ci < 3; ci++) {
                        int quant = eb_dtype_quantized(dt);
                        if (quant && ci == 2 && eb_format(dt)->block != 32) continue;
                        if (quant && threads == 2 && rows_list[ri] > 130) continue; /* enough of the long ones */
                        int scaled = eb_dtype_scaled(dt);
                        int rows = rows_list[ri], cols = quant ? cols_quant[ci] : scaled ? cols_scaled[ci] : cols_float[ci];
                        size_t count = (size_t)rows * (size_t)cols;
                        size_t n_scales = (size_t)(eb_scale_grid_rows(dt, rows) * eb_scale_grid_cols(dt, cols));
                        float *grid = n_scales ? malloc(n_scales * sizeof *grid) : NULL;
                        for (size_t k = 0; k < n_scales; k++) {
                            seed = seed * 1664525u + 1013904223u;
                            grid[k] = ((float)(seed >> 8) / (float)(1u << 24) + 0.01f) * 0.003f;
                        }
                        eb_rt_scale sc = {grid, grid ? eb_format(dt)->scale_rows : 0, grid ? eb_format(dt)->scale_cols : 0};
                        unsigned char *w = malloc((size_t)rows * eb_row_bytes(dt, cols));
                        float *wf = malloc(count * sizeof(float));
                        float *x = malloc(sizeof(float) * MAXN * (size_t)cols);
                        float *yb = malloc(sizeof(float) * MAXN * (size_t)rows);
                        float *ys = malloc(sizeof(float) * (size_t)rows);
                        float *yf = malloc(sizeof(float) * MAXN * (size_t)rows);
                        double *xdq = malloc(sizeof(double) * MAXN * (size_t)cols);
                        if (!w || !wf || !x || !yb || !ys || !yf || !xdq || (n_scales && !grid)) {
                            CHECK(0, "out of memory");
                        } else {
                            fill_weights(w, dt, rows, cols, &seed);
                            for (int r = 0; r < rows; r++)
                                eb_dequantize_scaled_row(w + (size_t)r * eb_row_bytes(dt, cols), dt,
                                                         eb_scale_row(grid, dt, r, cols), cols, wf + (size_t)r * cols);
                            for (int i = 0; i < MAXN * cols; i++) {
                                seed = seed * 1664525u + 1013904223u;
                                x[i] = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
                            }
                            int q8_block = eb_format(dt)->q8_block;
                            if (q8_block) q8_reference(x, MAXN * cols, q8_block, xdq);
                            for (int prec = 0; prec <= (quant || scaled ? 1 : 0); prec++)
                                for (int n = 1; n <= MAXN; n++) {
                                    /* a failed call counts as a mismatch: its buffers hold nothing to compare */
                                    eb_rt_matmul batch = {w, dt, rows, cols, x, n, yb, prec, sc};
                                    mismatches += T->forward->matmul(rt, 0, NULL, &batch, 1, 0, err, sizeof err) != 0;
                                    for (int t = 0; t < n; t++) {
                                        eb_rt_matmul one = {w, dt, rows, cols, x + t * cols, 1, ys, prec, sc};
                                        mismatches += T->forward->matmul(rt, 0, NULL, &one, 1, 0, err, sizeof err) != 0;
                                        mismatches += memcmp(ys, yb + (size_t)t * rows, sizeof(float) * rows) != 0;
                                    }
                                    eb_rt_matmul two[2] = {{w, dt, rows, cols, x, 1, ys, prec, sc},
                                                           {w, dt, rows, cols, x, n, yb, prec, sc}};
                                    mismatches += T->forward->matmul(rt, 0, NULL, two, 2, 0, err, sizeof err) != 0;
                                    mismatches += memcmp(ys, yb, sizeof(float) * rows) != 0;
                                    if (!quant && !scaled) continue;
                                    eb_rt_matmul f = {wf, EB_DTYPE_F32, rows, cols, x, n, yf, EB_PRECISION_F32, {0}};
                                    unlike_f32 += T->forward->matmul(rt, 0, NULL, &f, 1, 0, err, sizeof err) != 0;
                                    /* a format without integer products (Q5_0 / Q5_1): both precisions read it in
                                     * f32 */
                                    if (prec == EB_PRECISION_F32 || !q8_block) {
                                        unlike_f32 += memcmp(yf, yb, sizeof(float) * (size_t)n * rows) != 0;
                                    } else { /* q8: the exact product of the dequantized weights and activations */
                                        for (int t = 0; t < n; t++)
                                            for (int r = 0; r < rows; r++) {
                                                double ref = 0.0, mag = 0.0;
                                                for (int c = 0; c < cols; c++) {
                                                    double v = (double)wf[(size_t)r * cols + c] * xdq[t * cols + c];
                                                    ref += v, mag += fabs(v);
                                                }
                                                double got = yb[(size_t)t * rows + r];
                                                if (!(fabs(got - ref) <= 1e-5 * mag) && getenv("EB_DEBUG_Q8"))
                                                    fprintf(stderr, "q8 %s rows %d cols %d: %g, expected %g (of %g)\n",
                                                            eb_dtype_name(dt), rows, cols, got, ref, mag);
                                                q8_far += !(fabs(got - ref) <= 1e-5 * mag);
                                            }
                                    }
                                }
                        }
                        free(w);
                        free(wf);
                        free(x);
                        free(yb);
                        free(ys);
                        free(yf);
                        free(xdq);
                        free(grid);
                    }
            CHECK(mismatches == 0, "%s kernels, %d threads: %d batch rows differ from single steps",
                  kernels_name(kernels), threads, mismatches);
            CHECK(unlike_f32 == 0, "%s kernels, %d threads: %d quantized products differ from their dequantized f32",
                  kernels_name(kernels), threads, unlike_f32);
            CHECK(q8_far == 0, "%s kernels, %d threads: %d q8 products differ from the exact product of the "
                  "dequantized weights and q8 activations (by more than 1e-5 of the sum of magnitudes)",
                  kernels_name(kernels), threads, q8_far);
            T->shutdown(rt);
        }
    dlclose(h);
}

/* A quantized block's quants (and the K formats' sub-block scales) at their largest magnitudes, both signs where the
 * format has them; its f16 / E8M0 scales as they were. */
static void extreme_block(unsigned char *b, int dt) {
    switch (dt) {
    case EB_DTYPE_Q8_0:
        for (int i = 2; i < 34; i++) b[i] = i & 1 ? 0x80 : 0x7F; /* -128, 127 */
        return;
    case EB_DTYPE_MXFP4: {
        static const unsigned char exps[] = {0, 1, 2, 127, 254}; /* both of the E8M0 halving's cases, and the ends */
        static unsigned next;
        b[0] = exps[next++ % sizeof exps];
        for (int i = 1; i < 17; i++) b[i] = i & 1 ? 0xFF : 0x77; /* -12 and -12, 12 and 12 */
        return;
    }
    case EB_DTYPE_Q4_0:
    case EB_DTYPE_IQ4_NL: /* the first and last values: -8 and 7 (Q4_0), -127 and 113 (IQ4_NL) */
        for (int i = 2; i < 18; i++) b[i] = i & 1 ? 0x0F : 0xF0;
        return;
    case EB_DTYPE_Q4_1: memset(b + 4, 0xFF, 16); return; /* 15 */
    case EB_DTYPE_IQ4_XS: /* scales -32, the grid's ends */
        memset(b + 2, 0, 6);
        for (int i = 8; i < 136; i++) b[i] = i & 1 ? 0x0F : 0xF0;
        return;
    case EB_DTYPE_Q4_K: memset(b + 4, 0xFF, 140); return; /* scales and minima 63, quants 15 */
    case EB_DTYPE_Q5_K: memset(b + 4, 0xFF, 172); return; /* quants 31 */
    case EB_DTYPE_Q6_K:
        memset(b, 0xFF, 192); /* quants 63 - 32 */
        for (int i = 192; i < 208; i++) b[i] = i & 1 ? 0x80 : 0x7F; /* scales -128, 127 */
        return;
    case EB_DTYPE_Q2_K: memset(b, 0xFF, 80); return; /* scales and minima 15, quants 3 */
    case EB_DTYPE_Q3_K: /* quants -4 and 3, scales -32 */
        for (int i = 0; i < 96; i++) b[i] = i & 1 ? 0xFF : 0x00;
        memset(b + 96, 0, 12);
        return;
    default:
        (void)eb_test_extreme_iq(b, dt);
        return;
    }
}

/* The q8 products of the best kernels the CPU runs against those capped at AVX2: the same bits for every quantized
 * format, batch size and row count (the AVX-512 VNNI kernels' promise, cpu_kernels_avx512.c), on random blocks and
 * on blocks of extreme quants with activations at +-127 (the largest integer sums). Where the CPU has no AVX-512
 * VNNI, both are the AVX2 kernels: said, and not counted as a check. */
static void test_kernel_variants_agree(const char *module) {
    void *h;
    const eb_runtime_table *T = open_module(module, &h);
    if (!T) return;
    void *best = init_kernels(T, EB_CPU_KERNELS_BEST, 2), *avx2 = init_kernels(T, EB_CPU_KERNELS_AVX2, 2);
    const char *vb = best ? T->kernel_variant(best) : "", *va = avx2 ? T->kernel_variant(avx2) : "";
    if (best && avx2 && strcmp(vb, va) == 0) {
        printf("skip: the q8 kernels' agreement across variants: this CPU runs %s only (no AVX-512 VNNI)\n", vb);
    } else if (best && avx2) {
        CHECK(strstr(vb, "avx512vnni") != NULL, "best kernels %s beside %s: expected the AVX-512 VNNI ones", vb, va);
        enum { MAXN = 6 };
        static const int rows_list[] = {1, 5, 37, 130}, cols_list[] = {32, 96, 256, 512, 2304};
        unsigned seed = 11;
        int differ = 0, compared = 0;
        char err[256] = "";
        for (int dt = 0; dt < EB_DTYPE_COUNT; dt++) {
            if (!eb_dtype_quantized(dt)) continue;
            for (size_t ci = 0; ci < sizeof cols_list / sizeof *cols_list; ci++)
                for (size_t ri = 0; ri < sizeof rows_list / sizeof *rows_list; ri++)
                    for (int extreme = 0; extreme <= 1; extreme++) {
                        int rows = rows_list[ri], cols = cols_list[ci];
                        if (cols % eb_format(dt)->block) continue;
                        size_t wbytes = (size_t)rows * eb_row_bytes(dt, cols);
                        unsigned char *w = malloc(wbytes);
                        float *x = malloc(sizeof(float) * MAXN * (size_t)cols);
                        float *ya = malloc(sizeof(float) * MAXN * (size_t)rows);
                        float *yb = malloc(sizeof(float) * MAXN * (size_t)rows);
                        if (!w || !x || !ya || !yb) {
                            CHECK(0, "out of memory");
                        } else {
                            fill_weights(w, dt, rows, cols, &seed);
                            for (int i = 0; i < MAXN * cols; i++) {
                                seed = seed * 1664525u + 1013904223u;
                                x[i] = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
                                if (extreme) x[i] = (seed >> 3) & 1 ? 1.0f : -1.0f; /* every quant at +-127 */
                            }
                            if (extreme)
                                for (size_t k = 0; k < wbytes; k += (size_t)eb_format(dt)->block_bytes)
                                    extreme_block(w + k, dt);
                            for (int n = 1; n <= MAXN; n++) {
                                eb_rt_matmul a = {w, dt, rows, cols, x, n, ya, EB_PRECISION_Q8, {0}};
                                eb_rt_matmul b = {w, dt, rows, cols, x, n, yb, EB_PRECISION_Q8, {0}};
                                int fa = T->forward->matmul(avx2, 0, NULL, &a, 1, 0, err, sizeof err);
                                int fb = T->forward->matmul(best, 0, NULL, &b, 1, 0, err, sizeof err);
                                differ += fa != 0 || fb != 0 || memcmp(ya, yb, sizeof(float) * (size_t)n * rows) != 0;
                                compared++;
                            }
                        }
                        free(w);
                        free(x);
                        free(ya);
                        free(yb);
                    }
        }
        CHECK(differ == 0, "q8 products: %d of %d differ between the %s and %s kernels", differ, compared, vb, va);
    }
    if (best) T->shutdown(best);
    if (avx2) T->shutdown(avx2);
    dlclose(h);
}

/* The q8 precision's exp (eb_q8.h), which every module computes alike: within one ulp of e^x everywhere (the double
 * exp rounded to f32 as the reference), equal to it on all but a few in a million of the f32 values where e^x is a
 * finite non-zero f32 (a sweep of every 997th bit pattern there), its edges (overflow to inf, subnormals, 0 below,
 * NaN), and the activations built on it within two ulps of the f32 precision's (libm's expf). */
static void test_q8_exp(void) {
    long swept = 0, differ = 0, far = 0;
    for (uint32_t bits = 0; bits < 0xff800000u; bits += 997) {
        float x;
        memcpy(&x, &bits, sizeof x);
        if (!(x > -103.9f && x < 88.72f)) continue;
        float got = eb_q8_exp(x), want = (float)exp((double)x);
        swept++;
        if (got != want) {
            differ++;
            far += !(nextafterf(want, INFINITY) == got || nextafterf(want, -INFINITY) == got);
        }
    }
    CHECK(swept > 1000000 && far == 0 && differ * 100000 < swept,
          "eb_q8_exp: %ld of %ld values differ from the rounded double exp, %ld by more than one ulp", differ, swept,
          far);
    CHECK(isinf(eb_q8_exp(89.5f)) && isinf(eb_q8_exp(INFINITY)) && eb_q8_exp(88.72f) < INFINITY, "overflow");
    CHECK(eb_q8_exp(-105.0f) == 0.0f && eb_q8_exp(-INFINITY) == 0.0f && eb_q8_exp(-100.0f) > 0.0f &&
              eb_q8_exp(-100.0f) == (float)exp(-100.0),
          "underflow and subnormals");
    CHECK(eb_q8_exp(0.0f) == 1.0f && eb_q8_exp(-0.0f) == 1.0f && isnan(eb_q8_exp(NAN)), "exp(0), NaN");
    int act_far = 0;
    for (int i = 0; i < 20000; i++) {
        float g = (float)(i - 10000) * 0.0137f, u = 0.5f - (float)(i % 7) * 0.31f;
        for (int kind = 0; kind <= 1; kind++) {
            float a = eb_q8_act(kind, 1.702f, 7.0f, g, u), b = eb_act(kind, 1.702f, 7.0f, g, u);
            act_far += !(fabsf(a - b) <= 2.0f * (nextafterf(fabsf(b), INFINITY) - fabsf(b)));
        }
    }
    CHECK(act_far == 0, "eb_q8_act: %d activations more than two ulps from eb_act's", act_far);
}

/* ---- the half KV caches' roundings ---------------------------------------------------------------------------- */

/* eb_f32_to_f16 and eb_f32_to_bf16 against their definition: every half value (but NaN) converts back to itself; the
 * midpoint of two neighbours rounds to the one with the even code, a hair either side of it to the nearer; f16's
 * overflow (65520 up) and its subnormals and underflow; NaN stays NaN. */
static void test_half_roundings(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float v = eb_f16_to_f32((uint16_t)h), b = eb_bf16_to_f32((uint16_t)h);
        if (!isnan(v)) bad += eb_f32_to_f16(v) != h;
        if (!isnan(b)) bad += eb_f32_to_bf16(b) != h;
        uint32_t mag = h & 0x7fffu;
        if (mag < 0x7bffu) { /* f16: h and h + 1 both finite, same sign */
            double lo = eb_f16_to_f32((uint16_t)h), hi = eb_f16_to_f32((uint16_t)(h + 1)), mid = (lo + hi) / 2;
            uint16_t even = (h & 1u) ? (uint16_t)(h + 1) : (uint16_t)h;
            bad += eb_f32_to_f16((float)mid) != even; /* every midpoint is exact in f32 */
            bad += eb_f32_to_f16(nextafterf((float)mid, (float)lo)) != h;
            bad += eb_f32_to_f16(nextafterf((float)mid, (float)hi)) != (uint16_t)(h + 1);
        }
        if (mag < 0x7f7fu) { /* bf16 likewise */
            /* the f32 halfway to the next code up in magnitude: 0x8000 more in the bits (the same sign) */
            uint32_t mid = eb_f32_to_bits(eb_bf16_to_f32((uint16_t)h)) + 0x8000u;
            uint16_t even = (h & 1u) ? (uint16_t)(h + 1) : (uint16_t)h;
            bad += eb_f32_to_bf16(eb_bits_to_f32(mid)) != even;
            bad += eb_f32_to_bf16(eb_bits_to_f32(mid - 1)) != h;
            bad += eb_f32_to_bf16(eb_bits_to_f32(mid + 1)) != (uint16_t)(h + 1);
        }
    }
    CHECK(bad == 0, "half roundings: %d cases off", bad);
    int lanes = 0;
    for (uint32_t h = 0; h < 0x10000u; h++)
        lanes += eb_f32_to_bits(eb_f16_to_f32_lanes((uint16_t)h)) != eb_f32_to_bits(eb_f16_to_f32((uint16_t)h));
    CHECK(lanes == 0, "eb_f16_to_f32_lanes: %d of the 65536 halves other bits than eb_f16_to_f32's", lanes);
    CHECK(eb_f32_to_f16(65519.99f) == 0x7bffu && eb_f32_to_f16(65520.0f) == 0x7c00u &&
              eb_f32_to_f16(-1e30f) == 0xfc00u && eb_f32_to_f16(INFINITY) == 0x7c00u,
          "f16 overflow");
    CHECK(eb_f32_to_f16(0x1p-25f) == 0 && eb_f32_to_f16(nextafterf(0x1p-25f, 1.0f)) == 1 &&
              eb_f32_to_f16(-0x1p-24f) == 0x8001u && eb_f32_to_f16(1e-40f) == 0 && eb_f32_to_f16(-0.0f) == 0x8000u,
          "f16 subnormals and underflow");
    CHECK((eb_f32_to_f16(NAN) & 0x7fffu) > 0x7c00u && (eb_f32_to_bf16(NAN) & 0x7fffu) > 0x7f80u &&
              eb_f32_to_bf16(INFINITY) == 0x7f80u && eb_f32_to_bf16(3.0e38f * 10.0f) == 0x7f80u,
          "NaN and infinity");
}

/* The attention over a half cache with the portable kernels (each value converted in C) and the best ones (an f16
 * row by F16C's instruction): the same bits, for f16 and bf16 caches with random finite halves, subnormal ones among
 * them, a head size with a tail past the blocks of eight, and keys and values stored by the operation itself. */
static void test_half_cache_attention(const char *module) {
    void *h;
    const eb_runtime_table *T = open_module(module, &h);
    if (!T) return;
    enum { NH = 4, NKV = 2, HD = 76, NCTX = 48, POS = 40, N = 3 };
    void *rts[2] = {init_kernels(T, EB_CPU_KERNELS_PORTABLE, 1), init_kernels(T, EB_CPU_KERNELS_BEST, 1)};
    static float q[2][N * NH * HD], k[2][N * NKV * HD], v[N * NKV * HD], out[2][N * NH * HD];
    static float cs[NCTX * HD / 2], sn[NCTX * HD / 2];
    static uint16_t kc[2][NCTX * NKV * HD], vc[2][NCTX * NKV * HD];
    for (int i = 0; i < NCTX * HD / 2; i++) cs[i] = cosf(0.01f * (float)i), sn[i] = sinf(0.01f * (float)i);
    for (int dt = EB_DTYPE_F16; dt <= EB_DTYPE_BF16 && rts[0] && rts[1]; dt++) {
        unsigned seed = 5;
        for (int i = 0; i < NCTX * NKV * HD; i++) { /* finite halves of both signs, every 37th a subnormal f16 */
            seed = seed * 1103515245u + 12345u;
            uint16_t r = (uint16_t)(seed >> 8);
            uint16_t half = dt == EB_DTYPE_F16 ? (uint16_t)(i % 37 ? (r & 0xbbffu) : (r & 0x83ffu)) : (uint16_t)(r & 0xbeffu);
            kc[0][i] = kc[1][i] = half;
            vc[0][i] = vc[1][i] = (uint16_t)(half ^ 0x8001u);
        }
        for (int i = 0; i < N * NH * HD; i++) q[0][i] = q[1][i] = sinf(0.37f * (float)i);
        for (int i = 0; i < N * NKV * HD; i++) k[0][i] = k[1][i] = cosf(0.23f * (float)i), v[i] = sinf(0.11f * (float)i);
        int32_t pos = POS;
        char err[256] = "";
        for (int r = 0; r < 2; r++) {
            eb_rt_attention a = {q[r], k[r], v, NULL, NULL, cs, sn, kc[r], vc[r], &pos, N, NH, NKV, HD, NCTX, 1e-6f,
                                 out[r], NULL, 0, NCTX, dt};
            CHECK(T->forward->attention(rts[r], 0, &a, err, sizeof err) == 0, "attention: %s", err);
        }
        CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0 && memcmp(kc[0], kc[1], sizeof kc[0]) == 0,
              "%s cache: the portable and the best kernels' attention differ", eb_dtype_name(dt));
    }
    for (int r = 0; r < 2; r++)
        if (rts[r]) T->shutdown(rts[r]);
    dlclose(h);
}

/* ---- the scaled format F8_E4M3_B128 ---------------------------------------------------------------------------- */

/* Every one of the 256 codes: the core's decode (eb_dequantize) and each kernel variant's products (one row per code,
 * scale 1, against a one-hot activation: the product is the value) against the reference table; the extremes named. */
static void test_e4m3_decode(const char *module) {
    unsigned char codes[256];
    float got[256];
    for (int i = 0; i < 256; i++) codes[i] = (unsigned char)i;
    CHECK(eb_dequantize(EB_DTYPE_F8_E4M3_B128, codes, sizeof codes, 256, got) == EB_OK, "dequantize 256 codes");
    int wrong = 0;
    for (int i = 0; i < 256; i++) {
        float want = e4m3_reference((unsigned)i);
        wrong += isnan(want) ? !isnan(got[i]) : memcmp(&got[i], &want, sizeof want) != 0;
    }
    CHECK(wrong == 0, "E4M3 decode: %d of 256 codes differ from the reference table", wrong);
    CHECK(got[0x7E] == 448.0f && got[0xFE] == -448.0f && got[0x01] == 0x1p-9f && got[0x08] == 0x1p-6f &&
              got[0x07] == 7 * 0x1p-9f && signbit(got[0x80]) && got[0x80] == 0.0f && isnan(got[0x7F]) &&
              isnan(got[0xFF]),
          "E4M3 extremes: 448, -448, the least subnormal 2^-9, the least normal 2^-6, -0, NaN");
    void *h;
    const eb_runtime_table *T = open_module(module, &h);
    if (!T) return;
    /* row i: code i then seven zeros; cols 8 and 13: the vector loop, and the scalar tail */
    for (int cols = 8; cols <= 13; cols += 5)
        for (int kernels = 0; kernels < EB_CPU_KERNELS_COUNT; kernels++) {
            void *rt = init_kernels(T, kernels, 1);
            if (!rt) continue;
            unsigned char w[256 * 13];
            float x[13] = {0}, y[256], ones[2 * 1] = {1.0f, 1.0f};
            memset(w, 0, sizeof w);
            int at = cols == 8 ? 0 : 9; /* the code in the vector part, or in the tail */
            for (int i = 0; i < 256; i++) w[i * cols + at] = (unsigned char)i;
            x[at] = 1.0f;
            char err[256] = "";
            eb_rt_matmul mm = {w, EB_DTYPE_F8_E4M3_B128, 256, cols, x, 1, y, EB_PRECISION_F32, {ones, 128, 128}};
            CHECK(T->forward->matmul(rt, 0, NULL, &mm, 1, 0, err, sizeof err) == 0, "matmul: %s", err);
            int bad = 0;
            for (int i = 0; i < 256; i++) {
                float want = e4m3_reference((unsigned)i);
                bad += isnan(want) ? !isnan(y[i]) : y[i] != want;
            }
            CHECK(bad == 0, "%s kernels, %d columns: %d of 256 E4M3 codes decode wrongly in the products",
                  kernels_name(kernels), cols, bad);
            T->shutdown(rt);
        }
    dlclose(h);
}

/* A scaled matrix of 300 x 260 (scale blocks of 128: 3 x 3, the last ones partial) times 3 tokens against a double
 * sum of E4M3 value x scale x activation: within f32 rounding, in every kernel variant. */
static void test_scaled_matvec(const char *module) {
    void *h;
    const eb_runtime_table *T = open_module(module, &h);
    if (!T) return;
    enum { R = 300, C = 260, N = 3, GR = 3, GC = 3 };
    static unsigned char w[R * C];
    static float x[N * C], y[N * R], grid[GR * GC];
    unsigned seed = 99;
    for (int i = 0; i < R * C; i++) {
        seed = seed * 1664525u + 1013904223u;
        w[i] = (unsigned char)(seed >> 13);
        if ((w[i] & 0x7F) == 0x7F) w[i] ^= 1;
    }
    for (int i = 0; i < N * C; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
    }
    for (int i = 0; i < GR * GC; i++) grid[i] = 0.001f * (float)(i + 1);
    for (int kernels = 0; kernels < EB_CPU_KERNELS_COUNT; kernels++) {
        void *rt = init_kernels(T, kernels, 2);
        if (!rt) continue;
        char err[256] = "";
        eb_rt_matmul mm = {w, EB_DTYPE_F8_E4M3_B128, R, C, x, N, y, EB_PRECISION_F32, {grid, 128, 128}};
        CHECK(T->forward->matmul(rt, 0, NULL, &mm, 1, 0, err, sizeof err) == 0, "matmul: %s", err);
        int far = 0;
        for (int t = 0; t < N; t++)
            for (int r = 0; r < R; r++) {
                double ref = 0.0, mag = 0.0;
                for (int c = 0; c < C; c++) {
                    double v = (double)e4m3_reference(w[r * C + c]) * grid[(r / 128) * GC + c / 128] * x[t * C + c];
                    ref += v, mag += fabs(v);
                }
                far += !(fabs(y[t * R + r] - ref) <= 1e-5 * mag);
            }
        CHECK(far == 0, "%s kernels: %d of %d scaled products differ from the double reference", kernels_name(kernels),
              far, N * R);
        T->shutdown(rt);
    }
    dlclose(h);
}

/* The logits of 8 positions of a model on an engine of cpu:0, cpu:1 and hostsim:0 (a device that cannot read host
 * memory: its experts are copies, their scale companions with them), the experts placed by owners (NULL: all on
 * cpu:0), kernels capped as `kernels` says. */
static int scaled_logits(const char *build, const char *file, const eb_model_config *cfg, builder *b, int kernels,
                         const int32_t *owners, float *out) {
    char cpu[1024], sim[1024];
    snprintf(cpu, sizeof cpu, "%s/expertbench_rt_cpu.so", build);
    snprintf(sim, sizeof sim, "%s/expertbench_rt_hostsim.so", build);
    eb_engine *e = NULL;
    eb_runtime_options o = {.n_devices = 2, .threads_per_device = 2, .kernels = kernels};
    eb_runtime_options so = {.n_devices = 1, .threads_per_device = 1, .kernels = kernels};
    int st = eb_engine_create(&e);
    if (!st) st = eb_engine_load_runtime(e, "cpu", cpu, &o);
    if (!st) st = eb_engine_load_runtime(e, "hostsim", sim, &so);
    const char *files[] = {file};
    eb_model *m = NULL;
    eb_context *c = NULL;
    if (!st) st = eb_model_load(e, cfg, files, 1, b->d, b->n, 0, NULL, &m);
    if (!st && owners) st = eb_model_set_placement(m, owners, (int64_t)L * E);
    if (!st) st = eb_context_create(m, 16, 8, &c);
    int32_t prompt[6] = {3, 17, 42, 5, 63, 8}, next[2] = {9, 1};
    if (!st) st = eb_context_eval(c, prompt, 6, out, 1);
    if (!st) st = eb_context_eval(c, next, 2, out + 6 * V, 1);
    eb_context_free(c);
    eb_model_free(m);
    eb_engine_destroy(e);
    return st;
}

/* A model whose weights are F8_E4M3_B128 with scale companions gives the bits of the same model with the weights
 * dequantized to F32 (the kernels' promise), in every kernel variant and whatever device owns the scaled experts;
 * and the load refuses, naming the tensor and what was expected: a scaled weight without its companion, with one of
 * the wrong shape or dtype, a companion beside a weight whose format takes none, a vector in the scaled format. */
static void test_scaled_model(const char *build) {
    char fp8[] = "/tmp/eb_native_fp8_XXXXXX", f32[] = "/tmp/eb_native_fp8f32_XXXXXX";
    int fd1 = mkstemp(fp8), fd2 = mkstemp(f32);
    CHECK(fd1 >= 0 && fd2 >= 0, "mkstemp");
    close(fd1);
    close(fd2);
    static builder bs, bf;
    eb_model_config c2;
    int32_t mlp_only[1];
    write_model(fp8, &c2, &bs, mlp_only, SCALED_FP8);
    write_model(f32, &c2, &bf, mlp_only, SCALED_AS_F32);
    const eb_model_config *cfg = &c2;
    static float ys[8 * V], yf[8 * V];
    /* layer 0: the scaled experts 1 and 3 on hostsim:0 and cpu:1, the others on cpu:0 */
    int32_t owners[L * E] = {0, 2, 0, 1, -1, -1, -1, -1};
    for (int kernels = 0; kernels < EB_CPU_KERNELS_COUNT; kernels++)
        for (int placed = 0; placed <= 1; placed++) {
            int a = scaled_logits(build, fp8, cfg, &bs, kernels, placed ? owners : NULL, ys);
            CHECK(a == EB_OK, "%s kernels: the scaled model (placed %d): %s", kernels_name(kernels), placed,
                  eb_last_error());
            int b = scaled_logits(build, f32, cfg, &bf, kernels, placed ? owners : NULL, yf);
            CHECK(b == EB_OK, "the dequantized model: %s", eb_last_error());
            CHECK(a == EB_OK && b == EB_OK && memcmp(ys, yf, sizeof ys) == 0,
                  "%s kernels (placed %d): the scaled model's logits differ from its dequantized F32 model's",
                  kernels_name(kernels), placed);
        }
    char module[1024];
    snprintf(module, sizeof module, "%s/expertbench_rt_cpu.so", build);
    /* each case: one descriptor edited (renamed, or given a dtype, a shape [d0, d1] (d1 0: its rows only), bytes and
     * an offset moved by shift), then the tensor the message names (followed by its file) and what it expects */
    static const struct {
        const char *edit, *rename;
        int dtype, d0, d1, nbytes, shift;
        const char *tensor, *expected;
    } cases[] = {
        {"model.layers.1.mlp.up_proj.weight_scale_inv", "model.layers.1.mlp.up_proj.weight_scales", 0, 0, 0, 0, 0,
         "tensor 'model.layers.1.mlp.up_proj.weight", "is stored as F8_E4M3_B128, which needs its scale companion "
         "'model.layers.1.mlp.up_proj.weight_scale_inv' (F32 of shape [1, 1]"},
        {"model.layers.1.mlp.up_proj.weight_scale_inv", NULL, EB_DTYPE_F32, 1, 2, 8, -4,
         "tensor 'model.layers.1.mlp.up_proj.weight_scale_inv", "(the scale companion of "
         "'model.layers.1.mlp.up_proj.weight', [40, 32] in F8_E4M3_B128) is F32 of shape [1, 2], expected F32 or E8M0 "
         "of shape [1, 1] (one scale per block of 128 x 128 values)"},
        {"model.layers.1.mlp.up_proj.weight_scale_inv", NULL, EB_DTYPE_BF16, 1, 2, 4, 0,
         "tensor 'model.layers.1.mlp.up_proj.weight_scale_inv", "is BF16 of shape [1, 2], expected F32 or E8M0 of shape [1, 1]"},
        {"model.layers.1.mlp.up_proj.weight_scale_inv", "model.layers.1.self_attn.v_proj.weight_scale_inv", 0, 0, 0, 0,
         0, "tensor 'model.layers.1.self_attn.v_proj.weight_scale_inv", "is a scale companion of "
         "'model.layers.1.self_attn.v_proj.weight', which is stored as F32 and takes none"},
        {"model.norm.weight", NULL, EB_DTYPE_F8_E4M3_B128, H, 0, H, 0, "tensor 'model.norm.weight",
         "is a vector stored as F8_E4M3_B128, expected F32, F16 or BF16"},
    };
    builder saved = bs;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bs = saved;
        for (int k = 0; k < bs.n; k++) bs.d[k].name = bs.names[k];
        int t = find(&bs, cases[i].edit);
        if (cases[i].rename) {
            snprintf(bs.names[t], sizeof bs.names[t], "%s", cases[i].rename);
        } else {
            bs.d[t].dtype = cases[i].dtype, bs.d[t].shape[0] = cases[i].d0, bs.d[t].nbytes = (uint64_t)cases[i].nbytes;
            if (cases[i].d1) bs.d[t].shape[1] = cases[i].d1;
            bs.d[t].offset += (uint64_t)(int64_t)cases[i].shift;
        }
        expect_refusal(module, fp8, cfg, &bs, cases[i].tensor, "' in '/tmp/eb_native_fp8_", cases[i].expected);
    }
    unlink(fp8);
    unlink(f32);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s BUILD_DIR\n", argv[0]);
        return 2;
    }
    char module[1024];
    snprintf(module, sizeof module, "%s/expertbench_rt_cpu.so", argv[1]);
    char file[] = "/tmp/eb_native_model_XXXXXX";
    int fd = mkstemp(file);
    if (fd < 0) return 2;
    close(fd);
    eb_model_config cfg;
    int32_t mlp_only[1];
    static builder b;
    write_model(file, &cfg, &b, mlp_only, PLAIN);
    test_modules(argv[1]);
    test_kernels(module);
    test_kernel_variants_agree(module);
    test_q8_exp();
    test_half_roundings();
    test_half_cache_attention(module);
    test_e4m3_decode(module);
    test_scaled_matvec(module);
    test_scaled_model(argv[1]);
    test_forward(module, file, &cfg, &b);
    test_attend_group_blocks();
    test_attention_items(module, file, &cfg, &b);
    test_greedy(module, file, &cfg, &b);
    test_bad_checkpoints(module, file, &cfg, &b);
    test_v4_config(module, file, &cfg, &b);
    test_descriptor_fuzz(module, file, &cfg, &b);
    test_weights_modes(module, file, &cfg, &b);
    test_weight_check(module, file, &cfg, &b);
    test_placement(argv[1], file, &cfg, &b);
    test_device_primary(argv[1], file, &cfg, &b);
    test_lifetimes(module, file, &cfg, &b);
    unlink(file);
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}
