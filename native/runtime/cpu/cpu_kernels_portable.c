/* Portable C kernels: correct on any machine, used where AVX2/FMA/F16C is missing or when forced. */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"
#include "expertbench.h"
#include "eb_formats.h"

/* Four partial sums per dot product so the compiler can keep several chains in flight. */
static float dot_f32(const unsigned char *w, const float *x, int64_t cols) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    int64_t c = 0;
    for (; c + 4 <= cols; c += 4) {
        float v[4];
        memcpy(v, w + 4 * c, sizeof v);
        s0 += v[0] * x[c];
        s1 += v[1] * x[c + 1];
        s2 += v[2] * x[c + 2];
        s3 += v[3] * x[c + 3];
    }
    for (; c < cols; c++) s0 += eb_load_f32(w + 4 * c) * x[c];
    return (s0 + s1) + (s2 + s3);
}

static float dot_16bit(const unsigned char *w, const float *x, int64_t cols, int dtype) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    int64_t c = 0;
    for (; c + 4 <= cols; c += 4) {
        uint16_t v[4];
        memcpy(v, w + 2 * c, sizeof v);
        if (dtype == EB_DTYPE_BF16) {
            s0 += eb_bf16_to_f32(v[0]) * x[c];
            s1 += eb_bf16_to_f32(v[1]) * x[c + 1];
            s2 += eb_bf16_to_f32(v[2]) * x[c + 2];
            s3 += eb_bf16_to_f32(v[3]) * x[c + 3];
        } else {
            s0 += eb_f16_to_f32(v[0]) * x[c];
            s1 += eb_f16_to_f32(v[1]) * x[c + 1];
            s2 += eb_f16_to_f32(v[2]) * x[c + 2];
            s3 += eb_f16_to_f32(v[3]) * x[c + 3];
        }
    }
    for (; c < cols; c++) s0 += eb_load_as_f32(w, dtype, c) * x[c];
    return (s0 + s1) + (s2 + s3);
}

/* A quantized row, 32 values at a time, into the same four sums in the same order as dot_f32 over its dequantized
 * row (a whole number of chunks: no tail). */
static float dot_quant(const unsigned char *w, int dtype, const float *x, int64_t cols) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, v[EB_CHUNK];
    for (int64_t ch = 0; ch < cols / EB_CHUNK; ch++) {
        eb_dequantize_chunk(w, dtype, ch, v);
        const float *xc = x + EB_CHUNK * ch;
        for (int i = 0; i < EB_CHUNK; i += 4) {
            s0 += v[i] * xc[i];
            s1 += v[i + 1] * xc[i + 1];
            s2 += v[i + 2] * xc[i + 2];
            s3 += v[i + 3] * xc[i + 3];
        }
    }
    return (s0 + s1) + (s2 + s3);
}

/* A row of a scaled format (one byte a value: F8_E4M3_B128) with its scales (sc: the row's, one per scale_cols
 * values), into the same four sums in the same order as dot_f32 over its dequantized row: a value is its E4M3 value
 * times its scale, rounded once, then multiplied and added as an f32 weight is (four values share a scale: scale_cols
 * is a whole number of chunks). */
static float dot_scaled(const unsigned char *w, int dtype, const float *sc, const float *x, int64_t cols) {
    int64_t per = eb_format_table[dtype].scale_cols;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    int64_t c = 0;
    for (; c + 4 <= cols; c += 4) {
        float d = sc[c / per];
        float v0 = eb_e4m3_to_f32(w[c]) * d, v1 = eb_e4m3_to_f32(w[c + 1]) * d;
        float v2 = eb_e4m3_to_f32(w[c + 2]) * d, v3 = eb_e4m3_to_f32(w[c + 3]) * d;
        s0 += v0 * x[c];
        s1 += v1 * x[c + 1];
        s2 += v2 * x[c + 2];
        s3 += v3 * x[c + 3];
    }
    for (; c < cols; c++) {
        float v = eb_e4m3_to_f32(w[c]) * sc[c / per];
        s0 += v * x[c];
    }
    return (s0 + s1) + (s2 + s3);
}

static void matmul_rows(const void *w, int dtype, const float *scale, int64_t r0, int64_t r1, int64_t cols,
                        const float *x, int64_t n, float *y, int64_t ldy) {
    const unsigned char *base = (const unsigned char *)w;
    size_t rowbytes = (size_t)eb_row_bytes(dtype, cols);
    int quantized = eb_dtype_quantized(dtype), scaled = eb_dtype_scaled(dtype);
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *row = base + (size_t)r * rowbytes;
        const float *sc = scaled ? eb_scale_row(scale, dtype, r, cols) : NULL;
        for (int64_t t = 0; t < n; t++) {
            const float *xt = x + t * cols;
            y[t * ldy + r] = quantized               ? dot_quant(row, dtype, xt, cols)
                             : scaled                ? dot_scaled(row, dtype, sc, xt, cols)
                             : dtype == EB_DTYPE_F32 ? dot_f32(row, xt, cols)
                                                     : dot_16bit(row, xt, cols, dtype);
        }
    }
}

/* ---- the q8 precision --------------------------------------------------------------------------------------- */

eb_cpu_q8_rows eb_cpu_q8_layout(void *mem, int64_t n, int64_t cols, int32_t block) {
    uintptr_t p = ((uintptr_t)mem + 63) & ~(uintptr_t)63;
    eb_cpu_q8_rows r = {.cols = cols, .block = block};
    r.q = (int8_t *)p;
    p = (p + (uintptr_t)(n * cols) + 63) & ~(uintptr_t)63;
    r.d = (float *)p;
    p = (p + (uintptr_t)(n * cols / block) * sizeof(float) + 63) & ~(uintptr_t)63;
    r.s16 = (int16_t *)p;
    return r;
}

static void quantize_q8(const float *x, int64_t n, int64_t cols, eb_cpu_q8_rows *out) {
    int64_t B = out->block;
    for (int64_t b = 0; b < n * cols / B; b++) {
        const float *v = x + B * b;
        float amax = 0.0f;
        for (int64_t i = 0; i < B; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        int8_t *q = out->q + B * b;
        for (int64_t i = 0; i < B; i++) {
            float r = nearbyintf(v[i] * id);
            q[i] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
        }
        out->d[b] = d;
        for (int64_t h = 0; h < B / 16; h++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += q[16 * h + i];
            out->s16[B / 16 * b + h] = (int16_t)s;
        }
    }
}

/* The 16 bytes of 4-bit codes of a 32-value block as their entries in values (eb_nibbles_times' order). */
static void nibble_quants(const unsigned char *qs, const int8_t *values, int8_t *q) {
    for (int i = 0; i < 16; i++) {
        q[i] = values[qs[i] & 0xF];
        q[i + 16] = values[qs[i] >> 4];
    }
}

/* A block of scaled minima (Q4_K, Q5_K, Q2_K; dm: its f16 d and dmin) from its integer sums of quants times scales and
 * of minima times activations. */
static float min_block_value(const unsigned char *dm, float dx, int32_t isum, int32_t msum) {
    return eb_f16_to_f32(eb_load_u16(dm)) * dx * (float)isum - eb_f16_to_f32(eb_load_u16(dm + 2)) * dx * (float)msum;
}

/* A K-format or i-quant block (256 values) against 256 activations of one scale (i-quants: eb_iq_quants' values
 * per 16 times their odd scales 2 s + 1, llama.cpp's vec_dot's integers; the 1-bit ones' deltas apart, in msum, and
 * added as 1/8 of it, as its vec_dot's one float expression): the eight sub-blocks' integer sums times
 * their 6-bit (Q4_K, Q5_K, IQ4_XS's signed ones; Q3_K's signed, per 16), int8 (Q6_K, per 16) or 4-bit (Q2_K, per
 * 16) scales, summed in integers, then scaled once; the minima (Q4_K, Q5_K, Q2_K) and the offsets of Q6_K (32) and
 * Q3_K (4) through the activations' sums of 16. The vector kernels compute the same integers and this same float expression. */
static float block_k_q8(const unsigned char *b, int dtype, const int8_t *x, float dx, const int16_t *s) {
    int32_t isum = 0, msum = 0;
    if (dtype == EB_DTYPE_IQ4_XS) { /* each chunk's grid values times its activations, times its signed scale */
        for (int j = 0; j < 8; j++) {
            int8_t q[32];
            int32_t part = 0;
            nibble_quants(b + 8 + 16 * j, eb_iq4nl_values, q);
            for (int i = 0; i < 32; i++) part += q[i] * x[32 * j + i];
            isum += eb_iq4xs_scale(b, j) * part;
        }
        return eb_f16_to_f32(eb_load_u16(b)) * dx * (float)isum;
    }
    if (eb_dtype_iq1(dtype)) { /* per 16 values: the grid values times the activations, and the deltas' signs times
                                * their 8 activations' sums, each times 2 s + 1 */
        for (int j = 0; j < 8; j++) {
            int8_t q[32];
            int delta[4];
            eb_iq1_quants(b, dtype, j, q, delta);
            for (int h = 0; h < 2; h++) {
                int32_t part = 0, dpart = 0, ls = 2 * eb_iq1_scale(b, dtype, j, h) + 1;
                for (int i = 16 * h; i < 16 * h + 16; i++) part += q[i] * x[32 * j + i], dpart += delta[i / 8] * x[32 * j + i];
                isum += ls * part, msum += ls * dpart;
            }
        }
        return eb_iq1_d(b, dtype) * dx * ((float)isum + 0.125f * (float)msum);
    }
    if (eb_dtype_iq(dtype)) { /* each half chunk's signed grid values times its activations, times 2 s + 1 */
        for (int j = 0; j < 8; j++) {
            int8_t q[32];
            eb_iq_quants(b, dtype, j, q);
            for (int h = 0; h < 2; h++) {
                int32_t part = 0;
                for (int i = 16 * h; i < 16 * h + 16; i++) part += q[i] * x[32 * j + i];
                isum += (2 * eb_iq_scale(b, dtype, j, h) + 1) * part;
            }
        }
        return eb_f16_to_f32(eb_load_u16(b)) * dx * (float)isum;
    }
    if (dtype == EB_DTYPE_Q6_K || dtype == EB_DTYPE_Q2_K || dtype == EB_DTYPE_Q3_K) { /* eb_k16_quant's, per 16 */
        for (int g = 0; g < 16; g++) {
            int32_t part = 0;
            for (int i = 0; i < 16; i++) part += eb_k16_quant(b, dtype, g / 2, 16 * (g & 1) + i) * x[16 * g + i];
            isum += eb_k16_scale(b, dtype, g) * part;
            msum += (dtype == EB_DTYPE_Q2_K ? b[g] >> 4 : eb_k16_scale(b, dtype, g)) * s[g];
        }
        if (dtype == EB_DTYPE_Q2_K) return min_block_value(b + 80, dx, isum, msum);
        return eb_f16_to_f32(eb_load_u16(b + eb_k16_d(dtype))) * dx * (float)(isum - eb_k16_offset(dtype) * msum);
    }
    int q5 = dtype == EB_DTYPE_Q5_K;
    const unsigned char *qh = b + 16, *qs = b + 16 + (q5 ? 32 : 0);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        eb_k4_scale_min(b + 4, j, &sc, &m);
        int32_t part = 0;
        for (int i = 0; i < 32; i++) {
            int q = (qs[32 * (j / 2) + i] >> (4 * (j & 1))) & 0xF;
            if (q5) q |= ((qh[i] >> j) & 1) << 4;
            part += q * x[32 * j + i];
        }
        isum += sc * part;
        msum += m * (s[2 * j] + s[2 * j + 1]);
    }
    return min_block_value(b, dx, isum, msum);
}

/* A block of 32 values (Q8_0, MXFP4, Q4_0, Q4_1, IQ4_NL) as 32 signed quants; returns its scale (the values are the
 * quants times it, Q4_1's plus its minimum: eb_q4_1_min_term). */
static float block32_quants(const unsigned char *b, int dtype, int8_t *q) {
    switch (dtype) {
    case EB_DTYPE_Q8_0: memcpy(q, b + 2, 32); return eb_f16_to_f32(eb_load_u16(b));
    case EB_DTYPE_MXFP4: nibble_quants(b + 1, eb_mxfp4_values, q); return eb_e8m0_half(b[0]);
    case EB_DTYPE_Q4_1: nibble_quants(b + 4, eb_q4_1_values, q); return eb_f16_to_f32(eb_load_u16(b));
    case EB_DTYPE_IQ4_NL: nibble_quants(b + 2, eb_iq4nl_values, q); return eb_f16_to_f32(eb_load_u16(b));
    default: nibble_quants(b + 2, eb_q4_0_values, q); return eb_f16_to_f32(eb_load_u16(b));
    }
}

/* One row against one row of q8 activations: per block the integer sum of products, scaled once. */
static float dot_q8(const unsigned char *row, int dtype, int64_t cols, const int8_t *xq, const float *xd,
                    const int16_t *xs) {
    float acc = 0.0f, macc = 0.0f; /* macc: Q4_1's minima times the sums of their activations */
    const eb_format_traits *f = &eb_format_table[dtype];
    for (int64_t k = 0; k < cols / f->block; k++) {
        const unsigned char *b = row + (size_t)k * (size_t)f->block_bytes;
        if (f->block == 32) {
            int8_t q[32];
            float dw = block32_quants(b, dtype, q);
            int32_t sum = 0;
            for (int i = 0; i < 32; i++) sum += q[i] * xq[32 * k + i];
            acc += (float)sum * (dw * xd[k]);
            if (dtype == EB_DTYPE_Q4_1) macc += eb_q4_1_min_term(b, xd[k], xs + 2 * k);
        } else {
            acc += block_k_q8(b, dtype, xq + 256 * k, xd[k], xs + 16 * k);
        }
    }
    if (eb_dtype_iq(dtype)) return eb_iq_row_scale(dtype) * acc;
    return dtype == EB_DTYPE_Q4_1 ? acc + macc : acc;
}

static void matmul_q8(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const eb_cpu_q8_rows *x,
                      int64_t n, float *y, int64_t ldy) {
    size_t rowbytes = (size_t)eb_row_bytes(dtype, cols);
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *row = (const unsigned char *)w + (size_t)r * rowbytes;
        for (int64_t t = 0; t < n; t++)
            y[t * ldy + r] =
                dot_q8(row, dtype, cols, x->q + t * cols, x->d + t * cols / x->block, x->s16 + t * cols / 16);
    }
}

/* ---- the table ---------------------------------------------------------------------------------------------- */

/* Each format's entries: the loops above with its dtype a constant (the dtype argument is the table's index). */
#define FORMAT_KERNELS(name, code, block, block_bytes, ggml_type, quantized, q8_block, scale_rows, scale_cols)      \
    static void dequantize_##name(const void *row, const float *scales, int64_t n, float *out) {                      \
        eb_dequantize_scaled_row(row, EB_DTYPE_##name, scales, n, out);                                               \
    }                                                                                                                 \
    static void rows_##name(const void *w, int dtype, const float *scale, int64_t r0, int64_t r1, int64_t cols,       \
                            const float *x, int64_t n, float *y, int64_t ldy) {                                       \
        (void)dtype;                                                                                                  \
        matmul_rows(w, EB_DTYPE_##name, scale, r0, r1, cols, x, n, y, ldy);                                           \
    }
EB_FORMATS(FORMAT_KERNELS)
#undef FORMAT_KERNELS

EB_FORMATS(EB_CPU_Q8_KERNEL)

/* Integer products for the formats whose q8_block says they have them: Q5_0 / Q5_1 have none (dot_q8 reads every
 * other block as a K format's). */
const eb_cpu_kernel_set eb_cpu_kernels_portable = {
    .variant = "portable",
    .quantize_q8 = quantize_q8,
    .format =
        {
#define TABLE_ENTRY(name, code, block, block_bytes, ggml_type, quantized, q8_block, scale_rows, scale_cols)          \
    [EB_DTYPE_##name] = {dequantize_##name, rows_##name, EB_Q8_OR_NULL(q8_block, q8_##name)},
            EB_FORMATS(TABLE_ENTRY)
#undef TABLE_ENTRY
        },
};
