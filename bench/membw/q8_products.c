/* One thread's q8 products of one format through the cpu module's forward->matmul, weights small enough to stay in
 * the caches: the kernels' compute alone, the AVX2 set against the best the CPU runs (AVX-512 VNNI where it has it),
 * in one run. Prints the best of 200 x 10 calls and nanoseconds per 256 weight values per token.
 *
 *   cc -O2 -Inative/include bench/membw/q8_products.c -ldl -o /tmp/q8_products && \
 *       /tmp/q8_products engine/expertbench_rt_cpu.so q2_k,q3_k,iq4_xs,iq2_xxs 1
 *
 * The weights are random bytes with every block's f16 scale set to 1 where the format begins with one (the K formats'
 * random scales are harmless); the speed does not depend on the values. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "eb_formats.h"
#include "eb_runtime.h"

enum { ROWS = 256, COLS = 1024 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int time_format(const eb_runtime_table *T, int dt, int n) {
    size_t wb = (size_t)ROWS * eb_row_bytes(dt, COLS);
    unsigned char *w = malloc(wb);
    float *x = malloc(sizeof(float) * (size_t)n * COLS), *y = malloc(sizeof(float) * (size_t)n * ROWS);
    if (!w || !x || !y) return 1;
    unsigned s = 1;
    for (size_t i = 0; i < wb; i++) w[i] = (unsigned char)((s = s * 1664525u + 1013904223u) >> 24);
    const eb_format_traits *f = eb_format(dt);
    if (dt != EB_DTYPE_Q2_K && dt != EB_DTYPE_Q3_K && dt != EB_DTYPE_Q6_K && dt != EB_DTYPE_MXFP4)
        for (size_t k = 0; k < wb; k += (size_t)f->block_bytes) w[k] = 0, w[k + 1] = 0x3c; /* d = 1 */
    for (int i = 0; i < n * COLS; i++) x[i] = (float)(i % 7) - 3.1f;
    static const int sets[2] = {EB_CPU_KERNELS_AVX2, EB_CPU_KERNELS_BEST};
    for (int k = 0; k < 2; k++) {
        eb_runtime_options o;
        memset(&o, 0, sizeof o);
        o.n_devices = 1, o.threads_per_device = 1, o.kernels = sets[k];
        void *rt;
        char err[256];
        if (T->init(&o, &rt, err, sizeof err)) {
            fprintf(stderr, "init: %s\n", err);
            return 1;
        }
        eb_rt_matmul m = {w, dt, ROWS, COLS, x, n, y, EB_PRECISION_Q8, {0}};
        double best = 1e9;
        for (int r = 0; r < 200; r++) {
            double t0 = now();
            for (int i = 0; i < 10; i++)
                if (T->forward->matmul(rt, 0, NULL, &m, 1, 0, err, sizeof err)) {
                    fprintf(stderr, "matmul: %s\n", err);
                    return 1;
                }
            double t = (now() - t0) / 10;
            best = t < best ? t : best;
        }
        printf("%-8s %-28s %d tokens  %8.2f us  %6.2f ns per 256 values per token\n", f->name, T->kernel_variant(rt),
               n, best * 1e6, best * 1e9 / ((double)ROWS * COLS / 256.0) / n);
        T->shutdown(rt);
    }
    free(w), free(x), free(y);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODULE.so FORMAT[,FORMAT...] [TOKENS]\n", argv[0]);
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    const eb_runtime_table *(*entry)(void) = h ? (const eb_runtime_table *(*)(void))dlsym(h, EB_RUNTIME_ENTRY) : NULL;
    if (!entry) {
        fprintf(stderr, "%s: %s\n", argv[1], dlerror());
        return 1;
    }
    const eb_runtime_table *T = entry();
    int n = argc > 3 ? atoi(argv[3]) : 1;
    if (n < 1 || n > 64) {
        fprintf(stderr, "TOKENS: 1 to 64\n");
        return 2;
    }
    char *names = strdup(argv[2]);
    for (char *d = strtok(names, ","); d; d = strtok(NULL, ",")) {
        int dt = -1;
        for (int k = 0; k < EB_DTYPE_COUNT; k++)
            if (!strcasecmp(d, eb_format_table[k].name)) dt = k;
        if (dt < 0 || !eb_dtype_quantized(dt) || COLS % eb_format(dt)->block) {
            fprintf(stderr, "%s: not a quantized format of the table\n", d);
            return 2;
        }
        if (time_format(T, dt, n)) return 1;
    }
    free(names);
    return 0;
}
