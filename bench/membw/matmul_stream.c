/* The CPU decode kernel alone against a plain read of the same bytes, in one run: how close the one-token
 * products come to the memory ceiling before the engine's other work is counted. The read is the faster of a
 * plain one and one that requests lines ahead as the kernel does (membw.c's read and read_ahead).
 *
 * A GiB of weight matrices (expert-sized by default: 512 rows x 1024 columns) is swept as decode sweeps its
 * weights: every product split into row ranges across the threads, the threads meeting after each product.
 * The same bytes are then summed plainly (the read kernel of membw.c). Best of --repeats sweeps each, with one
 * thread and with all cores (or --threads). Compiled with the engine's kernel sources:
 *
 *   cc -O2 -ffp-contract=off -mavx2 -mfma -mf16c -pthread -Inative/include -Inative/runtime/cpu \
 *      bench/membw/matmul_stream.c native/runtime/cpu/cpu_kernels_avx2.c native/runtime/cpu/cpu_kernels_portable.c \
 *      -o /tmp/matmul_stream && /tmp/matmul_stream --dtype bf16
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "read_kernels.h"
#include "expertbench.h"

static int64_t ROWS = 512, COLS = 1024;
static size_t TOTAL = (size_t)1 << 30;
static int REPEATS = 5, DTYPE = EB_DTYPE_BF16, THREADS = 0; /* 0: all cores */

typedef struct {
    int id, n, kind; /* kind 0: the decode kernel, 1: a plain read, 2: a read requesting lines ahead */
    const unsigned char *w;
    const float *x;
    float *y;
    int64_t n_mat;
    double sum;
    _Atomic int *arrived;
    _Atomic int *round;
} job;

/* All threads meet: the last to arrive starts the next round. */
static void meet(job *j) {
    int r = atomic_load(j->round);
    if (atomic_fetch_add(j->arrived, 1) == j->n - 1) {
        atomic_store(j->arrived, 0);
        atomic_fetch_add(j->round, 1);
    } else {
        for (int spins = 0; atomic_load(j->round) == r; spins++) {
            if (spins < 4096) __builtin_ia32_pause();
            else sched_yield(); /* more threads than cores: let the others run */
        }
    }
}

static void *sweep(void *arg) {
    job *j = (job *)arg;
    size_t esize = DTYPE == EB_DTYPE_F32 ? 4 : 2, mat = (size_t)ROWS * (size_t)COLS * esize;
    if (j->kind == 0) {
        int64_t r0 = ROWS * j->id / j->n, r1 = ROWS * (j->id + 1) / j->n;
        for (int64_t m = 0; m < j->n_mat; m++) {
            eb_cpu_matmul_rows_avx2(j->w + (size_t)m * mat, DTYPE, NULL, r0, r1, COLS, j->x, 1, j->y + m * ROWS, ROWS);
            meet(j);
        }
    } else {
        size_t lo, hi;
        bench_part((size_t)j->n_mat * mat / 4, j->id, j->n, &lo, &hi);
        j->sum = j->kind == 1 ? plain_read((const float *)j->w, lo, hi) : read_ahead((const float *)j->w, lo, hi);
    }
    return NULL;
}

static double read_sum; /* what the plain reads summed */

/* best GB/s of REPEATS sweeps with n threads */
static double measure(int kind, int n, const unsigned char *w, const float *x, float *y, int64_t n_mat) {
    double best = 1e30;
    for (int r = 0; r < REPEATS; r++) {
        _Atomic int arrived = 0, round = 0;
        pthread_t th[256];
        job jobs[256];
        for (int i = 0; i < n; i++) jobs[i] = (job){i, n, kind, w, x, y, n_mat, 0.0, &arrived, &round};
        double t0 = bench_now();
        for (int i = 1; i < n; i++) pthread_create(&th[i], NULL, sweep, &jobs[i]);
        sweep(&jobs[0]);
        for (int i = 1; i < n; i++) pthread_join(th[i], NULL);
        double dt = bench_now() - t0;
        for (int i = 0; i < n; i++) read_sum += jobs[i].sum;
        if (dt < best) best = dt;
    }
    size_t esize = DTYPE == EB_DTYPE_F32 ? 4 : 2;
    return (double)n_mat * (double)ROWS * (double)COLS * (double)esize / best / 1e9;
}

int main(int argc, char **argv) {
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            DTYPE = !strcmp(d, "f32") ? EB_DTYPE_F32 : !strcmp(d, "f16") ? EB_DTYPE_F16 : !strcmp(d, "bf16") ? EB_DTYPE_BF16 : -1;
        } else if (!strcmp(argv[i], "--rows") && i + 1 < argc) ROWS = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--cols") && i + 1 < argc) COLS = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc) TOTAL = (size_t)atoll(argv[++i]) << 20;
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) REPEATS = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) THREADS = atoi(argv[++i]);
        else bad = 1;
    }
    if (bad || DTYPE < 0 || ROWS < 1 || COLS < 8 || REPEATS < 1 || TOTAL == 0 || THREADS < 0 || THREADS > 256) {
        fprintf(stderr, "usage: %s [--dtype bf16|f16|f32] [--rows R] [--cols C] [--mib MiB] [--repeats N] [--threads T]\n",
                argv[0]);
        return 2;
    }
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c")) {
        fprintf(stderr, "this CPU lacks AVX2/FMA/F16C: the engine uses its portable kernels here\n");
        return 1;
    }
    size_t esize = DTYPE == EB_DTYPE_F32 ? 4 : 2, mat = (size_t)ROWS * (size_t)COLS * esize;
    int64_t n_mat = (int64_t)(TOTAL / mat);
    if (n_mat < 1) {
        fprintf(stderr, "--mib %zu holds no %lldx%lld matrix\n", TOTAL >> 20, (long long)ROWS, (long long)COLS);
        return 2;
    }
    unsigned char *w = bench_huge_alloc((size_t)n_mat * mat); /* as a copied checkpoint's weights are */
    float *x = malloc((size_t)COLS * sizeof(float)), *y = malloc((size_t)n_mat * (size_t)ROWS * sizeof(float));
    if (!w || !x || !y) return 1;
    for (size_t i = 0; i < (size_t)n_mat * mat / 2; i++) ((uint16_t *)w)[i] = (uint16_t)(0x3c00 + i % 251);
    for (int64_t i = 0; i < COLS; i++) x[i] = 0.001f * (float)(i % 97);
    int cores = THREADS ? THREADS : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 256) cores = 256;
    printf("%lld matrices of %lldx%lld %s (%zu MiB)\n", (long long)n_mat, (long long)ROWS, (long long)COLS,
           DTYPE == EB_DTYPE_F32 ? "f32" : DTYPE == EB_DTYPE_F16 ? "f16" : "bf16", (size_t)n_mat * mat >> 20);
    printf("| threads | read GB/s (the faster of plain and ahead) | decode kernel GB/s | kernel / read |\n"
           "| --- | --- | --- | --- |\n");
    int counts[2] = {1, cores};
    for (int k = 0; k < (cores > 1 ? 2 : 1); k++) {
        double plain = measure(1, counts[k], w, x, y, n_mat), ahead = measure(2, counts[k], w, x, y, n_mat);
        double read = plain > ahead ? plain : ahead, kern = measure(0, counts[k], w, x, y, n_mat);
        printf("| %d | %.1f | %.1f | %.0f%% |\n", counts[k], read, kern, 100.0 * kern / read);
        fprintf(stderr, "(sums %g %g)\n", read_sum, (double)y[0]); /* the results used, so no loop is dropped */
    }
    bench_pages_free(w, (size_t)n_mat * mat);
    free(x);
    free(y);
    return 0;
}
