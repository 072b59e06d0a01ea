/* The q8 precision's arithmetic that the runtime modules share (header-only; C, and CUDA / HIP device code).
 *
 * A q8 run is placement-independent only if every module computes an expert's output with the same bits: the same
 * quantized activations, the same integer sums and the same float expressions around them (each module's kernels,
 * written to the x86 CPU kernels' order), and the same activation between the gate/up and down products, which is
 * defined here. The f32 precision's activation calls the C library's expf, whose last bit differs between libraries
 * (glibc's and a GPU's), so the q8 precision's uses eb_q8_exp instead: every step an IEEE operation in round to
 * nearest, its result the same wherever those operations are exact (no contraction into fused multiply-adds, which
 * the C modules' -ffp-contract=off and the helpers below rule out), and accurate to about 1e-14 before the final
 * rounding to f32, so almost always the correctly rounded exp. It applies to an expert whose gate and up products are
 * both q8 products; an expert with a float gate or up keeps the f32 activation (its products differ between
 * modules anyway).
 */
#ifndef EB_Q8_H
#define EB_Q8_H

#include <stdint.h>
#include <string.h>

#include "eb_runtime.h"

#if defined(__CUDACC__) && !defined(__HIPCC__)
/* nvcc contracts a * b + c into one fma unless the operations are these intrinsics */
#define EB_Q8_FN __device__ static __forceinline__
#define EB_Q8_EXACT
#define EB_Q8_FMUL(a, b) __fmul_rn(a, b)
#define EB_Q8_FADD(a, b) __fadd_rn(a, b)
#define EB_Q8_FDIV(a, b) __fdiv_rn(a, b)
#define EB_Q8_DMUL(a, b) __dmul_rn(a, b)
#define EB_Q8_DADD(a, b) __dadd_rn(a, b)
#define EB_Q8_DSUB(a, b) __dsub_rn(a, b)
#else
#if defined(__HIPCC__)
/* hipcc contracts across expressions unless a function says otherwise (-ffp-contract=fast-honor-pragmas) */
#define EB_Q8_FN __device__ static __forceinline__
#define EB_Q8_EXACT _Pragma("clang fp contract(off)")
#else
/* the C modules are built with -ffp-contract=off */
#define EB_Q8_FN static inline
#define EB_Q8_EXACT
#endif
#define EB_Q8_FMUL(a, b) ((a) * (b))
#define EB_Q8_FADD(a, b) ((a) + (b))
#define EB_Q8_FDIV(a, b) ((a) / (b))
#define EB_Q8_DMUL(a, b) ((a) * (b))
#define EB_Q8_DADD(a, b) ((a) + (b))
#define EB_Q8_DSUB(a, b) ((a) - (b))
#endif

/* e^x in f32: 2^k e^r with k the nearest integer to x / ln 2 and r = x - k ln 2 (ln 2 in two parts, the first with
 * few enough bits that k times it is exact, as fdlibm's exp), e^r by its Taylor series to r^11 / 11! (|r| < 0.35: a
 * relative error near 1e-14), times 2^k exactly in double, then one rounding to f32 (subnormals rounded once; what
 * rounds past the largest f32 is inf). Beyond the range where e^x is a finite non-zero f32 it returns inf or 0
 * directly; NaN stays NaN. */
EB_Q8_FN float eb_q8_exp(float x) {
    EB_Q8_EXACT
    const uint32_t inf_bits = 0x7f800000u;
    float inf;
    memcpy(&inf, &inf_bits, sizeof inf);
    if (x != x) return x;
    if (x > 89.0f) return inf;
    if (x < -104.0f) return 0.0f;
    const double shift = 0x1.8p52; /* adding it rounds to an integer, ties to even */
    const double ln2_hi = 0x1.62e42feep-1, ln2_lo = 0x1.a39ef35793c76p-33;
    double xd = (double)x;
    double kd = EB_Q8_DSUB(EB_Q8_DADD(EB_Q8_DMUL(xd, 0x1.71547652b82fep0), shift), shift); /* x / ln 2, rounded */
    double r = EB_Q8_DSUB(EB_Q8_DSUB(xd, EB_Q8_DMUL(kd, ln2_hi)), EB_Q8_DMUL(kd, ln2_lo));
    double p = 0x1.ae64567f544e4p-26; /* 1 / n!, n = 11 .. 0 */
    p = EB_Q8_DADD(EB_Q8_DMUL(p, r), 0x1.27e4fb7789f5cp-22);
    p = EB_Q8_DADD(EB_Q8_DMUL(p, r), 0x1.71de3a556c734p-19);
    p = EB_Q8_DADD(EB_Q8_DMUL(p, r), 0x1.a01a01a01a01ap-16);
    p = EB_Q8_DADD(EB_Q8_DMUL(p, r), 0x1.a01a01a01a01ap-13);
    p = EB_Q8_DADD(EB_Q8_DMUL(p, r), 0x1.6c16c16c16c17p-10);
    p = EB_Q8_DADD(EB_Q8_DMUL(p, r), 0x1.1111111111111p-7);
    p = EB_Q8_DADD(EB_Q8_DMUL(p, r), 0x1.5555555555555p-5);
    p = EB_Q8_DADD(EB_Q8_DMUL(p, r), 0x1.5555555555555p-3);
    p = EB_Q8_DADD(EB_Q8_DMUL(p, r), 0x1p-1);
    p = EB_Q8_DADD(EB_Q8_DMUL(p, r), 1.0);
    p = EB_Q8_DADD(EB_Q8_DMUL(p, r), 1.0);
    uint64_t bits = (uint64_t)((int64_t)kd + 1023) << 52; /* k in -150 .. 129: 2^k a normal double */
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    double y = EB_Q8_DMUL(p, scale);
    return y >= 0x1.ffffffp127 ? inf : (float)y; /* from half an ulp past the largest f32, it rounds to inf */
}

/* The experts' activation (eb_rt_act) in the q8 precision: eb_act's expressions (eb_ops.h), in the same order, with
 * eb_q8_exp: silu(g) * u = g / (1 + e^-g) * u, or gpt-oss's clamped SwiGLU (u' + 1) * (g' / (1 + e^(-alpha g'))). */
EB_Q8_FN float eb_q8_act(int kind, float alpha, float limit, float g, float u) {
    EB_Q8_EXACT
    if (kind == EB_ACT_SILU) return EB_Q8_FMUL(EB_Q8_FDIV(g, EB_Q8_FADD(1.0f, eb_q8_exp(-g))), u);
    g = g < limit ? g : limit;
    u = u < -limit ? -limit : u > limit ? limit : u;
    if (kind == EB_ACT_SILU_CLAMP) return EB_Q8_FMUL(EB_Q8_FDIV(g, EB_Q8_FADD(1.0f, eb_q8_exp(-g))), u);
    return EB_Q8_FMUL(EB_Q8_FADD(u, 1.0f), EB_Q8_FDIV(g, EB_Q8_FADD(1.0f, eb_q8_exp(-EB_Q8_FMUL(alpha, g)))));
}

#endif
