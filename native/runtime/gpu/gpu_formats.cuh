// Part of gpu_runtime.cu (included there, one translation unit): the quantized formats' device-side reading.

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
     1u << EB_DTYPE_Q5_K | 1u << EB_DTYPE_Q6_K | 1u << EB_DTYPE_MXFP4 | 1u << EB_DTYPE_Q5_0 | 1u << EB_DTYPE_Q5_1)
#define QUANT_CASES(CALL)                                                                                        \
    case EB_DTYPE_Q8_0: CALL(qfmt<EB_DTYPE_Q8_0>); break;                                                         \
    case EB_DTYPE_Q4_K: CALL(qfmt<EB_DTYPE_Q4_K>); break;                                                         \
    case EB_DTYPE_Q5_K: CALL(qfmt<EB_DTYPE_Q5_K>); break;                                                         \
    case EB_DTYPE_Q6_K: CALL(qfmt<EB_DTYPE_Q6_K>); break;                                                         \
    case EB_DTYPE_MXFP4: CALL(qfmt<EB_DTYPE_MXFP4>); break;                                                       \
    case EB_DTYPE_Q5_0: CALL(qfmt<EB_DTYPE_Q5_0>); break;                                                         \
    case EB_DTYPE_Q5_1: CALL(qfmt<EB_DTYPE_Q5_1>); break;                                                         \
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

// A quantized row of the embedding table dequantized into out (hidden floats), by the whole block.
template <class F> __device__ __forceinline__ void embed_row(const unsigned char *row, int hidden, float *out) {
    bool a16 = ((uintptr_t)row & 15) == 0;
    int n = hidden / F::VALS * F::GROUPS;
    for (int g = threadIdx.x; g < n; g += blockDim.x) {
        float v[F::RUNS * F::RUN];
        int col[F::RUNS];
        int blk = g / F::GROUPS;
        F::load(row + (long long)blk * F::BYTES, g % F::GROUPS, a16, v, col);
#pragma unroll
        for (int r = 0; r < F::RUNS; r++)
#pragma unroll
            for (int q = 0; q < F::RUN / 4; q++) {
                const float *u = v + r * F::RUN + 4 * q;
                *(float4 *)(out + blk * F::VALS + col[r] + 4 * q) = make_float4(u[0], u[1], u[2], u[3]);
            }
    }
}

// The dot product of weight row `row` (cols long) with x, reduced over one warp; lane 0 holds the result.
__device__ __forceinline__ float warp_dot(const void *w, int dtype, long long row, int cols, const float *x, int lane,
                                          int warp) {
    float s = 0.0f;
    long long base = row * (long long)cols;
    if (quantized(dtype)) {
        float q[DOT_TILE] = {0.0f, 0.0f, 0.0f, 0.0f};
        const float *xs[DOT_TILE] = {x, x, x, x};
        qdot_tile_any(w, dtype, row, cols, xs, 1, lane, warp, q, NULL, NULL);
        s = q[0];
    } else if (dtype != EB_DTYPE_F32 && (cols % 8) == 0) {
        // 8 x 16-bit weights per 16-byte load
        const uint4 *w4 = (const uint4 *)((const unsigned short *)w + base);
        for (int c = lane; c < cols / 8; c += warp) {
            float wv[8];
            unpack8(w4[c], dtype, wv);
            const float *xc = x + c * 8;
#pragma unroll
            for (int k = 0; k < 4; k++) s += wv[2 * k] * xc[2 * k] + wv[2 * k + 1] * xc[2 * k + 1];
        }
    } else {
        for (int c = lane; c < cols; c += warp) s += load_w(w, dtype, base + c) * x[c];
    }
    for (int o = warp / 2; o > 0; o /= 2) s += SHFL_DOWN(s, o);
    return s;
}

// The experts' activation of one gate value and one up value (eb_rt_act), in f32 with the CPU's expressions:
// silu(g) * u (DeepSeek-V4: g and u clamped first), or gpt-oss's clamped SwiGLU (u' + 1) * g' * sigmoid(alpha * g'), g' = min(g, limit),
// u' = clamp(u, -limit, limit). Every expert kernel (expert_ffn's and the forward moe's) applies it here.
__device__ __forceinline__ float expert_act(const eb_rt_act &act, float g, float u) {
    if (act.kind == EB_ACT_SILU) return g / (1.0f + expf(-g)) * u;
    float lim = act.limit;
    g = g < lim ? g : lim;
    u = u < -lim ? -lim : u > lim ? lim : u;
    if (act.kind == EB_ACT_SILU_CLAMP) return g / (1.0f + expf(-g)) * u;
    return (u + 1.0f) * (g / (1.0f + expf(-act.alpha * g)));
}

// A product with its bias added: an expert's biases (NULL: none, v as it is) are inter gate biases (k = i), inter up
// biases (k = inter + i) and hidden down biases (k = 2 * inter + j).
__device__ __forceinline__ float biased(float v, const float *bias, long long k) { return bias ? v + bias[k] : v; }

// h[p][i] = act(gate_i . x[tok(p)] + bg_i, up_i . x[tok(p)] + bu_i) for the m pairs of one expert; one warp per
// row i.
__global__ void gate_up_kernel(const void *gate, const void *up, int gate_dtype, int up_dtype, const float *bias,
                               eb_rt_act act, int hidden, int inter, const float *x, const int *pair_token, int p0,
                               int m, float *h, int warp) {
    int lane = threadIdx.x % warp;
    int i = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    if (i >= inter) return;
    for (int p = 0; p < m; p++) {
        const float *xr = x + (long long)pair_token[p0 + p] * hidden;
        float g = warp_dot(gate, gate_dtype, i, hidden, xr, lane, warp);
        float u = warp_dot(up, up_dtype, i, hidden, xr, lane, warp);
        if (lane == 0)
            h[(long long)p * inter + i] = expert_act(act, biased(g, bias, i), biased(u, bias, (long long)inter + i));
    }
}

// reference: y[p0 + p][j] = down_j . h[p] + bd_j;  owner_local: y[tok(p)][j] += w(p) * (down_j . h[p] + bd_j).
__global__ void down_kernel(const void *down, int dtype, const float *bias, int hidden, int inter, const float *h,
                            const int *pair_token, const float *pair_weight, int p0, int m, float *y, int owner_local,
                            int warp) {
    int lane = threadIdx.x % warp;
    int j = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    if (j >= hidden) return;
    for (int p = 0; p < m; p++) {
        float v = warp_dot(down, dtype, j, inter, h + (long long)p * inter, lane, warp);
        if (lane != 0) continue;
        v = biased(v, bias, 2LL * inter + j);
        if (owner_local) y[(long long)pair_token[p0 + p] * hidden + j] += pair_weight[p0 + p] * v;
        else y[(long long)(p0 + p) * hidden + j] = v;
    }
}

// The same products for every expert of a batch in one launch each (grid.y = expert): reference mode, where every
// pair writes its own row, so experts never write the same memory.
__global__ void gate_up_grouped(const gpu_expert_slot *slots, eb_rt_act act, int hidden, int inter, const float *x,
                                const int *pair_token, float *h, int warp) {
    const gpu_expert_slot s = slots[blockIdx.y];
    int lane = threadIdx.x % warp;
    int i = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    if (i >= inter) return;
    for (int p = 0; p < s.m; p++) {
        const float *xr = x + (long long)pair_token[s.p0 + p] * hidden;
        float g = warp_dot(s.gate, s.gate_dtype, i, hidden, xr, lane, warp);
        float u = warp_dot(s.up, s.up_dtype, i, hidden, xr, lane, warp);
        if (lane == 0)
            h[(long long)(s.p0 + p) * inter + i] =
                expert_act(act, biased(g, s.bias, i), biased(u, s.bias, (long long)inter + i));
    }
}

__global__ void down_grouped(const gpu_expert_slot *slots, int hidden, int inter, const float *h, float *y, int warp) {
    const gpu_expert_slot s = slots[blockIdx.y];
    int lane = threadIdx.x % warp;
    int j = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    if (j >= hidden) return;
    for (int p = 0; p < s.m; p++) {
        float v = warp_dot(s.down, s.down_dtype, j, inter, h + (long long)(s.p0 + p) * inter, lane, warp);
        if (lane == 0) y[(long long)(s.p0 + p) * hidden + j] = biased(v, s.bias, 2LL * inter + j);
    }
}

__global__ void zero_kernel(float *y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = 0.0f;
}
