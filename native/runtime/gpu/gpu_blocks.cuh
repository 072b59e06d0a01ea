// Part of gpu_runtime.cu (through gpu_formats.cuh): the quantized formats' blocks as a lane reads them, and the
// per-lane dot products over them. Plain arithmetic on loaded words, with no launch, thread index or warp shuffle:
// native/tests/test_gpu_formats.cpp compiles it for the host and holds every reader to the core's dequantization.

// ---- quantized weights: each value exactly as eb_dequantize_chunk gives it ---------------------------------
//
// A quantized row is a whole number of blocks at w + row * row_bytes (gpu_row_bytes: eb_row_bytes in device code).
// A warp reads it in groups (qfmt<>::GROUPS per block, group g of the row on lane g % warp): the values one lane
// dequantizes from one read of its block, RUNS runs of RUN consecutive columns (multiples of 8 from the block's
// first column). The lanes of a block read its bytes side by side, the widest pieces its layout allows: 16 bytes
// of Q4_K / Q5_K nibbles (one vector load where the row is 16-byte aligned, as the core's device allocations are),
// 8-byte pieces of Q8_0, Q6_K and MXFP4, whose blocks (34, 210, 17 bytes) lie at any alignment, from the aligned
// words that hold them. Measured on an H200 (32768 x 2048 products, n = 1), this layout read each format 1.3-1.8x
// faster than one of 4-column groups whose x loads are whole 128-byte lines, which wins only for several rows of x
// on Q4_K / Q5_K (its extra per-group work costs more than the lines save when a row of x is read once).
//
// Every dequantized value is the reference's, bit for bit: the scales' products with the quants are exact in f32
// (at most 24 significant bits), so a product is the same however it is formed, and the one rounding of Q4_K /
// Q5_K (the scaled minimum subtracted) is the one of fmaf(d * sc, q, -dmin * m), the product in it being exact.
// A lane multiplies and adds the values with explicit fmaf in column order within each run, so that no compiler
// contracts one kernel's sums differently from another's (warp_dot_tile and warp_dot_rows give the same bits).

// Bytes of one row of cols values (cols a whole number of the format's blocks), in device code too: a case per format
// of EB_FORMATS (expertbench.h), so its constants are the core's table's.
__host__ __device__ __forceinline__ unsigned long long gpu_row_bytes(int dtype, long long cols) {
    switch (dtype) {
#define GPU_ROW_BYTES(name, code, block, block_bytes, ggml_type, quantized, q8_block, scale_rows, scale_cols) \
    case code: return (unsigned long long)(cols / block) * (unsigned long long)block_bytes;
        EB_FORMATS(GPU_ROW_BYTES)
#undef GPU_ROW_BYTES
    default: return 0;
    }
}

// Loads of bytes at any alignment from the aligned 4-byte words that hold them: never a word none of whose bytes
// is wanted (so never past the end of the weights), a word selected instead of a branch (no divergence where
// neighbouring blocks have different alignments: Q8_0's 34-byte, Q6_K's 210-byte and MXFP4's 17-byte blocks).
__device__ __forceinline__ unsigned word_at(const unsigned char *a) { return *(const unsigned *)a; }
__device__ __forceinline__ unsigned funnel(unsigned lo, unsigned hi, unsigned r) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> r);
}
__device__ __forceinline__ const unsigned char *word_of(const unsigned char *p) {
    return (const unsigned char *)((uintptr_t)p & ~(uintptr_t)3);
}
__device__ __forceinline__ unsigned ld_u8(const unsigned char *p) {
    return (word_at(word_of(p)) >> (8u * ((uintptr_t)p & 3))) & 0xffu;
}
__device__ __forceinline__ unsigned ld_u16(const unsigned char *p) {
    const unsigned char *a = word_of(p);
    unsigned r = (unsigned)((uintptr_t)p & 3);
    return funnel(word_at(a), word_at(a + (r == 3 ? 4 : 0)), 8u * r) & 0xffffu;
}
__device__ __forceinline__ unsigned ld_u32(const unsigned char *p) {
    const unsigned char *a = word_of(p);
    unsigned r = (unsigned)((uintptr_t)p & 3);
    return funnel(word_at(a), word_at(a + (r ? 4 : 0)), 8u * r);
}
__device__ __forceinline__ uint2 ld_u64(const unsigned char *p) {
    const unsigned char *a = word_of(p);
    unsigned r = (unsigned)((uintptr_t)p & 3);
    unsigned w0 = word_at(a), w1 = word_at(a + 4), w2 = word_at(a + (r ? 8 : 4));
    return make_uint2(funnel(w0, w1, 8u * r), funnel(w1, w2, 8u * r));
}
// 16 bytes: one vector load where p is 16-byte aligned (a16: the row's base is, and so every piece read here)
__device__ __forceinline__ uint4 ld_u128(const unsigned char *p, bool a16) {
    if (a16) return *(const uint4 *)p;
    const unsigned char *a = word_of(p);
    unsigned r = (unsigned)((uintptr_t)p & 3);
    unsigned w0 = word_at(a), w1 = word_at(a + 4), w2 = word_at(a + 8), w3 = word_at(a + 12);
    unsigned w4 = word_at(a + (r ? 16 : 12));
    return make_uint4(funnel(w0, w1, 8u * r), funnel(w1, w2, 8u * r), funnel(w2, w3, 8u * r),
                      funnel(w3, w4, 8u * r));
}

__device__ __forceinline__ float half_bits(unsigned h) { return __half2float(__ushort_as_half((unsigned short)h)); }

// Byte k (a constant) of w as a float, exactly: 2^23 + byte by its bits, less 2^23 (a byte permute and a float
// add, where a conversion instruction runs at a quarter of their rate). sbyte_f: the byte as a signed int8.
__device__ __forceinline__ float ubyte_f(unsigned w, int k) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (unsigned)k)) - 8388608.0f;
}
__device__ __forceinline__ float sbyte_f(unsigned w, int k) { // w already XORed with 0x80808080
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (unsigned)k)) - 8388736.0f;
}

// eb_e8m0_half
__device__ __forceinline__ float e8m0_half(unsigned e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// Byte k (< 12, any value) of the 12 bytes s0, s1, s2.
__device__ __forceinline__ unsigned byte12(unsigned s0, unsigned s1, unsigned s2, int k) {
    unsigned w = k < 4 ? s0 : k < 8 ? s1 : s2;
    return (w >> (8 * (k & 3))) & 0xffu;
}

// eb_k4_scale_min on the 12 packed bytes s0, s1, s2.
__device__ __forceinline__ void k4_scale_min(unsigned s0, unsigned s1, unsigned s2, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = (int)(byte12(s0, s1, s2, j) & 63);
        *m = (int)(byte12(s0, s1, s2, j + 4) & 63);
    } else {
        unsigned b = byte12(s0, s1, s2, j + 4);
        *sc = (int)((b & 0xF) | ((byte12(s0, s1, s2, j - 4) >> 6) << 4));
        *m = (int)((b >> 4) | ((byte12(s0, s1, s2, j) >> 6) << 4));
    }
}

template <int DT> struct qfmt;

// Q8_0: 34 bytes (f16 d, 32 int8); a group is 8 values (a quarter block), one run.
template <> struct qfmt<EB_DTYPE_Q8_0> {
    static constexpr int VALS = 32, BYTES = 34, GROUPS = 4, RUNS = 1, RUN = 8;
    __device__ static __forceinline__ void load(const unsigned char *b, int g, bool, float *v, int *col) {
        float d = half_bits(ld_u16(b));
        uint2 q = ld_u64(b + 2 + 8 * g);
        unsigned w[2] = {q.x ^ 0x80808080u, q.y ^ 0x80808080u};
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = sbyte_f(w[i / 4], i % 4) * d;
        col[0] = 8 * g;
    }
};

// MXFP4: 17 bytes (E8M0 exponent, 16 bytes of E2M1 pairs); a group is 8 bytes: 8 low nibbles (columns 8g..8g+7)
// and their 8 high ones (16 + 8g..), two runs. The values table {0, 1, 2, 3, 4, 6, 8, 12} and its negatives by
// byte permutes, four nibbles at a time.
template <> struct qfmt<EB_DTYPE_MXFP4> {
    static constexpr int VALS = 32, BYTES = 17, GROUPS = 2, RUNS = 2, RUN = 8;
    __device__ static __forceinline__ void values4(unsigned n, float d, float *v) { // n: 4 nibbles, one a byte
        unsigned t = n | (n >> 4);
        unsigned sel = (t & 0xffu) | ((t >> 8) & 0xff00u);
        unsigned pos = __byte_perm(0x03020100u, 0x0C080604u, sel & 0x7777u);
        unsigned neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, sel & 0x7777u);
        unsigned mask = ((n >> 3) & 0x01010101u) * 0xffu;
        unsigned q = ((pos & ~mask) | (neg & mask)) ^ 0x80808080u;
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = d * sbyte_f(q, k);
    }
    __device__ static __forceinline__ void load(const unsigned char *b, int g, bool, float *v, int *col) {
        float d = e8m0_half(ld_u8(b));
        uint2 q = ld_u64(b + 1 + 8 * g);
        values4(q.x & 0x0F0F0F0Fu, d, v);
        values4(q.y & 0x0F0F0F0Fu, d, v + 4);
        values4((q.x >> 4) & 0x0F0F0F0Fu, d, v + 8);
        values4((q.y >> 4) & 0x0F0F0F0Fu, d, v + 12);
        col[0] = 8 * g;
        col[1] = 16 + 8 * g;
    }
};

// Q5_0 (22 bytes: f16 d, 32 fifth bits, 16 bytes of nibbles) and Q5_1 (24: f16 d and m first): a group is 8 bytes
// of nibbles, their low halves columns 8g..8g+7 and their high ones 16 + 8g.., two runs (eb_dequantize_chunk's).
template <int Q51> struct qfmt_q5 {
    static constexpr int VALS = 32, BYTES = Q51 ? 24 : 22, GROUPS = 2, RUNS = 2, RUN = 8;
    __device__ static __forceinline__ void load(const unsigned char *b, int g, bool, float *v, int *col) {
        float d = half_bits(ld_u16(b)), m = Q51 ? half_bits(ld_u16(b + 2)) : 0.0f;
        unsigned qh = ld_u16(b + 2 + 2 * Q51) | ld_u16(b + 4 + 2 * Q51) << 16;
        uint2 q = ld_u64(b + 6 + 2 * Q51 + 8 * g);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            unsigned byte = ((i < 4 ? q.x : q.y) >> (8 * (i % 4))) & 0xffu;
            int lo = (int)((byte & 0xFu) | ((qh >> (8 * g + i)) & 1u) << 4);
            int hi = (int)((byte >> 4) | ((qh >> (16 + 8 * g + i)) & 1u) << 4);
            v[i] = Q51 ? fmaf(d, (float)lo, m) : d * (float)(lo - 16);
            v[8 + i] = Q51 ? fmaf(d, (float)hi, m) : d * (float)(hi - 16);
        }
        col[0] = 8 * g;
        col[1] = 16 + 8 * g;
    }
};
template <> struct qfmt<EB_DTYPE_Q5_0> : qfmt_q5<0> {};
template <> struct qfmt<EB_DTYPE_Q5_1> : qfmt_q5<1> {};

// Q4_K (144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales and minimums, 128 bytes of nibbles) and Q5_K (the
// same, then 32 bytes of fifth bits before the nibbles: 176): a group is 16 bytes of nibbles, g = 2p + h: the 16
// low nibbles are sub-block 2p's values 16h..16h+15 (columns 64p + 16h..), the high ones sub-block 2p + 1's
// (64p + 32 + 16h..), two runs. The 16-byte head (d, dmin, scales) is one read, shared by the block's 8 lanes.
template <int Q5> struct qfmt_k45 {
    static constexpr int VALS = 256, BYTES = Q5 ? 176 : 144, GROUPS = 8, RUNS = 2, RUN = 16;
    __device__ static __forceinline__ void load(const unsigned char *b, int g, bool a16, float *v, int *col) {
        int p = g >> 1, h = g & 1;
        uint4 head = ld_u128(b, a16);
        uint4 qs = ld_u128(b + 16 + (Q5 ? 32 : 0) + 16 * g, a16);
        int sc0, m0, sc1, m1;
        k4_scale_min(head.y, head.z, head.w, 2 * p, &sc0, &m0);
        k4_scale_min(head.y, head.z, head.w, 2 * p + 1, &sc1, &m1);
        float d = half_bits(head.x & 0xffffu), dmin = half_bits(head.x >> 16);
        float dl0 = d * (float)sc0, ml0 = dmin * (float)m0, dl1 = d * (float)sc1, ml1 = dmin * (float)m1;
        unsigned q[4] = {qs.x, qs.y, qs.z, qs.w}, hb[4] = {0, 0, 0, 0};
        if (Q5) {
            uint4 qh = ld_u128(b + 16 + 16 * h, a16);
            hb[0] = qh.x, hb[1] = qh.y, hb[2] = qh.z, hb[3] = qh.w;
        }
#pragma unroll
        for (int w = 0; w < 4; w++) {
            unsigned lo = q[w] & 0x0F0F0F0Fu, hi = (q[w] >> 4) & 0x0F0F0F0Fu;
            if (Q5) {
                lo |= ((hb[w] >> (2 * p)) & 0x01010101u) << 4;
                hi |= ((hb[w] >> (2 * p + 1)) & 0x01010101u) << 4;
            }
#pragma unroll
            for (int k = 0; k < 4; k++) {
                v[4 * w + k] = fmaf(dl0, ubyte_f(lo, k), -ml0); // = dl0 * q - ml0 rounded once, as the reference
                v[16 + 4 * w + k] = fmaf(dl1, ubyte_f(hi, k), -ml1);
            }
        }
        col[0] = 64 * p + 16 * h;
        col[1] = 64 * p + 32 + 16 * h;
    }
};
template <> struct qfmt<EB_DTYPE_Q4_K> : qfmt_k45<0> {};
template <> struct qfmt<EB_DTYPE_Q5_K> : qfmt_k45<1> {};

// Q6_K: 210 bytes (128 bytes of low nibbles ql, 64 of high bit pairs qh, 16 int8 scales, f16 d). A group, g =
// 4hh + t, is 8 bytes each of ql[64hh + 8t..], ql[64hh + 32 + 8t..] and qh[32hh + 8t..]: values 8t..8t+7 of
// sub-blocks 4hh + s (s < 4; columns 128hh + 32s + 8t..), four runs.
template <> struct qfmt<EB_DTYPE_Q6_K> {
    static constexpr int VALS = 256, BYTES = 210, GROUPS = 8, RUNS = 4, RUN = 8;
    __device__ static __forceinline__ void load(const unsigned char *b, int g, bool, float *v, int *col) {
        int hh = g >> 2, t = g & 3;
        uint2 qa = ld_u64(b + 64 * hh + 8 * t), qb = ld_u64(b + 64 * hh + 32 + 8 * t);
        uint2 qh = ld_u64(b + 128 + 32 * hh + 8 * t), scw = ld_u64(b + 192 + 8 * hh);
        float d = half_bits(ld_u16(b + 208));
        unsigned a[2] = {qa.x, qa.y}, c[2] = {qb.x, qb.y}, hq[2] = {qh.x, qh.y};
        unsigned scs[2] = {scw.x ^ 0x80808080u, scw.y ^ 0x80808080u}; // the 8 int8 scales of this half
        float dsc[4];
#pragma unroll
        for (int s = 0; s < 4; s++) { // values 8t.. of sub-block s take scale 2s + (t >= 2): 16 values each
            int k = 2 * s + (t >> 1);
            unsigned byte = (scs[s >> 1] >> (8 * (k & 3))) & 0xffu;
            dsc[s] = d * (__uint_as_float(0x4B000000u | byte) - 8388736.0f);
            col[s] = 128 * hh + 32 * s + 8 * t;
        }
#pragma unroll
        for (int s = 0; s < 4; s++)
#pragma unroll
            for (int w = 0; w < 2; w++) {
                unsigned l = s & 1 ? c[w] : a[w];
                unsigned q = ((s & 2 ? l >> 4 : l) & 0x0F0F0F0Fu) | (((hq[w] >> (2 * s)) & 0x03030303u) << 4);
#pragma unroll
                for (int k = 0; k < 4; k++)
                    v[8 * s + 4 * w + k] = dsc[s] * (__uint_as_float(__byte_perm(q, 0x4B000000u, 0x7440u | k)) -
                                                     8388640.0f); // q - 32
            }
    }
};

// Four 4-bit codes (one a byte, in its low nibble) looked up in a table of 16 signed bytes t0..t3 (entries 4k..4k+3
// in word k), by byte permutes as MXFP4's values4: one signed byte each, XORed with 0x80808080 for sbyte_f.
__device__ __forceinline__ unsigned table4(unsigned n, unsigned t0, unsigned t1, unsigned t2, unsigned t3) {
    unsigned sel = (n | (n >> 4)) & 0xffu;
    sel |= ((n >> 8) | (n >> 12)) & 0xff00u;
    sel &= 0x7777u;
    unsigned lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    unsigned mask = ((n >> 3) & 0x01010101u) * 0xffu;
    return ((lo & ~mask) | (hi & mask)) ^ 0x80808080u;
}
// IQ4_NL's grid (eb_iq4nl_values), four signed bytes a word
#define IQ4NL_T0 0xBFAD9881u // -127, -104, -83, -65
#define IQ4NL_T1 0xF6EADDCFu // -49, -35, -22, -10
#define IQ4NL_T2 0x26190D01u // 1, 13, 25, 38
#define IQ4NL_T3 0x71594535u // 53, 69, 89, 113

// 16 bytes of 4-bit codes (value i in byte i's low half, i + 16 in its high: eb_nibbles_times) as lo[0..3] and
// hi[0..3], four nibbles a word, one a byte.
__device__ __forceinline__ void nibbles16(uint2 a, uint2 b, unsigned *lo, unsigned *hi) {
    unsigned w[4] = {a.x, a.y, b.x, b.y};
#pragma unroll
    for (int k = 0; k < 4; k++) lo[k] = w[k] & 0x0F0F0F0Fu, hi[k] = (w[k] >> 4) & 0x0F0F0F0Fu;
}

// Q4_0 (18 bytes: f16 d, 16 bytes of codes), Q4_1 (20: f16 d and m first) and IQ4_NL (18, codes into its grid): a
// group is 8 bytes of codes, their low halves columns 8g..8g+7 and their high ones 16 + 8g.., two runs. Each value
// d times its entry, Q4_1's plus m after (two roundings, as eb_dequantize_chunk).
template <int DT> struct qfmt_nib32 {
    static constexpr int VALS = 32, BYTES = DT == EB_DTYPE_Q4_1 ? 20 : 18, GROUPS = 2, RUNS = 2, RUN = 8;
    // four codes (one a byte) as their values times d, into v[0..3]
    __device__ static __forceinline__ void values4(unsigned n, float d, float *v) {
        if (DT == EB_DTYPE_IQ4_NL) {
            unsigned q = table4(n, IQ4NL_T0, IQ4NL_T1, IQ4NL_T2, IQ4NL_T3);
#pragma unroll
            for (int k = 0; k < 4; k++) v[k] = d * sbyte_f(q, k);
        } else {
#pragma unroll
            for (int k = 0; k < 4; k++) v[k] = d * (ubyte_f(n, k) - (DT == EB_DTYPE_Q4_0 ? 8.0f : 0.0f)); // exact
        }
    }
    __device__ static __forceinline__ void load(const unsigned char *b, int g, bool, float *v, int *col) {
        constexpr int QS = DT == EB_DTYPE_Q4_1 ? 4 : 2;
        float d = half_bits(ld_u16(b));
        uint2 q = ld_u64(b + QS + 8 * g);
        values4(q.x & 0x0F0F0F0Fu, d, v);
        values4(q.y & 0x0F0F0F0Fu, d, v + 4);
        values4((q.x >> 4) & 0x0F0F0F0Fu, d, v + 8);
        values4((q.y >> 4) & 0x0F0F0F0Fu, d, v + 12);
        if (DT == EB_DTYPE_Q4_1) {
            float m = half_bits(ld_u16(b + 2));
#pragma unroll
            for (int i = 0; i < 16; i++) v[i] = __fadd_rn(v[i], m);
        }
        col[0] = 8 * g;
        col[1] = 16 + 8 * g;
    }
};
template <> struct qfmt<EB_DTYPE_Q4_0> : qfmt_nib32<EB_DTYPE_Q4_0> {};
template <> struct qfmt<EB_DTYPE_Q4_1> : qfmt_nib32<EB_DTYPE_Q4_1> {};
template <> struct qfmt<EB_DTYPE_IQ4_NL> : qfmt_nib32<EB_DTYPE_IQ4_NL> {};

// IQ4_XS: 136 bytes (f16 d, 16 bits of the scales' top pairs, 4 bytes of their low nibbles, 128 bytes of codes into
// IQ4_NL's grid); group g is sub-block g: its 16 bytes of codes, values 32g..32g+15 low and 32g+16.. high, two runs
// of 16; its scale d * (s - 32) rounded once, then times each grid value (eb_iq4xs_scale).
template <> struct qfmt<EB_DTYPE_IQ4_XS> {
    static constexpr int VALS = 256, BYTES = 136, GROUPS = 8, RUNS = 2, RUN = 16;
    __device__ static __forceinline__ void load(const unsigned char *b, int g, bool, float *v, int *col) {
        float d = half_bits(ld_u16(b));
        int lo = (int)(ld_u8(b + 4 + g / 2) >> (4 * (g & 1))) & 0xF, hi = (int)(ld_u16(b + 2) >> (2 * g)) & 3;
        float dl = d * (float)((lo | hi << 4) - 32);
        unsigned nl[4], nh[4];
        nibbles16(ld_u64(b + 8 + 16 * g), ld_u64(b + 16 + 16 * g), nl, nh);
#pragma unroll
        for (int w = 0; w < 4; w++) {
            unsigned ql = table4(nl[w], IQ4NL_T0, IQ4NL_T1, IQ4NL_T2, IQ4NL_T3);
            unsigned qh = table4(nh[w], IQ4NL_T0, IQ4NL_T1, IQ4NL_T2, IQ4NL_T3);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                v[4 * w + k] = dl * sbyte_f(ql, k);
                v[16 + 4 * w + k] = dl * sbyte_f(qh, k);
            }
        }
        col[0] = 32 * g;
        col[1] = 32 * g + 16;
    }
};

// Q2_K (84 bytes: 16 bytes of scale/minimum nibble pairs, 64 bytes of 2-bit quants, f16 d, f16 dmin) and Q3_K (110:
// 32 bytes of third bits, 64 bytes of 2-bit quants, 12 bytes of 6-bit scales, f16 d): group g is chunk g, 32
// consecutive values in one run, two 16-value sub-blocks of their own scales (eb_k16_quant, eb_k16_scale). Each value
// d * scale rounded once, times the quant less its offset (Q3_K: 4 where its third bit is clear), Q2_K's scaled
// minimum subtracted after (two roundings, as the reference's dl * q - ml).
template <int DT> struct qfmt_k16 {
    static constexpr bool Q2 = DT == EB_DTYPE_Q2_K;
    static constexpr int VALS = 256, BYTES = Q2 ? 84 : 110, GROUPS = 8, RUNS = 1, RUN = 32;
    __device__ static __forceinline__ int scale(const unsigned char *b, int sb) {
        if (Q2) return (int)ld_u8(b + sb) & 0xF;
        return (int)(((ld_u8(b + 96 + sb % 8) >> (4 * (sb / 8))) & 0xFu) | ((ld_u8(b + 104 + sb % 4) >> (2 * (sb / 4))) & 3u) << 4) - 32;
    }
    __device__ static __forceinline__ void load(const unsigned char *b, int g, bool, float *v, int *col) {
        int h = g / 4, s = g % 4;
        float d = half_bits(ld_u16(b + (Q2 ? 80 : 108)));
        const unsigned char *qs = b + (Q2 ? 16 : 32) + 32 * h;
        unsigned q[8], hm[8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint2 a = ld_u64(qs + 8 * k);
            q[2 * k] = a.x, q[2 * k + 1] = a.y;
            if (!Q2) {
                uint2 m = ld_u64(b + 8 * k);
                hm[2 * k] = m.x, hm[2 * k + 1] = m.y;
            }
        }
#pragma unroll
        for (int half = 0; half < 2; half++) {
            int sb = 2 * g + half, sc = scale(b, sb);
            float dl = d * (float)sc, ml = 0.0f;
            if (Q2) ml = half_bits(ld_u16(b + 82)) * (float)(ld_u8(b + sb) >> 4);
#pragma unroll
            for (int w = 4 * half; w < 4 * half + 4; w++) {
                unsigned quant = (q[w] >> (2 * s)) & 0x03030303u;
                if (!Q2) quant |= ((hm[w] >> g) & 0x01010101u) << 2;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    float x = ubyte_f(quant, k) - (Q2 ? 0.0f : 4.0f); // exact
                    v[4 * w + k] = Q2 ? __fsub_rn(__fmul_rn(dl, x), ml) : dl * x;
                }
            }
        }
        col[0] = 32 * g;
    }
};
template <> struct qfmt<EB_DTYPE_Q2_K> : qfmt_k16<EB_DTYPE_Q2_K> {};
template <> struct qfmt<EB_DTYPE_Q3_K> : qfmt_k16<EB_DTYPE_Q3_K> {};

// The i-quants (eb_dtype_iq, eb_dtype_iq1): 256-value blocks whose values come in groups of 8 from rows of a
// codebook, signed (or shifted by 1/8), times a scale per half chunk. A group of qfmt is chunk g, 32 consecutive
// values in one run, as Q2_K's; the q8 products (gpu_q8.cuh) read the same chunks as signed bytes.
__host__ __device__ constexpr bool gpu_iq(int dt) {
    return dt == EB_DTYPE_IQ2_XXS || dt == EB_DTYPE_IQ3_XXS || dt == EB_DTYPE_IQ2_XS || dt == EB_DTYPE_IQ3_S ||
           dt == EB_DTYPE_IQ2_S;
}
__host__ __device__ constexpr bool gpu_iq1(int dt) { return dt == EB_DTYPE_IQ1_S || dt == EB_DTYPE_IQ1_M; }

// The codebooks in device memory, made from eb_iq_tables.h's data (its host arrays are made from the same macros).
// The lanes of a warp read the rows their own indices name, so they are global memory read through the cache: a
// __constant__ array serialises a warp's reads of distinct entries. A row is one aligned load of 8 (IQ3's: 4) bytes.
alignas(8) static __device__ const uint8_t gpu_iq2xxs_grid[256][8] = {EB_IQ2XXS_GRID_DATA};
alignas(4) static __device__ const uint8_t gpu_iq3xxs_grid[256][4] = {EB_IQ3XXS_GRID_DATA};
alignas(8) static __device__ const uint8_t gpu_iq2xs_grid[512][8] = {EB_IQ2XS_GRID_DATA};
alignas(4) static __device__ const uint8_t gpu_iq3s_grid[512][4] = {EB_IQ3S_GRID_DATA};
alignas(8) static __device__ const int8_t gpu_iq1s_grid[2048][8] = {EB_IQ1S_GRID_DATA};
alignas(8) static __device__ const uint8_t gpu_iq2s_grid[1024][8] = {EB_IQ2S_GRID_DATA};

template <class T> __device__ __forceinline__ uint2 grid_row8(const T (*grid)[8], unsigned i) {
    return *(const uint2 *)grid[i];
}
__device__ __forceinline__ unsigned grid_row4(const uint8_t (*grid)[4], unsigned i) {
    return *(const unsigned *)grid[i];
}

// eb_iq_ksigns: a 7-bit sign index, the parity of its bits as the eighth
__device__ __forceinline__ unsigned iq_ksigns(unsigned si) { return si | ((unsigned)__popc(si) & 1u) << 7; }

// A group's 8 magnitudes (two words of bytes, none 0: every i-quant grid's entries are 1 .. 62) with the signs of s
// (bit i set: value i negative), as signed bytes into q[0], q[1]: a byte to negate is XORed with 0xff and 1 added,
// which never carries out of it (the complement of a magnitude is at most 0xfe).
__device__ __forceinline__ void iq_signed(uint2 g, unsigned s, unsigned *q) {
    unsigned n0 = ((s & 15u) * 0x00204081u) & 0x01010101u, n1 = (((s >> 4) & 15u) * 0x00204081u) & 0x01010101u;
    q[0] = (g.x ^ (n0 * 0xffu)) + n0;
    q[1] = (g.y ^ (n1 * 0xffu)) + n1;
}

// Chunk j (< 8) of an IQ2_XXS, IQ3_XXS, IQ2_XS, IQ3_S or IQ2_S block: its 32 signed quants (eb_iq_quants) as q[0..7],
// value 4w + k in byte k of q[w], and the 4-bit scales s[0], s[1] of its halves (eb_iq_scale; IQ2_XXS, IQ3_XXS and
// IQ3_S have one a chunk, given twice).
template <int DT> __device__ __forceinline__ void iq_chunk(const unsigned char *b, int j, unsigned *q, int *s) {
    if (DT == EB_DTYPE_IQ2_XXS || DT == EB_DTYPE_IQ3_XXS) { // grid indices, then a word of 4 sign indices and s
        uint2 a = ld_u64(b + 2 + 8 * j);
        unsigned w = DT == EB_DTYPE_IQ2_XXS ? a.y : ld_u32(b + 66 + 4 * j);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            uint2 g;
            if (DT == EB_DTYPE_IQ2_XXS) {
                g = grid_row8(gpu_iq2xxs_grid, (a.x >> (8 * l)) & 0xffu);
            } else { // two rows of 4 a group
                unsigned two = (l < 2 ? a.x : a.y) >> (16 * (l & 1));
                g = make_uint2(grid_row4(gpu_iq3xxs_grid, two & 0xffu), grid_row4(gpu_iq3xxs_grid, (two >> 8) & 0xffu));
            }
            iq_signed(g, iq_ksigns((w >> (7 * l)) & 127u), q + 2 * l);
        }
        s[0] = s[1] = (int)(w >> 28);
    } else if (DT == EB_DTYPE_IQ2_XS) { // a 16-bit word a group: a 9-bit grid index, its sign index above
        uint2 a = ld_u64(b + 2 + 8 * j);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            unsigned word = ((l < 2 ? a.x : a.y) >> (16 * (l & 1))) & 0xffffu;
            iq_signed(grid_row8(gpu_iq2xs_grid, word & 511u), iq_ksigns(word >> 9), q + 2 * l);
        }
        unsigned sc = ld_u8(b + 66 + j);
        s[0] = (int)(sc & 15u), s[1] = (int)(sc >> 4);
    } else if (DT == EB_DTYPE_IQ3_S) { // 9-bit indices of rows of 4 (two a group), a sign bit a value
        uint2 a = ld_u64(b + 2 + 8 * j);
        unsigned hi = ld_u8(b + 66 + j), sg = ld_u32(b + 74 + 4 * j);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            unsigned two = (l < 2 ? a.x : a.y) >> (16 * (l & 1));
            unsigned i0 = (two & 0xffu) | ((hi >> (2 * l)) & 1u) << 8;
            unsigned i1 = ((two >> 8) & 0xffu) | ((hi >> (2 * l + 1)) & 1u) << 8;
            iq_signed(make_uint2(grid_row4(gpu_iq3s_grid, i0), grid_row4(gpu_iq3s_grid, i1)), (sg >> (8 * l)) & 0xffu,
                      q + 2 * l);
        }
        s[0] = s[1] = (int)((ld_u8(b + 106 + j / 2) >> (4 * (j & 1))) & 15u);
    } else { // IQ2_S: 10-bit indices of rows of 8, a sign bit a value
        unsigned lo = ld_u32(b + 2 + 4 * j), sg = ld_u32(b + 34 + 4 * j);
        unsigned hi = ld_u8(b + 66 + j), sc = ld_u8(b + 74 + j);
#pragma unroll
        for (int l = 0; l < 4; l++)
            iq_signed(grid_row8(gpu_iq2s_grid, ((lo >> (8 * l)) & 0xffu) | ((hi >> (2 * l)) & 3u) << 8),
                      (sg >> (8 * l)) & 0xffu, q + 2 * l);
        s[0] = (int)(sc & 15u), s[1] = (int)(sc >> 4);
    }
}

// eb_iq_half_d: the f32 scale of a half chunk of 4-bit scale s, d the block's, rounded where the gguf package rounds:
// (d (s + 1/2)) / 4 (IQ3_XXS: / 2), IQ3_S's d (1 + 2 s) one product.
template <int DT> __device__ __forceinline__ float iq_half_d(float d, int s) {
    if (DT == EB_DTYPE_IQ3_S) return d * (float)(1 + 2 * s);
    return d * (0.5f + (float)s) * (DT == EB_DTYPE_IQ3_XXS ? 0.5f : 0.25f);
}

// IQ2_XXS (66 bytes), IQ3_XXS (98), IQ2_XS (74), IQ3_S (110) and IQ2_S (82), each an f16 d first: group g is chunk g,
// each half's scale rounded as eb_iq_half_d, then times the signed grid values (eb_dequantize_chunk's one product).
template <int DT> struct qfmt_iq {
    static constexpr int VALS = 256, GROUPS = 8, RUNS = 1, RUN = 32;
    static constexpr int BYTES = DT == EB_DTYPE_IQ2_XXS  ? 66
                                 : DT == EB_DTYPE_IQ3_XXS ? 98
                                 : DT == EB_DTYPE_IQ2_XS  ? 74
                                 : DT == EB_DTYPE_IQ3_S   ? 110
                                                          : 82; // IQ2_S
    __device__ static __forceinline__ void load(const unsigned char *b, int g, bool, float *v, int *col) {
        unsigned q[8];
        int s[2];
        iq_chunk<DT>(b, g, q, s);
        float d = half_bits(ld_u16(b)), dl[2] = {iq_half_d<DT>(d, s[0]), iq_half_d<DT>(d, s[1])};
#pragma unroll
        for (int w = 0; w < 8; w++) {
            unsigned x = q[w] ^ 0x80808080u;
#pragma unroll
            for (int k = 0; k < 4; k++) v[4 * w + k] = dl[w / 4] * sbyte_f(x, k);
        }
        col[0] = 32 * g;
    }
};
template <> struct qfmt<EB_DTYPE_IQ2_XXS> : qfmt_iq<EB_DTYPE_IQ2_XXS> {};
template <> struct qfmt<EB_DTYPE_IQ3_XXS> : qfmt_iq<EB_DTYPE_IQ3_XXS> {};
template <> struct qfmt<EB_DTYPE_IQ2_XS> : qfmt_iq<EB_DTYPE_IQ2_XS> {};
template <> struct qfmt<EB_DTYPE_IQ3_S> : qfmt_iq<EB_DTYPE_IQ3_S> {};
template <> struct qfmt<EB_DTYPE_IQ2_S> : qfmt_iq<EB_DTYPE_IQ2_S> {};

// Chunk j (< 8) of an IQ1_S or IQ1_M block: its 32 grid values (-1, 0, +1; eb_iq1_quants) as signed bytes q[0..7],
// value 4w + k in byte k of q[w]; *neg bit l set where group l's delta is -1/8 (else +1/8); the 3-bit scales s[0],
// s[1] of its halves (eb_iq1_scale; IQ1_S has one a chunk, given twice).
template <int DT>
__device__ __forceinline__ void iq1_chunk(const unsigned char *b, int j, unsigned *q, unsigned *neg, int *s) {
    if (DT == EB_DTYPE_IQ1_M) { // a nibble a group: its top 3 index bits and its delta's sign
        unsigned lo = ld_u32(b + 4 * j), nib = ld_u16(b + 32 + 2 * j);
        unsigned sw = ld_u16(b + 48 + 2 * (j / 2)) >> (6 * (j & 1)); // chunk j's two scales
        *neg = 0u;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            unsigned n = (nib >> (4 * l)) & 15u;
            uint2 g = grid_row8(gpu_iq1s_grid, ((lo >> (8 * l)) & 0xffu) | (n & 7u) << 8);
            q[2 * l] = g.x, q[2 * l + 1] = g.y;
            *neg |= (n >> 3) << l;
        }
        s[0] = (int)(sw & 7u), s[1] = (int)((sw >> 3) & 7u);
    } else { // IQ1_S: a 16-bit word a chunk: the groups' top 3 index bits, s, the delta's sign
        unsigned lo = ld_u32(b + 2 + 4 * j), w = ld_u16(b + 34 + 2 * j);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            uint2 g = grid_row8(gpu_iq1s_grid, ((lo >> (8 * l)) & 0xffu) | ((w >> (3 * l)) & 7u) << 8);
            q[2 * l] = g.x, q[2 * l + 1] = g.y;
        }
        *neg = w >> 15 ? 15u : 0u;
        s[0] = s[1] = (int)((w >> 12) & 7u);
    }
}

// eb_iq1_d: the block's f16 d (IQ1_M's from the top nibbles of its four scale words) as f32
template <int DT> __device__ __forceinline__ float iq1_d(const unsigned char *b) {
    if (DT == EB_DTYPE_IQ1_M) {
        uint2 w = ld_u64(b + 48);
        return half_bits(((w.x >> 12) & 0xFu) | ((w.x >> 24) & 0xF0u) | ((w.y >> 4) & 0xF00u) |
                         ((w.y >> 16) & 0xF000u));
    }
    return half_bits(ld_u16(b));
}

// IQ1_S (50 bytes: f16 d first) and IQ1_M (56, d in its scale words): group g is chunk g; each half's d (2 s + 1)
// rounded once, then times the grid value plus its group's delta (an exact sum), as eb_dequantize_chunk.
template <int DT> struct qfmt_iq1 {
    static constexpr int VALS = 256, BYTES = DT == EB_DTYPE_IQ1_M ? 56 : 50, GROUPS = 8, RUNS = 1, RUN = 32;
    __device__ static __forceinline__ void load(const unsigned char *b, int g, bool, float *v, int *col) {
        unsigned q[8], neg;
        int s[2];
        iq1_chunk<DT>(b, g, q, &neg, s);
        float d = iq1_d<DT>(b), dl[2] = {d * (float)(2 * s[0] + 1), d * (float)(2 * s[1] + 1)};
#pragma unroll
        for (int w = 0; w < 8; w++) {
            unsigned x = q[w] ^ 0x80808080u;
            float delta = (neg >> (w / 2)) & 1u ? -0.125f : 0.125f;
#pragma unroll
            for (int k = 0; k < 4; k++) v[4 * w + k] = dl[w / 4] * (sbyte_f(x, k) + delta);
        }
        col[0] = 32 * g;
    }
};
template <> struct qfmt<EB_DTYPE_IQ1_S> : qfmt_iq1<EB_DTYPE_IQ1_S> {};
template <> struct qfmt<EB_DTYPE_IQ1_M> : qfmt_iq1<EB_DTYPE_IQ1_M> {};

// Chunk j of a block of any of the seven as the q8 products read it (gpu_q8.cuh q8_dot_iq: one loop for all of them):
// iq_chunk's or iq1_chunk's quants and scales, *neg the 1-bit formats' deltas (0: +1/8 each; the others: 0); returns
// the block's d.
__device__ __forceinline__ float iq_q8_chunk(const unsigned char *b, int dtype, int j, unsigned *q, unsigned *neg,
                                             int *s) {
    *neg = 0u;
    switch (dtype) {
    case EB_DTYPE_IQ2_XXS: iq_chunk<EB_DTYPE_IQ2_XXS>(b, j, q, s); break;
    case EB_DTYPE_IQ3_XXS: iq_chunk<EB_DTYPE_IQ3_XXS>(b, j, q, s); break;
    case EB_DTYPE_IQ2_XS: iq_chunk<EB_DTYPE_IQ2_XS>(b, j, q, s); break;
    case EB_DTYPE_IQ3_S: iq_chunk<EB_DTYPE_IQ3_S>(b, j, q, s); break;
    case EB_DTYPE_IQ2_S: iq_chunk<EB_DTYPE_IQ2_S>(b, j, q, s); break;
    case EB_DTYPE_IQ1_S: iq1_chunk<EB_DTYPE_IQ1_S>(b, j, q, neg, s); return iq1_d<EB_DTYPE_IQ1_S>(b);
    default: iq1_chunk<EB_DTYPE_IQ1_M>(b, j, q, neg, s); return iq1_d<EB_DTYPE_IQ1_M>(b);
    }
    return half_bits(ld_u16(b));
}

__host__ __device__ __forceinline__ bool quantized(int dtype) {
    return dtype != EB_DTYPE_F32 && dtype != EB_DTYPE_F16 && dtype != EB_DTYPE_BF16;
}

// Four values of x from column c, normalised on the fly when nw is given: x[c] -> nw[c] * (x[c] * inv), exactly as
// the rmsnorm kernel writes them.
__device__ __forceinline__ float4 normed(float4 a, const float *nw, int c, float inv) {
    float4 n = *(const float4 *)(nw + c);
    return make_float4(n.x * (a.x * inv), n.y * (a.y * inv), n.z * (a.z * inv), n.w * (a.w * inv));
}

// s + the group's values times x (c0: the block's first column), run by run in column order.
template <class F>
__device__ __forceinline__ float group_dot(const float *v, const int *col, const float *x, int c0, const float *nw,
                                           float inv, float s) {
#pragma unroll
    for (int r = 0; r < F::RUNS; r++)
#pragma unroll
        for (int q = 0; q < F::RUN / 4; q++) {
            int c = c0 + col[r] + 4 * q;
            float4 a = *(const float4 *)(x + c);
            if (nw) a = normed(a, nw, c, inv);
            const float *u = v + r * F::RUN + 4 * q;
            s = fmaf(u[0], a.x, s);
            s = fmaf(u[1], a.y, s);
            s = fmaf(u[2], a.z, s);
            s = fmaf(u[3], a.w, s);
        }
    return s;
}

// Per-lane partial sums s[j] += row . xs[j] (j < nt) of one quantized row, its groups lane, lane + warp, ...
template <class F>
__device__ __forceinline__ void qdot_tile(const unsigned char *row, int cols, const float *const *xs, int nt, int lane,
                                          int warp, float *s, const float *nw, const float *inv) {
    bool a16 = ((uintptr_t)row & 15) == 0;
    int n = cols / F::VALS * F::GROUPS;
#pragma unroll 2
    for (int g = lane; g < n; g += warp) {
        float v[F::RUNS * F::RUN];
        int col[F::RUNS];
        int blk = g / F::GROUPS;
        F::load(row + (long long)blk * F::BYTES, g % F::GROUPS, a16, v, col);
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++)
            if (j < nt) s[j] = group_dot<F>(v, col, xs[j], blk * F::VALS, nw, nw ? inv[j] : 1.0f, s[j]);
    }
}

// The same for distinct rows: s[j] += ws[j]'s row (off bytes in) . xs[j], with the arithmetic of qdot_tile.
template <class F>
__device__ __forceinline__ void qdot_rows(const void *const *ws, unsigned long long off, int cols,
                                          const float *const *xs, int nt, int lane, int warp, float *s) {
    bool a16 = true;
#pragma unroll
    for (int j = 0; j < DOT_TILE; j++)
        if (j < nt) a16 = a16 && (((uintptr_t)ws[j] + off) & 15) == 0;
    int n = cols / F::VALS * F::GROUPS;
    for (int g = lane; g < n; g += warp) {
        int blk = g / F::GROUPS;
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) {
            if (j >= nt) continue;
            float v[F::RUNS * F::RUN];
            int col[F::RUNS];
            F::load((const unsigned char *)ws[j] + off + (unsigned long long)blk * F::BYTES, g % F::GROUPS, a16, v, col);
            s[j] = group_dot<F>(v, col, xs[j], blk * F::VALS, NULL, 1.0f, s[j]);
        }
    }
}

#define GPU_FORMATS                                                                                              \
    (1u << EB_DTYPE_F32 | 1u << EB_DTYPE_F16 | 1u << EB_DTYPE_BF16 | 1u << EB_DTYPE_Q8_0 | 1u << EB_DTYPE_Q4_K |     \
     1u << EB_DTYPE_Q5_K | 1u << EB_DTYPE_Q6_K | 1u << EB_DTYPE_MXFP4 | 1u << EB_DTYPE_Q5_0 | 1u << EB_DTYPE_Q5_1 |     \
     1u << EB_DTYPE_Q4_0 | 1u << EB_DTYPE_Q4_1 | 1u << EB_DTYPE_IQ4_NL | 1u << EB_DTYPE_IQ4_XS | 1u << EB_DTYPE_Q2_K | \
     1u << EB_DTYPE_Q3_K | 1u << EB_DTYPE_IQ2_XXS | 1u << EB_DTYPE_IQ3_XXS | 1u << EB_DTYPE_IQ2_XS |                 \
     1u << EB_DTYPE_IQ3_S | 1u << EB_DTYPE_IQ1_S | 1u << EB_DTYPE_IQ1_M | 1u << EB_DTYPE_IQ2_S)
#define QUANT_CASES(CALL)                                                                                        \
    case EB_DTYPE_Q8_0: CALL(qfmt<EB_DTYPE_Q8_0>); break;                                                         \
    case EB_DTYPE_Q4_K: CALL(qfmt<EB_DTYPE_Q4_K>); break;                                                         \
    case EB_DTYPE_Q5_K: CALL(qfmt<EB_DTYPE_Q5_K>); break;                                                         \
    case EB_DTYPE_Q6_K: CALL(qfmt<EB_DTYPE_Q6_K>); break;                                                         \
    case EB_DTYPE_MXFP4: CALL(qfmt<EB_DTYPE_MXFP4>); break;                                                       \
    case EB_DTYPE_Q5_0: CALL(qfmt<EB_DTYPE_Q5_0>); break;                                                         \
    case EB_DTYPE_Q5_1: CALL(qfmt<EB_DTYPE_Q5_1>); break;                                                         \
    case EB_DTYPE_Q4_0: CALL(qfmt<EB_DTYPE_Q4_0>); break;                                                         \
    case EB_DTYPE_Q4_1: CALL(qfmt<EB_DTYPE_Q4_1>); break;                                                         \
    case EB_DTYPE_IQ4_NL: CALL(qfmt<EB_DTYPE_IQ4_NL>); break;                                                     \
    case EB_DTYPE_IQ4_XS: CALL(qfmt<EB_DTYPE_IQ4_XS>); break;                                                     \
    case EB_DTYPE_Q2_K: CALL(qfmt<EB_DTYPE_Q2_K>); break;                                                         \
    case EB_DTYPE_Q3_K: CALL(qfmt<EB_DTYPE_Q3_K>); break;                                                         \
    case EB_DTYPE_IQ2_XXS: CALL(qfmt<EB_DTYPE_IQ2_XXS>); break;                                                   \
    case EB_DTYPE_IQ3_XXS: CALL(qfmt<EB_DTYPE_IQ3_XXS>); break;                                                   \
    case EB_DTYPE_IQ2_XS: CALL(qfmt<EB_DTYPE_IQ2_XS>); break;                                                     \
    case EB_DTYPE_IQ3_S: CALL(qfmt<EB_DTYPE_IQ3_S>); break;                                                       \
    case EB_DTYPE_IQ1_S: CALL(qfmt<EB_DTYPE_IQ1_S>); break;                                                       \
    case EB_DTYPE_IQ1_M: CALL(qfmt<EB_DTYPE_IQ1_M>); break;                                                       \
    case EB_DTYPE_IQ2_S: CALL(qfmt<EB_DTYPE_IQ2_S>); break;                                                       \
    default: break;

__device__ __forceinline__ void qdot_tile_any(const void *w, int dtype, long long row, int cols,
                                              const float *const *xs, int nt, int lane, int warp, float *s,
                                              const float *nw, const float *inv) {
    const unsigned char *rp = (const unsigned char *)w + (unsigned long long)row * gpu_row_bytes(dtype, cols);
#define QDOT_TILE(F) qdot_tile<F>(rp, cols, xs, nt, lane, warp, s, nw, inv)
    switch (dtype) { QUANT_CASES(QDOT_TILE) }
#undef QDOT_TILE
}

__device__ __forceinline__ void qdot_rows_any(const void *const *ws, int dtype, long long row, int cols,
                                              const float *const *xs, int nt, int lane, int warp, float *s) {
    unsigned long long off = (unsigned long long)row * gpu_row_bytes(dtype, cols);
#define QDOT_ROWS(F) qdot_rows<F>(ws, off, cols, xs, nt, lane, warp, s)
    switch (dtype) { QUANT_CASES(QDOT_ROWS) }
#undef QDOT_ROWS
}
