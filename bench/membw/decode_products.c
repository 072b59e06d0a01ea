/* A decode step's matrix products alone, through the engine's CPU runtime module, in decode's order, against a
 * plain read: what the engine could reach if nothing but its products took time.
 *
 * The products of the `--size bench` demo target (hidden 1024, 16 layers, 32 experts of which 4 are chosen per
 * layer, expert width 512, 16 query and 4 key/value heads of 64, vocabulary 32000) with random weights: per layer
 * q/k/v as one group, o, the router, the chosen experts' gate and up as one group, their down products as
 * another; then lm_head. The experts are chosen pseudo-randomly per token, so, as in decode, they come from
 * memory and not from the caches. Each group is one call of the module's matmul or matmul_multi, as the engine
 * makes it. Prints tokens/s, GB/s of weights and their fraction of a plain read (membw.c's read kernel, one
 * sweep over all the weights, best of 3), measured in the same run:
 *
 *   cc -O2 -mavx2 -pthread -Inative/include bench/membw/decode_products.c -ldl -o /tmp/decode_products && \
 *       /tmp/decode_products engine/expertbench_rt_cpu.so --dtype bf16
 *
 * Together with matmul_stream.c (the kernel alone) and decode.py (the whole engine) it splits the gap between
 * decode and the ceiling into the kernel's part, the hand-offs' and small products' part, and the rest.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eb_runtime.h"
#include "read_kernels.h"
#include "expertbench.h"

enum { H = 1024, LAYERS = 16, EXPERTS = 32, TOP_K = 4, INTER = 512, QD = 1024, KVD = 256, VOCAB = 32000 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *weights(size_t rows, size_t cols, size_t esize, unsigned seed) {
    size_t bytes = rows * cols * esize;
    unsigned char *w = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!w) return NULL;
    for (size_t i = 0; i < bytes / 2; i++) /* small values whatever the dtype's reading of the bits */
        ((uint16_t *)w)[i] = (uint16_t)(0x3c00 + (i * 2654435761u + seed) % 251);
    return w;
}

/* Sum of n floats, 4 accumulators (a plain read, as membw.c's) on one thread; the threads split the arrays. */
typedef struct {
    void **arrays;
    size_t *bytes;
    int n_arrays, id, n;
    double sum;
} read_job;

static void *read_part(void *arg) {
    read_job *j = (read_job *)arg;
    j->sum = 0.0;
    for (int a = 0; a < j->n_arrays; a++) {
        size_t floats = j->bytes[a] / 4, lo = floats * (size_t)j->id / (size_t)j->n & ~(size_t)31,
               hi = j->id == j->n - 1 ? floats : floats * (size_t)(j->id + 1) / (size_t)j->n & ~(size_t)31;
        j->sum += plain_read((const float *)j->arrays[a], lo, hi);
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *module = argc > 1 ? argv[1] : NULL;
    int dtype = EB_DTYPE_BF16, tokens = 64, threads = 0, bad = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            dtype = !strcmp(d, "f32") ? EB_DTYPE_F32 : !strcmp(d, "bf16") ? EB_DTYPE_BF16 : -1;
        } else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else bad = 1;
    }
    if (!module || bad || dtype < 0 || tokens < 1 || threads < 0 || threads > 256) {
        fprintf(stderr, "usage: %s MODULE.so [--dtype bf16|f32] [--tokens N] [--threads T]\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(module, RTLD_NOW | RTLD_LOCAL);
    eb_runtime_entry_fn entry = lib ? (eb_runtime_entry_fn)dlsym(lib, "eb_runtime_module") : NULL;
    const eb_runtime_table *t = entry ? entry() : NULL;
    if (!t || t->abi_version != EB_RUNTIME_ABI_VERSION || !t->matmul || !t->matmul_multi) {
        fprintf(stderr, "%s: not a runtime module of ABI %d with matmul_multi (%s)\n", module, EB_RUNTIME_ABI_VERSION,
                lib ? "entry or ABI" : dlerror());
        return 1;
    }
    char err[256] = "";
    eb_runtime_options opt = {1, threads, 0, 0};
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

    size_t es = dtype == EB_DTYPE_F32 ? 4 : 2;
    enum { PER_LAYER = 5 + 3 * EXPERTS }; /* q, k, v, o, router, then gate/up/down of each expert */
    void *w[LAYERS * PER_LAYER + 1];
    size_t bytes[LAYERS * PER_LAYER + 1];
    int nw = 0;
    for (int l = 0; l < LAYERS; l++) {
        size_t shapes[5][2] = {{QD, H}, {KVD, H}, {KVD, H}, {H, QD}, {EXPERTS, H}};
        for (int i = 0; i < 5; i++, nw++) bytes[nw] = shapes[i][0] * shapes[i][1] * es;
        for (int e = 0; e < EXPERTS; e++)
            for (int m = 0; m < 3; m++, nw++) bytes[nw] = (size_t)INTER * H * es;
    }
    bytes[nw++] = (size_t)VOCAB * H * es;
    for (int i = 0; i < nw; i++)
        if (!(w[i] = weights(bytes[i] / es, 1, es, (unsigned)i))) {
            fprintf(stderr, "out of memory for the weights\n");
            return 1;
        }
    float *x = calloc(H * 4, sizeof(float)), *y = calloc((size_t)VOCAB + H * 8, sizeof(float));
    if (!x || !y) return 1;
    for (int i = 0; i < H * 4; i++) x[i] = 0.001f * (float)(i % 97);

    size_t per_token = 0;
    unsigned rng = 12345;
    double t0 = 0.0;
    for (int tok = -2; tok < tokens; tok++) { /* two warm-up tokens */
        if (tok == 0) t0 = now();
        for (int l = 0; l < LAYERS; l++) {
            void **L = w + l * PER_LAYER;
            eb_rt_matmul qkv[3] = {{L[0], dtype, QD, H, x, 1, y}, {L[1], dtype, KVD, H, x, 1, y + QD},
                                   {L[2], dtype, KVD, H, x, 1, y + QD + KVD}};
            int st = t->matmul_multi(rt, 0, qkv, 3, err, sizeof err);
            st = st ? st : t->matmul(rt, 0, L[3], dtype, H, QD, x, 1, y, err, sizeof err);
            st = st ? st : t->matmul(rt, 0, L[4], dtype, EXPERTS, H, x, 1, y, err, sizeof err);
            int chosen[TOP_K];
            for (int k = 0; k < TOP_K; k++) { /* distinct pseudo-random experts */
                int e, taken;
                do {
                    rng = rng * 1103515245u + 12345u;
                    e = (int)(rng >> 16) % EXPERTS;
                    taken = 0;
                    for (int j = 0; j < k; j++) taken |= chosen[j] == e;
                } while (taken);
                chosen[k] = e;
            }
            eb_rt_matmul gu[2 * TOP_K], down[TOP_K];
            for (int k = 0; k < TOP_K; k++) {
                void **E = L + 5 + 3 * chosen[k];
                gu[2 * k] = (eb_rt_matmul){E[0], dtype, INTER, H, x, 1, y + 2 * k * INTER};
                gu[2 * k + 1] = (eb_rt_matmul){E[1], dtype, INTER, H, x, 1, y + (2 * k + 1) * INTER};
                down[k] = (eb_rt_matmul){E[2], dtype, H, INTER, x, 1, y + k * H};
            }
            st = st ? st : t->matmul_multi(rt, 0, gu, 2 * TOP_K, err, sizeof err);
            st = st ? st : t->matmul_multi(rt, 0, down, TOP_K, err, sizeof err);
            if (st) {
                fprintf(stderr, "%s: %s\n", module, err);
                return 1;
            }
            if (tok == 0) per_token += bytes[l * PER_LAYER] + 2 * bytes[l * PER_LAYER + 1] + bytes[l * PER_LAYER + 3] +
                                       bytes[l * PER_LAYER + 4] + 3 * (size_t)TOP_K * bytes[l * PER_LAYER + 5];
        }
        if (t->matmul(rt, 0, w[nw - 1], dtype, VOCAB, H, x, 1, y, err, sizeof err)) {
            fprintf(stderr, "%s: %s\n", module, err);
            return 1;
        }
        if (tok == 0) per_token += bytes[nw - 1];
    }
    double seconds = now() - t0;

    /* the same kinds of arrays read plainly: best of 3 sweeps over every weight */
    int n = info.threads < 1 ? 1 : info.threads > 256 ? 256 : info.threads;
    double best = 1e30, total = 0.0, sum = 0.0;
    for (int i = 0; i < nw; i++) total += (double)bytes[i];
    for (int r = 0; r < 3; r++) {
        pthread_t th[256];
        read_job jobs[256];
        double r0 = now();
        for (int i = 0; i < n; i++) {
            jobs[i] = (read_job){w, bytes, nw, i, n, 0.0};
        }
        int started = 1;
        while (started < n && pthread_create(&th[started], NULL, read_part, &jobs[started]) == 0) started++;
        for (int i = started; i < n; i++) read_part(&jobs[i]); /* threads that could not start: read here */
        read_part(&jobs[0]);
        for (int i = 1; i < started; i++) pthread_join(th[i], NULL);
        double dt = now() - r0;
        for (int i = 0; i < n; i++) sum += jobs[i].sum;
        if (dt < best) best = dt;
    }
    double read_gbs = total / best / 1e9, gbs = (double)per_token * tokens / seconds / 1e9;
    printf("%s, %s, %d threads, %d tokens\n", info.name, dtype == EB_DTYPE_F32 ? "f32" : "bf16", n, tokens);
    printf("| MB per token | products tok/s | products GB/s | plain read GB/s | products / read |\n");
    printf("| --- | --- | --- | --- | --- |\n");
    printf("| %.0f | %.1f | %.1f | %.1f | %.0f%% |\n", per_token / 1e6, tokens / seconds, gbs, read_gbs,
           100.0 * gbs / read_gbs);
    fprintf(stderr, "(sums %g %g)\n", sum, (double)y[0]); /* the results used, so no loop is dropped */
    for (int i = 0; i < nw; i++) free(w[i]);
    free(x);
    free(y);
    t->shutdown(rt);
    return 0;
}
