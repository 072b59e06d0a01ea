/* CPU matmul kernels: one portable C version, one for AVX2 + FMA + F16C, and the q8 products for AVX-512 VNNI,
 * chosen at run time. */
#ifndef EB_CPU_KERNELS_H
#define EB_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "expertbench.h"

/* How far ahead the streaming decode tiles request each row's weights (bench/RESULTS.md: 2 KiB was the fastest of
 * 1-4 KiB); bench/membw's read_ahead requests lines as far ahead, so the ceiling keeps in step with the kernels. */
#define EB_CPU_AHEAD_BYTES 2048

/* y[t * ldy + r] = dot(w row r, x[t * cols ...]) for r in [r0, r1), t < n. */
typedef void (*eb_cpu_matmul_rows_fn)(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols,
                                      const float *x, int64_t n, float *y, int64_t ldy);

/* Activations quantized for the q8 precision: each row's blocks of `block` values as int8 with one f32 scale (d = the
 * block's largest magnitude / 127, q = x / d rounded to nearest even), and the sums of every 16 quants (the K
 * formats' minima and Q6_K's offset need them). Row t: q + t * cols, d + t * cols / block, s16 + t * cols / 16.
 * Blocks of 32 meet Q8_0 and MXFP4 weights (a scale per weight block); blocks of 256 the K formats, whose 256-value
 * blocks then sum their eight sub-blocks in integers, as llama.cpp's Q8_K does. */
typedef struct {
    int8_t *q;
    float *d;
    int16_t *s16;
    int64_t cols;
    int32_t block;
} eb_cpu_q8_rows;

static inline int32_t eb_cpu_q8_block(int dtype) {
    return dtype == EB_DTYPE_Q4_K || dtype == EB_DTYPE_Q5_K || dtype == EB_DTYPE_Q6_K ? 256 : 32;
}
static inline size_t eb_cpu_q8_bytes(int64_t n, int64_t cols, int32_t block) {
    return (size_t)(n * cols) + (size_t)(n * cols / block) * sizeof(float) + (size_t)(n * cols / 16) * sizeof(int16_t) +
           192;
}
/* Carve an eb_cpu_q8_rows for n rows of cols (a multiple of block) out of mem (eb_cpu_q8_bytes of it). */
eb_cpu_q8_rows eb_cpu_q8_layout(void *mem, int64_t n, int64_t cols, int32_t block);
void eb_cpu_quantize_q8(const float *x, int64_t n, int64_t cols, eb_cpu_q8_rows *out);
typedef void (*eb_cpu_quantize_q8_fn)(const float *x, int64_t n, int64_t cols, eb_cpu_q8_rows *out);

/* y[t * ldy + r] = dot(w row r, activations row t) for r in [r0, r1), t < n: a quantized format against q8
 * activations, integer products per 32 values and one f32 sum per row in a fixed order (any batch, any thread split
 * gives the same bits). */
typedef void (*eb_cpu_matmul_q8_fn)(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols,
                                    const eb_cpu_q8_rows *x, int64_t n, float *y, int64_t ldy);

void eb_cpu_matmul_q8_portable(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const eb_cpu_q8_rows *x,
                               int64_t n, float *y, int64_t ldy);
void eb_cpu_matmul_rows_portable(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const float *x,
                                 int64_t n, float *y, int64_t ldy);
#if defined(__x86_64__) || defined(__i386__)
#define EB_CPU_HAVE_AVX2_BUILD 1
void eb_cpu_matmul_rows_avx2(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const float *x,
                             int64_t n, float *y, int64_t ldy);
void eb_cpu_quantize_q8_avx2(const float *x, int64_t n, int64_t cols, eb_cpu_q8_rows *out);
void eb_cpu_matmul_q8_avx2(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const eb_cpu_q8_rows *x,
                           int64_t n, float *y, int64_t ldy);
/* The q8 products with AVX-512 F, BW, VL and VNNI for Q8_0 and Q6_K, AVX2 for the rest: the bits of
 * eb_cpu_matmul_q8_avx2 (cpu_kernels_avx512.c). */
#define EB_CPU_HAVE_AVX512_BUILD 1
void eb_cpu_matmul_q8_avx512(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const eb_cpu_q8_rows *x,
                             int64_t n, float *y, int64_t ldy);
#endif

#endif
