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
 * lines ahead as the decode kernels do; then times a cache line bounced between two threads held on the first two
 * CPUs it may run on. Prints one line "PLAIN_GBS AHEAD_GBS ROUND_TRIP_NS" (the round trip 0 with one CPU) and
 * flushes. Between requests it waits on stdin, taking no CPU time from the decode. Exits at end of input.
 *
 * The round trip tells a shared VM's states apart: on the 2-core development VM it was 90-170 ns while 2 threads
 * read 44-52 GB/s and about 400 ns while they read 60-90 GB/s (two virtual CPUs on different dies: twice the
 * memory links, three times the latency of every hand-off between the threads; bench/RESULTS.md).
 *
 *   cc -O2 -mavx2 -pthread -Inative/runtime/cpu bench/membw/readpass.c -o /tmp/readpass
 *   echo 22000000000 | /tmp/readpass --mib 1742
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
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

/* The round trip of a cache line between two threads on two CPUs. */
enum { BOUNCES = 20000 };
static _Atomic long ball __attribute__((aligned(64)));

static int hold_to(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

/* The ball holds 2i + 1 when thrown for the i-th time and 2i + 2 when caught; -1 when a side gives up. */
static void *bounce_back(void *arg) {
    if (hold_to(*(int *)arg) != 0) {
        atomic_store(&ball, -1);
        return NULL;
    }
    for (long i = 0; i < BOUNCES; i++) {
        long v;
        while ((v = atomic_load_explicit(&ball, memory_order_acquire)) != 2 * i + 1) {
            if (v < 0) return NULL;
            _mm_pause();
        }
        atomic_store_explicit(&ball, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

/* ns per round trip between the first two CPUs of the process's mask; 0 where it has one CPU or cannot hold them */
static double round_trip_ns(void) {
    cpu_set_t mine;
    int cpus[2], n = 0;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) return 0.0;
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, &mine)) cpus[n++] = c;
    if (n < 2) return 0.0;
    pthread_t other;
    atomic_store(&ball, 0);
    if (pthread_create(&other, NULL, bounce_back, &cpus[1]) != 0) return 0.0;
    double ns = 0.0;
    if (hold_to(cpus[0]) == 0) {
        double t0 = bench_now();
        long i = 0;
        for (; i < BOUNCES; i++) {
            long v = 2 * i + 1;
            if (!atomic_compare_exchange_strong(&ball, &(long){2 * i}, v)) break; /* the other side gave up */
            while ((v = atomic_load_explicit(&ball, memory_order_acquire)) == 2 * i + 1) _mm_pause();
            if (v < 0) break;
        }
        if (i == BOUNCES) ns = (bench_now() - t0) / BOUNCES * 1e9;
    } else {
        atomic_store(&ball, -1); /* not held: the other side stops */
    }
    pthread_join(other, NULL);
    sched_setaffinity(0, sizeof mine, &mine); /* the reads' threads inherit the whole mask again */
    return ns;
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
        printf("%.2f %.2f %.0f\n", plain, ahead, round_trip_ns());
        fflush(stdout);
    }
    bench_pages_free(a, bytes);
    return sink == 12345.0f; /* keeps the sums alive */
}
