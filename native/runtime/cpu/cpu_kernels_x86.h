/* What the x86 kernel files share (cpu_kernels_avx2.c, cpu_kernels_avx512.c): horizontal sums, Q6_K's offset sum
 * and its block's one f32 expression in the q8 precision, and the q8 loops over rows and tokens. Both files include it and compile it with their own instruction sets; every function here uses AVX2 at
 * most, so the two variants compute these steps with the same instructions.
 *
 * The q8 loops call dot_q8 (one row, one to four tokens), which the including file defines first.
 *
 * The GPU modules' q8 kernels (gpu_runtime.cu, q8_dot32 and q8_dotk) reproduce these kernels' order of float
 * operations, so that a q8 run gives the same bits on a CPU and a GPU: a change to that order is a change there too
 * (tests/test_gpu_quantized.py compares the bits on the GPU machine). */
#ifndef EB_CPU_KERNELS_X86_H
#define EB_CPU_KERNELS_X86_H

#include <immintrin.h>
#include <string.h>

#include "cpu_kernels.h"
#include "eb_formats.h"

#define INLINE static inline __attribute__((always_inline))

/* Fully unrolled so the accumulators live in registers. */
#define UNROLL _Pragma("GCC unroll 16")

/* How far ahead of the columns being read the streaming kernels ask for each row's weights (cpu_kernels_avx2.c). */
#define AHEAD_BYTES EB_CPU_AHEAD_BYTES

/* One row's dot products with up to four tokens' q8 activations: defined by each including file. */
INLINE void dot_q8(const unsigned char *row, int dtype, int64_t cols, const eb_cpu_q8_rows *xr, int64_t t0, int T,
                   float *out, int pf);

/* Where tokens t0 .. t0 + T - 1 of xr keep their quants, block scales and sums of 16 (a dot_q8's rows). */
INLINE void q8_tokens(const eb_cpu_q8_rows *xr, int64_t cols, int64_t t0, int T, const int8_t **xq, const float **xd,
                      const int16_t **xs) {
    UNROLL for (int t = 0; t < T; t++) {
        xq[t] = xr->q + (t0 + t) * cols;
        xd[t] = xr->d + (t0 + t) * cols / xr->block;
        xs[t] = xr->s16 + (t0 + t) * cols / 16;
    }
}

INLINE float hsum(__m256 s) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

INLINE int32_t hsum_i32(__m256i v) {
    __m128i q = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(q, _mm_shuffle_epi32(q, 0xb1)));
}

/* Sixteen int16 times the sums of their 16 activations: Q6_K's scales (its offset of 32 is subtracted as this), Q2_K's
 * minima. */
INLINE int32_t per16_sum(__m256i sc16, const int16_t *s) {
    return hsum_i32(_mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)s)));
}

/* A Q6_K or Q3_K block's value in the q8 precision, from its exact integer sums (msum: per16_sum of its scales):
 * cpu_kernels_portable.c's block_k_q8 expression, the same float operations in the same order, in every variant. */
INLINE float k16_block_value(const unsigned char *b, int dtype, float dx, int32_t isum, int32_t msum) {
    return _cvtsh_ss(eb_load_u16(b + eb_k16_d(dtype))) * dx * (float)(isum - eb_k16_offset(dtype) * msum);
}

/* The eight 6-bit scales and minima of a Q4_K / Q5_K block as int16 (eb_k4_scale_min, four bytes at a time). */
INLINE void k4_scales(const unsigned char *p, __m128i *sc, __m128i *m) {
    uint32_t u[3];
    memcpy(u, p, sizeof u);
    uint32_t sc_lo = u[0] & 0x3f3f3f3fu, m_lo = u[1] & 0x3f3f3f3fu;
    uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4;
    uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4;
    *sc = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)sc_hi, (int)sc_lo));
    *m = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)m_hi, (int)m_lo));
}

/* Q4_K / Q5_K: the eight minima (int16) times the sums of their 32 activations (s: the block's sixteen sums of 16). */
INLINE int32_t k4_min_sum(__m128i m8, const int16_t *s) {
    __m128i s32 = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)s), _mm_loadu_si128((const __m128i *)(s + 8)));
    __m128i mm = _mm_madd_epi16(m8, s32);
    mm = _mm_add_epi32(mm, _mm_shuffle_epi32(mm, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(mm, _mm_shuffle_epi32(mm, 0xb1)));
}

/* The sixteen scales of a Q6_K, Q2_K or Q3_K block as int16 (eb_k16_scale). */
INLINE __m256i k16_scales(const unsigned char *b, int dtype) {
    if (dtype == EB_DTYPE_Q6_K) return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
    if (dtype == EB_DTYPE_Q2_K) return _mm256_cvtepu8_epi16(_mm_and_si128(_mm_loadu_si128((const __m128i *)b), _mm_set1_epi8(0x0F)));
    uint32_t u[3]; /* Q3_K: eb_k16_scale four at a time */
    memcpy(u, b + 96, sizeof u);
    const uint32_t m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    __m128i s = _mm_set_epi32((int)(((u[1] >> 4) & m4) | ((u[2] >> 6) & m2) << 4), (int)(((u[0] >> 4) & m4) | ((u[2] >> 4) & m2) << 4),
                              (int)((u[1] & m4) | ((u[2] >> 2) & m2) << 4), (int)((u[0] & m4) | (u[2] & m2) << 4));
    return _mm256_cvtepi8_epi16(_mm_sub_epi8(s, _mm_set1_epi8(32)));
}

/* A Q4_K / Q5_K / Q2_K block's value in the q8 precision (dm: its f16 d and dmin), from its exact integer sums:
 * cpu_kernels_portable.c's min_block_value expression, the same float operations in the same order. */
INLINE float k4_block_value(const unsigned char *dm, float dx, int32_t isum, int32_t msum) {
    float d = _cvtsh_ss(eb_load_u16(dm)), dmin = _cvtsh_ss(eb_load_u16(dm + 2));
    return d * dx * (float)isum - dmin * dx * (float)msum;
}

/* The tokens of one row in groups of up to four (the row's blocks read once per group; from L1 after the first). */
INLINE void row_q8(const unsigned char *row, int dtype, int64_t cols, const eb_cpu_q8_rows *x, int64_t n, float *y,
                   int64_t ldy, int64_t r) {
    float o[4];
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
        dot_q8(row, dtype, cols, x, t, 4, o, t == 0);
        for (int i = 0; i < 4; i++) y[(t + i) * ldy + r] = o[i];
    }
    switch (n - t) {
    case 3: dot_q8(row, dtype, cols, x, t, 3, o, t == 0); break;
    case 2: dot_q8(row, dtype, cols, x, t, 2, o, t == 0); break;
    case 1: dot_q8(row, dtype, cols, x, t, 1, o, t == 0); break;
    default: return;
    }
    for (int64_t i = 0; i < n - t; i++) y[(t + i) * ldy + r] = o[i];
}

/* Long batches (prefill): blocks of rows that stay in L2 while every group of tokens passes over them, so each
 * weight is read from memory once. Up to four tokens (decode, short drafts): four segments of the range side by
 * side, as the float tiles walk them: four long streams. */
#define Q8_ROW_BLOCK_BYTES (128 * 1024)

INLINE void matmul_q8(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const eb_cpu_q8_rows *x,
                      int64_t n, float *y, int64_t ldy) {
    size_t rowbytes = (size_t)eb_row_bytes(dtype, cols);
    const unsigned char *base = (const unsigned char *)w;
    if (n > 4) {
        int64_t rb = (int64_t)(Q8_ROW_BLOCK_BYTES / rowbytes);
        if (rb < 1) rb = 1;
        for (int64_t rs = r0; rs < r1; rs += rb) {
            int64_t re = rs + rb < r1 ? rs + rb : r1;
            for (int64_t ts = 0; ts < n; ts += 4) {
                int64_t tn = n - ts < 4 ? n - ts : 4;
                eb_cpu_q8_rows xs = *x;
                xs.q += ts * cols, xs.d += ts * cols / x->block, xs.s16 += ts * cols / 16;
                for (int64_t r = rs; r < re; r++)
                    row_q8(base + (size_t)r * rowbytes, dtype, cols, &xs, tn, y + ts * ldy, ldy, r);
            }
        }
        return;
    }
    int64_t seg = (r1 - r0) / 4;
    for (int64_t i = 0; i < seg; i++)
        for (int g = 0; g < 4; g++) {
            int64_t r = r0 + g * seg + i;
            row_q8(base + (size_t)r * rowbytes, dtype, cols, x, n, y, ldy, r);
        }
    for (int64_t r = r0 + 4 * seg; r < r1; r++) row_q8(base + (size_t)r * rowbytes, dtype, cols, x, n, y, ldy, r);
}

#endif
