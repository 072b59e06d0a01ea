/* Test blocks shared by the native tests (test_native.c, test_gpu_formats.cpp) and the GPU driver that
 * tests/test_gpu_quantized.py builds: an i-quant block's quants at their largest magnitudes, both signs. */
#ifndef EB_TEST_BLOCKS_H
#define EB_TEST_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "eb_formats.h"

/* The grid entries of the largest magnitudes, the scales at their largest, signs all + in even chunks and all - in
 * odd ones; IQ1_S and IQ1_M: the entries of all -1 and all +1, deltas of the same sign. Each block's d is kept (IQ1_M's
 * in the top nibbles of its scales too). 0 for a format that is no i-quant, 1 otherwise. */
static inline int eb_test_extreme_iq(unsigned char *b, int dt) {
    switch (dt) {
    case EB_DTYPE_IQ2_XXS: /* scales 15, grid entry 57 (the largest magnitudes), all signs + then all - */
        for (int j = 0; j < 8; j++) {
            uint32_t word = (j & 1 ? 0x0FFFFFFFu : 0u) | 15u << 28;
            memset(b + 2 + 8 * j, 57, 4);
            memcpy(b + 6 + 8 * j, &word, 4);
        }
        return 1;
    case EB_DTYPE_IQ3_XXS: /* scales 15, grid entry 135 (the largest magnitudes), all signs + then all - */
        memset(b + 2, 135, 64);
        for (int j = 0; j < 8; j++) {
            uint32_t word = (j & 1 ? 0x0FFFFFFFu : 0u) | 15u << 28;
            memcpy(b + 66 + 4 * j, &word, 4);
        }
        return 1;
    case EB_DTYPE_IQ2_XS: /* scales 15, grid entry 511 (all 43), all signs + then all - */
        for (int k = 0; k < 32; k++) {
            uint16_t q = (uint16_t)(511u | (k & 1 ? 127u : 0u) << 9);
            memcpy(b + 2 + 2 * k, &q, 2);
        }
        memset(b + 66, 0xFF, 8);
        return 1;
    case EB_DTYPE_IQ3_S: /* scales 15, grid entry 338 (the largest magnitudes), all signs + then all - */
        memset(b + 2, 338 & 255, 64);
        memset(b + 66, 0xFF, 8);
        for (int j = 0; j < 8; j++) memset(b + 74 + 4 * j, j & 1 ? 0xFF : 0x00, 4);
        memset(b + 106, 0xFF, 4);
        return 1;
    case EB_DTYPE_IQ2_S: /* scales 15, grid entry 1023 (all 43), all signs + then all - */
        memset(b + 2, 0xFF, 32);
        for (int j = 0; j < 8; j++) memset(b + 34 + 4 * j, j & 1 ? 0xFF : 0x00, 4);
        memset(b + 66, 0xFF, 16);
        return 1;
    case EB_DTYPE_IQ1_S: /* scales 7, grid entries 0 (all -1) and 2047 (all +1), deltas of the same sign */
        for (int j = 0; j < 8; j++) {
            uint16_t word = j & 1 ? 0x7FFFu : 0xF000u; /* top index bits 7 (2047) and +delta, or 0 (0) and -delta */
            memset(b + 2 + 4 * j, j & 1 ? 0xFF : 0x00, 4);
            memcpy(b + 34 + 2 * j, &word, 2);
        }
        return 1;
    case EB_DTYPE_IQ1_M: /* scales 7, grid entries 0 (all -1) and 2047 (all +1), deltas of the same sign; d kept */
        for (int j = 0; j < 8; j++) {
            memset(b + 4 * j, j & 1 ? 0xFF : 0x00, 4);
            memset(b + 32 + 2 * j, j & 1 ? 0x77 : 0x88, 2);
        }
        for (int k = 0; k < 4; k++) b[48 + 2 * k] = 0xFF, b[49 + 2 * k] |= 0x0F;
        return 1;
    default: return 0;
    }
}

/* An i-quant block's d set to the f16 h: the first two bytes, or IQ1_M's top nibbles of its four scale words. */
static inline void eb_test_iq_set_d(unsigned char *b, int dt, uint16_t h) {
    if (dt != EB_DTYPE_IQ1_M) {
        memcpy(b, &h, 2);
        return;
    }
    for (int i = 0; i < 4; i++) {
        uint16_t word;
        memcpy(&word, b + 48 + 2 * i, 2);
        word = (uint16_t)((word & 0x0FFFu) | (unsigned)((h >> (4 * i)) & 0xF) << 12);
        memcpy(b + 48 + 2 * i, &word, 2);
    }
}

#endif
