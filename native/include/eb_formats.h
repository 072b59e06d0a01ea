/* Weight formats (internal, header-only): the table made from EB_FORMATS (expertbench.h), and the scalar reference
 * dequantization.
 *
 * A format stores a row of `cols` values as cols / block blocks of block_bytes each (the float formats are blocks of
 * one value). The table is the one place that knows a format's sizes: every byte count of a weight is
 * eb_row_bytes(dtype, cols) times its rows, never elements times an element size.
 *
 * Every kernel reads quantized rows 32 values at a time (EB_CHUNK: one block of Q8_0 and MXFP4, one sub-block of
 * the 256-value K formats) through eb_dequantize_chunk or a vector version of it with the same results. A
 * dequantized value is the gguf package's (gguf.quants.dequantize), bit for bit: the scales' products with the
 * quants are exact in f32 (at most 24 significant bits), and Q4_K / Q5_K subtract the scaled minimum once after
 * that product, as it does. So a product against a quantized row equals the same product against its dequantized
 * f32 row wherever the kernel sums the values in the same order.
 */
#ifndef EB_FORMATS_H
#define EB_FORMATS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "eb_convert.h"
#include "eb_iq_tables.h"
#include "expertbench.h"

#define EB_CHUNK 32

typedef struct {
    const char *name;
    int32_t dtype;
    int32_t block;       /* values per block */
    int32_t block_bytes; /* bytes per block */
    int32_t ggml_type;
    int32_t quantized;
    int32_t q8_block; /* the q8 precision's activation block against it (0: f32 activations) */
    int32_t scale_rows, scale_cols; /* the block of one scale of its scale companion (0: it takes none) */
} eb_format_traits;

/* EB_FORMATS lists the formats in code order, so that the table's index is the code. */
#define EB_FORMAT_ROW(name, code, block, block_bytes, ggml_type, quantized, q8_block, scale_rows, scale_cols) \
    {#name, code, block, block_bytes, ggml_type, quantized, q8_block, scale_rows, scale_cols},
static const eb_format_traits eb_format_table[EB_DTYPE_COUNT] = {EB_FORMATS(EB_FORMAT_ROW)};
#undef EB_FORMAT_ROW

#ifdef __cplusplus
#define EB_STATIC_ASSERT static_assert
#else
#define EB_STATIC_ASSERT _Static_assert
#endif
enum { /* each format's place in the list */
    EB_FORMAT_PLACE_FIRST = -1,
#define EB_FORMAT_PLACE(name, code, block, block_bytes, ggml_type, quantized, q8_block, scale_rows, scale_cols) \
    EB_FORMAT_PLACE_##name,
    EB_FORMATS(EB_FORMAT_PLACE)
#undef EB_FORMAT_PLACE
};
#define EB_FORMAT_CHECK(name, code, block, block_bytes, ggml_type, quantized, q8_block, scale_rows, scale_cols)     \
    EB_STATIC_ASSERT(EB_FORMAT_PLACE_##name == code, "EB_FORMATS: " #name " is not in code order");              \
    EB_STATIC_ASSERT(block > 0 && block_bytes > 0 && (quantized ? block % EB_CHUNK == 0 : block == 1),           \
                     "EB_FORMATS: " #name ": a quantized format's blocks are whole chunks, a float one's one value"); \
    EB_STATIC_ASSERT(q8_block == 0 || (quantized && q8_block % block == 0),                                     \
                     "EB_FORMATS: " #name ": a q8 block is a whole number of weight blocks");                     \
    EB_STATIC_ASSERT((scale_rows == 0) == (scale_cols == 0) && scale_cols % EB_CHUNK == 0 &&                   \
                         (scale_cols == 0 || (block == 1 && q8_block == 0)),                                    \
                     "EB_FORMATS: " #name ": a scale companion's blocks are both sides or none, whole chunks wide, "  \
                     "of a one-value format without integer products");
EB_FORMATS(EB_FORMAT_CHECK)
#undef EB_FORMAT_CHECK
EB_STATIC_ASSERT(EB_DTYPE_COUNT <= EB_DTYPE_U8, "EB_FORMATS: a format's code would be the raw bytes' (EB_DTYPE_U8)");

static inline const eb_format_traits *eb_format(int dtype) {
    return dtype >= 0 && dtype < EB_DTYPE_COUNT ? &eb_format_table[dtype] : NULL;
}

static inline const char *eb_dtype_name(int dtype) {
    const eb_format_traits *f = eb_format(dtype);
    return f ? f->name : "unknown";
}

static inline int eb_dtype_quantized(int dtype) {
    const eb_format_traits *f = eb_format(dtype);
    return f && f->quantized;
}

/* Whether a format's values are multiplied by a scale companion (EB_FORMATS' scale block). */
static inline int eb_dtype_scaled(int dtype) {
    const eb_format_traits *f = eb_format(dtype);
    return f && f->scale_rows > 0;
}

/* The scale companion's grid for a weight of rows x cols in a scaled format: ceil(rows / scale_rows) x
 * ceil(cols / scale_cols) scales, row-major (0 x 0 for a format without). */
static inline int64_t eb_scale_grid_rows(int dtype, int64_t rows) {
    const eb_format_traits *f = eb_format(dtype);
    return f && f->scale_rows ? (rows + f->scale_rows - 1) / f->scale_rows : 0;
}
static inline int64_t eb_scale_grid_cols(int dtype, int64_t cols) {
    const eb_format_traits *f = eb_format(dtype);
    return f && f->scale_cols ? (cols + f->scale_cols - 1) / f->scale_cols : 0;
}
/* The scales of row r of a weight of cols values per row (grid: its scale companion; NULL without one). */
static inline const float *eb_scale_row(const float *grid, int dtype, int64_t r, int64_t cols) {
    if (!grid) return NULL;
    return grid + (size_t)(r / eb_format_table[dtype].scale_rows) * (size_t)eb_scale_grid_cols(dtype, cols);
}

/* Bytes of one row of cols values; 0 for an unknown format or a row that is not a whole number of blocks. */
static inline uint64_t eb_row_bytes(int dtype, int64_t cols) {
    const eb_format_traits *f = eb_format(dtype);
    if (!f || cols < 0 || cols % f->block) return 0;
    return (uint64_t)(cols / f->block) * (uint64_t)f->block_bytes;
}

/* The names of the formats in a bit mask (1 << dtype), comma separated, into buf. */
static inline const char *eb_format_list(uint32_t mask, char *buf, size_t len) {
    size_t off = 0;
    if (len) buf[0] = '\0';
    for (int d = 0; d < EB_DTYPE_COUNT; d++) {
        if (!(mask & (1u << d))) continue;
        int w = snprintf(buf + off, len - off, "%s%s", off ? ", " : "", eb_format_table[d].name);
        if (w < 0 || (size_t)w >= len - off) break;
        off += (size_t)w;
    }
    return buf;
}

static inline uint16_t eb_load_u16(const unsigned char *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* ggml's E8M0 exponent as the half of a power of two (its kvalues are the E2M1 values doubled). */
static inline float eb_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return eb_bits_to_f32(bits);
}

/* An E8M0 exponent's own value, 2^(e - 127) (255: NaN), as DeepSeek-V4's released scales mean it. */
static inline float eb_e8m0_to_f32(uint8_t e) {
    uint32_t bits = e == 255 ? 0x7FC00000u : e == 0 ? 0x00400000u : (uint32_t)e << 23;
    return eb_bits_to_f32(bits);
}

/* The values of a 4-bit code in the formats that look their quants up in 16 entries: MXFP4's E2M1 values (doubled), and
 * Q4_0's code less 8, Q4_1's code, and IQ4_NL's (and IQ4_XS's) grid, ggml's kvalues_iq4nl. */
static const int8_t eb_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
static const int8_t eb_q4_0_values[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
static const int8_t eb_q4_1_values[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const int8_t eb_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* 32 values of 16 bytes of 4-bit codes (value i in byte i's low half, i + 16 in its high), each d times its entry in
 * values: one f32 product of exact operands, as the gguf package forms them. */
static inline void eb_nibbles_times(const unsigned char *qs, const int8_t *values, float d, float *out) {
    for (int i = 0; i < 16; i++) {
        out[i] = d * (float)values[qs[i] & 0xF];
        out[i + 16] = d * (float)values[qs[i] >> 4];
    }
}

/* The 6-bit scale and minimum of sub-block j (< 8) of a Q4_K / Q5_K block's 12 packed bytes. */
static inline void eb_k4_scale_min(const unsigned char *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* The signed 6-bit scale of chunk j (< 8) of an IQ4_XS block: its low four bits from bytes 4..7 (two chunks a byte,
 * the even one low), its top two from the 16-bit word at byte 2 (two bits a chunk), less 32. */
static inline int eb_iq4xs_scale(const unsigned char *b, int j) {
    int lo = (b[4 + j / 2] >> (4 * (j & 1))) & 0xF, hi = (eb_load_u16(b + 2) >> (2 * j)) & 3;
    return (lo | hi << 4) - 32;
}

/* The formats of sixteen 16-value sub-blocks in a 256-value block, each its own scale (Q6_K, Q2_K, Q3_K): value i of
 * chunk j (< 8) is d times its sub-block's scale times its unsigned quant less an offset (Q6_K: 32, Q3_K: 4), Q2_K's
 * less its sub-block's minimum times dmin. Their quants lie in two 128-value halves; in each the chunk's (s = j % 4)
 * are bits 2s.. of the half's 32 bytes of 2-bit fields (Q2_K at byte 16, Q3_K at 32, its third bit bit j of the
 * first 32 bytes: the offset where that bit is clear, as the gguf package reads it), Q6_K's low four from a nibble of
 * 64 bytes and its top two from the half's 32 bytes at 128. */
static inline int eb_k16_quant(const unsigned char *b, int dtype, int j, int i) {
    int h = j / 4, s = j % 4;
    if (dtype == EB_DTYPE_Q2_K) return (b[16 + 32 * h + i] >> (2 * s)) & 3;
    if (dtype == EB_DTYPE_Q3_K) return ((b[32 + 32 * h + i] >> (2 * s)) & 3) | ((b[i] >> j) & 1) << 2;
    return ((b[64 * h + 32 * (s & 1) + i] >> (4 * (s >> 1))) & 0xF) | ((b[128 + 32 * h + i] >> (2 * s)) & 3) << 4;
}

/* The scale of sub-block g (< 16): Q6_K's int8 at byte 192, Q2_K's low nibble of byte g (its minimum the high), Q3_K's
 * 6 bits less 32, its low four a nibble of bytes 96..103 (g < 8 low), its top two from bytes 104..107 (bits 2 (g / 4)). */
static inline int eb_k16_scale(const unsigned char *b, int dtype, int g) {
    if (dtype == EB_DTYPE_Q3_K) return (((b[96 + g % 8] >> (4 * (g / 8))) & 0xF) | ((b[104 + g % 4] >> (2 * (g / 4))) & 3) << 4) - 32;
    return dtype == EB_DTYPE_Q2_K ? b[g] & 0xF : (int8_t)b[192 + g];
}

static inline int eb_k16_offset(int dtype) { return dtype == EB_DTYPE_Q6_K ? 32 : dtype == EB_DTYPE_Q3_K ? 4 : 0; }

/* Where the block's f16 scale d lies (Q2_K's dmin follows it). */
static inline int eb_k16_d(int dtype) { return dtype == EB_DTYPE_Q2_K ? 80 : dtype == EB_DTYPE_Q3_K ? 108 : 208; }

static inline uint32_t eb_load_u32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The i-quants: 256-value blocks whose values come in groups of 8, each the magnitudes of codebook entries
 * (eb_iq_tables.h; IQ3_XXS's hold 4 values, two make a group) with signs from a 7-bit index into eb_iq_ksigns,
 * times a per-chunk scale. After an f16 d:
 * - IQ2_XXS: per chunk j (32 values) eight bytes at 2 + 8j: four grid indices (group l's at byte l), then a 32-bit
 *   word of the four groups' sign indices (bits 7l .. 7l + 6) and the chunk's 4-bit scale s (bits 28..31); the
 *   values are d (s + 1/2) / 4 times the signed grid values.
 * - IQ3_XXS: 64 grid indices (chunk j's eight at 2 + 8j), then per chunk a 32-bit word at 66 + 4j as IQ2_XXS's; the
 *   values are d (s + 1/2) / 2 times the signed grid values.
 * - IQ2_XS: 32 16-bit words (chunk j's four at 2 + 8j), each a group's 9-bit grid index and 7-bit sign index above
 *   it, then per chunk a byte at 66 + j of two 4-bit scales (the low one its first 16 values'); the values are
 *   d (s + 1/2) / 4 times the signed grid values.
 * - IQ3_S: the low 8 bits of 64 indices into a 512-entry grid of 4 values (chunk j's eight at 2 + 8j), their ninth
 *   bits (chunk j's in the byte at 66 + j, index k's bit k), the signs themselves (chunk j's 32 bits at 74 + 4j, one
 *   a value), then per chunk a 4-bit scale s (bytes 106..109, the even chunk's low); the values are d (1 + 2 s)
 *   times the signed grid values.
 * - IQ2_S: the low 8 bits of 32 indices into a 1024-entry grid of 8 values (chunk j's four at 2 + 4j), the signs
 *   themselves (a byte a group, chunk j's four at 34 + 4j, bit i value i's), the indices' top 2 bits (chunk j's in
 *   the byte at 66 + j, group l's at bit 2l), then per chunk a byte at 74 + j of two 4-bit scales as IQ2_XS's; the
 *   values are d (s + 1/2) / 4 times the signed grid values. */
static inline int eb_dtype_iq(int dtype) {
    return dtype == EB_DTYPE_IQ2_XXS || dtype == EB_DTYPE_IQ3_XXS || dtype == EB_DTYPE_IQ2_XS || dtype == EB_DTYPE_IQ3_S ||
           dtype == EB_DTYPE_IQ2_S;
}

/* The word of chunk j's sign indices and scale (IQ2_XXS, IQ3_XXS). */
static inline uint32_t eb_iq_word(const unsigned char *b, int dtype, int j) {
    return eb_load_u32(b + (dtype == EB_DTYPE_IQ2_XXS ? 6 + 8 * j : 66 + 4 * j));
}

/* The 32 signed quants of chunk j (< 8) of an i-quant block: each group's grid values, negated where its sign bit is
 * set (the gguf package's grid * signs). */
static inline void eb_iq_quants(const unsigned char *b, int dtype, int j, int8_t *q) {
    const unsigned char *g = b + 2 + 8 * j;
    uint32_t w = dtype == EB_DTYPE_IQ2_XS || dtype == EB_DTYPE_IQ3_S || dtype == EB_DTYPE_IQ2_S ? 0
                                                                                              : eb_iq_word(b, dtype, j);
    for (int l = 0; l < 4; l++) {
        uint8_t grid[8];
        unsigned si = (w >> (7 * l)) & 127; /* the group's sign index */
        if (dtype == EB_DTYPE_IQ2_XS) {
            unsigned word = eb_load_u16(g + 2 * l);
            memcpy(grid, eb_iq2xs_grid[word & 511], 8);
            si = word >> 9;
        } else if (dtype == EB_DTYPE_IQ3_S) {
            int hi = b[66 + j];
            memcpy(grid, eb_iq3s_grid[g[2 * l] | ((hi >> (2 * l)) & 1) << 8], 4);
            memcpy(grid + 4, eb_iq3s_grid[g[2 * l + 1] | ((hi >> (2 * l + 1)) & 1) << 8], 4);
        } else if (dtype == EB_DTYPE_IQ2_S) {
            memcpy(grid, eb_iq2s_grid[b[2 + 4 * j + l] | ((b[66 + j] >> (2 * l)) & 3) << 8], 8);
        } else if (dtype == EB_DTYPE_IQ2_XXS) {
            memcpy(grid, eb_iq2xxs_grid[g[l]], 8);
        } else {
            memcpy(grid, eb_iq3xxs_grid[g[2 * l]], 4);
            memcpy(grid + 4, eb_iq3xxs_grid[g[2 * l + 1]], 4);
        }
        unsigned s = dtype == EB_DTYPE_IQ3_S ? b[74 + 4 * j + l] : dtype == EB_DTYPE_IQ2_S ? b[34 + 4 * j + l]
                                                                                        : eb_iq_ksigns[si];
        for (int i = 0; i < 8; i++) q[8 * l + i] = (int8_t)((s >> i) & 1 ? -grid[i] : grid[i]);
    }
}

/* The 4-bit scale s of half h (values 16h .. 16h + 15) of chunk j. */
static inline int eb_iq_scale(const unsigned char *b, int dtype, int j, int h) {
    if (dtype == EB_DTYPE_IQ2_XS) return (b[66 + j] >> (4 * h)) & 15;
    if (dtype == EB_DTYPE_IQ2_S) return (b[74 + j] >> (4 * h)) & 15;
    if (dtype == EB_DTYPE_IQ3_S) return (b[106 + j / 2] >> (4 * (j & 1))) & 15;
    return (int)(eb_iq_word(b, dtype, j) >> 28); /* IQ2_XXS, IQ3_XXS: one per chunk */
}

/* The f32 scale of half h of chunk j as the gguf package forms it, rounded where it rounds: (d (s + 1/2)) / 4
 * (IQ3_XXS: / 2; IQ3_S: d (1 + 2 s), one product). */
static inline float eb_iq_half_d(const unsigned char *b, int dtype, int j, int h) {
    float d = eb_f16_to_f32(eb_load_u16(b));
    if (dtype == EB_DTYPE_IQ3_S) return d * (float)(1 + 2 * eb_iq_scale(b, dtype, j, h));
    return d * (0.5f + (float)eb_iq_scale(b, dtype, j, h)) * (dtype == EB_DTYPE_IQ3_XXS ? 0.5f : 0.25f);
}

/* The q8 products sum each block's quants times 2 s + 1 in integers and scale the block once by d dx, as llama.cpp's
 * vec_dot does; what is left of the values' scale (IQ2_XXS, IQ2_XS, IQ2_S: 1/8, IQ3_XXS: 1/4, IQ3_S: none)
 * multiplies the row's sum once at its end. */
static inline float eb_iq_row_scale(int dtype) {
    return dtype == EB_DTYPE_IQ3_S ? 1.0f : dtype == EB_DTYPE_IQ3_XXS ? 0.25f : 0.125f;
}

/* The 1-bit i-quants: per group of 8 values an 11-bit index into a 2048-entry grid of -1, 0 and +1 (eb_iq1s_grid)
 * and the sign of a shift of 1/8 (delta); the values are d (2 s + 1) times (grid value + delta), s a 3-bit scale, the
 * first product rounded, as the gguf package forms them.
 * - IQ1_S: an f16 d, the low 8 bits of 32 indices (chunk j's four at 2 + 4j), then per chunk a 16-bit word at
 *   34 + 2j: its groups' top 3 index bits (bits 3l ..), its scale s (bits 12..14) and its delta's sign (bit 15).
 * - IQ1_M: the low 8 bits of 32 indices (chunk j's four at 4j), then per group a nibble (chunk j's four in the bytes
 *   at 32 + 2j, the even group's low) of its top 3 index bits and its delta's sign (bit 3), then four 16-bit words at
 *   48: per 16 values a 3-bit scale (chunk j's two in word j / 2, bits 6 (j % 2) ..), and in the words' top nibbles
 *   the f16 d (its low nibble in the first word's). */
static inline int eb_dtype_iq1(int dtype) { return dtype == EB_DTYPE_IQ1_S || dtype == EB_DTYPE_IQ1_M; }

/* The 32 grid values (-1, 0, +1) of chunk j (< 8) of a 1-bit block, and its four groups' delta signs (+1 or -1). */
static inline void eb_iq1_quants(const unsigned char *b, int dtype, int j, int8_t *q, int *delta) {
    if (dtype == EB_DTYPE_IQ1_M) {
        for (int l = 0; l < 4; l++) {
            unsigned nib = (b[32 + 2 * j + l / 2] >> (4 * (l % 2))) & 15;
            memcpy(q + 8 * l, eb_iq1s_grid[b[4 * j + l] | (nib & 7) << 8], 8);
            delta[l] = nib & 8 ? -1 : 1;
        }
        return;
    }
    unsigned w = eb_load_u16(b + 34 + 2 * j); /* IQ1_S */
    for (int l = 0; l < 4; l++) {
        memcpy(q + 8 * l, eb_iq1s_grid[b[2 + 4 * j + l] | ((w >> (3 * l)) & 7) << 8], 8);
        delta[l] = w & 0x8000 ? -1 : 1;
    }
}

/* The 3-bit scale s of half h (values 16h .. 16h + 15) of chunk j of a 1-bit block (IQ1_S: one per chunk). */
static inline int eb_iq1_scale(const unsigned char *b, int dtype, int j, int h) {
    if (dtype == EB_DTYPE_IQ1_M) return (eb_load_u16(b + 48 + 2 * (j / 2)) >> (6 * (j % 2) + 3 * h)) & 7;
    return (eb_load_u16(b + 34 + 2 * j) >> 12) & 7;
}

/* A 1-bit block's f16 d (IQ1_M's from the top nibbles of its four scale words) as f32. */
static inline float eb_iq1_d(const unsigned char *b, int dtype) {
    if (dtype == EB_DTYPE_IQ1_M)
        return eb_f16_to_f32((uint16_t)((eb_load_u16(b + 48) >> 12) | ((eb_load_u16(b + 50) >> 8) & 0x00F0) |
                                        ((eb_load_u16(b + 52) >> 4) & 0x0F00) | (eb_load_u16(b + 54) & 0xF000)));
    return eb_f16_to_f32(eb_load_u16(b));
}

/* Where chunk c (the values 32c .. 32c + 31) of a quantized row begins, and which of its block's chunks it is. */
static inline const unsigned char *eb_chunk_block(const void *row, int dtype, int64_t c, int *sub) {
    const eb_format_traits *f = &eb_format_table[dtype];
    int per = f->block / EB_CHUNK;
    *sub = (int)(c % per);
    return (const unsigned char *)row + (size_t)(c / per) * (size_t)f->block_bytes;
}

/* The 32 values of chunk c of a row (scalar reference; the vector kernels give the same values). */
static inline void eb_dequantize_chunk(const void *row, int dtype, int64_t c, float *out) {
    int j;
    const unsigned char *b = eb_chunk_block(row, dtype, c, &j);
    switch (dtype) {
    case EB_DTYPE_Q8_0: {
        float d = eb_f16_to_f32(eb_load_u16(b));
        for (int i = 0; i < 32; i++) out[i] = (float)(int8_t)b[2 + i] * d;
        return;
    }
    case EB_DTYPE_MXFP4: eb_nibbles_times(b + 1, eb_mxfp4_values, eb_e8m0_half(b[0]), out); return;
    case EB_DTYPE_Q4_0: eb_nibbles_times(b + 2, eb_q4_0_values, eb_f16_to_f32(eb_load_u16(b)), out); return;
    case EB_DTYPE_IQ4_NL: eb_nibbles_times(b + 2, eb_iq4nl_values, eb_f16_to_f32(eb_load_u16(b)), out); return;
    case EB_DTYPE_IQ4_XS: { /* the chunk's scale d * s rounded once, then times each grid value, as the gguf package */
        float dl = eb_f16_to_f32(eb_load_u16(b)) * (float)eb_iq4xs_scale(b, j);
        eb_nibbles_times(b + 8 + 16 * j, eb_iq4nl_values, dl, out);
        return;
    }
    case EB_DTYPE_Q4_1: { /* d times the code, then plus m: two roundings, as the gguf package's (d * q) + m */
        float m = eb_f16_to_f32(eb_load_u16(b + 2));
        eb_nibbles_times(b + 4, eb_q4_1_values, eb_f16_to_f32(eb_load_u16(b)), out);
        for (int i = 0; i < 32; i++) out[i] = out[i] + m;
        return;
    }
    case EB_DTYPE_Q5_0:
    case EB_DTYPE_Q5_1: { /* d, (m,) 32 fifth bits, nibbles: value j in byte j's low half, j + 16 in its high */
        int q51 = dtype == EB_DTYPE_Q5_1;
        float d = eb_f16_to_f32(eb_load_u16(b)), m = q51 ? eb_f16_to_f32(eb_load_u16(b + 2)) : 0.0f;
        uint32_t qh;
        memcpy(&qh, b + 2 + 2 * q51, sizeof qh);
        const unsigned char *qs = b + 6 + 2 * q51;
        for (int i = 0; i < 16; i++) {
            int lo = (qs[i] & 0xF) | (int)((qh >> i) & 1) << 4, hi = (qs[i] >> 4) | (int)((qh >> (i + 16)) & 1) << 4;
            out[i] = q51 ? d * (float)lo + m : d * (float)(lo - 16);
            out[i + 16] = q51 ? d * (float)hi + m : d * (float)(hi - 16);
        }
        return;
    }
    case EB_DTYPE_Q4_K:
    case EB_DTYPE_Q5_K: {
        int sc, m;
        eb_k4_scale_min(b + 4, j, &sc, &m);
        float dl = eb_f16_to_f32(eb_load_u16(b)) * (float)sc, ml = eb_f16_to_f32(eb_load_u16(b + 2)) * (float)m;
        int q5 = dtype == EB_DTYPE_Q5_K;
        const unsigned char *qh = b + 16, *qs = b + 16 + (q5 ? 32 : 0) + 32 * (j / 2);
        for (int i = 0; i < 32; i++) {
            int q = (qs[i] >> (4 * (j & 1))) & 0xF;
            if (q5) q |= ((qh[i] >> j) & 1) << 4;
            out[i] = dl * (float)q - ml;
        }
        return;
    }
    case EB_DTYPE_IQ2_XXS:
    case EB_DTYPE_IQ3_XXS:
    case EB_DTYPE_IQ2_XS:
    case EB_DTYPE_IQ3_S:
    case EB_DTYPE_IQ2_S: { /* each half's scale times the signed grid values (negation is exact) */
        int8_t q[32];
        eb_iq_quants(b, dtype, j, q);
        for (int h = 0; h < 2; h++) {
            float dl = eb_iq_half_d(b, dtype, j, h);
            for (int i = 16 * h; i < 16 * h + 16; i++) out[i] = dl * (float)q[i];
        }
        return;
    }
    case EB_DTYPE_IQ1_S:
    case EB_DTYPE_IQ1_M: { /* d (2 s + 1) rounded, times each grid value plus its group's delta (an exact sum) */
        int8_t q[32];
        int delta[4];
        eb_iq1_quants(b, dtype, j, q, delta);
        float d = eb_iq1_d(b, dtype);
        for (int h = 0; h < 2; h++) {
            float dl = d * (float)(2 * eb_iq1_scale(b, dtype, j, h) + 1);
            for (int i = 16 * h; i < 16 * h + 16; i++) out[i] = dl * ((float)q[i] + 0.125f * (float)delta[i / 8]);
        }
        return;
    }
    case EB_DTYPE_Q6_K:
    case EB_DTYPE_Q2_K:
    case EB_DTYPE_Q3_K: { /* per 16 values d * scale rounded once, times the quant less its offset; Q2_K's scaled
                           * minimum subtracted after, as the gguf package's dl * q - ml */
        int q2 = dtype == EB_DTYPE_Q2_K;
        float d = eb_f16_to_f32(eb_load_u16(b + eb_k16_d(dtype))), dmin = q2 ? eb_f16_to_f32(eb_load_u16(b + 82)) : 0.0f;
        for (int half = 0; half < 2; half++) {
            int g = 2 * j + half;
            float dl = d * (float)eb_k16_scale(b, dtype, g), ml = q2 ? dmin * (float)(b[g] >> 4) : 0.0f;
            for (int i = 16 * half; i < 16 * half + 16; i++) {
                float q = (float)(eb_k16_quant(b, dtype, j, i) - eb_k16_offset(dtype));
                out[i] = q2 ? dl * q - ml : dl * q;
            }
        }
        return;
    }
    default: { /* a float format */
        for (int i = 0; i < 32; i++) out[i] = eb_load_as_f32(row, dtype, 32 * c + i);
        return;
    }
    }
}

/* Values 0 .. n - 1 of a row as f32 (n a whole number of blocks for a quantized format). A scaled format's values
 * before their scales (eb_dequantize_scaled_row gives them with). */
static inline void eb_dequantize_row(const void *row, int dtype, int64_t n, float *out) {
    const unsigned char *b = (const unsigned char *)row;
    switch (dtype) { /* the float formats' loops apart (a row of them is read whole at load: the weights' check) */
    case EB_DTYPE_F32: memcpy(out, row, (size_t)n * sizeof *out); return;
    case EB_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = eb_bf16_to_f32(eb_load_u16(b + 2 * i));
        return;
    case EB_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) out[i] = eb_f16_to_f32(eb_load_u16(b + 2 * i));
        return;
    default: break;
    }
    if (!eb_dtype_quantized(dtype)) {
        for (int64_t i = 0; i < n; i++) out[i] = eb_load_as_f32(row, dtype, i);
        return;
    }
    for (int64_t c = 0; c < n / EB_CHUNK; c++) eb_dequantize_chunk(row, dtype, c, out + EB_CHUNK * c);
}

/* A row's values as every kernel computes with them: of a scaled format each value times its block's scale
 * (scales: the row's scales, eb_scale_row; one f32 product, as DeepSeek's and transformers' dequantization form it),
 * of any other format eb_dequantize_row's (scales NULL). */
static inline void eb_dequantize_scaled_row(const void *row, int dtype, const float *scales, int64_t n, float *out) {
    eb_dequantize_row(row, dtype, n, out);
    if (!scales || !eb_dtype_scaled(dtype)) return;
    int64_t sc = eb_format_table[dtype].scale_cols;
    for (int64_t i = 0; i < n; i++) out[i] = out[i] * scales[i / sc];
}

#endif
