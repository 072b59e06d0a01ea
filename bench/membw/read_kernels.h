/* What the memory benchmarks share (membw.c, readpass.c, matmul_stream.c, decode_products.c): a clock, a thread's
 * part of an array, memory on huge pages as the engine's copied weights are, the size of STREAM's arrays, the
 * read kernels (the sum of a[lo, hi) in four 8-lane accumulators, 32 floats at a time, a tail shorter than 32 left
 * out, with or without each line also requested as far ahead as the decode kernels request their weights:
 * EB_CPU_AHEAD_BYTES, native/runtime/cpu/cpu_kernels.h) and STREAM's copy and triad. AVX2. */
#ifndef EB_BENCH_READ_KERNELS_H
#define EB_BENCH_READ_KERNELS_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "cpu_kernels.h"

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Thread id of n's part of floats floats: whole 32-float blocks, the last thread taking the rest. */
static inline void bench_part(size_t floats, int id, int n, size_t *lo, size_t *hi) {
    *lo = floats * (size_t)id / (size_t)n & ~(size_t)31;
    *hi = id == n - 1 ? floats : floats * (size_t)(id + 1) / (size_t)n & ~(size_t)31;
}

/* bytes of private memory on 2 MiB boundaries, advised for transparent huge pages (huge = 1, as the engine holds a
 * model's files when it copies them: native/src/model.c, copy_file) or against them (huge = 0: 4 KiB pages even
 * where the kernel gives huge pages to everything); NULL on failure. Free with bench_pages_free. */
static inline void *bench_pages_alloc(size_t bytes, int huge) {
    const size_t two_mib = (size_t)2 << 20;
    size_t rounded = (bytes + two_mib - 1) / two_mib * two_mib;
    unsigned char *raw = mmap(NULL, rounded + two_mib, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uintptr_t start = ((uintptr_t)raw + two_mib - 1) & ~(uintptr_t)(two_mib - 1);
    size_t head = start - (uintptr_t)raw;
    if (head) munmap(raw, head);
    munmap((unsigned char *)start + rounded, two_mib - head);
    madvise((void *)start, rounded, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    return (void *)start;
}

static inline void *bench_huge_alloc(size_t bytes) { return bench_pages_alloc(bytes, 1); }

static inline void bench_pages_free(void *p, size_t bytes) {
    const size_t two_mib = (size_t)2 << 20;
    if (p) munmap(p, (bytes + two_mib - 1) / two_mib * two_mib);
}

/* Of [p, p + bytes), about how many bytes the kernel backs with huge pages now: AnonHugePages of /proc/self/smaps,
 * reported per mapping, each mapping counted in proportion to its overlap with the range (the rule of the core's
 * copied_huge_bytes), at most bytes. */
static inline size_t bench_huge_bytes(const void *p, size_t bytes) {
    FILE *fp = fopen("/proc/self/smaps", "r");
    if (!fp) return 0;
    char line[512];
    double share = 0.0, total = 0.0;
    uintptr_t a = (uintptr_t)p, b = a + bytes;
    while (fgets(line, sizeof line, fp)) {
        unsigned long lo, hi;
        unsigned long long kib;
        char dash;
        if (sscanf(line, "%lx%c%lx ", &lo, &dash, &hi) == 3 && dash == '-' && hi > lo) {
            share = a < hi && b > lo ? (double)((b < hi ? b : hi) - (a > lo ? a : lo)) / (double)(hi - lo) : 0.0;
        } else if (share > 0.0 && sscanf(line, "AnonHugePages: %llu kB", &kib) == 1) {
            total += share * (double)kib * 1024.0;
        }
    }
    fclose(fp);
    return total < (double)bytes ? (size_t)total : bytes;
}

/* The largest cache of CPU 0 in bytes (sysfs: "32768K", "300M"), 0 where it is not known. STREAM asks for arrays
 * of at least four times the caches: on a host with a 300 MiB L3, 256 MiB arrays partly stay in it. */
static inline size_t bench_largest_cache(void) {
    size_t best = 0;
    for (int i = 0; i < 8; i++) {
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *fp = fopen(path, "r");
        if (!fp) continue;
        unsigned long long v = 0;
        char unit = 0;
        if (fscanf(fp, "%llu%c", &v, &unit) >= 1) {
            size_t bytes = (size_t)v * (unit == 'K' ? 1024 : unit == 'M' ? 1 << 20 : unit == 'G' ? 1 << 30 : 1);
            if (bytes > best) best = bytes;
        }
        fclose(fp);
    }
    return best;
}

/* MiB per array for a STREAM-like measurement: `floor` MiB, or four times the largest cache where that is more. */
static inline size_t bench_array_mib(size_t floor) {
    size_t four = (4 * bench_largest_cache() + ((size_t)1 << 20) - 1) >> 20;
    return four > floor ? four : floor;
}

static inline float lanes_sum(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    return t[0] + t[7];
}

static inline float plain_read(const float *a, size_t lo, size_t hi) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = lo; i + 32 <= hi; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(a + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(a + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(a + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(a + i + 24));
    }
    return lanes_sum(s0, s1, s2, s3);
}

/* STREAM's copy (dst = src) and triad (a = b + 3c) over [lo, hi). */
static inline void stream_copy(float *dst, const float *src, size_t lo, size_t hi) {
    memcpy(dst + lo, src + lo, (hi - lo) * sizeof(float));
}
static inline void stream_triad(float *a, const float *b, const float *c, size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; i++) a[i] = b[i] + 3.0f * c[i];
}
static inline float read_ahead(const float *a, size_t lo, size_t hi) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = lo; i + 32 <= hi; i += 32) {
        _mm_prefetch((const char *)((uintptr_t)(a + i) + EB_CPU_AHEAD_BYTES), _MM_HINT_T0);
        _mm_prefetch((const char *)((uintptr_t)(a + i) + EB_CPU_AHEAD_BYTES + 64), _MM_HINT_T0);
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(a + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(a + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(a + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(a + i + 24));
    }
    return lanes_sum(s0, s1, s2, s3);
}

#endif
