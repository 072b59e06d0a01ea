/* Scalar dtype conversions shared by the core and the runtime modules (internal, header-only). */
#ifndef EB_CONVERT_H
#define EB_CONVERT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "expertbench.h"

static inline float eb_bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float eb_bf16_to_f32(uint16_t h) { return eb_bits_to_f32((uint32_t)h << 16); }

static inline float eb_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0) return eb_bits_to_f32(sign);
        /* subnormal: renormalise */
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while ((mant & 0x400u) == 0);
        mant &= 0x3ffu;
        return eb_bits_to_f32(sign | ((uint32_t)(127 - 15 - e) << 23) | (mant << 13));
    }
    if (exp == 31) return eb_bits_to_f32(sign | 0x7f800000u | (mant << 13));
    return eb_bits_to_f32(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

static inline uint32_t eb_f32_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* eb_f16_to_f32's bits without branches, for loops the compiler makes SIMD (the half KV cache's reads): the half's
 * exponent and mantissa moved into an f32's fields and the product with 2^112 rebiasing it (exact for the normal
 * halves and the subnormal ones, which land on f32 subnormals: the default floating-point mode, no
 * denormals-are-zero), infinities and NaNs given the all-ones exponent, then the sign. test_native checks every
 * value against eb_f16_to_f32. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline float eb_f16_to_f32_lanes(uint16_t h) {
    uint32_t em = h & 0x7fffu, top = (em + 0x400u) >> 15; /* top: 1 for an infinity or NaN (em >= 0x7c00) */
    uint32_t bits = eb_f32_to_bits(eb_bits_to_f32(em << 13) * 0x1p112f) | top * 0x7f800000u;
    return eb_bits_to_f32(bits | (uint32_t)(h & 0x8000u) << 16);
}

/* f32 to bf16, rounded to the nearest (ties to even), as torch and numpy's ml_dtypes round; a NaN stays a quiet
 * NaN of its sign. */
static inline uint16_t eb_f32_to_bf16(float f) {
    uint32_t u = eb_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* f32 to IEEE half, rounded to the nearest (ties to even), as numpy's astype(float16): magnitudes from 65520 up
 * become infinity, those under 2^-14 the subnormals (2^-24 apart), a NaN the quiet NaN of its sign. */
static inline uint16_t eb_f32_to_f16(float f) {
    uint32_t u = eb_f32_to_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* a normal half: the exponent rebiased, 13 mantissa bits rounded off */
        uint32_t r = a - ((127u - 15u) << 23);
        return (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
    }
    /* a subnormal half (or zero): the magnitude in units of 2^-24, rounded; 1024 units is the smallest normal */
    uint32_t e = a >> 23, mant = (a & 0x7fffffu) | (e ? 0x800000u : 0u), s = 126u - (e ? e : 1u);
    if (s >= 25u) return (uint16_t)sign;
    uint32_t q = mant >> s, rem = mant & ((1u << s) - 1u), half = 1u << (s - 1u);
    q += rem > half || (rem == half && (q & 1u));
    return (uint16_t)(sign | q);
}

/* OCP FP8 E4M3FN (torch.float8_e4m3fn): sign, 4-bit exponent of bias 7, 3-bit mantissa; exponent 0 the subnormals
 * m * 2^-9; 0x7F and 0xFF NaN (the quiet NaN of that sign); no infinities, the largest magnitude 448. Every value is
 * exact in f32. The vector kernels compute the same bits (normal values by moving the exponent and mantissa into an
 * f32's fields and adding 120 to the exponent, subnormals by an exact integer conversion and power-of-two product). */
static inline float eb_e4m3_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, mag = b & 0x7Fu;
    if (mag == 0x7Fu) return eb_bits_to_f32(sign | 0x7FC00000u);
    if (mag < 8u) return eb_bits_to_f32(sign | eb_f32_to_bits((float)mag * 0x1p-9f));
    return eb_bits_to_f32(sign | ((mag << 20) + (120u << 23)));
}

static inline float eb_load_f32(const void *p) {
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

/* Element i of a tensor of the given dtype, as f32. */
static inline float eb_load_as_f32(const void *base, int dtype, int64_t i) {
    const unsigned char *b = (const unsigned char *)base;
    uint16_t h;
    switch (dtype) {
    case EB_DTYPE_F32: return eb_load_f32(b + 4 * i);
    case EB_DTYPE_F16: memcpy(&h, b + 2 * i, 2); return eb_f16_to_f32(h);
    case EB_DTYPE_BF16: memcpy(&h, b + 2 * i, 2); return eb_bf16_to_f32(h);
    case EB_DTYPE_F8_E4M3_B128: return eb_e4m3_to_f32(b[i]); /* before its scale */
    default: return 0.0f;
    }
}

#endif
