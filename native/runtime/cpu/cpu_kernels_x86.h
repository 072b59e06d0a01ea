/* What the x86 kernel files share (cpu_kernels_avx2.c, cpu_kernels_avx512.c): horizontal sums, the K formats'
 * scales and minima, each quantized block's one f32 expression in the q8 precision, and the q8 loops over rows and
 * tokens. Both files include it and compile it with their own instruction sets; every function here uses AVX2 at
 * most, so the two variants compute these steps with the same instructions.
 *
 * The q8 loops call dot_q8 (one row, one to four tokens), which the including file defines first. */
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

/* The lanes of a, b, c and d summed: [sum a, sum b, sum c, sum d] (exact in int32). */
INLINE __m128i sum4_i32(__m128i a, __m128i b, __m128i c, __m128i d) {
    return _mm_hadd_epi32(_mm_hadd_epi32(a, b), _mm_hadd_epi32(c, d));
}
INLINE __m128i fold_i32(__m256i v) { return _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)); }

/* Q4_K / Q5_K: the eight minima (int16) times the sums of their 32 activations (s: the block's sixteen sums of 16),
 * in four lanes to add. */
INLINE __m128i k4_min_part(__m128i m8, const int16_t *s) {
    __m128i s32 = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)s), _mm_loadu_si128((const __m128i *)(s + 8)));
    return _mm_madd_epi16(m8, s32);
}

/* Q6_K: its sixteen scales (int16) times the sums of their 16 activations (the offset of 32 is subtracted as this),
 * in four lanes to add. */
INLINE __m128i q6_offset_part(__m256i sc16, const int16_t *s) {
    return fold_i32(_mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)s)));
}

/* One K-format block's integer sums for each of T tokens, in four int32 lanes to add: ip[t] the quants times the
 * activations times the sub-block scales, mp[t] the minima's (Q4_K, Q5_K) or the offset's (Q6_K) part. Defined by
 * each including file. */
INLINE void k_block_parts(const unsigned char *b, int dtype, int64_t k, const int8_t *const *xq,
                          const int16_t *const *xs, int T, __m128i *ip, __m128i *mp, int pf);

/* A K-format row's dot products with T tokens. Every block's value is cpu_kernels_portable.c's block_k_q8
 * expression of its exact integer sums, added to the token's sum in block order; four blocks' expressions are
 * computed side by side in vector lanes (the same operations on each lane as on the scalar: the same bits), their
 * integer sums reduced together. */
INLINE void k_row_q8(const unsigned char *row, int dtype, int64_t nb, const int8_t *const *xq, const float *const *xd,
                     const int16_t *const *xs, int T, float *out, int pf) {
    const size_t bb = (size_t)eb_format_table[dtype].block_bytes;
    float ksum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t k0 = 0; k0 < nb; k0 += 4) {
        int G = nb - k0 < 4 ? (int)(nb - k0) : 4;
        __m128i ip[4][4], mp[4][4]; /* [block][token] */
        for (int g = 0; g < G; g++) k_block_parts(row + (size_t)(k0 + g) * bb, dtype, k0 + g, xq, xs, T, ip[g], mp[g], pf);
        for (int g = G; g < 4; g++)
            for (int t = 0; t < T; t++) ip[g][t] = mp[g][t] = _mm_setzero_si128();
        /* the blocks' f16 scales (Q6_K: d; Q4_K, Q5_K: d and dmin), four lanes, unused ones 0 */
        uint16_t hd[4] = {0, 0, 0, 0}, hm[4] = {0, 0, 0, 0};
        for (int g = 0; g < G; g++) {
            const unsigned char *b = row + (size_t)(k0 + g) * bb;
            hd[g] = eb_load_u16(dtype == EB_DTYPE_Q6_K ? b + 208 : b), hm[g] = eb_load_u16(b + 2);
        }
        __m128 d = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)hd)), dmin = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)hm));
        UNROLL for (int t = 0; t < T; t++) {
            float dxs[4] = {0.0f, 0.0f, 0.0f, 0.0f}, v[4];
            memcpy(dxs, xd[t] + k0, sizeof(float) * (size_t)G);
            __m128 dx = _mm_loadu_ps(dxs);
            __m128i isum = sum4_i32(ip[0][t], ip[1][t], ip[2][t], ip[3][t]);
            __m128i msum = sum4_i32(mp[0][t], mp[1][t], mp[2][t], mp[3][t]);
            __m128 val;
            if (dtype == EB_DTYPE_Q6_K) /* d * dx * (float)(isum - 32 * msum) */
                val = _mm_mul_ps(_mm_mul_ps(d, dx), _mm_cvtepi32_ps(_mm_sub_epi32(isum, _mm_slli_epi32(msum, 5))));
            else /* d * dx * (float)isum - dmin * dx * (float)msum */
                val = _mm_sub_ps(_mm_mul_ps(_mm_mul_ps(d, dx), _mm_cvtepi32_ps(isum)),
                                 _mm_mul_ps(_mm_mul_ps(dmin, dx), _mm_cvtepi32_ps(msum)));
            _mm_storeu_ps(v, val);
            for (int g = 0; g < G; g++) ksum[t] += v[g];
        }
    }
    for (int t = 0; t < T; t++) out[t] = ksum[t];
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

/* One copy of the loops per quantized format, its dtype a constant in each (the format's choices fold away). */
#define Q8_MATMUL_BY_FORMAT(NAME)                                                                                \
    void NAME(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const eb_cpu_q8_rows *x, int64_t n, \
              float *y, int64_t ldy) {                                                                           \
        switch (dtype) {                                                                                         \
        case EB_DTYPE_Q8_0: matmul_q8(w, EB_DTYPE_Q8_0, r0, r1, cols, x, n, y, ldy); return;                     \
        case EB_DTYPE_Q4_K: matmul_q8(w, EB_DTYPE_Q4_K, r0, r1, cols, x, n, y, ldy); return;                     \
        case EB_DTYPE_Q5_K: matmul_q8(w, EB_DTYPE_Q5_K, r0, r1, cols, x, n, y, ldy); return;                     \
        case EB_DTYPE_Q6_K: matmul_q8(w, EB_DTYPE_Q6_K, r0, r1, cols, x, n, y, ldy); return;                     \
        case EB_DTYPE_MXFP4: matmul_q8(w, EB_DTYPE_MXFP4, r0, r1, cols, x, n, y, ldy); return;                   \
        default: return;                                                                                         \
        }                                                                                                        \
    }

#endif
