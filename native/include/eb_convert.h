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
    default: return 0.0f;
    }
}

#endif
