// The few CUDA names that the GPU modules' device-side format readers use, for the host: with them,
// native/runtime/gpu/gpu_blocks.cuh compiles as plain C++ and its readers run on the CPU (test_gpu_formats.cpp), so
// that a reader's values are checked where no GPU exists. Each is written from the CUDA documentation's definition.
#ifndef EB_GPU_HOST_SHIM_H
#define EB_GPU_HOST_SHIM_H

#include <cmath>
#include <cstdint>
#include <cstring>

extern "C" {
#include "eb_convert.h"
}

#define __device__
#define __host__
#define __forceinline__ inline

struct uint2 {
    unsigned x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};
struct float4 {
    float x, y, z, w;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// Byte n of the result is byte (s >> 4n) & 7 of the eight bytes x (0-3) and y (4-7).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long v = (unsigned long long)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; n++) r |= (unsigned)((v >> (8 * ((s >> (4 * n)) & 7))) & 0xffu) << (8 * n);
    return r;
}
inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
}
// the rounded operations device code writes where a product and a sum must not be fused (the host build of the test
// has -ffp-contract=off, so a plain expression is rounded at each step too)
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
struct __half {
    unsigned short bits;
};
inline __half __ushort_as_half(unsigned short s) { return {s}; }
inline float __half2float(__half h) { return eb_f16_to_f32(h.bits); }

#endif
