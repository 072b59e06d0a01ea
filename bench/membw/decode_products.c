/* A decode step's matrix products alone, through the engine's CPU runtime module, in decode's order, against a
 * plain read: what the engine could reach if nothing but its products took time.
 *
 * The products of the `--size bench` demo target (hidden 1024, 16 layers, 32 experts of which 4 are chosen per
 * layer, expert width 512, 16 query and 4 key/value heads of 64, vocabulary 32000) with random weights: per layer
 * q/k/v as one group, o, the router, then the chosen experts as the scheduler hands them to their owner (one
 * expert_ffn call: gate and up with silu in one pass over the threads, down in another); then lm_head. The experts
 * are chosen pseudo-randomly per token, so, as in decode, they come from memory and not from the caches. Each
 * call is the one the engine makes. Prints tokens/s, GB/s of weights and their fraction of a read of all the
 * weights (membw.c's read kernels, plain and requesting lines ahead, best of 3 sweeps each, the faster taken;
 * the weights lie in one arena on huge pages, as the engine holds a checkpoint it copies),
 * measured in the same run:
 *
 *   cc -O2 -mavx2 -pthread -Inative/include -Inative/runtime/cpu bench/membw/decode_products.c -ldl \
 *       -o /tmp/decode_products && /tmp/decode_products engine/expertbench_rt_cpu.so --dtype bf16
 *
 * Together with matmul_stream.c (the kernel alone) and decode.py (the whole engine) it splits the gap between
 * decode and the ceiling into the kernel's part, the hand-offs' and small products' part, and the rest. The
 * read sweeps all 1.7 GB of weights once each time, where a decode step reads 352 MB of them, of which the dense
 * part (q/k/v, o, router, lm_head: about 150 MB) is the same every token.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "eb_runtime.h"
#include "read_kernels.h"
#include "eb_formats.h"
#include "expertbench.h"

#define NO_SCALE ((eb_rt_scale){NULL, 0, 0}) /* these formats take no scale companion */

enum { H = 1024, LAYERS = 16, EXPERTS = 32, TOP_K = 4, INTER = 512, QD = 1024, KVD = 256, VOCAB = 32000 };

/* Fill bytes of weights at w (one after another in one arena on huge pages, as a copied checkpoint's are). */
static void fill_weights(void *w, size_t bytes, unsigned seed, int dtype) {
    for (size_t i = 0; i < bytes / 2; i++) /* small values whatever the dtype's reading of the bits */
        ((uint16_t *)w)[i] = (uint16_t)(0x3c00 + (i * 2654435761u + seed) % 251);
    const eb_format_traits *f = eb_format(dtype);
    if (!f->quantized) return;
    /* quantized blocks: normal scales (no subnormal products, which some cores take slow paths for) */
    uint16_t half = 0x2c00; /* 1/16 */
    for (size_t at = 0; at + (size_t)f->block_bytes <= bytes; at += (size_t)f->block_bytes) {
        unsigned char *b = (unsigned char *)w + at;
        if (dtype == EB_DTYPE_MXFP4) b[0] = 124;
        else if (dtype == EB_DTYPE_Q6_K) memcpy(b + 208, &half, 2);
        else memcpy(b, &half, 2), memcpy(b + 2, &half, 2);
    }
}

/* A thread's part of every array read (membw.c's read kernels: plain, or requesting lines ahead); the threads
 * split each array. */
typedef struct {
    void **arrays;
    size_t *bytes;
    int n_arrays, id, n, ahead;
    double sum;
} read_job;

static void *read_part(void *arg) {
    read_job *j = (read_job *)arg;
    j->sum = 0.0;
    for (int a = 0; a < j->n_arrays; a++) {
        size_t lo, hi;
        bench_part(j->bytes[a] / 4, j->id, j->n, &lo, &hi);
        const float *f = (const float *)j->arrays[a];
        j->sum += j->ahead ? read_ahead(f, lo, hi) : plain_read(f, lo, hi);
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *module = argc > 1 ? argv[1] : NULL;
    int dtype = EB_DTYPE_BF16, tokens = 64, threads = 0, bad = 0, prec = EB_PRECISION_F32, kernels = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            dtype = -1;
            for (int k = 0; k < EB_DTYPE_COUNT; k++)
                if (!strcasecmp(d, eb_format_table[k].name)) dtype = k;
        } else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc) {
            const char *p = argv[++i];
            prec = !strcmp(p, "f32") ? EB_PRECISION_F32 : !strcmp(p, "q8") ? EB_PRECISION_Q8 : -1;
        } else if (!strcmp(argv[i], "--kernels") && i + 1 < argc) {
            const char *k = argv[++i];
            kernels = !strcmp(k, "best") ? EB_CPU_KERNELS_BEST : !strcmp(k, "avx2") ? EB_CPU_KERNELS_AVX2
                      : !strcmp(k, "portable") ? EB_CPU_KERNELS_PORTABLE : -1;
        }
        else bad = 1;
    }
    if (!module || bad || prec < 0 || kernels < 0 || dtype < 0 || tokens < 1 || threads < 0 || threads > 256) {
        fprintf(stderr, "usage: %s MODULE.so [--dtype FORMAT (a name of the format table: bf16, q4_k, iq2_xxs, ...)] "
                "[--precision f32|q8] [--kernels best|avx2|portable] [--tokens N] [--threads T]\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(module, RTLD_NOW | RTLD_LOCAL);
    eb_runtime_entry_fn entry = lib ? (eb_runtime_entry_fn)dlsym(lib, "eb_runtime_module") : NULL;
    const eb_runtime_table *t = entry ? entry() : NULL;
    if (!t || t->abi_version != EB_RUNTIME_ABI_VERSION || !t->forward || !t->expert_ffn) {
        fprintf(stderr, "%s: not a runtime module of ABI %d with the forward operations and expert_ffn (%s)\n", module,
                EB_RUNTIME_ABI_VERSION, lib ? "entry or ABI" : dlerror());
        return 1;
    }
    char err[256] = "";
    eb_runtime_options opt = {1, threads, kernels, 0};
    void *rt = NULL;
    if (t->init(&opt, &rt, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", module, err);
        return 1;
    }
    eb_rt_device_info info;
    if (t->device_info(rt, 0, &info, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", module, err);
        return 1;
    }

    enum { PER_LAYER = 5 + 3 * EXPERTS }; /* q, k, v, o, router, then gate/up/down of each expert */
    void *w[LAYERS * PER_LAYER + 1];
    size_t bytes[LAYERS * PER_LAYER + 1];
    int nw = 0;
    for (int l = 0; l < LAYERS; l++) {
        size_t shapes[5][2] = {{QD, H}, {KVD, H}, {KVD, H}, {H, QD}, {EXPERTS, H}};
        for (int i = 0; i < 5; i++, nw++) bytes[nw] = shapes[i][0] * eb_row_bytes(dtype, (int64_t)shapes[i][1]);
        for (int e = 0; e < EXPERTS; e++)
            for (int m = 0; m < 3; m++, nw++) bytes[nw] = (m == 2 ? H : INTER) * eb_row_bytes(dtype, m == 2 ? INTER : H);
    }
    bytes[nw++] = (size_t)VOCAB * eb_row_bytes(dtype, H);
    size_t arena_bytes = 0;
    for (int i = 0; i < nw; i++) arena_bytes += (bytes[i] + 63) / 64 * 64;
    unsigned char *arena = bench_huge_alloc(arena_bytes);
    if (!arena) {
        fprintf(stderr, "out of memory for the weights\n");
        return 1;
    }
    for (size_t i = 0, at = 0; i < (size_t)nw; at += (bytes[i] + 63) / 64 * 64, i++) {
        w[i] = arena + at;
        fill_weights(w[i], bytes[i], (unsigned)i, dtype);
    }
    float *x = calloc(H * 4, sizeof(float)), *y = calloc((size_t)VOCAB + H * 8, sizeof(float));
    size_t scratch_bytes = eb_rt_expert_scratch_bytes(TOP_K, H, INTER);
    void *scratch = aligned_alloc(64, (scratch_bytes + 63) / 64 * 64);
    if (!x || !y || !scratch) return 1;
    for (int i = 0; i < H * 4; i++) x[i] = 0.001f * (float)(i % 97);
    /* per token: q, k, v, o and the router of every layer, the chosen experts' three matrices, lm_head */
    size_t per_token = bytes[nw - 1];
    for (int l = 0; l < LAYERS; l++) {
        for (int i = 0; i < 5; i++) per_token += bytes[l * PER_LAYER + i];
        per_token += 3 * (size_t)TOP_K * bytes[l * PER_LAYER + 5];
    }
    /* the chosen experts as the scheduler hands them to an owner: one token, one (token, expert) pair each */
    eb_rt_expert experts[TOP_K];
    int32_t pair_start[TOP_K + 1], pair_token[TOP_K] = {0};
    float pair_weight[TOP_K];
    for (int k = 0; k <= TOP_K; k++) pair_start[k] = k;
    for (int k = 0; k < TOP_K; k++) pair_weight[k] = 1.0f / TOP_K;
    eb_rt_expert_batch batch = {.n_experts = TOP_K, .experts = experts, .pair_start = pair_start, .n_pairs = TOP_K,
                                .n_tokens = 1, .hidden = H, .inter = INTER, .mode = EB_REDUCE_REFERENCE, .precision = prec, .x = x,
                                .pair_token = pair_token, .pair_weight = pair_weight, .y = y, .scratch = scratch,
                                .scratch_bytes = scratch_bytes};

    unsigned rng = 12345;
    double t0 = 0.0;
    for (int tok = -2; tok < tokens; tok++) { /* two warm-up tokens */
        if (tok == 0) t0 = bench_now();
        for (int l = 0; l < LAYERS; l++) {
            void **L = w + l * PER_LAYER;
            eb_rt_matmul qkv[3] = {{L[0], dtype, QD, H, x, 1, y, prec, NO_SCALE}, {L[1], dtype, KVD, H, x, 1, y + QD, prec, NO_SCALE},
                                   {L[2], dtype, KVD, H, x, 1, y + QD + KVD, prec, NO_SCALE}};
            eb_rt_matmul o = {L[3], dtype, H, QD, x, 1, y, prec, NO_SCALE}, router = {L[4], dtype, EXPERTS, H, x, 1, y, prec, NO_SCALE};
            int st = t->forward->matmul(rt, 0, NULL, qkv, 3, 0, err, sizeof err);
            st = st ? st : t->forward->matmul(rt, 0, NULL, &o, 1, 0, err, sizeof err);
            st = st ? st : t->forward->matmul(rt, 0, NULL, &router, 1, 0, err, sizeof err);
            int chosen[TOP_K];
            for (int k = 0; k < TOP_K; k++) { /* distinct pseudo-random experts, in ascending order as routing's */
                int e, taken;
                do {
                    rng = rng * 1103515245u + 12345u;
                    e = (int)(rng >> 16) % EXPERTS;
                    taken = 0;
                    for (int j = 0; j < k; j++) taken |= chosen[j] == e;
                } while (taken);
                int j = k;
                for (; j > 0 && chosen[j - 1] > e; j--) chosen[j] = chosen[j - 1];
                chosen[j] = e;
            }
            for (int k = 0; k < TOP_K; k++) {
                void **E = L + 5 + 3 * chosen[k];
                experts[k] = (eb_rt_expert){E[0], E[1], E[2], dtype, dtype, dtype, chosen[k], NULL, NO_SCALE, NO_SCALE, NO_SCALE};
            }
            st = st ? st : t->expert_ffn(rt, 0, &batch, 0, err, sizeof err);
            if (st) {
                fprintf(stderr, "%s: %s\n", module, err);
                return 1;
            }
        }
        eb_rt_matmul lm = {w[nw - 1], dtype, VOCAB, H, x, 1, y, prec, NO_SCALE};
        if (t->forward->matmul(rt, 0, NULL, &lm, 1, 0, err, sizeof err)) {
            fprintf(stderr, "%s: %s\n", module, err);
            return 1;
        }
    }
    double seconds = bench_now() - t0;

    /* the same kinds of arrays read: best of 3 sweeps over every weight, plainly and requesting lines ahead as the
     * kernels do; the faster of the two is the read the products are compared with */
    int n = info.threads < 1 ? 1 : info.threads > 256 ? 256 : info.threads;
    double best = 1e30, total = 0.0, sum = 0.0;
    for (int i = 0; i < nw; i++) total += (double)bytes[i];
    for (int r = 0; r < 6; r++) {
        pthread_t th[256];
        read_job jobs[256];
        double r0 = bench_now();
        for (int i = 0; i < n; i++) jobs[i] = (read_job){w, bytes, nw, i, n, r % 2, 0.0};
        int started = 1;
        while (started < n && pthread_create(&th[started], NULL, read_part, &jobs[started]) == 0) started++;
        for (int i = started; i < n; i++) read_part(&jobs[i]); /* threads that could not start: read here */
        read_part(&jobs[0]);
        for (int i = 1; i < started; i++) pthread_join(th[i], NULL);
        double dt = bench_now() - r0;
        for (int i = 0; i < n; i++) sum += jobs[i].sum;
        if (dt < best) best = dt;
    }
    double read_gbs = total / best / 1e9, gbs = (double)per_token * tokens / seconds / 1e9;
    printf("%s, %s, %d threads, %d tokens\n", info.name, eb_dtype_name(dtype), n, tokens);
    printf("activations: %s, kernels: %s\n", prec == EB_PRECISION_Q8 ? "q8" : "f32", t->kernel_variant(rt));
    printf("| MB per token | products tok/s | products GB/s | read GB/s (the faster of plain and ahead) "
           "| products / read |\n");
    printf("| --- | --- | --- | --- | --- |\n");
    printf("| %.0f | %.1f | %.1f | %.1f | %.0f%% |\n", per_token / 1e6, tokens / seconds, gbs, read_gbs,
           100.0 * gbs / read_gbs);
    fprintf(stderr, "(sums %g %g)\n", sum, (double)y[0]); /* the results used, so no loop is dropped */
    bench_pages_free(arena, arena_bytes);
    free(x);
    free(y);
    free(scratch);
    t->shutdown(rt);
    return 0;
}
