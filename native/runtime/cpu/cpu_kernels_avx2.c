/* AVX2 + FMA + F16C kernels. Compiled with -mavx2 -mfma -mf16c and only called after a run-time check.
 *
 * Every dot product (one weight row with one token's activations) is computed the same way: one 8-lane
 * accumulator over 8-column steps, a fixed horizontal sum, then a scalar tail. What changes with the batch is
 * only how many dot products run side by side: 4 rows x 1-3 tokens or 2 rows x 4 tokens when decoding or
 * verifying a short draft, 4 rows x 3 tokens for longer batches (each weight load feeds three tokens, each
 * activation load four rows), in blocks of rows and tokens that stay in L2. So a batch of positions gives
 * bit-identical rows to single steps, and the thread count never changes a result.
 *
 * Up to four tokens read every weight once, so they are bound by how fast memory streams in. Their rows are not
 * neighbours but the i-th rows of equal segments of the thread's range: each chain then walks forward through
 * contiguous memory, long sequential streams the hardware prefetchers follow across pages, where eight
 * neighbouring rows (eight short streams, each one page of an f32 row, then a jump) left them retraining at
 * every tile. Measured on a 2-core EPYC: 4 segments read 15 % (f32) to 40 % (bf16) faster than 8 neighbouring
 * rows, and faster than 2 or 8 segments; two to four tokens in one pass over the segments instead of row blocks
 * re-read from L2 per token: 1.5x, 1.15x and 1.2x (bf16). Eight segments (eight accumulator chains) were slower
 * than four: the stream count, not the FMA latency, bounds a core here. These streaming tiles also request each
 * row's weights ahead of use (AHEAD_BYTES); the batch tiles re-read row blocks from L2 and do not.
 */
#include "cpu_kernels.h"

#ifdef EB_CPU_HAVE_AVX2_BUILD
#include "cpu_kernels_x86.h"
#include "expertbench.h"

/* Everything below is inlined into one copy of the loops per dtype (eb_cpu_matmul_rows_avx2), so that the choice
 * of conversion is made once per call and not per row and step inside the loops (GCC's -O2 does not unswitch
 * loops). The same instructions per dot product otherwise, so the same bits. On the 2-core EPYC, one thread
 * over 2 MiB of bf16 rows in L2: 55 -> 65 GB/s, near what four FMA chains of 4 cycles allow at 4.2 GHz; from
 * memory matmul_stream is unchanged (memory-bound), decode +1-2 % in the fast memory state. */

INLINE __m256 load8(const unsigned char *w, int dtype, int64_t c) {
    switch (dtype) {
    case EB_DTYPE_BF16: {
        __m128i v = _mm_loadu_si128((const __m128i *)(w + 2 * c));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    }
    case EB_DTYPE_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * c)));
    default: return _mm256_loadu_ps((const float *)(w + 4 * c));
    }
}

INLINE float tail(const unsigned char *row, int dtype, int64_t c0, int64_t cols, const float *x) {
    float s = 0.0f;
    for (int64_t c = c0; c < cols; c++) s += eb_load_as_f32(row, dtype, c) * x[c];
    return s;
}


/* How far ahead of the columns being read the streaming tiles ask for each row's weights: 2 KiB, one request
 * per 64-byte line. With the hardware prefetchers alone a core read 512x1024 bf16 products at 82 % of a plain
 * read of the same bytes; with these requests at 92 % (bench/membw/matmul_stream.c, one thread), and two threads
 * went from 62 to 71 GB/s in this machine's fast memory state. 1 KiB and 4 KiB ahead were slower, and so was
 * the same request in L2 only. A request past the end of the rows is harmless: a prefetch never faults. */

INLINE void ahead(const unsigned char *row, int dtype, int64_t c) {
    int64_t byte = c * eb_format_table[dtype].block_bytes; /* a float format: one value a block */
    /* an address, not a pointer into the rows: it may lie past their end */
    if ((byte & 63) == 0) _mm_prefetch((const char *)((uintptr_t)row + (uintptr_t)byte + AHEAD_BYTES), _MM_HINT_T0);
}

/* ---- scaled rows: F8_E4M3_B128, 8 values at a time, eb_e4m3_to_f32's bits times their scale ------------------ */

/* Eight E4M3 bytes as f32: normal values by moving exponent and mantissa into an f32's fields (the exponent 120
 * more: bias 127 for 7), subnormals (exponent 0) as the integer mantissa times 2^-9, both exact; 0x7F the quiet NaN;
 * then the sign. */
INLINE __m256 e4m3x8(const unsigned char *p) {
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7F));
    __m256 normal = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23)));
    __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(0x1p-9f));
    __m256 v = _mm256_blendv_ps(normal, sub, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag)));
    v = _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)),
                         _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F))));
    return _mm256_or_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24)));
}

/* The scales of the rows of a tile: row `row + r * step` reads the grid's row of its scale block. */
INLINE const float *scale_row(const float *sc, int dtype, int64_t cols, int64_t row) {
    return sc + (size_t)(row / eb_format_table[dtype].scale_rows) * (size_t)eb_scale_grid_cols(dtype, cols);
}

/* tail's scaled values: each E4M3 value times its scale, rounded, then as a float weight's. */
INLINE float tail_scaled(const unsigned char *row, int dtype, const float *srow, int64_t c0, int64_t cols,
                         const float *x) {
    int64_t per = eb_format_table[dtype].scale_cols;
    float s = 0.0f;
    for (int64_t c = c0; c < cols; c++) {
        float v = eb_e4m3_to_f32(row[c]) * srow[c / per];
        s += v * x[c];
    }
    return s;
}

/* ---- quantized rows: 32 values at a time, the same values as eb_dequantize_chunk ---------------------------- */

INLINE __m256 cvt_u8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
INLINE __m256 cvt_i8(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

/* 32 unsigned bytes as four vectors of 8 floats, each times d minus m: the 4- and 5-bit K formats */
INLINE void scale_u8x32(__m256i q, float d, float m, __m256 *w) {
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    w[0] = _mm256_sub_ps(_mm256_mul_ps(vd, cvt_u8(lo)), vm);
    w[1] = _mm256_sub_ps(_mm256_mul_ps(vd, cvt_u8(_mm_srli_si128(lo, 8))), vm);
    w[2] = _mm256_sub_ps(_mm256_mul_ps(vd, cvt_u8(hi)), vm);
    w[3] = _mm256_sub_ps(_mm256_mul_ps(vd, cvt_u8(_mm_srli_si128(hi, 8))), vm);
}

/* 16 bytes of 4-bit codes as the 32 int8 entries of values they name, in eb_nibbles_times' order (the low halves'
 * entries, then the high halves'). */
INLINE __m256i nibble_values(const unsigned char *qs, const int8_t *values) {
    __m128i lut = _mm_loadu_si128((const __m128i *)values), q = _mm_loadu_si128((const __m128i *)qs);
    __m128i m4 = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(q, m4)), hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    return _mm256_set_m128i(hi, lo);
}

/* 32 signed bytes as four vectors of 8 floats, the first 16 times d0, the last 16 times d1 */
INLINE void scale_i8x32_halves(__m256i q, float d0, float d1, __m256 *w) {
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m256 v0 = _mm256_set1_ps(d0), v1 = _mm256_set1_ps(d1);
    w[0] = _mm256_mul_ps(v0, cvt_i8(lo));
    w[1] = _mm256_mul_ps(v0, cvt_i8(_mm_srli_si128(lo, 8)));
    w[2] = _mm256_mul_ps(v1, cvt_i8(hi));
    w[3] = _mm256_mul_ps(v1, cvt_i8(_mm_srli_si128(hi, 8)));
}

/* 32 signed bytes as four vectors of 8 floats, each times d: Q8_0 and the formats of eb_nibbles_times */
INLINE void scale_i8x32(__m256i q, float d, __m256 *w) { scale_i8x32_halves(q, d, d, w); }

/* The bytes of half h (chunks 4h .. 4h + 3) of a Q6_K, Q2_K or Q3_K block that its quants come from, loaded once for
 * its four chunks: Q6_K's two 32 bytes of nibbles and its 32 of top bits, Q2_K's and Q3_K's 2-bit fields, Q3_K's
 * third bits. */
typedef struct {
    __m256i lo, lo2, hi;
} k16_half;

INLINE k16_half k16_load(const unsigned char *b, int dtype, int h) {
    k16_half v;
    switch (dtype) {
    case EB_DTYPE_Q6_K:
        v.lo = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
        v.lo2 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
        v.hi = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        return v;
    case EB_DTYPE_Q2_K: v.lo = v.lo2 = v.hi = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * h)); return v;
    default:
        v.lo = v.lo2 = _mm256_loadu_si256((const __m256i *)(b + 32 + 32 * h));
        v.hi = _mm256_loadu_si256((const __m256i *)b);
        return v;
    }
}

/* eb_k16_quant's 32 unsigned quants of chunk 4h + s, from its half's bytes. */
INLINE __m256i k16_quants(k16_half v, int dtype, int h, int s) {
    const __m256i three = _mm256_set1_epi8(3);
    if (dtype == EB_DTYPE_Q6_K) {
        __m256i ql = s & 1 ? v.lo2 : v.lo;
        ql = _mm256_and_si256(s >> 1 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0x0F));
        __m256i qh = _mm256_and_si256(_mm256_srli_epi16(v.hi, 2 * s), three);
        return _mm256_or_si256(ql, _mm256_slli_epi16(qh, 4));
    }
    __m256i q = _mm256_and_si256(_mm256_srli_epi16(v.lo, 2 * s), three);
    if (dtype == EB_DTYPE_Q2_K) return q;
    __m256i third = _mm256_and_si256(_mm256_srli_epi16(v.hi, 4 * h + s), _mm256_set1_epi8(1));
    return _mm256_or_si256(q, _mm256_slli_epi16(third, 2));
}

/* Four 8-byte rows (codebook entries, sign bytes) as one vector, loaded straight into its lanes. */
INLINE __m256i rows8x4(const void *p0, const void *p1, const void *p2, const void *p3) {
    __m128i lo = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p0), _mm_loadl_epi64((const __m128i *)p1));
    __m128i hi = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p2), _mm_loadl_epi64((const __m128i *)p3));
    return _mm256_set_m128i(hi, lo);
}

/* Eight 4-byte codebook entries (IQ3_XXS, IQ3_S) of one grid as one vector. */
INLINE __m256i rows4x8(const uint8_t (*grid)[4], const unsigned *k) {
    return _mm256_set_epi32((int)eb_load_u32(grid[k[7]]), (int)eb_load_u32(grid[k[6]]), (int)eb_load_u32(grid[k[5]]),
                            (int)eb_load_u32(grid[k[4]]), (int)eb_load_u32(grid[k[3]]), (int)eb_load_u32(grid[k[2]]),
                            (int)eb_load_u32(grid[k[1]]), (int)eb_load_u32(grid[k[0]]));
}

/* 32 sign bits (bit i value i's: 1 negative) as 32 bytes of +1 / -1: byte i of the word is bit i % 8 of byte i / 8,
 * spread by a shuffle and compared with its bit. */
INLINE __m256i sign_bits32(uint32_t bits) {
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                    _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201u);
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(1));
}

/* Chunk j of an i-quant block (eb_iq_quants): its 32 grid magnitudes (unsigned bytes: four 8-byte codebook rows, or
 * eight 4-byte ones) and *signs their signs as bytes of +1 / -1 (four rows of eb_iq_sign_bytes). */
INLINE __m256i iq_grid(const unsigned char *b, int dtype, int j, __m256i *signs) {
    const unsigned char *g = b + 2 + 8 * j;
    if (dtype == EB_DTYPE_IQ2_XS) { /* a 16-bit word a group: grid index, then sign index */
        unsigned q0 = eb_load_u16(g), q1 = eb_load_u16(g + 2), q2 = eb_load_u16(g + 4), q3 = eb_load_u16(g + 6);
        *signs = rows8x4(eb_iq_sign_bytes[q0 >> 9], eb_iq_sign_bytes[q1 >> 9], eb_iq_sign_bytes[q2 >> 9],
                         eb_iq_sign_bytes[q3 >> 9]);
        return rows8x4(eb_iq2xs_grid[q0 & 511], eb_iq2xs_grid[q1 & 511], eb_iq2xs_grid[q2 & 511], eb_iq2xs_grid[q3 & 511]);
    }
    if (dtype == EB_DTYPE_IQ2_S) { /* 10-bit indices (the top 2 bits at 66 + j), and a sign bit a value: the 32 bits
                                    * at 34 + 4j, spread as IQ3_S's */
        unsigned hi = b[66 + j];
        const unsigned char *lo = b + 2 + 4 * j;
        *signs = sign_bits32(eb_load_u32(b + 34 + 4 * j));
        return rows8x4(eb_iq2s_grid[lo[0] | (hi & 3) << 8], eb_iq2s_grid[lo[1] | ((hi >> 2) & 3) << 8],
                       eb_iq2s_grid[lo[2] | ((hi >> 4) & 3) << 8], eb_iq2s_grid[lo[3] | ((hi >> 6) & 3) << 8]);
    }
    if (dtype == EB_DTYPE_IQ3_S) { /* 9-bit indices, and a sign bit a value: byte i of the 32 bits at 74 + 4j is
                                    * bit i % 8 of byte i / 8, spread by a shuffle and compared with its bit */
        unsigned k[8], hi = b[66 + j];
        UNROLL for (int i = 0; i < 8; i++) k[i] = g[i] | ((hi >> i) & 1) << 8;
        *signs = sign_bits32(eb_load_u32(b + 74 + 4 * j));
        return rows4x8(eb_iq3s_grid, k);
    }
    uint32_t w = eb_iq_word(b, dtype, j);
    *signs = rows8x4(eb_iq_sign_bytes[w & 127], eb_iq_sign_bytes[(w >> 7) & 127], eb_iq_sign_bytes[(w >> 14) & 127],
                     eb_iq_sign_bytes[(w >> 21) & 127]);
    if (dtype == EB_DTYPE_IQ3_XXS) {
        unsigned k[8];
        UNROLL for (int i = 0; i < 8; i++) k[i] = g[i];
        return rows4x8(eb_iq3xxs_grid, k);
    }
    return rows8x4(eb_iq2xxs_grid[g[0]], eb_iq2xxs_grid[g[1]], eb_iq2xxs_grid[g[2]], eb_iq2xxs_grid[g[3]]);
}

/* The odd integer scales 2 s + 1 of chunk j's halves as int16: half 0's in the low lane, half 1's in the high. */
INLINE __m256i iq_scales16(const unsigned char *b, int dtype, int j) {
    return _mm256_set_m128i(_mm_set1_epi16((short)(2 * eb_iq_scale(b, dtype, j, 1) + 1)),
                            _mm_set1_epi16((short)(2 * eb_iq_scale(b, dtype, j, 0) + 1)));
}

/* Chunk j of a 1-bit block (eb_iq1_quants): its 32 grid values (-1, 0, +1) from four 8-byte rows, *dsign its groups'
 * delta signs as 8 bytes of +1 / -1 each. */
INLINE __m256i iq1_grid(const unsigned char *b, int dtype, int j, __m256i *dsign) {
    unsigned k[4], neg[4]; /* each group's grid index and whether its delta is negative */
    if (dtype == EB_DTYPE_IQ1_M) {
        unsigned h = eb_load_u16(b + 32 + 2 * j);
        UNROLL for (int l = 0; l < 4; l++) k[l] = b[4 * j + l] | ((h >> (4 * l)) & 7) << 8, neg[l] = (h >> (4 * l + 3)) & 1;
    } else {
        unsigned w = eb_load_u16(b + 34 + 2 * j);
        UNROLL for (int l = 0; l < 4; l++) k[l] = b[2 + 4 * j + l] | ((w >> (3 * l)) & 7) << 8, neg[l] = w >> 15;
    }
    const int64_t plus = 0x0101010101010101, minus = -1;
    *dsign = _mm256_set_epi64x(neg[3] ? minus : plus, neg[2] ? minus : plus, neg[1] ? minus : plus, neg[0] ? minus : plus);
    return rows8x4(eb_iq1s_grid[k[0]], eb_iq1s_grid[k[1]], eb_iq1s_grid[k[2]], eb_iq1s_grid[k[3]]);
}

/* The odd integer scales 2 s + 1 of a 1-bit chunk's halves as int16: half 0's in the low lane, half 1's in the high. */
INLINE __m256i iq1_scales16(const unsigned char *b, int dtype, int j) {
    return _mm256_set_m128i(_mm_set1_epi16((short)(2 * eb_iq1_scale(b, dtype, j, 1) + 1)),
                            _mm_set1_epi16((short)(2 * eb_iq1_scale(b, dtype, j, 0) + 1)));
}

/* A 32-value block of Q8_0, MXFP4, Q4_0, Q4_1 or IQ4_NL as its 32 signed quants; *d its scale (Q4_1: then plus its minimum). */
INLINE __m256i block32_quants(const unsigned char *b, int dtype, float *d) {
    switch (dtype) {
    case EB_DTYPE_Q8_0: *d = _cvtsh_ss(eb_load_u16(b)); return _mm256_loadu_si256((const __m256i *)(b + 2));
    case EB_DTYPE_MXFP4: *d = eb_e8m0_half(b[0]); return nibble_values(b + 1, eb_mxfp4_values);
    case EB_DTYPE_Q4_1: *d = _cvtsh_ss(eb_load_u16(b)); return nibble_values(b + 4, eb_q4_1_values);
    case EB_DTYPE_IQ4_NL: *d = _cvtsh_ss(eb_load_u16(b)); return nibble_values(b + 2, eb_iq4nl_values);
    default: *d = _cvtsh_ss(eb_load_u16(b)); return nibble_values(b + 2, eb_q4_0_values);
    }
}

/* Chunk c of a Q8_0, MXFP4, Q4_0, Q4_1, IQ4_NL, IQ4_XS, Q6_K, Q2_K, Q3_K or i-quant row (Q4_K and Q5_K: dequant32_k4, their scales unpacked once per block). */
INLINE void dequant32(const unsigned char *row, int dtype, int64_t c, __m256 *w) {
    int j;
    const unsigned char *b = eb_chunk_block(row, dtype, c, &j);
    switch (dtype) {
    case EB_DTYPE_Q8_0:
    case EB_DTYPE_MXFP4:
    case EB_DTYPE_Q4_0:
    case EB_DTYPE_IQ4_NL: {
        float d;
        __m256i q = block32_quants(b, dtype, &d);
        scale_i8x32(q, d, w);
        return;
    }
    case EB_DTYPE_IQ4_XS:
        scale_i8x32(nibble_values(b + 8 + 16 * j, eb_iq4nl_values), _cvtsh_ss(eb_load_u16(b)) * (float)eb_iq4xs_scale(b, j), w);
        return;
    case EB_DTYPE_Q4_1: { /* (d q) + m, as eb_dequantize_chunk */
        float d;
        __m256i q = block32_quants(b, dtype, &d);
        __m256 m = _mm256_set1_ps(_cvtsh_ss(eb_load_u16(b + 2)));
        scale_i8x32(q, d, w);
        for (int i = 0; i < 4; i++) w[i] = _mm256_add_ps(w[i], m);
        return;
    }
    case EB_DTYPE_IQ2_XXS:
    case EB_DTYPE_IQ3_XXS:
    case EB_DTYPE_IQ2_XS:
    case EB_DTYPE_IQ3_S:
    case EB_DTYPE_IQ2_S: { /* eb_dequantize_chunk's: each half's scale times the signed grid values */
        __m256i sg, g = iq_grid(b, dtype, j, &sg);
        scale_i8x32_halves(_mm256_sign_epi8(g, sg), eb_iq_half_d(b, dtype, j, 0), eb_iq_half_d(b, dtype, j, 1), w);
        return;
    }
    case EB_DTYPE_IQ1_S:
    case EB_DTYPE_IQ1_M: { /* eb_dequantize_chunk's dl (grid value + delta), per 8 values */
        __m256i ds, q = iq1_grid(b, dtype, j, &ds);
        float d = eb_iq1_d(b, dtype), dl[2] = {d * (float)(2 * eb_iq1_scale(b, dtype, j, 0) + 1),
                                               d * (float)(2 * eb_iq1_scale(b, dtype, j, 1) + 1)};
        __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        __m128i dlo = _mm256_castsi256_si128(ds), dhi = _mm256_extracti128_si256(ds, 1);
        const __m256 eighth = _mm256_set1_ps(0.125f);
        w[0] = _mm256_mul_ps(_mm256_set1_ps(dl[0]), _mm256_add_ps(cvt_i8(lo), _mm256_mul_ps(eighth, cvt_i8(dlo))));
        w[1] = _mm256_mul_ps(_mm256_set1_ps(dl[0]), _mm256_add_ps(cvt_i8(_mm_srli_si128(lo, 8)), _mm256_mul_ps(eighth, cvt_i8(_mm_srli_si128(dlo, 8)))));
        w[2] = _mm256_mul_ps(_mm256_set1_ps(dl[1]), _mm256_add_ps(cvt_i8(hi), _mm256_mul_ps(eighth, cvt_i8(dhi))));
        w[3] = _mm256_mul_ps(_mm256_set1_ps(dl[1]), _mm256_add_ps(cvt_i8(_mm_srli_si128(hi, 8)), _mm256_mul_ps(eighth, cvt_i8(_mm_srli_si128(dhi, 8)))));
        return;
    }
    case EB_DTYPE_Q6_K:
    case EB_DTYPE_Q2_K:
    case EB_DTYPE_Q3_K: { /* eb_dequantize_chunk's dl * (q - offset), Q2_K's then less ml, per 16 values */
        __m256i q = k16_quants(k16_load(b, dtype, j / 4), dtype, j / 4, j % 4);
        q = _mm256_sub_epi8(q, _mm256_set1_epi8((char)eb_k16_offset(dtype)));
        float d = _cvtsh_ss(eb_load_u16(b + eb_k16_d(dtype)));
        scale_i8x32_halves(q, d * (float)eb_k16_scale(b, dtype, 2 * j), d * (float)eb_k16_scale(b, dtype, 2 * j + 1), w);
        if (dtype == EB_DTYPE_Q2_K) {
            float dmin = _cvtsh_ss(eb_load_u16(b + 82));
            __m256 m0 = _mm256_set1_ps(dmin * (float)(b[2 * j] >> 4)), m1 = _mm256_set1_ps(dmin * (float)(b[2 * j + 1] >> 4));
            w[0] = _mm256_sub_ps(w[0], m0), w[1] = _mm256_sub_ps(w[1], m0);
            w[2] = _mm256_sub_ps(w[2], m1), w[3] = _mm256_sub_ps(w[3], m1);
        }
        return;
    }
    case EB_DTYPE_Q5_0:
    case EB_DTYPE_Q5_1: { /* small rows (a K-quant's fallback): the scalar values */
        float v[32];
        eb_dequantize_chunk(row, dtype, c, v);
        for (int i = 0; i < 4; i++) w[i] = _mm256_loadu_ps(v + 8 * i);
        return;
    }
    default: return;
    }
}

/* A Q4_K / Q5_K block's eight scales and minima times its d and dmin: dequant32's dl and ml for each of its chunks,
 * unpacked once per block (eb_k4_scale_min, four bytes at a time). */
INLINE void k4_block_scales(const unsigned char *b, float *dl, float *ml) {
    uint32_t u[3];
    memcpy(u, b + 4, sizeof u);
    uint32_t w[4] = {u[0] & 0x3f3f3f3fu, (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4,
                     u[1] & 0x3f3f3f3fu, ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4};
    unsigned char v[16];
    memcpy(v, w, sizeof v); /* scales 0-7, then minima 0-7 */
    float d = _cvtsh_ss(eb_load_u16(b)), dmin = _cvtsh_ss(eb_load_u16(b + 2));
    for (int j = 0; j < 8; j++) dl[j] = d * (float)v[j], ml[j] = dmin * (float)v[8 + j];
}

/* dequant32 of chunk j of a Q4_K / Q5_K block whose scales k4_block_scales gave. */
INLINE void dequant32_k4(const unsigned char *b, int q5, int j, float dl, float ml, __m256 *w) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i q = _mm256_loadu_si256((const __m256i *)(b + 16 + (q5 ? 32 : 0) + 32 * (j / 2)));
    q = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(q, 4) : q, low4);
    if (q5) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(b + 16));
        h = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(j)), _mm256_set1_epi8(1));
        q = _mm256_or_si256(q, _mm256_slli_epi16(h, 4));
    }
    scale_u8x32(q, dl, ml, w);
}

/* The streaming request for a quantized row: once per 64-byte line of its blocks, AHEAD_BYTES ahead. */
INLINE void ahead_q(const unsigned char *row, int dtype, int64_t c) {
    const eb_format_traits *f = &eb_format_table[dtype];
    int64_t byte = c * EB_CHUNK * f->block_bytes / f->block, chunk = EB_CHUNK * f->block_bytes / f->block;
    if ((byte & 63) < chunk) _mm_prefetch((const char *)((uintptr_t)row + (uintptr_t)byte + AHEAD_BYTES), _MM_HINT_T0);
}

/* R rows x T tokens of dot products, one accumulator each; rows at w + r * rowbytes, tokens at x + t * cols.
 * PF: request each row's weights AHEAD_BYTES ahead (the streaming tiles of decode and short drafts). A quantized
 * row is read 32 values at a time and its four vectors of 8 go into each accumulator in column order: the same
 * products and sums as the float loop over its dequantized row (whose empty tail adds 0 as here). A scaled row
 * (sc: the weight's scale grid; tile row r is the weight's row `row + r * step`) is read 8 values at a time, each
 * vector times its scale (eight values share one: scale_cols is a whole number of chunks), then as the float loop. */
#define TILE(NAME, R, T, PF)                                                                                     \
    INLINE void NAME(const unsigned char *w, size_t rowbytes, int dtype, int64_t cols, const float *x,            \
                     float *out, const float *sc, int64_t row, int64_t step) {                                   \
        __m256 acc[R][T];                                                                                        \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();   \
        if (eb_dtype_scaled(dtype)) {                                                                            \
            int64_t per = eb_format_table[dtype].scale_cols, c8 = cols & ~(int64_t)7;                             \
            const float *srow[R];                                                                                \
            UNROLL for (int r = 0; r < R; r++) srow[r] = scale_row(sc, dtype, cols, row + r * step);             \
            for (int64_t c = 0; c < c8; c += 8) {                                                                \
                __m256 xv[T];                                                                                    \
                UNROLL for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(x + t * cols + c);                    \
                UNROLL for (int r = 0; r < R; r++) {                                                             \
                    if (PF) ahead(w + r * rowbytes, dtype, c);                                                   \
                    __m256 wv = _mm256_mul_ps(e4m3x8(w + r * rowbytes + c), _mm256_set1_ps(srow[r][c / per]));  \
                    UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);        \
                }                                                                                                \
            }                                                                                                    \
            UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) out[r * T + t] =               \
                hsum(acc[r][t]) + tail_scaled(w + r * rowbytes, dtype, srow[r], c8, cols, x + t * cols);         \
            return;                                                                                              \
        }                                                                                                        \
        if (eb_dtype_quantized(dtype)) {                                                                         \
            const eb_format_traits *f = &eb_format_table[dtype];                                                 \
            int per = f->block / EB_CHUNK, k4 = dtype == EB_DTYPE_Q4_K || dtype == EB_DTYPE_Q5_K;                \
            for (int64_t kb = 0; kb < cols / f->block; kb++) {                                                   \
                size_t bb = (size_t)f->block_bytes * (size_t)kb;                                                 \
                float dl[R][8], ml[R][8]; /* Q4_K, Q5_K: the block's scales, unpacked once for its 8 chunks */   \
                if (k4) UNROLL for (int r = 0; r < R; r++) k4_block_scales(w + r * rowbytes + bb, dl[r], ml[r]); \
                for (int j = 0; j < per; j++) {                                                                  \
                    int64_t c = per * kb + j;                                                                    \
                    UNROLL for (int r = 0; r < R; r++) {                                                         \
                        if (PF) ahead_q(w + r * rowbytes, dtype, c);                                             \
                        __m256 wv[4];                                                                            \
                        if (k4) dequant32_k4(w + r * rowbytes + bb, dtype == EB_DTYPE_Q5_K, j, dl[r][j], ml[r][j], wv); \
                        else dequant32(w + r * rowbytes, dtype, c, wv);                                          \
                        UNROLL for (int t = 0; t < T; t++) UNROLL for (int i = 0; i < 4; i++) acc[r][t] =        \
                            _mm256_fmadd_ps(wv[i], _mm256_loadu_ps(x + t * cols + EB_CHUNK * c + 8 * i),         \
                                            acc[r][t]);                                                          \
                    }                                                                                            \
                }                                                                                                \
            }                                                                                                    \
            UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) out[r * T + t] =               \
                hsum(acc[r][t]) + 0.0f;                                                                          \
            return;                                                                                              \
        }                                                                                                        \
        int64_t c8 = cols & ~(int64_t)7;                                                                         \
        for (int64_t c = 0; c < c8; c += 8) {                                                                    \
            __m256 xv[T];                                                                                        \
            UNROLL for (int t = 0; t < T; t++) xv[t] = _mm256_loadu_ps(x + t * cols + c);                        \
            UNROLL for (int r = 0; r < R; r++) {                                                                 \
                if (PF) ahead(w + r * rowbytes, dtype, c);                                                       \
                __m256 wv = load8(w + r * rowbytes, dtype, c);                                                   \
                UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);            \
            }                                                                                                    \
        }                                                                                                        \
        UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < T; t++) out[r * T + t] =                   \
            hsum(acc[r][t]) + tail(w + r * rowbytes, dtype, c8, cols, x + t * cols);                             \
    }

TILE(tile_4x3, 4, 3, 0) /* longer batches: row blocks re-read from L2 */
TILE(tile_4x1, 4, 1, 0)
TILE(tile_1x3, 1, 3, 0)
TILE(tile_1x1, 1, 1, 0)
TILE(stream_4x1, 4, 1, 1) /* decoding and short drafts: weight streams */
TILE(stream_4x2, 4, 2, 1)
TILE(stream_4x3, 4, 3, 1)
TILE(stream_2x4, 2, 4, 1)
TILE(stream_1x1, 1, 1, 1)
TILE(stream_1x2, 1, 2, 1)
TILE(stream_1x3, 1, 3, 1)
TILE(stream_1x4, 1, 4, 1)

/* Up to four tokens: rows r0 + i + g * seg (g < S segments) side by side for each i < seg, then the rows left
 * over one at a time. */
#define SEGMENTS(S, TILE_S, TILE1, T)                                                                            \
    do {                                                                                                         \
        int64_t seg = (r1 - r0) / (S);                                                                           \
        for (int64_t i = 0; i < seg; i++) {                                                                      \
            TILE_S(base + (size_t)(r0 + i) * rowbytes, (size_t)seg * rowbytes, dtype, cols, x, o, scale, r0 + i, \
                   seg);                                                                                         \
            for (int g = 0; g < (S); g++)                                                                        \
                for (int t = 0; t < (T); t++) y[t * ldy + r0 + g * seg + i] = o[g * (T) + t];                    \
        }                                                                                                        \
        for (int64_t r = r0 + (S) * seg; r < r1; r++) {                                                         \
            TILE1(base + (size_t)r * rowbytes, rowbytes, dtype, cols, x, o, scale, r, 1);                        \
            for (int t = 0; t < (T); t++) y[t * ldy + r] = o[t];                                                 \
        }                                                                                                        \
    } while (0)

#define ROW_BLOCK_BYTES (64 * 1024)
#define TOKEN_BLOCK_BYTES (64 * 1024)

INLINE void matmul_rows(const void *w, int dtype, const float *scale, int64_t r0, int64_t r1, int64_t cols,
                        const float *x, int64_t n, float *y, int64_t ldy) {
    const unsigned char *base = (const unsigned char *)w;
    size_t rowbytes = (size_t)eb_row_bytes(dtype, cols);
    float o[16];
    switch (n) { /* decoding, or verifying a short draft */
    case 1: SEGMENTS(4, stream_4x1, stream_1x1, 1); return;
    case 2: SEGMENTS(4, stream_4x2, stream_1x2, 2); return;
    case 3: SEGMENTS(4, stream_4x3, stream_1x3, 3); return;
    case 4: SEGMENTS(2, stream_2x4, stream_1x4, 4); return; /* four rows of four would not fit the 16 registers */
    default: break;
    }
    int64_t rb = (int64_t)(ROW_BLOCK_BYTES / rowbytes) & ~(int64_t)3, tb = (int64_t)(TOKEN_BLOCK_BYTES / ((size_t)cols * 4));
    if (rb < 4) rb = 4;
    if (tb < 3) tb = 3;
    tb -= tb % 3;
    for (int64_t rs = r0; rs < r1; rs += rb) {
        int64_t re = rs + rb < r1 ? rs + rb : r1;
        for (int64_t ts = 0; ts < n; ts += tb) {
            int64_t te = ts + tb < n ? ts + tb : n;
            int64_t r = rs;
            for (; r + 4 <= re; r += 4) {
                const unsigned char *wr = base + (size_t)r * rowbytes;
                int64_t t = ts;
                for (; t + 3 <= te; t += 3) {
                    tile_4x3(wr, rowbytes, dtype, cols, x + t * cols, o, scale, r, 1);
                    for (int i = 0; i < 4; i++)
                        for (int k = 0; k < 3; k++) y[(t + k) * ldy + r + i] = o[3 * i + k];
                }
                for (; t < te; t++) {
                    tile_4x1(wr, rowbytes, dtype, cols, x + t * cols, o, scale, r, 1);
                    for (int i = 0; i < 4; i++) y[t * ldy + r + i] = o[i];
                }
            }
            for (; r < re; r++) {
                const unsigned char *wr = base + (size_t)r * rowbytes;
                int64_t t = ts;
                for (; t + 3 <= te; t += 3) {
                    tile_1x3(wr, rowbytes, dtype, cols, x + t * cols, o, scale, r, 1);
                    for (int k = 0; k < 3; k++) y[(t + k) * ldy + r] = o[k];
                }
                for (; t < te; t++) {
                    tile_1x1(wr, rowbytes, dtype, cols, x + t * cols, o, scale, r, 1);
                    y[t * ldy + r] = o[0];
                }
            }
        }
    }
}

/* ---- the q8 precision: integer products of 32 values, one f32 sum per row -------------------------------------
 *
 * Each 32-value chunk's products are summed exactly in int32 lanes (maddubs then madd: unsigned quants times signed
 * activations, or both signed through the sign trick; no int16 sum can saturate, as the largest quant magnitude times
 * 127 times 2 stays below 32768), then added into 8 f32 lanes times the chunk's scale, in chunk order; a row's
 * K-format minima and Q6_K's offset go into one scalar sum beside them. The lanes are added once at the end. Every
 * (row, token) dot is this same sequence, so the batch and the thread split never change a bit. */

INLINE __m256i sum_u8_i8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

INLINE __m256i sum_i8_i8(__m256i a, __m256i b) { return sum_u8_i8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a)); }

INLINE __m256 scaled(__m256i isum, float scale, __m256 acc) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(scale), acc);
}

/* pshufb masks that broadcast one 16-bit element of a 128-bit lane: BCAST[j] repeats bytes (2j, 2j + 1). */
static const uint8_t BCAST[8][16] = {
#define B2(j) 2 * j, 2 * j + 1
#define ROW(j) {B2(j), B2(j), B2(j), B2(j), B2(j), B2(j), B2(j), B2(j)}
    ROW(0), ROW(1), ROW(2), ROW(3), ROW(4), ROW(5), ROW(6), ROW(7),
#undef ROW
#undef B2
};

/* element e of each lane's 8 int16 in the low lane, element e + 1 in the high lane */
INLINE __m256i pair_of(__m256i v, int e) {
    return _mm256_shuffle_epi8(v, _mm256_set_m128i(_mm_loadu_si128((const __m128i *)BCAST[e + 1]),
                                                   _mm_loadu_si128((const __m128i *)BCAST[e])));
}

/* T (1..4) dot products of one row, with the activations of tokens t0 .. t0 + T - 1: the row's blocks are read and
 * unpacked once for the T tokens, and each token's sums take exactly the steps a single token's take (the same
 * integer sums, the same float operations in the same order), so a batch gives the bits of single steps. */
INLINE void dot_q8(const unsigned char *row, int dtype, int64_t cols, const eb_cpu_q8_rows *xr, int64_t t0, int T,
                   float *out, int pf) {
    __m256 acc[4][2]; /* Q8_0, MXFP4, Q4_0: per token, the even and odd blocks' lanes */
    float ksum[4];    /* the K formats: per token, one sum of their blocks; Q4_1: of its minima's terms */
    const int8_t *xq[4];
    const float *xd[4];
    const int16_t *xs[4];
    q8_tokens(xr, cols, t0, T, xq, xd, xs);
    UNROLL for (int t = 0; t < T; t++) {
        acc[t][0] = acc[t][1] = _mm256_setzero_ps();
        ksum[t] = 0.0f;
    }
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const eb_format_traits *f = &eb_format_table[dtype];
    int64_t nb = cols / f->block;
    for (int64_t k = 0; k < nb; k++) {
        const unsigned char *b = row + (size_t)k * (size_t)f->block_bytes;
        if (pf) _mm_prefetch((const char *)((uintptr_t)b + AHEAD_BYTES), _MM_HINT_T0);
        if (f->block == 32) {
            float dw;
            __m256i w = block32_quants(b, dtype, &dw);
            __m256i aw = _mm256_sign_epi8(w, w);
            UNROLL for (int t = 0; t < T; t++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(xq[t] + 32 * k));
                __m256i isum = sum_u8_i8(aw, _mm256_sign_epi8(x, w));
                acc[t][k & 1] = scaled(isum, dw * xd[t][k], acc[t][k & 1]);
                if (dtype == EB_DTYPE_Q4_1) ksum[t] += eb_q4_1_min_term(b, xd[t][k], xs[t] + 2 * k);
            }
            continue;
        }
        /* the K formats: the block's integer sum (hsum_i32 of the lanes), then cpu_kernels_portable.c's block_k_q8
         * expression for it, the same float operations in the same order */
        if (pf) _mm_prefetch((const char *)((uintptr_t)b + 64 + AHEAD_BYTES), _MM_HINT_T0);
        __m256i iacc[4];
        UNROLL for (int t = 0; t < T; t++) iacc[t] = _mm256_setzero_si256();
        if (dtype == EB_DTYPE_IQ4_XS) { /* per chunk: grid values times activations (the sign trick), times its scale */
            if (pf) _mm_prefetch((const char *)((uintptr_t)b + 128 + AHEAD_BYTES), _MM_HINT_T0);
            for (int j = 0; j < 8; j++) {
                __m256i w = nibble_values(b + 8 + 16 * j, eb_iq4nl_values), aw = _mm256_sign_epi8(w, w);
                __m256i sc = _mm256_set1_epi16((short)eb_iq4xs_scale(b, j));
                UNROLL for (int t = 0; t < T; t++) {
                    __m256i x = _mm256_loadu_si256((const __m256i *)(xq[t] + 256 * k + 32 * j));
                    __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
                    iacc[t] = _mm256_add_epi32(iacc[t], _mm256_madd_epi16(p16, sc));
                }
            }
            /* cpu_kernels_portable.c's block_k_q8 expression */
            UNROLL for (int t = 0; t < T; t++) ksum[t] += _cvtsh_ss(eb_load_u16(b)) * xd[t][k] * (float)hsum_i32(iacc[t]);
            continue;
        }
        if (eb_dtype_iq1(dtype)) { /* per chunk: the grid values times the activations (the sign trick), and the
                                    * deltas' signs times them, each times 2 s + 1 per 16 */
            __m256i macc[4];
            UNROLL for (int t = 0; t < T; t++) macc[t] = _mm256_setzero_si256();
            const __m256i ones = _mm256_set1_epi8(1);
            for (int j = 0; j < 8; j++) {
                __m256i ds, g = iq1_grid(b, dtype, j, &ds), ag = _mm256_sign_epi8(g, g), sc = iq1_scales16(b, dtype, j);
                UNROLL for (int t = 0; t < T; t++) {
                    __m256i x = _mm256_loadu_si256((const __m256i *)(xq[t] + 256 * k + 32 * j));
                    iacc[t] = _mm256_add_epi32(iacc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(ag, _mm256_sign_epi8(x, g)), sc));
                    macc[t] = _mm256_add_epi32(macc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(ones, _mm256_sign_epi8(x, ds)), sc));
                }
            }
            /* cpu_kernels_portable.c's block_k_q8 expression */
            UNROLL for (int t = 0; t < T; t++)
                ksum[t] += eb_iq1_d(b, dtype) * xd[t][k] * ((float)hsum_i32(iacc[t]) + 0.125f * (float)hsum_i32(macc[t]));
            continue;
        }
        if (eb_dtype_iq(dtype)) { /* per chunk: grid magnitudes (at most 62) times the signed activations, times
                                   * 2 s + 1 per 16 */
            for (int j = 0; j < 8; j++) {
                __m256i sg, g = iq_grid(b, dtype, j, &sg), sc = iq_scales16(b, dtype, j);
                UNROLL for (int t = 0; t < T; t++) {
                    __m256i x = _mm256_loadu_si256((const __m256i *)(xq[t] + 256 * k + 32 * j));
                    __m256i p16 = _mm256_maddubs_epi16(g, _mm256_sign_epi8(x, sg));
                    iacc[t] = _mm256_add_epi32(iacc[t], _mm256_madd_epi16(p16, sc));
                }
            }
            /* cpu_kernels_portable.c's block_k_q8 expression */
            UNROLL for (int t = 0; t < T; t++) ksum[t] += _cvtsh_ss(eb_load_u16(b)) * xd[t][k] * (float)hsum_i32(iacc[t]);
            continue;
        }
        if (dtype == EB_DTYPE_Q6_K || dtype == EB_DTYPE_Q2_K || dtype == EB_DTYPE_Q3_K) { /* unsigned quants, per 16 */
            int q2 = dtype == EB_DTYPE_Q2_K;
            if (pf && !q2) _mm_prefetch((const char *)((uintptr_t)b + 128 + AHEAD_BYTES), _MM_HINT_T0);
            __m128i nib = _mm_loadu_si128((const __m128i *)b), m4 = _mm_set1_epi8(0x0F); /* Q2_K's scales, minima */
            __m256i sc16 = k16_scales(b, dtype);
            for (int h = 0; h < 2; h++) {
                /* this half's 8 scales in both lanes: chunk q4 takes scales 2 q4 (low lane) and 2 q4 + 1 (high) */
                __m256i sch = _mm256_broadcastsi128_si256(h ? _mm256_extracti128_si256(sc16, 1)
                                                            : _mm256_castsi256_si128(sc16));
                k16_half v = k16_load(b, dtype, h);
                for (int q4 = 0; q4 < 4; q4++) {
                    int j = 4 * h + q4;
                    __m256i q = k16_quants(v, dtype, h, q4), scj = pair_of(sch, 2 * q4);
                    UNROLL for (int t = 0; t < T; t++) {
                        __m256i p16 = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)(xq[t] + 256 * k + 32 * j)));
                        iacc[t] = _mm256_add_epi32(iacc[t], _mm256_madd_epi16(p16, scj));
                    }
                }
            }
            if (q2) {
                __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(nib, 4), m4));
                UNROLL for (int t = 0; t < T; t++)
                    ksum[t] += k4_block_value(b + 80, xd[t][k], hsum_i32(iacc[t]), per16_sum(m16, xs[t] + 16 * k));
            } else {
                UNROLL for (int t = 0; t < T; t++)
                    ksum[t] += k16_block_value(b, dtype, xd[t][k], hsum_i32(iacc[t]), per16_sum(sc16, xs[t] + 16 * k));
            }
            continue;
        }
        int q5 = dtype == EB_DTYPE_Q5_K;
        __m128i sc8, m8;
        k4_scales(b + 4, &sc8, &m8);
        __m256i scw = _mm256_broadcastsi128_si256(sc8);
        __m256i hbits = q5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        const unsigned char *qs = b + 16 + (q5 ? 32 : 0);
        for (int i = 0; i < 4; i++) {
            __m256i both = _mm256_loadu_si256((const __m256i *)(qs + 32 * i));
            __m256i lo = _mm256_and_si256(both, low4), hi = _mm256_and_si256(_mm256_srli_epi16(both, 4), low4);
            if (q5) {
                __m256i one = _mm256_set1_epi8(1);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * i), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * i + 1), one), 4));
            }
            /* the pair's two scales: sc[2i] for lo (both lanes), sc[2i + 1] for hi */
            __m256i se = _mm256_shuffle_epi8(scw, _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)BCAST[2 * i])));
            __m256i so = _mm256_shuffle_epi8(scw, _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)BCAST[2 * i + 1])));
            UNROLL for (int t = 0; t < T; t++) {
                const int8_t *x = xq[t] + 256 * k;
                __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(x + 64 * i)));
                __m256i phi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 64 * i + 32)));
                iacc[t] = _mm256_add_epi32(iacc[t], _mm256_add_epi32(_mm256_madd_epi16(plo, se), _mm256_madd_epi16(phi, so)));
            }
        }
        UNROLL for (int t = 0; t < T; t++)
            ksum[t] += k4_block_value(b, xd[t][k], hsum_i32(iacc[t]), k4_min_sum(m8, xs[t] + 16 * k));
    }
    UNROLL for (int t = 0; t < T; t++) {
        float lanes = hsum(_mm256_add_ps(acc[t][0], acc[t][1]));
        out[t] = eb_dtype_iq(dtype)   ? eb_iq_row_scale(dtype) * ksum[t]
                 : f->block == 256    ? ksum[t]
                 : dtype == EB_DTYPE_Q4_1 ? lanes + ksum[t]
                                          : lanes;
    }
}

/* cpu_kernels_portable.c's quantize_q8 with vectors: the same maxima, scales, rounding (to nearest even, as nearbyintf
 * in the default mode) and sums, so the same bytes. */
static void quantize_q8(const float *x, int64_t n, int64_t cols, eb_cpu_q8_rows *out) {
    int64_t B = out->block;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n * cols / B; b++) {
        const float *v = x + B * b;
        __m256 mx = _mm256_setzero_ps();
        for (int64_t i = 0; i < B; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        __m256 vid = _mm256_set1_ps(id), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
        int8_t *q = out->q + B * b;
        for (int64_t i = 0; i < B; i += 16) {
            __m256 r0 = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m256 r1 = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i + 8), vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            r0 = _mm256_min_ps(_mm256_max_ps(r0, lo), hi);
            r1 = _mm256_min_ps(_mm256_max_ps(r1, lo), hi);
            __m256i i0 = _mm256_cvtps_epi32(r0), i1 = _mm256_cvtps_epi32(r1);
            __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xd8); /* 16 int16 in order */
            __m128i b8 = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
            _mm_storeu_si128((__m128i *)(q + i), b8);
            /* the sum of these 16 quants */
            __m256i s = _mm256_madd_epi16(w, _mm256_set1_epi16(1));
            out->s16[B / 16 * b + i / 16] = (int16_t)hsum_i32(s);
        }
        out->d[b] = d;
    }
}

/* ---- the table: one copy of the loops per format, its dtype a constant in each (load8's and dequant32's choices
 * fold away) ------------------------------------------------------------------------------------------------ */

#define ROWS_KERNEL(name, code, block, block_bytes, ggml_type, quantized, q8_block, scale_rows, scale_cols)         \
    static void rows_##name(const void *w, int dtype, const float *scale, int64_t r0, int64_t r1, int64_t cols,       \
                            const float *x, int64_t n, float *y, int64_t ldy) {                                       \
        (void)dtype;                                                                                                  \
        matmul_rows(w, EB_DTYPE_##name, scale, r0, r1, cols, x, n, y, ldy);                                           \
    }
EB_FORMATS(ROWS_KERNEL)
#undef ROWS_KERNEL

EB_FORMATS(EB_CPU_Q8_KERNEL)

/* Over the portable set: its dequantization (the same values) stays. */
const eb_cpu_kernel_set eb_cpu_kernels_avx2 = {
    .variant = "avx2+fma+f16c",
    .quantize_q8 = quantize_q8,
    .format =
        {
#define TABLE_ENTRY(name, code, block, block_bytes, ggml_type, quantized, q8_block, scale_rows, scale_cols)          \
    [EB_DTYPE_##name] = {NULL, rows_##name, EB_Q8_OR_NULL(q8_block, q8_##name)},
            EB_FORMATS(TABLE_ENTRY)
#undef TABLE_ENTRY
        },
};

void eb_cpu_matmul_rows_avx2(const void *w, int dtype, const float *scale, int64_t r0, int64_t r1, int64_t cols,
                             const float *x, int64_t n, float *y, int64_t ldy) {
    eb_cpu_kernels_avx2.format[dtype].rows(w, dtype, scale, r0, r1, cols, x, n, y, ldy);
}
#endif
