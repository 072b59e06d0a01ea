/* CPU matmul kernels: one portable C version, one for AVX2 + FMA + F16C, and the q8 products for AVX-512 VNNI,
 * chosen at run time. */
#ifndef EB_CPU_KERNELS_H
#define EB_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "eb_formats.h"
#include "expertbench.h"

/* How far ahead the streaming decode tiles request each row's weights (bench/RESULTS.md: 2 KiB was the fastest of
 * 1-4 KiB); bench/membw's read_ahead requests lines as far ahead, so the ceiling keeps in step with the kernels. */
#define EB_CPU_AHEAD_BYTES 2048

/* y[t * ldy + r] = dot(w row r, x[t * cols ...]) for r in [r0, r1), t < n. scale: the weight's scale companion
 * (eb_rt_scale's data, its blocks the format's scale block) where its format has one, else NULL. */
typedef void (*eb_cpu_matmul_rows_fn)(const void *w, int dtype, const float *scale, int64_t r0, int64_t r1,
                                      int64_t cols, const float *x, int64_t n, float *y, int64_t ldy);

/* Activations quantized for the q8 precision: each row's blocks of `block` values as int8 with one f32 scale (d = the
 * block's largest magnitude / 127, q = x / d rounded to nearest even), and the sums of every 16 quants (the K
 * formats' minima and Q6_K's offset need them). Row t: q + t * cols, d + t * cols / block, s16 + t * cols / 16.
 * The block is the format's q8_block (EB_FORMATS): 32 against Q8_0 and MXFP4 (a scale per weight block), 256 against
 * the K formats, whose 256-value blocks then sum their eight sub-blocks in integers, as llama.cpp's Q8_K does. */
typedef struct {
    int8_t *q;
    float *d;
    int16_t *s16;
    int64_t cols;
    int32_t block;
} eb_cpu_q8_rows;

static inline size_t eb_cpu_q8_bytes(int64_t n, int64_t cols, int32_t block) {
    return (size_t)(n * cols) + (size_t)(n * cols / block) * sizeof(float) + (size_t)(n * cols / 16) * sizeof(int16_t) +
           192;
}
/* Carve an eb_cpu_q8_rows for n rows of cols (a multiple of block) out of mem (eb_cpu_q8_bytes of it). */
eb_cpu_q8_rows eb_cpu_q8_layout(void *mem, int64_t n, int64_t cols, int32_t block);
typedef void (*eb_cpu_quantize_q8_fn)(const float *x, int64_t n, int64_t cols, eb_cpu_q8_rows *out);

/* A Q4_1 block's minimum times its 32 activations in the q8 precision (dx: their scale, s16: their two sums of 16):
 * the one float expression every variant adds beside the block's integer product. */
static inline float eb_q4_1_min_term(const unsigned char *b, float dx, const int16_t *s16) {
    return eb_f16_to_f32(eb_load_u16(b + 2)) * dx * (float)(s16[0] + s16[1]);
}

/* y[t * ldy + r] = dot(w row r, activations row t) for r in [r0, r1), t < n: a quantized format against q8
 * activations, integer products per 32 values and one f32 sum per row in a fixed order (any batch, any thread split
 * gives the same bits). */
typedef void (*eb_cpu_matmul_q8_fn)(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols,
                                    const eb_cpu_q8_rows *x, int64_t n, float *y, int64_t ldy);

/* Values 0 .. n - 1 of a row (n a whole number of blocks): eb_dequantize_scaled_row's values (scales: the row's
 * scales, eb_scale_row, where its format has a scale companion; else NULL). */
typedef void (*eb_cpu_dequantize_fn)(const void *row, const float *scales, int64_t n, float *out);

/* One format's kernels in one instruction set. rows and dequantize: a format the module reads has both. q8: the
 * integer products against activations quantized in blocks of the format's q8_block; NULL where it has none, and then
 * the q8 precision reads it with f32 activations through rows (a scaled format has none: its rows read the scales). */
typedef struct {
    eb_cpu_dequantize_fn dequantize;
    eb_cpu_matmul_rows_fn rows;
    eb_cpu_matmul_q8_fn q8;
} eb_cpu_format_kernels;

/* The kernels of an instruction set, indexed by format. A set either stands alone (portable) or lies over the one
 * below it, where a NULL entry is the lower set's (AVX2 over portable, AVX-512 VNNI over AVX2: it replaces only the
 * q8 products it makes faster). */
typedef struct {
    const char *variant;
    eb_cpu_quantize_q8_fn quantize_q8; /* every set's gives the same bytes */
    eb_cpu_format_kernels format[EB_DTYPE_COUNT];
} eb_cpu_kernel_set;

/* A format has integer (q8) products where its q8 block (EB_FORMATS) is not 0, so a set's q8 entries follow from the
 * table: EB_IF_Q8(q8_block, code...) is the code for a block of 32 or 256 and nothing for 0, EB_Q8_OR_NULL(q8_block,
 * fn) the function or NULL. A new format with a q8 block gets its entries from its row; it needs its loops only. */
#define EB_IF_Q8_0(...)
#define EB_IF_Q8_32(...) __VA_ARGS__
#define EB_IF_Q8_256(...) __VA_ARGS__
#define EB_IF_Q8(q8_block, ...) EB_IF_Q8_##q8_block(__VA_ARGS__)
#define EB_Q8_OR_NULL_0(fn) NULL
#define EB_Q8_OR_NULL_32(fn) fn
#define EB_Q8_OR_NULL_256(fn) fn
#define EB_Q8_OR_NULL(q8_block, fn) EB_Q8_OR_NULL_##q8_block(fn)

/* A set's q8 entry points of every format that has them: q8_NAME, the loop matmul_q8 of the set's file with its dtype
 * a constant (the dtype argument is the table's index). */
#define EB_CPU_Q8_KERNEL(name, code, block, block_bytes, ggml_type, quantized, q8_block, scale_rows, scale_cols)     \
    EB_IF_Q8(q8_block, static void q8_##name(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols,          \
                                             const eb_cpu_q8_rows *x, int64_t n, float *y, int64_t ldy) {              \
        (void)dtype;                                                                                                  \
        matmul_q8(w, EB_DTYPE_##name, r0, r1, cols, x, n, y, ldy);                                                    \
    })

extern const eb_cpu_kernel_set eb_cpu_kernels_portable;
#if defined(__x86_64__) || defined(__i386__)
#define EB_CPU_HAVE_AVX2_BUILD 1
#define EB_CPU_HAVE_AVX512_BUILD 1
extern const eb_cpu_kernel_set eb_cpu_kernels_avx2;   /* AVX2 + FMA + F16C */
extern const eb_cpu_kernel_set eb_cpu_kernels_avx512; /* AVX-512 F, BW, VL, VNNI, BMI2: the AVX2 q8 products' bits */
extern const eb_cpu_kernel_set eb_cpu_kernels_avx512_vbmi; /* and VBMI: IQ2_XXS's, the same bits */
/* The AVX2 products of any format through its table (for the benchmarks). */
void eb_cpu_matmul_rows_avx2(const void *w, int dtype, const float *scale, int64_t r0, int64_t r1, int64_t cols,
                             const float *x, int64_t n, float *y, int64_t ldy);
#endif

#endif
