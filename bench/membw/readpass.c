/* Sustained reads on request: the ceiling sampled beside each decode, for bench/decode.py's paired rounds.
 *
 * membw.c reports the best of ten 256 MiB passes (3 ms each at 80 GB/s), as STREAM does. On a shared machine whose
 * bandwidth moves from one moment to the next, that best catches the bursts, while a decode of 64 tokens lasts a
 * third of a second. This program holds a buffer on huge pages (as the engine holds a copied checkpoint) and, for
 * each request, reads as many bytes as the decode beside it read, over about as long: the same statistic and the
 * same moment for both.
 *
 * Reads requests from stdin, one per line: a byte count. For each, reads that many bytes (whole sweeps of the
 * buffer, split across the threads) twice: with read_kernels.h's plain read, then with its read that requests
 * lines ahead as the decode kernels do; prints one line "PLAIN_GBS AHEAD_GBS" and flushes. Between requests it
 * waits on stdin, taking no CPU time from the decode. Exits at end of input.
 *
 *   cc -O2 -mavx2 -pthread -Inative/runtime/cpu bench/membw/readpass.c -o /tmp/readpass
 *   echo 22000000000 | /tmp/readpass --mib 1742
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "read_kernels.h"

typedef struct {
    const float *a;
    size_t lo, hi; /* this thread's part of the buffer, in floats */
    long sweeps;
    int ahead;
    float sum;
} part;

static void *sweep(void *arg) {
    part *p = (part *)arg;
    for (long s = 0; s < p->sweeps; s++)
        p->sum += p->ahead ? read_ahead(p->a, p->lo, p->hi) : plain_read(p->a, p->lo, p->hi);
    return NULL;
}

/* GB/s of `sweeps` whole sweeps of a[0, floats) on n threads (the calling thread is one of them) */
static double timed(const float *a, size_t floats, int n, long sweeps, int ahead, float *sink) {
    pthread_t th[64];
    part parts[64];
    for (int i = 0; i < n; i++) {
        parts[i] = (part){a, 0, 0, sweeps, ahead, 0.0f};
        bench_part(floats, i, n, &parts[i].lo, &parts[i].hi);
    }
    double t0 = bench_now();
    for (int i = 1; i < n; i++) pthread_create(&th[i], NULL, sweep, &parts[i]);
    sweep(&parts[0]);
    for (int i = 1; i < n; i++) pthread_join(th[i], NULL);
    double dt = bench_now() - t0;
    for (int i = 0; i < n; i++) *sink += parts[i].sum;
    return (double)sweeps * (double)(floats & ~(size_t)31) * sizeof(float) / dt / 1e9;
}

int main(int argc, char **argv) {
    size_t mib = 256;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--mib MiB] [--threads N]  (byte counts on stdin, one per line)\n", argv[0]);
            return 2;
        }
    }
    if (mib < 1 || threads < 1 || threads > 64) {
        fprintf(stderr, "readpass: --mib must be at least 1 and --threads 1 to 64 (got %zu, %d)\n", mib, threads);
        return 2;
    }
    size_t bytes = mib << 20, floats = bytes / sizeof(float);
    float *a = bench_huge_alloc(bytes);
    if (!a) {
        fprintf(stderr, "readpass: cannot allocate %zu MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < floats; i++) a[i] = 1.0f;
    float sink = 0.0f;
    timed(a, floats, threads, 1, 0, &sink); /* a first sweep: every page present before the first request */
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        char *end;
        double want = strtod(line, &end);
        if (end == line || want <= 0) {
            fprintf(stderr, "readpass: expected a positive byte count per line, got %s", line);
            return 2;
        }
        long sweeps = (long)(want / (double)bytes + 0.5);
        if (sweeps < 1) sweeps = 1;
        double plain = timed(a, floats, threads, sweeps, 0, &sink);
        double ahead = timed(a, floats, threads, sweeps, 1, &sink);
        printf("%.2f %.2f\n", plain, ahead);
        fflush(stdout);
    }
    bench_pages_free(a, bytes);
    return sink == 12345.0f; /* keeps the sums alive */
}
