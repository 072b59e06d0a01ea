/* What the memory benchmarks share (membw.c, matmul_stream.c, decode_products.c): a clock, a thread's part of an
 * array, and the read kernels: the sum of a[lo, hi) in four 8-lane accumulators, 32 floats at a time (a tail
 * shorter than 32 is left out), with or without each line also requested as far ahead as the decode kernels
 * request their weights (EB_CPU_AHEAD_BYTES, native/runtime/cpu/cpu_kernels.h). AVX2. */
#ifndef EB_BENCH_READ_KERNELS_H
#define EB_BENCH_READ_KERNELS_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
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
