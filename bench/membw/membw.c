/* A STREAM-like measurement of this machine's memory bandwidth ceiling, with 1 thread and with all cores.
 *
 * read:  sum of a large array (AVX2, several accumulators): the ceiling for decode, which only reads weights
 * read_ahead: the same sum, each line also requested 2 KiB ahead with a prefetch instruction, as the decode
 *        kernels do; the decode ceiling is the faster of the two reads, so a kernel that requests its weights
 *        ahead is not measured against a ceiling that does not
 * copy:  b[i] = a[i]              (bytes counted: read + write)
 * triad: a[i] = b[i] + s * c[i]   (bytes counted: two reads + one write)
 * These four run over arrays on 4 KiB pages (advised against huge pages, whatever the system's default);
 * *_huge: each of the four again over arrays on transparent huge pages (2 MiB), as the engine holds a model's
 *        weights when it copies its files. The read ceiling is the fastest of the four reads; STREAM's
 *        bandwidth is the faster of copy and triad, on either page size.
 * Each kernel runs --repeats times over arrays far larger than the caches (256 MiB each, or four times the
 * largest cache where that is more, as STREAM asks); the best run is reported, as STREAM does. Prints a table
 * and, with --json FILE, one JSON document.
 *
 *   cc -O2 -mavx2 -mfma -pthread -Inative/include -Inative/runtime/cpu bench/membw/membw.c -o /tmp/membw && /tmp/membw --json out.json
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "read_kernels.h"

static size_t N; /* floats per array: 256 MiB each, or four times the largest cache (--mib sets it) */
static int REPEATS = 10;

typedef struct {
    int kind, id, n;
    float *a, *b, *c; /* the arrays of the kernel's page size */
    double sum;
    pthread_barrier_t *start, *stop;
} job;

static void run_part(job *j) {
    size_t lo, hi;
    bench_part(N, j->id, j->n, &lo, &hi);
    if (j->kind == 0) {
        j->sum += plain_read(j->a, lo, hi);
    } else if (j->kind == 3) {
        j->sum += read_ahead(j->a, lo, hi);
    } else if (j->kind == 1) {
        stream_copy(j->b, j->a, lo, hi);
    } else {
        stream_triad(j->a, j->b, j->c, lo, hi);
    }
}

static void *worker(void *arg) {
    job *j = (job *)arg;
    for (int r = 0; r < REPEATS; r++) {
        pthread_barrier_wait(j->start);
        run_part(j);
        pthread_barrier_wait(j->stop);
    }
    return NULL;
}

/* best GB/s of REPEATS runs of kernel `kind` (0 read, 1 copy, 2 triad, 3 read_ahead) on n threads */
static double measure(int kind, int n, float *a, float *b, float *c) {
    pthread_barrier_t start, stop;
    pthread_barrier_init(&start, NULL, (unsigned)n + 1);
    pthread_barrier_init(&stop, NULL, (unsigned)n + 1);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    job *jobs = calloc((size_t)n, sizeof *jobs);
    for (int i = 0; i < n; i++) {
        jobs[i] = (job){kind, i, n, a, b, c, 0.0, &start, &stop};
        pthread_create(&th[i], NULL, worker, &jobs[i]);
    }
    double best = 1e30;
    for (int r = 0; r < REPEATS; r++) {
        double t0 = bench_now();
        pthread_barrier_wait(&start);
        pthread_barrier_wait(&stop);
        double dt = bench_now() - t0;
        if (dt < best) best = dt;
    }
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    free(th);
    free(jobs);
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&stop);
    double bytes = (double)N * sizeof(float) * (kind == 1 ? 2 : kind == 2 ? 3 : 1);
    return bytes / best / 1e9;
}

int main(int argc, char **argv) {
    const char *json = NULL;
    N = bench_array_mib(256) << 18;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) REPEATS = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc) N = (size_t)atoi(argv[++i]) << 18;
        else {
            fprintf(stderr, "usage: %s [--json FILE] [--repeats N] [--mib MiB-per-array]\n", argv[0]);
            return 2;
        }
    }
    float *arr[2][3]; /* a, b, c on 4 KiB pages, then on huge pages */
    for (int k = 0; k < 3; k++) {
        arr[0][k] = bench_pages_alloc(N * sizeof(float), 0);
        arr[1][k] = bench_huge_alloc(N * sizeof(float));
        if (!arr[0][k] || !arr[1][k]) return 1;
        for (int p = 0; p < 2; p++)
            for (size_t i = 0; i < N; i++) arr[p][k][i] = k == 0 ? 1.0f : k == 1 ? 2.0f : 0.5f;
    }
    size_t huge_mib = 0, small_huge_mib = 0; /* what the kernel gave each set */
    for (int k = 0; k < 3; k++) {
        huge_mib += bench_huge_bytes(arr[1][k], N * sizeof(float)) >> 20;
        small_huge_mib += bench_huge_bytes(arr[0][k], N * sizeof(float)) >> 20;
    }
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    enum { KINDS = 8 };
    const char *names[KINDS] = {"read", "copy", "triad", "read_ahead",
                                "read_huge", "copy_huge", "triad_huge", "read_ahead_huge"};
    double r[KINDS][2];
    for (int k = 0; k < KINDS; k++) {
        float **set = arr[k / 4];
        r[k][0] = measure(k % 4, 1, set[0], set[1], set[2]);
        r[k][1] = measure(k % 4, cores, set[0], set[1], set[2]);
    }
    printf("| kernel | 1 thread GB/s | %d threads GB/s |\n| --- | --- | --- |\n", cores);
    for (int k = 0; k < KINDS; k++) printf("| %s | %.1f | %.1f |\n", names[k], r[k][0], r[k][1]);
    printf("huge pages: %zu of %zu MiB of the *_huge arrays, %zu MiB of the others\n", huge_mib,
           3 * N * sizeof(float) >> 20, small_huge_mib);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) return 1;
        fprintf(f, "{\"threads\": %d, \"array_mib\": %zu, \"repeats\": %d, \"huge_page_mib\": %zu, "
                "\"small_page_arrays_huge_mib\": %zu", cores, N * 4 >> 20, REPEATS, huge_mib, small_huge_mib);
        for (int k = 0; k < KINDS; k++)
            fprintf(f, ", \"%s_gbs\": {\"1\": %.2f, \"all\": %.2f}", names[k], r[k][0], r[k][1]);
        fprintf(f, "}\n");
        fclose(f);
    }
    for (int k = 0; k < 3; k++) {
        bench_pages_free(arr[0][k], N * sizeof(float));
        bench_pages_free(arr[1][k], N * sizeof(float));
    }
    return 0;
}
