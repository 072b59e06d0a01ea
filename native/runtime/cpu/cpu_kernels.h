/* CPU matmul kernels: one portable C version and one for AVX2 + FMA + F16C, chosen at run time. */
#ifndef EB_CPU_KERNELS_H
#define EB_CPU_KERNELS_H

#include <stdint.h>

/* How far ahead the streaming decode tiles request each row's weights (bench/RESULTS.md: 2 KiB was the fastest of
 * 1-4 KiB); bench/membw's read_ahead requests lines as far ahead, so the ceiling keeps in step with the kernels. */
#define EB_CPU_AHEAD_BYTES 2048

/* y[t * ldy + r] = dot(w row r, x[t * cols ...]) for r in [r0, r1), t < n. */
typedef void (*eb_cpu_matmul_rows_fn)(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols,
                                      const float *x, int64_t n, float *y, int64_t ldy);

void eb_cpu_matmul_rows_portable(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const float *x,
                                 int64_t n, float *y, int64_t ldy);
#if defined(__x86_64__) || defined(__i386__)
#define EB_CPU_HAVE_AVX2_BUILD 1
void eb_cpu_matmul_rows_avx2(const void *w, int dtype, int64_t r0, int64_t r1, int64_t cols, const float *x,
                             int64_t n, float *y, int64_t ldy);
#endif

#endif
