/* Portable C kernels: correct on any machine, used where AVX2/FMA/F16C is missing or when forced. */
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

void eb_cpu_matmul_rows_portable(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const float *x,
                                 int64_t n, float *y, int64_t ldy) {
    const unsigned char *base = (const unsigned char *)w;
    size_t rowbytes = (size_t)eb_row_bytes(dtype, cols);
    int quantized = eb_dtype_quantized(dtype);
    for (int64_t r = r0; r < r1; r++) {
        const unsigned char *row = base + (size_t)r * rowbytes;
        for (int64_t t = 0; t < n; t++) {
            const float *xt = x + t * cols;
            y[t * ldy + r] = quantized               ? dot_quant(row, dtype, xt, cols)
                             : dtype == EB_DTYPE_F32 ? dot_f32(row, xt, cols)
                                                     : dot_16bit(row, xt, cols, dtype);
        }
    }
}
