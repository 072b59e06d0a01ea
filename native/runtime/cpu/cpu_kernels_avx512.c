/* The q8 precision's products with AVX-512 VNNI (F, BW, VL and VNNI; BMI2's pdep) for Q8_0, Q6_K, MXFP4, Q2_K, Q3_K,
 * IQ4_XS and IQ2_XXS, the formats where they beat the AVX2 kernels (its table lies over the AVX2 one, which keeps the
 * others). Compiled with those instruction sets and only called after a run-time check.
 *
 * The same bits as cpu_kernels_avx2.c's q8 kernels, on every input: the integer sums are exact in both, and the
 * float steps are the same operations in the same order.
 * - Q8_0 (blocks of 32): one 512-bit register holds two blocks. vpdpbusd gives each int32 lane the sum of four
 *   neighbouring products, as AVX2's maddubs + madd do (their int16 pairs never saturate), so the lanes hold the
 *   same integers. The low half of the f32 accumulator then takes the even blocks and the high half the odd ones:
 *   the AVX2 kernel's two 8-lane accumulators, side by side. AVX-512 has no vpsignb, so the weights' magnitudes meet
 *   activations negated where the weight is negative (a mask), the products the sign trick gives.
 * - Q6_K (blocks of 256): 64 quants a register, their products in int16 pairs (vpmaddubsw, as AVX2), each times its
 *   16 values' scale and summed into int32 lanes by vpdpwssd; a block's integer sums are exact, so any order of them
 *   is the AVX2 kernel's sum, and one shared expression (k16_block_value) makes the block's float. Q2_K and Q3_K
 *   alike (their 2-bit fields and Q3_K's third bits unpacked as k16_quants does, two chunks a register).
 * - IQ4_XS and IQ2_XXS: two chunks a register, the signed values' magnitudes times the activations negated under a
 *   mask (IQ2_XXS: the stored sign bits and their parity, expanded by pdep), int16 pairs times the chunk's integer
 *   scale summed by vpdpwssd: the block's exact integer sum, then the AVX2 kernel's float expression. IQ2_XXS's grid
 *   rows come from a table of 2-bit levels in registers (vpermi2w, vpmultishiftqb: AVX-512 VBMI, asked of it alone)
 *   instead of 32 loads a block.
 * So a run's tokens and hashes do not depend on whether the machine has AVX-512, and the batch == single steps and
 * thread-count identities carry over unchanged. */
#include "cpu_kernels.h"

#ifdef EB_CPU_HAVE_AVX512_BUILD
#include "cpu_kernels_x86.h"
#include <pthread.h>

#include "expertbench.h"

/* 16 f32 lanes: the first 8 hold a, the last 8 b. */
INLINE __m512 halves_ps(float a, float b) {
    return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                 _mm512_castps128_ps512(_mm_set_ps(0.0f, 0.0f, b, a)));
}

/* 32 bytes as both halves of a register, then each 64-bit lane shifted right by lo (first half) or hi (second). */
INLINE __m512i halves_shifted(__m256i v, int lo, int hi) {
    __m512i both = _mm512_broadcast_i64x4(v);
    return _mm512_srlv_epi64(both, _mm512_set_epi64(hi, hi, hi, hi, lo, lo, lo, lo));
}

/* int16 elements idx (a vector of element numbers) of the first 16 int16 of v. */
INLINE __m512i pick16(__m256i v, __m512i idx) { return _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(v)); }

/* Q6_K's scales for the 32 int16 products (two values each) of two chunks: a, b, c, d for each 16 values. */
#define SIXTEENS(a, b, c, d) \
    _mm512_set_epi16(d, d, d, d, d, d, d, d, c, c, c, c, c, c, c, c, b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a)

/* Two Q8_0 blocks b and c as 64 signed quants, and their two weight scales. */
INLINE __m512i two_q8_0_blocks(const unsigned char *b, const unsigned char *c, float *d0, float *d1) {
    *d0 = _cvtsh_ss(eb_load_u16(b)), *d1 = _cvtsh_ss(eb_load_u16(c));
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 2))),
                              _mm256_loadu_si256((const __m256i *)(c + 2)), 1);
}

/* Per int32 lane, the sum of four neighbouring products of signed w and signed x (no |w| * |x| sum of four exceeds
 * what int32 holds). */
INLINE __m512i dot_i8(__m512i w, __m512i x) {
    __m512i sx = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), sx);
}

/* What only IQ2_XXS's product uses: AVX-512 VBMI (vpermb, vpmultishiftqb), which the run-time check asks of it alone. */
#define VBMI __attribute__((target("avx512vbmi")))

/* IQ2_XXS's grid as data for vpermi2w: entry e's eight magnitudes (8, 25, 43) as 2-bit levels (0, 1, 2), value i's
 * at bits 2i, made once from eb_iq2xxs_grid. */
static uint16_t iq2xxs_levels[256];
static pthread_once_t iq2xxs_levels_once = PTHREAD_ONCE_INIT;
static void iq2xxs_levels_init(void) {
    for (int e = 0; e < 256; e++) {
        unsigned v = 0;
        for (int i = 0; i < 8; i++) v |= (unsigned)((eb_iq2xxs_grid[e][i] > 8) + (eb_iq2xxs_grid[e][i] > 25)) << (2 * i);
        iq2xxs_levels[e] = (uint16_t)v;
    }
}

/* The 32 grid entries of an IQ2_XXS block (raw: its 64 bytes after d, chunk j's four indices at 8j) as 32 words of
 * levels, word 4j + l group l of chunk j's: the indices as words (vpermb), their levels looked up 64 at a time
 * (vpermi2w over two registers of the table) and chosen by the indices' top two bits. */
VBMI static inline __m512i iq2xxs_codes(__m512i raw) {
    static const uint8_t at[64] = {0,  0, 1,  0, 2,  0, 3,  0, 8,  0, 9,  0, 10, 0, 11, 0, 16, 0, 17, 0, 18, 0,
                                   19, 0, 24, 0, 25, 0, 26, 0, 27, 0, 32, 0, 33, 0, 34, 0, 35, 0, 40, 0, 41, 0,
                                   42, 0, 43, 0, 48, 0, 49, 0, 50, 0, 51, 0, 56, 0, 57, 0, 58, 0, 59, 0};
    const __m512i *t = (const __m512i *)(const void *)iq2xxs_levels;
    __m512i idx = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, _mm512_loadu_si512((const void *)at), raw);
    __m512i r0 = _mm512_permutex2var_epi16(_mm512_loadu_si512(t + 0), idx, _mm512_loadu_si512(t + 1));
    __m512i r1 = _mm512_permutex2var_epi16(_mm512_loadu_si512(t + 2), idx, _mm512_loadu_si512(t + 3));
    __m512i r2 = _mm512_permutex2var_epi16(_mm512_loadu_si512(t + 4), idx, _mm512_loadu_si512(t + 5));
    __m512i r3 = _mm512_permutex2var_epi16(_mm512_loadu_si512(t + 6), idx, _mm512_loadu_si512(t + 7));
    __mmask32 b6 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(64)), b7 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(128));
    return _mm512_mask_blend_epi16(b7, _mm512_mask_blend_epi16(b6, r0, r1), _mm512_mask_blend_epi16(b6, r2, r3));
}

/* The 64 sign bits of two IQ2_XXS chunks (their words a0, a1): per group of 8 values its 7 stored bits and, as bit 7,
 * their parity (eb_iq_ksigns), bit i of byte g for value i of group g. In scalar registers (pdep), beside the vector
 * work: the same bits made with vpmultishiftqb and vpopcntb ran slower. */
INLINE uint64_t iq2xxs_sign_bits(uint32_t a0, uint32_t a1) {
    uint64_t s = _pdep_u64(a0, 0x7F7F7F7Full) | _pdep_u64(a1, 0x7F7F7F7Full) << 32;
    uint64_t p = s ^ (s >> 4);
    p ^= p >> 2;
    p ^= p >> 1;
    return s | (p & 0x0101010101010101ull) << 7;
}

/* The 64 magnitudes of chunks 2p and 2p + 1 from their eight words of levels: each word alone in a 64-bit lane, its
 * eight 2-bit fields picked into bytes (vpmultishiftqb), then the levels as magnitudes (pshufb). */
VBMI static inline __m512i iq2xxs_rows(__m512i codes, int p) {
    const __m512i lanes = _mm512_set_epi16(0, 0, 0, 8 * p + 7, 0, 0, 0, 8 * p + 6, 0, 0, 0, 8 * p + 5, 0, 0, 0, 8 * p + 4,
                                           0, 0, 0, 8 * p + 3, 0, 0, 0, 8 * p + 2, 0, 0, 0, 8 * p + 1, 0, 0, 0, 8 * p);
    __m512i w = _mm512_maskz_permutexvar_epi16(0x11111111u, lanes, codes);
    __m512i f = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x0E0C0A0806040200ll), w);
    const __m512i mag = _mm512_broadcast_i32x4(_mm_setr_epi8(8, 25, 43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
    return _mm512_shuffle_epi8(mag, _mm512_and_si512(f, _mm512_set1_epi8(3)));
}

/* IQ2_XXS's q8 dot products of one row (nb blocks) with T tokens (dot_q8's): two chunks a register, their eight grid
 * rows from the levels (iq2xxs_codes, iq2xxs_rows), their 64 sign bits as a byte mask that negates the activations,
 * the magnitudes (at most 43) times those in int16 pairs (vpmaddubsw), each times its chunk's 2 s + 1 and summed by
 * vpdpwssd; then the AVX2 kernel's float expression per block and its row scale. Reached through a call
 * (iq2xxs_dot_q8), so that only it is built for VBMI. */
VBMI INLINE void iq2xxs_dot_tokens(const unsigned char *row, int64_t nb, const int8_t *const *xq,
                                   const float *const *xd, const int T, float *out, int pf) {
    float ksum[4] = {0};
    for (int64_t k = 0; k < nb; k++) {
        const unsigned char *b = row + (size_t)k * (size_t)eb_format_table[EB_DTYPE_IQ2_XXS].block_bytes;
        if (pf) {
            _mm_prefetch((const char *)((uintptr_t)b + AHEAD_BYTES), _MM_HINT_T0);
            _mm_prefetch((const char *)((uintptr_t)b + 64 + AHEAD_BYTES), _MM_HINT_T0);
        }
        __m512i iacc[4];
        UNROLL for (int t = 0; t < T; t++) iacc[t] = _mm512_setzero_si512();
        __m512i codes = iq2xxs_codes(_mm512_loadu_si512((const void *)(b + 2)));
        UNROLL for (int j = 0; j < 8; j += 2) {
            uint32_t a0 = eb_load_u32(b + 6 + 8 * j), a1 = eb_load_u32(b + 14 + 8 * j);
            __m512i g = iq2xxs_rows(codes, j / 2);
            __mmask64 neg = _cvtu64_mask64(iq2xxs_sign_bits(a0, a1));
            __m512i sc = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16((short)(2 * (a0 >> 28) + 1)),
                                                 _mm512_set1_epi16((short)(2 * (a1 >> 28) + 1)));
            UNROLL for (int t = 0; t < T; t++) {
                __m512i x = _mm512_loadu_si512((const void *)(xq[t] + 256 * k + 32 * j));
                __m512i xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
                iacc[t] = _mm512_dpwssd_epi32(iacc[t], _mm512_maddubs_epi16(g, xs), sc);
            }
        }
        UNROLL for (int t = 0; t < T; t++)
            ksum[t] += _cvtsh_ss(eb_load_u16(b)) * xd[t][k] * (float)_mm512_reduce_add_epi32(iacc[t]);
    }
    UNROLL for (int t = 0; t < T; t++) out[t] = eb_iq_row_scale(EB_DTYPE_IQ2_XXS) * ksum[t];
}

/* One copy a token count, so that each keeps its accumulators in registers. */
VBMI static void iq2xxs_dot_q8(const unsigned char *row, int64_t nb, const int8_t *const *xq, const float *const *xd,
                               int T, float *out, int pf) {
    switch (T) {
    case 1: iq2xxs_dot_tokens(row, nb, xq, xd, 1, out, pf); return;
    case 2: iq2xxs_dot_tokens(row, nb, xq, xd, 2, out, pf); return;
    case 3: iq2xxs_dot_tokens(row, nb, xq, xd, 3, out, pf); return;
    default: iq2xxs_dot_tokens(row, nb, xq, xd, 4, out, pf); return;
    }
}

/* MXFP4's codes as their values (eb_mxfp4_values) plus 12: unsigned, for vpdpbusd. */
static const uint8_t MXFP4_PLUS_12[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

/* An MXFP4 product's correction, computed once for its activations: per four neighbouring quants, -12 times their
 * sum (int32), laid out as the quants are (the same byte offset from corr_q as the quants from x->q); NULL when the
 * activations were too many for the buffer (then each row computes it again). */
static _Thread_local const int32_t *mxfp4_corr;
static _Thread_local const int8_t *mxfp4_corr_q;
enum { MXFP4_CORR_BYTES = 64 << 10 };

INLINE void dot_q8(const unsigned char *row, int dtype, int64_t cols, const eb_cpu_q8_rows *xr, int64_t t0, int T,
                   float *out, int pf) {
    __m512 acc[4]; /* Q8_0: per token, the even blocks' lanes then the odd blocks' */
    float ksum[4]; /* Q6_K: per token, one sum of its blocks */
    const int8_t *xq[4];
    const float *xd[4];
    const int16_t *xs[4];
    q8_tokens(xr, cols, t0, T, xq, xd, xs);
    UNROLL for (int t = 0; t < T; t++) {
        acc[t] = _mm512_setzero_ps();
        ksum[t] = 0.0f;
    }
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const eb_format_traits *f = &eb_format_table[dtype];
    int64_t nb = cols / f->block;
    if (dtype == EB_DTYPE_Q8_0) {
        for (int64_t k = 0; k < nb; k += 2) {
            const unsigned char *b = row + (size_t)k * (size_t)f->block_bytes;
            if (pf) {
                _mm_prefetch((const char *)((uintptr_t)b + AHEAD_BYTES), _MM_HINT_T0);
                _mm_prefetch((const char *)((uintptr_t)b + 64 + AHEAD_BYTES), _MM_HINT_T0);
            }
            /* an odd count's last block: decoded twice, its products in the first half only */
            int two = k + 1 < nb;
            __mmask16 lanes = two ? 0xFFFF : 0x00FF;
            float d0, d1;
            __m512i w = two_q8_0_blocks(b, two ? b + f->block_bytes : b, &d0, &d1);
            __m512 dw = halves_ps(d0, d1);
            UNROLL for (int t = 0; t < T; t++) {
                __m512i x = two ? _mm512_loadu_si512((const void *)(xq[t] + 32 * k))
                                : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(xq[t] + 32 * k)));
                __m512i isum = dot_i8(w, x);
                __m512 scale = _mm512_mul_ps(dw, halves_ps(xd[t][k], two ? xd[t][k + 1] : 0.0f));
                acc[t] = _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[t], lanes);
            }
        }
        UNROLL for (int t = 0; t < T; t++) out[t] =
            hsum(_mm256_add_ps(_mm512_castps512_ps256(acc[t]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[t]), 1))));
        return;
    }
    if (dtype == EB_DTYPE_MXFP4) {
        /* The codes looked up in pshufb as their values + 12 (unsigned, for vpdpbusd), whose products with x less
         * 12 x are the AVX2 kernel's int32 lanes; then its float steps: per block cvt(lanes) * (dw * xd) added to the
         * even or odd blocks' accumulator. Two blocks a 512-bit register (the even block's lanes low, the odd one's
         * high, as for Q8_0), the scales dw * xd of 16 blocks at a time (their exponent bytes gathered). A row's last
         * blocks (fewer than 16) one at a time in 256 bits. */
        const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)MXFP4_PLUS_12));
        const __m512i shift = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0), m4 = _mm512_set1_epi8(0x0F);
        const __m512i twelve = _mm512_set1_epi8(12), zero = _mm512_setzero_si512();
        const __m512i at = _mm512_set_epi32(255, 238, 221, 204, 187, 170, 153, 136, 119, 102, 85, 68, 51, 34, 17, 0);
        const __m512i pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
        __m512 acc16[4];
        UNROLL for (int t = 0; t < T; t++) acc16[t] = _mm512_setzero_ps();
        int64_t k = 0;
        for (; k + 16 <= nb; k += 16) {
            const unsigned char *g = row + (size_t)k * 17;
            __m512i e = _mm512_and_si512(_mm512_i32gather_epi32(at, g, 1), _mm512_set1_epi32(0xFF));
            __mmask16 tiny = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)); /* eb_e8m0_half's two cases */
            __m512 dw = _mm512_castsi512_ps(_mm512_mask_blend_epi32(
                tiny, _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23),
                _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e)));
            __m512 scale[4];
            UNROLL for (int t = 0; t < T; t++) scale[t] = _mm512_mul_ps(dw, _mm512_loadu_ps(xd[t] + k));
            UNROLL for (int j = 0; j < 8; j++) {
                const unsigned char *b = g + 34 * j;
                if (pf) _mm_prefetch((const char *)((uintptr_t)b + AHEAD_BYTES), _MM_HINT_T0);
                __m256i qa = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + 1)));
                __m256i qb = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + 18)));
                __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(qa), qb, 1);
                __m512i w = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srlv_epi64(q, shift), m4));
                __m512i ix = _mm512_add_epi32(pair, _mm512_set1_epi32(2 * j));
                UNROLL for (int t = 0; t < T; t++) {
                    const int8_t *xp = xq[t] + 32 * (k + 2 * j);
                    __m512i x = _mm512_loadu_si512((const void *)xp);
                    __m512i isum = mxfp4_corr ? _mm512_dpbusd_epi32(_mm512_loadu_si512((const void *)((const char *)mxfp4_corr + (xp - mxfp4_corr_q))), w, x)
                                              : _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, w, x), _mm512_dpbusd_epi32(zero, twelve, x));
                    acc16[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_permutexvar_ps(ix, scale[t]), acc16[t]);
                }
            }
        }
        const __m256i lut8 = _mm512_castsi512_si256(lut), shift8 = _mm256_set_epi64x(4, 4, 0, 0);
        __m256 a[4][2];
        UNROLL for (int t = 0; t < T; t++) {
            a[t][0] = _mm512_castps512_ps256(acc16[t]);
            a[t][1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc16[t]), 1));
        }
        for (; k < nb; k++) {
            const unsigned char *b = row + (size_t)k * 17;
            __m256i qs = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + 1)));
            __m256i w = _mm256_shuffle_epi8(lut8, _mm256_and_si256(_mm256_srlv_epi64(qs, shift8), _mm512_castsi512_si256(m4)));
            float dw = eb_e8m0_half(b[0]);
            UNROLL for (int t = 0; t < T; t++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(xq[t] + 32 * k));
                __m256i isum = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm512_castsi512_si256(zero), w, x),
                                                _mm256_dpbusd_epi32(_mm512_castsi512_si256(zero), _mm512_castsi512_si256(twelve), x));
                a[t][k & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * xd[t][k]), a[t][k & 1]);
            }
        }
        UNROLL for (int t = 0; t < T; t++) out[t] = hsum(_mm256_add_ps(a[t][0], a[t][1]));
        return;
    }
    if (dtype == EB_DTYPE_IQ2_XXS) {
        iq2xxs_dot_q8(row, nb, xq, xd, T, out, pf);
        return;
    }
    for (int64_t k = 0; k < nb; k++) {
        const unsigned char *b = row + (size_t)k * (size_t)f->block_bytes;
        if (pf) {
            _mm_prefetch((const char *)((uintptr_t)b + AHEAD_BYTES), _MM_HINT_T0);
            _mm_prefetch((const char *)((uintptr_t)b + 64 + AHEAD_BYTES), _MM_HINT_T0);
        }
        __m512i iacc[4];
        UNROLL for (int t = 0; t < T; t++) iacc[t] = _mm512_setzero_si512();
        if (pf) _mm_prefetch((const char *)((uintptr_t)b + 128 + AHEAD_BYTES), _MM_HINT_T0);
        if (dtype == EB_DTYPE_IQ4_XS) {
            /* two chunks a register (their nibbles looked up in pshufb as MXFP4's), the AVX2 kernel's sign trick with
             * a mask (the magnitudes times the activations negated where the value is negative), int16 pairs times
             * the chunk's scale summed by vpdpwssd; then the AVX2 kernel's float expression */
            const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)eb_iq4nl_values));
            const __m512i shift = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
            UNROLL for (int j = 0; j < 8; j += 2) {
                __m512i q = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 8 + 16 * j)));
                q = _mm512_shuffle_i64x2(q, q, _MM_SHUFFLE(1, 1, 0, 0));
                __m512i w = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srlv_epi64(q, shift), low4));
                __m512i aw = _mm512_abs_epi8(w);
                __mmask64 neg = _mm512_movepi8_mask(w);
                __m512i sc = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16((short)eb_iq4xs_scale(b, j)),
                                                     _mm512_set1_epi16((short)eb_iq4xs_scale(b, j + 1)));
                UNROLL for (int t = 0; t < T; t++) {
                    __m512i x = _mm512_loadu_si512((const void *)(xq[t] + 256 * k + 32 * j));
                    __m512i xs = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
                    iacc[t] = _mm512_dpwssd_epi32(iacc[t], _mm512_maddubs_epi16(aw, xs), sc);
                }
            }
            UNROLL for (int t = 0; t < T; t++)
                ksum[t] += _cvtsh_ss(eb_load_u16(b)) * xd[t][k] * (float)_mm512_reduce_add_epi32(iacc[t]);
            continue;
        }
        if (dtype == EB_DTYPE_Q2_K || dtype == EB_DTYPE_Q3_K) {
            /* 2-bit fields (Q3_K: and a third bit) of two chunks a register, unsigned, as the AVX2 kernel's
             * k16_quants; int16 pairs times each 16 values' scale summed by vpdpwssd; then its offset or minima
             * terms and float expression */
            int q2 = dtype == EB_DTYPE_Q2_K;
            __m256i sc16 = k16_scales(b, dtype);
            const __m512i three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
            /* Q3_K's third bits: every byte's bit c of the hmask, for chunk c, brought to bit 2 by a rotation of each
             * 64-bit lane (bit 8 i + c goes to 8 i + 2 in every byte at once) */
            __m512i hm = q2 ? _mm512_setzero_si512() : _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b));
            UNROLL for (int h = 0; h < 2; h++) {
                __m256i qs = _mm256_loadu_si256((const __m256i *)(b + (q2 ? 16 : 32) + 32 * h));
                UNROLL for (int p = 0; p < 2; p++) { /* chunks 4h + 2p and 4h + 2p + 1 */
                    __m512i q = _mm512_and_si512(halves_shifted(qs, 4 * p, 4 * p + 2), three);
                    if (!q2) {
                        int c = 4 * h + 2 * p;
                        __m512i third = _mm512_rorv_epi64(hm, _mm512_set_epi64(c - 1, c - 1, c - 1, c - 1, c - 2, c - 2,
                                                                               c - 2, c - 2));
                        q = _mm512_ternarylogic_epi32(q, third, four, 0xF8); /* q | (third & four) */
                    }
                    int e = 8 * h + 4 * p;
                    __m512i sc = pick16(sc16, SIXTEENS(e, e + 1, e + 2, e + 3));
                    UNROLL for (int t = 0; t < T; t++) {
                        __m512i x = _mm512_loadu_si512((const void *)(xq[t] + 256 * k + 32 * (4 * h + 2 * p)));
                        iacc[t] = _mm512_dpwssd_epi32(iacc[t], _mm512_maddubs_epi16(q, x), sc);
                    }
                }
            }
            if (q2) {
                __m128i nib = _mm_loadu_si128((const __m128i *)b);
                __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(nib, 4), _mm_set1_epi8(0x0F)));
                UNROLL for (int t = 0; t < T; t++)
                    ksum[t] += k4_block_value(b + 80, xd[t][k], _mm512_reduce_add_epi32(iacc[t]), per16_sum(m16, xs[t] + 16 * k));
            } else {
                UNROLL for (int t = 0; t < T; t++)
                    ksum[t] += k16_block_value(b, dtype, xd[t][k], _mm512_reduce_add_epi32(iacc[t]), per16_sum(sc16, xs[t] + 16 * k));
            }
            continue;
        }
        /* Q6_K */
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
        UNROLL for (int h = 0; h < 2; h++) {
            /* ql: chunks 4h and 4h + 1's low bits in its low nibbles, 4h + 2 and 4h + 3's in its high ones */
            __m512i ql = _mm512_loadu_si512((const void *)(b + 64 * h));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
            UNROLL for (int p = 0; p < 2; p++) { /* chunks 4h + 2p and 4h + 2p + 1 */
                __m512i lo = _mm512_and_si512(p ? _mm512_srli_epi16(ql, 4) : ql, low4);
                __m512i hb = _mm512_and_si512(halves_shifted(qh, 4 * p, 4 * p + 2), _mm512_set1_epi8(3));
                __m512i q = _mm512_or_si512(lo, _mm512_slli_epi16(hb, 4));
                int e = 8 * h + 4 * p;
                __m512i sc = pick16(sc16, SIXTEENS(e, e + 1, e + 2, e + 3));
                UNROLL for (int t = 0; t < T; t++) {
                    __m512i x = _mm512_loadu_si512((const void *)(xq[t] + 256 * k + 32 * (4 * h + 2 * p)));
                    iacc[t] = _mm512_dpwssd_epi32(iacc[t], _mm512_maddubs_epi16(q, x), sc);
                }
            }
        }
        UNROLL for (int t = 0; t < T; t++)
            ksum[t] += k16_block_value(b, EB_DTYPE_Q6_K, xd[t][k], _mm512_reduce_add_epi32(iacc[t]), per16_sum(sc16, xs[t] + 16 * k));
    }
    UNROLL for (int t = 0; t < T; t++) out[t] = ksum[t];
}

/* Q8_0, Q6_K, MXFP4, Q2_K, Q3_K, IQ4_XS and IQ2_XXS here; the other formats keep the AVX2 kernels (the same bits
 * either way). On 2 cores of a Xeon with AMX (bench/RESULTS.md) Q8_0 and Q6_K ran faster than their AVX2 kernels (Q6_K
 * 1.5-2x, Q8_0 1.0-1.2x of the decode step's products), MXFP4 at 75 % of a plain read where AVX2 reached 39 %
 * (bench/membw/decode_products.c, one thread). On a Zen 4 EPYC, one thread, 256 x 1024 weights in the caches, one
 * token: Q2_K 1.3x, Q3_K 1.5x, IQ4_XS 1.4x, IQ2_XXS 1.35x the AVX2 kernels (IQ2_XXS: its grid rows gathered ran
 * 0.8x, loaded one by one 1.2x; its signs and scales made in vectors too, 1.2x). 512-bit versions of Q4_K and Q5_K (the same vpdpwssd scheme, or AVX2's steps with 256-bit
 * vpdpwssd) ran 0.7-1.15x of AVX2 on the Xeon and 0.8-0.95x on the EPYC, so they are not kept. */
static void q8_Q8_0(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const eb_cpu_q8_rows *x, int64_t n,
                    float *y, int64_t ldy) {
    (void)dtype;
    matmul_q8(w, EB_DTYPE_Q8_0, r0, r1, cols, x, n, y, ldy);
}

static void q8_Q6_K(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const eb_cpu_q8_rows *x, int64_t n,
                    float *y, int64_t ldy) {
    (void)dtype;
    matmul_q8(w, EB_DTYPE_Q6_K, r0, r1, cols, x, n, y, ldy);
}

#define Q8_AVX512(name)                                                                                               \
    static void q8_##name(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const eb_cpu_q8_rows *x,    \
                          int64_t n, float *y, int64_t ldy) {                                                         \
        (void)dtype;                                                                                                  \
        matmul_q8(w, EB_DTYPE_##name, r0, r1, cols, x, n, y, ldy);                                                    \
    }
Q8_AVX512(Q2_K)
Q8_AVX512(Q3_K)
Q8_AVX512(IQ4_XS)
#undef Q8_AVX512

VBMI static void q8_IQ2_XXS(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const eb_cpu_q8_rows *x,
                       int64_t n, float *y, int64_t ldy) {
    (void)dtype;
    pthread_once(&iq2xxs_levels_once, iq2xxs_levels_init);
    matmul_q8(w, EB_DTYPE_IQ2_XXS, r0, r1, cols, x, n, y, ldy);
}

static void q8_MXFP4(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const eb_cpu_q8_rows *x,
                     int64_t n, float *y, int64_t ldy) {
    (void)dtype;
    /* the correction once for every row here where it fits in the buffer (a decode step's few tokens) */
    _Alignas(64) int32_t corr[MXFP4_CORR_BYTES / sizeof(int32_t)];
    size_t bytes = (size_t)n * (size_t)cols;
    if (bytes <= sizeof corr) {
        const __m512i twelve = _mm512_set1_epi8(12), zero = _mm512_setzero_si512();
        size_t i = 0;
        for (; i + 64 <= bytes; i += 64)
            _mm512_store_si512((void *)((char *)corr + i),
                               _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, twelve, _mm512_loadu_si512((const void *)(x->q + i)))));
        for (; i < bytes; i += 32) /* cols is a whole number of 32-value blocks */
            _mm256_storeu_si256((__m256i *)((char *)corr + i),
                                _mm256_sub_epi32(_mm512_castsi512_si256(zero),
                                                 _mm256_dpbusd_epi32(_mm512_castsi512_si256(zero), _mm512_castsi512_si256(twelve),
                                                                     _mm256_loadu_si256((const __m256i *)(x->q + i)))));
        mxfp4_corr = corr, mxfp4_corr_q = x->q;
    }
    matmul_q8(w, EB_DTYPE_MXFP4, r0, r1, cols, x, n, y, ldy);
    mxfp4_corr = NULL, mxfp4_corr_q = NULL;
}

/* Over the AVX2 set: only these q8 products. */
const eb_cpu_kernel_set eb_cpu_kernels_avx512 = {
    .variant = "avx2+fma+f16c+avx512vnni",
    .format =
        {
            [EB_DTYPE_Q8_0] = {NULL, NULL, q8_Q8_0},
            [EB_DTYPE_Q6_K] = {NULL, NULL, q8_Q6_K},
            [EB_DTYPE_MXFP4] = {NULL, NULL, q8_MXFP4},
            [EB_DTYPE_Q2_K] = {NULL, NULL, q8_Q2_K},
            [EB_DTYPE_Q3_K] = {NULL, NULL, q8_Q3_K},
            [EB_DTYPE_IQ4_XS] = {NULL, NULL, q8_IQ4_XS},
        },
};

/* Over that one where the CPU also has AVX-512 VBMI. */
const eb_cpu_kernel_set eb_cpu_kernels_avx512_vbmi = {
    .variant = "avx2+fma+f16c+avx512vnni",
    .format = {[EB_DTYPE_IQ2_XXS] = {NULL, NULL, q8_IQ2_XXS}},
};
#endif
