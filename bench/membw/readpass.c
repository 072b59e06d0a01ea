/* Sustained reads, copies and triads on request: the ceiling sampled beside each decode, for bench/decode.py's
 * paired rounds.
 *
 * membw.c reports the best of ten passes over arrays of 256 MiB or more (3 ms each at 80 GB/s), as STREAM does.
 * On a shared machine whose bandwidth moves from one moment to the next, that best catches the bursts, while a
 * decode of 64 tokens lasts a third of a second. This program holds a buffer on huge pages (as the engine holds a copied checkpoint) and, for
 * each request, moves as many bytes as the decode beside it read, over about as long: the same statistic and the
 * same moment for both.
 *
 * Reads requests from stdin, one per line: a byte count. For each, moves that many bytes (whole sweeps, split
 * across the threads) four ways: read_kernels.h's plain read and its read that requests lines ahead as the decode
 * kernels do, over the buffer; then STREAM's copy (b = c) and triad (a = b + 3c) over two more arrays of 512 MiB
 * or four times the largest cache (at most the buffer's size), their bytes counted as STREAM counts them
 * (membw.c's kernels); then times a cache line bounced between two threads held on the first two CPUs it may run
 * on. Prints one line "PLAIN AHEAD COPY TRIAD ROUND_TRIP" (GB/s, then ns; the round trip 0 with one CPU) and
 * flushes. Between requests it waits on stdin, taking no CPU time from the decode. Exits at end of input.
 *
 * The round trip tells a shared VM's states apart: on the 2-core development VM it was 44-170 ns while 2 threads
 * read 44-52 GB/s and about 400 ns while they read 60-90 GB/s (two virtual CPUs on different dies: twice the
 * memory links, three times the latency of every hand-off between the threads; bench/RESULTS.md).
 *
 *   cc -O2 -mavx2 -pthread -Inative/include -Inative/runtime/cpu bench/membw/readpass.c -o /tmp/readpass
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


enum { PLAIN, AHEAD, COPY, TRIAD, KINDS };

typedef struct {
    float *a, *b, *c; /* a: the read buffer (and triad's output); b, c: STREAM's other two arrays */
    size_t lo, hi;     /* this thread's part, in floats: of a for the reads, of b and c for copy and triad */
    long sweeps;
    int kind;
    float sum;
} part;

static void *sweep(void *arg) {
    part *p = (part *)arg;
    for (long s = 0; s < p->sweeps; s++) {
        switch (p->kind) {
        case PLAIN: p->sum += plain_read(p->a, p->lo, p->hi); break;
        case AHEAD: p->sum += read_ahead(p->a, p->lo, p->hi); break;
        case COPY: stream_copy(p->b, p->c, p->lo, p->hi); break;
        default: stream_triad(p->a, p->b, p->c, p->lo, p->hi);
        }
    }
    return NULL;
}

/* GB/s of a kind of pass over `floats` floats, repeated to about `want` bytes (STREAM's count: copy moves two bytes
 * per byte copied, triad three), on n threads (the calling thread is one of them) */
static double timed(float *a, float *b, float *c, size_t floats, int n, double want, int kind, float *sink) {
    double per_sweep = (double)(floats & ~(size_t)31) * sizeof(float) * (kind == COPY ? 2 : kind == TRIAD ? 3 : 1);
    long sweeps = (long)(want / per_sweep + 0.5);
    if (sweeps < 1) sweeps = 1;
    pthread_t th[64];
    part parts[64];
    for (int i = 0; i < n; i++) {
        parts[i] = (part){a, b, c, 0, 0, sweeps, kind, 0.0f};
        bench_part(floats, i, n, &parts[i].lo, &parts[i].hi);
    }
    double t0 = bench_now();
    int started = 1;
    for (int i = 1; i < n; i++, started++)
        if (pthread_create(&th[i], NULL, sweep, &parts[i]) != 0) break;
    for (int i = started; i < n; i++) sweep(&parts[i]); /* the parts no thread took */
    sweep(&parts[0]);
    for (int i = 1; i < started; i++) pthread_join(th[i], NULL);
    double dt = bench_now() - t0;
    for (int i = 0; i < n; i++) *sink += parts[i].sum;
    return (double)sweeps * per_sweep / dt / 1e9;
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

/* The ball holds -2 until the other side is held to its CPU, then 2i + 1 when thrown for the i-th time and 2i + 2
 * when caught; -1 when a side gives up. */
static void *bounce_back(void *arg) {
    if (hold_to(*(int *)arg) != 0) {
        atomic_store(&ball, -1);
        return NULL;
    }
    long ready = -2;
    if (!atomic_compare_exchange_strong(&ball, &ready, 0)) return NULL; /* the first side gave up already */
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
    atomic_store(&ball, -2);
    if (pthread_create(&other, NULL, bounce_back, &cpus[1]) != 0) return 0.0;
    double ns = 0.0;
    long seen;
    if (hold_to(cpus[0]) == 0) {
        while ((seen = atomic_load(&ball)) == -2) _mm_pause(); /* the other side held to its CPU: start the clock */
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
        seen = -2; /* not held: the other side stops, whether it is ready yet or not */
        if (!atomic_compare_exchange_strong(&ball, &seen, -1)) atomic_store(&ball, -1);
    }
    pthread_join(other, NULL);
    sched_setaffinity(0, sizeof mine, &mine); /* the reads' threads inherit the whole mask again */
    return ns;
}

int main(int argc, char **argv) {
    size_t mib = 256;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mib") && i + 1 < argc) {
            char *end = NULL;
            const char *v = argv[++i];
            mib = v[0] >= '0' && v[0] <= '9' ? strtoull(v, &end, 10) : 0;
            if (mib < 1 || mib > ((size_t)1 << 24) || *end != '\0') {
                fprintf(stderr, "readpass: --mib must be a whole number of MiB from 1 to 16777216, got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--mib MiB] [--threads N]  (byte counts on stdin, one per line)\n", argv[0]);
            return 2;
        }
    }
    if (threads < 1 || threads > 64) {
        fprintf(stderr, "readpass: --threads must be 1 to 64, got %d\n", threads);
        return 2;
    }
    size_t bytes = mib << 20, floats = bytes / sizeof(float);
    /* STREAM's arrays: 512 MiB or four times the largest cache (bench_array_mib), at most the read buffer's size */
    size_t stream_mib = bench_array_mib(512), stream = (mib < stream_mib ? mib : stream_mib) << 20;
    size_t stream_floats = stream / sizeof(float);
    float *a = bench_huge_alloc(bytes), *b = bench_huge_alloc(stream), *c = bench_huge_alloc(stream);
    if (!a || !b || !c) {
        fprintf(stderr, "readpass: cannot allocate %zu MiB\n", mib + 2 * (stream >> 20));
        return 1;
    }
    for (size_t i = 0; i < floats; i++) a[i] = 1.0f;
    for (size_t i = 0; i < stream_floats; i++) b[i] = 2.0f, c[i] = 0.5f;
    float sink = 0.0f;
    timed(a, b, c, floats, threads, 1.0, PLAIN, &sink); /* every page present before the first request */
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        char *end;
        double want = strtod(line, &end);
        while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n') end++;
        if (end == line || *end != '\0' || !(want > 0) || want > 1e18) {
            fprintf(stderr, "readpass: expected a positive byte count per line (at most 1e18), got %s", line);
            return 2;
        }
        double gbs[KINDS];
        for (int k = 0; k < KINDS; k++)
            gbs[k] = timed(a, b, c, k == COPY || k == TRIAD ? stream_floats : floats, threads, want, k, &sink);
        printf("%.2f %.2f %.2f %.2f %.0f\n", gbs[PLAIN], gbs[AHEAD], gbs[COPY], gbs[TRIAD], round_trip_ns());
        fflush(stdout);
    }
    bench_pages_free(a, bytes);
    bench_pages_free(b, stream);
    bench_pages_free(c, stream);
    return sink == 12345.0f; /* keeps the sums alive */
}
