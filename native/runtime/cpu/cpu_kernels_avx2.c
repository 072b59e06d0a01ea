/* AVX2 + FMA + F16C kernels. Compiled with -mavx2 -mfma -mf16c and only called after a run-time check.
 *
 * Every dot product uses four 8-lane accumulators over 32-column steps, then one 8-column step at a time
 * into the first accumulator, then a scalar tail, then a fixed reduction order. Tokens are processed in
 * pairs so each weight load serves two dot products, but each token's arithmetic is the same sequence as
 * when it is alone: a batch of positions gives bit-identical rows to single steps.
 */
#include "cpu_kernels.h"

#ifdef EB_CPU_HAVE_AVX2_BUILD
#include <immintrin.h>

#include "eb_convert.h"
#include "expertbench.h"

static inline __m256 load8(const unsigned char *w, int dtype, int64_t c) {
    switch (dtype) {
    case EB_DTYPE_BF16: {
        __m128i v = _mm_loadu_si128((const __m128i *)(w + 2 * c));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    }
    case EB_DTYPE_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * c)));
    default: return _mm256_loadu_ps((const float *)(w + 4 * c));
    }
}

static inline float hsum(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    __m128 lo = _mm256_castps256_ps128(s);
    __m128 hi = _mm256_extractf128_ps(s, 1);
    __m128 q = _mm_add_ps(lo, hi);
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

/* ntok is 1 or 2; out[t] = dot(row, x[t]). */
static inline void dot_tokens(const unsigned char *row, int dtype, int64_t cols, const float *x0, const float *x1,
                              int ntok, float *out) {
    __m256 a[2][4];
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < 4; k++) a[t][k] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 32 <= cols; c += 32) {
        __m256 w0 = load8(row, dtype, c), w1 = load8(row, dtype, c + 8);
        __m256 w2 = load8(row, dtype, c + 16), w3 = load8(row, dtype, c + 24);
        a[0][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + c), a[0][0]);
        a[0][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + c + 8), a[0][1]);
        a[0][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x0 + c + 16), a[0][2]);
        a[0][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x0 + c + 24), a[0][3]);
        if (ntok == 2) {
            a[1][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + c), a[1][0]);
            a[1][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + c + 8), a[1][1]);
            a[1][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x1 + c + 16), a[1][2]);
            a[1][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x1 + c + 24), a[1][3]);
        }
    }
    for (; c + 8 <= cols; c += 8) {
        __m256 w0 = load8(row, dtype, c);
        a[0][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + c), a[0][0]);
        if (ntok == 2) a[1][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + c), a[1][0]);
    }
    float tail0 = 0.0f, tail1 = 0.0f;
    for (; c < cols; c++) {
        float wv = eb_load_as_f32(row, dtype, c);
        tail0 += wv * x0[c];
        if (ntok == 2) tail1 += wv * x1[c];
    }
    out[0] = hsum(a[0][0], a[0][1], a[0][2], a[0][3]) + tail0;
    if (ntok == 2) out[1] = hsum(a[1][0], a[1][1], a[1][2], a[1][3]) + tail1;
}

/* Blocks for batches: a block of rows (about 64 KiB of weights) stays in L2 while blocks of tokens (about
 * 64 KiB of activations) stream past it, so a prefill reads each weight once from memory. */
#define ROW_BLOCK_BYTES (64 * 1024)
#define TOKEN_BLOCK_BYTES (64 * 1024)

void eb_cpu_matmul_rows_avx2(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const float *x,
                             int64_t n, float *y, int64_t ldy) {
    const unsigned char *base = (const unsigned char *)w;
    size_t rowbytes = (size_t)cols * eb_dtype_size(dtype);
    int64_t rb = (int64_t)(ROW_BLOCK_BYTES / rowbytes), tb = (int64_t)(TOKEN_BLOCK_BYTES / ((size_t)cols * 4));
    if (rb < 1) rb = 1;
    if (tb < 2) tb = 2;
    tb &= ~(int64_t)1;
    for (int64_t rs = r0; rs < r1; rs += rb) {
        int64_t re = rs + rb < r1 ? rs + rb : r1;
        for (int64_t ts = 0; ts < n; ts += tb) {
            int64_t te = ts + tb < n ? ts + tb : n;
            for (int64_t r = rs; r < re; r++) {
                const unsigned char *row = base + (size_t)r * rowbytes;
                int64_t t = ts;
                for (; t + 2 <= te; t += 2) {
                    float o[2];
                    dot_tokens(row, dtype, cols, x + t * cols, x + (t + 1) * cols, 2, o);
                    y[t * ldy + r] = o[0];
                    y[(t + 1) * ldy + r] = o[1];
                }
                if (t < te) {
                    float o[2];
                    dot_tokens(row, dtype, cols, x + t * cols, x + t * cols, 1, o);
                    y[t * ldy + r] = o[0];
                }
            }
        }
    }
}
#endif
