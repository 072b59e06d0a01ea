// Part of gpu_runtime.cu (included there, one translation unit): the q8 precision's kernels.

// ---- the q8 precision: the CPU module's q8 products, bit for bit ---------------------------------------------
//
// As the CPU module runs them (its x86 kernels, cpu_kernels_avx2.c and cpu_kernels_avx512.c, which give the same
// bits; the portable C kernels sum Q8_0 and MXFP4 blocks in another order): each row of x quantized per block of 32
// values (against Q8_0 and MXFP4 weights) or 256 (the K formats and the i-quants) exactly as eb_cpu_quantize_q8 does
// it, the integer sums of the products per block (exact, so in any order: dp4a here), the same float expression
// around each block's integer sum and the same order of the float sums (below, per format), and the experts'
// activation of eb_q8.h. Every float operation is an explicit one of the q8_* helpers (or eb_q8.h's), so that no
// compiler contracts a multiply and an add into a fused one where the CPU has two roundings (or the reverse).
//
// The quantized rows live in a block's shared memory: each block quantizes the rows of x its products read (up to
// DOT_TILE at a time, as many as the shared memory holds) and then takes its weight rows, 32 lanes a row (the K
// formats, and the f32 products of formats without integer kernels) or 16 (Q8_0, MXFP4). Q5_0, Q5_1 and the float
// formats have no q8 products on the CPU either: read with f32 activations in either precision, as warp_dot_tile
// reads them.

#define Q8_THREADS 256

#ifdef EB_GPU_HIP
__device__ __forceinline__ float q8_mul(float a, float b) { EB_Q8_EXACT return a * b; }
__device__ __forceinline__ float q8_add(float a, float b) { EB_Q8_EXACT return a + b; }
__device__ __forceinline__ float q8_sub(float a, float b) { EB_Q8_EXACT return a - b; }
__device__ __forceinline__ float q8_div(float a, float b) { EB_Q8_EXACT return a / b; }
__device__ __forceinline__ float q8_fma(float a, float b, float c) { return fmaf(a, b, c); }
#else
__device__ __forceinline__ float q8_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float q8_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float q8_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float q8_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float q8_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
#endif

// c + the sum of the four products of a's and b's signed bytes (exact in int32)
__device__ __forceinline__ int dot4(int a, int b, int c) {
#if !defined(EB_GPU_HIP)
    return __dp4a(a, b, c);
#elif defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx1030__)
    return __builtin_amdgcn_sdot4(a, b, c, false);
#else
    return c + (int)(signed char)a * (int)(signed char)b + (int)(signed char)(a >> 8) * (int)(signed char)(b >> 8) +
           (int)(signed char)(a >> 16) * (int)(signed char)(b >> 16) + (a >> 24) * (b >> 24);
#endif
}

// Four MXFP4 codes (one a byte, in its low nibble) as their values (eb_mxfp4_values), one signed byte each.
__device__ __forceinline__ int mxfp4_x4(unsigned n) {
    unsigned t = n | (n >> 4);
    unsigned sel = ((t & 0xffu) | ((t >> 8) & 0xff00u)) & 0x7777u;
    unsigned pos = __byte_perm(0x03020100u, 0x0C080604u, sel), neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, sel);
    unsigned mask = ((n >> 3) & 0x01010101u) * 0xffu;
    return (int)((pos & ~mask) | (neg & mask));
}

// The formats whose integer products read x in blocks of 32 (the others with integer products: blocks of 256).
__host__ __device__ __forceinline__ bool q8_block32(int dtype) {
    return dtype == EB_DTYPE_Q8_0 || dtype == EB_DTYPE_MXFP4 || dtype == EB_DTYPE_Q4_0 || dtype == EB_DTYPE_Q4_1 ||
           dtype == EB_DTYPE_IQ4_NL;
}

__host__ __device__ __forceinline__ bool q8_products(int dtype) { // the formats with integer products (the CPU's)
    return q8_block32(dtype) || dtype == EB_DTYPE_Q4_K || dtype == EB_DTYPE_Q5_K || dtype == EB_DTYPE_Q6_K ||
           dtype == EB_DTYPE_IQ4_XS || dtype == EB_DTYPE_Q2_K || dtype == EB_DTYPE_Q3_K || gpu_iq(dtype) ||
           gpu_iq1(dtype);
}

// The layouts of quantized x a format's products read (bits: 1 blocks of 32, 2 blocks of 256; 0: f32 products).
enum { Q8_L32 = 1, Q8_L256 = 2 };
__host__ __device__ __forceinline__ int q8_layout(int dtype) {
    if (!q8_products(dtype)) return 0;
    return q8_block32(dtype) ? Q8_L32 : Q8_L256;
}
// Lanes per weight row of its products.
__host__ __device__ __forceinline__ int q8_lanes(int dtype) { return q8_block32(dtype) ? 16 : 32; }
__host__ __device__ __forceinline__ bool q8_uses(int precision, int dtype) {
    return precision == EB_PRECISION_Q8 && q8_products(dtype);
}

// Up to DOT_TILE rows of x quantized (eb_cpu_q8_rows' layout, per block size): layout l's row j has its quants at
// q[l] + j * cols, its scales at d[l] + j * cols / B and its sums of 16 quants at s16[l] + j * cols / 16 (the K
// formats' minima and Q4_1's read them).
struct q8_tile {
    signed char *q[2];
    float *d[2];
    short *s16[2];
};

// Carve a tile of nt rows of cols values in the layouts `need` out of base (NULL: only measure); its bytes.
__host__ __device__ __forceinline__ size_t q8_carve(unsigned char *base, int nt, int cols, int need, q8_tile *t) {
    size_t off = 0, n = (size_t)nt * (size_t)cols;
    for (int l = 0; l < 2; l++) {
        if (t) t->q[l] = NULL, t->d[l] = NULL, t->s16[l] = NULL;
        if (!(need & (1 << l))) continue;
        if (t) t->q[l] = (signed char *)(base + off);
        off += n;
        if (t) t->d[l] = (float *)(base + off);
        off += (n / (l ? 256 : 32) * sizeof(float) + 15) / 16 * 16;
        if (t) t->s16[l] = (short *)(base + off);
        off += (n / 16 * sizeof(short) + 15) / 16 * 16;
    }
    return off;
}

__device__ __forceinline__ const float *q8_pick(const float *const *xs, int j) { // constant indices only
    return j == 0 ? xs[0] : j == 1 ? xs[1] : j == 2 ? xs[2] : xs[3];
}

// Rows xs[0 .. nt) of cols values quantized into t's layouts in need, as eb_cpu_quantize_q8 quantizes them: per
// block, d = its largest magnitude / 127, each value times 1 / d (0 when d is) rounded to the nearest integer (ties to
// even) and clamped to +-127, and the sums of every 16 quants. 8 values a thread, a block's B / 8 threads side by side
// in a group of 32 lanes (their maximum and sums by shuffles). Every thread of the block calls it.
__device__ void q8_quantize(const float *const *xs, int nt, int cols, int need, const q8_tile &t) {
    int per_row = cols / 8, items = nt * per_row;
    for (int l = 0; l < 2; l++) {
        if (!(need & (1 << l))) continue;
        int lanes = l ? 32 : 4, B = l ? 256 : 32;
        for (int base = 0; base < items; base += blockDim.x) {
            int it = base + (int)threadIdx.x;
            bool live = it < items;
            int row = live ? it / per_row : 0, c = live ? (it - row * per_row) * 8 : 0;
            float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (live) {
                const float4 *x4 = (const float4 *)(q8_pick(xs, row) + c);
                float4 a = x4[0], b = x4[1];
                v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
            }
            float amax = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(v[i]));
            for (int o = 1; o < lanes; o *= 2) amax = fmaxf(amax, SHFL_XOR32(amax, o));
            float d = q8_div(amax, 127.0f), id = d > 0.0f ? q8_div(1.0f, d) : 0.0f;
            unsigned w[2] = {0u, 0u};
            int sum = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float r = rintf(q8_mul(v[i], id));
                int q = r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r;
                sum += q;
                w[i / 4] |= ((unsigned)q & 0xffu) << (8 * (i % 4));
            }
            long long at = (long long)row * cols + c;
            if (live) *(uint2 *)(t.q[l] + at) = make_uint2(w[0], w[1]);
            sum += SHFL_XOR32(sum, 1); // the two threads of each 16 values (a block has an even count of threads)
            if (live && !(it & 1)) t.s16[l][at / 16] = (short)sum;
            if (live && it % lanes == 0) t.d[l][at / B] = d;
        }
    }
}

// The 32-value formats against blocks of 32 (Q8_0, MXFP4, Q4_0, Q4_1, IQ4_NL): the x86 kernels' arithmetic
// (cpu_kernels_avx2.c dot_q8; the AVX-512 one gives its bits). Lane 8p + l of a row's 16 is their accumulator lane l
// for the blocks of parity p: per block, the exact sum of the products of values 4l .. 4l + 3 (each block's 32 signed
// quants, block32_quants: Q4_0's codes less 8, IQ4_NL's grid entries, Q4_1's codes), converted to f32 and added times
// the block's scale dw * xd in one fma, block after block; at the end the lanes are added as hsum adds them, v_l (lane
// l's two accumulators added) in ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)) (each add commutes: the butterfly
// of shuffles gives it). Q4_1 adds its minima's terms (eb_q4_1_min_term, m * xd * the block's two sums of 16 quants)
// into one sum in block order, and that sum to the lanes'. Each half of a group of 32 lanes runs its own row (or both
// the same); every lane of the half receives the sums.
template <int DT>
__device__ __forceinline__ void q8_dot32(const unsigned char *row, int cols, const q8_tile &x, int nt, int lane,
                                         float *out) {
    constexpr int BYTES = DT == EB_DTYPE_Q8_0 ? 34 : DT == EB_DTYPE_MXFP4 ? 17 : DT == EB_DTYPE_Q4_1 ? 20 : 18;
    constexpr int QS = DT == EB_DTYPE_MXFP4 ? 1 : DT == EB_DTYPE_Q4_1 ? 4 : 2; // where the codes begin
    int p = (lane >> 3) & 1, l = lane & 7, nb = cols / 32;
    float acc[DOT_TILE] = {0.0f, 0.0f, 0.0f, 0.0f};
    const signed char *xq = x.q[0] + 4 * l;
    const float *xd = x.d[0];
    for (int k = p; k < nb; k += 2) {
        const unsigned char *b = row + (long long)k * BYTES;
        float dw;
        int w;
        if (DT == EB_DTYPE_Q8_0) {
            dw = half_bits(ld_u16(b));
            w = (int)ld_u32(b + 2 + 4 * l);
        } else {
            dw = DT == EB_DTYPE_MXFP4 ? e8m0_half(ld_u8(b)) : half_bits(ld_u16(b));
            unsigned n = ld_u32(b + QS + 4 * (l & 3)); // values 4l..: low nibbles (l < 4), else high ones
            n = ((l & 4) ? n >> 4 : n) & 0x0F0F0F0Fu;
            if (DT == EB_DTYPE_MXFP4) {
                w = mxfp4_x4(n);
            } else if (DT == EB_DTYPE_IQ4_NL) {
                w = (int)(table4(n, IQ4NL_T0, IQ4NL_T1, IQ4NL_T2, IQ4NL_T3) ^ 0x80808080u);
            } else if (DT == EB_DTYPE_Q4_0) { // code - 8 a byte: the code's top bit flipped is the 4-bit two's
                unsigned c = n ^ 0x08080808u; // complement of it, sign-extended (bit 3 into bits 4..7)
                w = (int)(c | ((c & 0x08080808u) * 0x1Eu));
            } else {
                w = (int)n;
            }
        }
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++)
            if (j < nt) {
                int xv = *(const int *)(xq + (long long)j * cols + 32 * k);
                acc[j] = q8_fma((float)dot4(w, xv, 0), q8_mul(dw, xd[j * nb + k]), acc[j]);
            }
    }
    float mins[DOT_TILE] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (DT == EB_DTYPE_Q4_1) { // each lane of the half a block's term, then added in block order by shuffles
        int h = lane & 15, base = lane & 16;
        for (int k0 = 0; k0 < nb; k0 += 16) {
            int k = k0 + h < nb ? k0 + h : k0;
            float m = half_bits(ld_u16(row + (long long)k * BYTES + 2)), term[DOT_TILE];
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++) {
                int jj = j < nt ? j : 0;
                const short *sp = x.s16[0] + (long long)jj * (cols / 16) + 2 * k;
                term[j] = q8_mul(q8_mul(m, xd[jj * nb + k]), (float)(sp[0] + sp[1]));
            }
            for (int s = 0; s < 16 && k0 + s < nb; s++)
#pragma unroll
                for (int j = 0; j < DOT_TILE; j++) mins[j] = q8_add(mins[j], SHFL_FROM32(term[j], base + s));
        }
    }
#pragma unroll
    for (int j = 0; j < DOT_TILE; j++) {
        float v = q8_add(acc[j], SHFL_XOR32(acc[j], 8));
        v = q8_add(v, SHFL_XOR32(v, 4));
        v = q8_add(v, SHFL_XOR32(v, 2));
        out[j] = q8_add(v, SHFL_XOR32(v, 1));
        if (DT == EB_DTYPE_Q4_1) out[j] = q8_add(out[j], mins[j]);
    }
}

// Sub-block j's chunk of 32 values of a Q2_K or Q3_K block (j < 8; sub-blocks 2j and 2j + 1 of 16 each) as eight
// words of four unsigned quants (eb_k16_quant): Q2_K's 2-bit fields, Q3_K's with their third bit from the 32 bytes of
// high bits (bit j of each).
template <int DT> __device__ __forceinline__ void k16_chunk(const unsigned char *b, int j, unsigned *q) {
    int h = j >> 2, s = j & 3;
    const unsigned char *f = b + (DT == EB_DTYPE_Q2_K ? 16 : 32) + 32 * h;
#pragma unroll
    for (int w = 0; w < 8; w++) {
        q[w] = (ld_u32(f + 4 * w) >> (2 * s)) & 0x03030303u;
        if (DT == EB_DTYPE_Q3_K) q[w] |= ((ld_u32(b + 4 * w) >> j) & 0x01010101u) << 2;
    }
}

// Q4_K, Q5_K, Q6_K, Q2_K, Q3_K and IQ4_XS against blocks of 256: the x86 kernels' arithmetic (cpu_kernels_avx2.c
// dot_q8 and cpu_kernels_x86.h). Per weight block two exact int32 sums: isum, every quant times its sub-block's scale
// times its activation, and msum, the minima (Q4_K, Q5_K, Q2_K) or the scales (Q6_K and Q3_K, whose quants are offset
// by 32 and 4) times the activations' sums of 16 (IQ4_XS: none; its quants are its grid's signed entries); the block's
// f32 value from them by the CPU's expression (k4_block_value, k16_block_value, IQ4_XS's d * xd * isum); the values
// added into one sum in block order. 32 lanes a row, four blocks at a time: lane 8i + g takes group g of block k0 + i
// (qfmt's groups; Q2_K, Q3_K and IQ4_XS: chunk g, values 32g ..), the block's 8 lanes add their partial sums by
// shuffles, then every lane adds the four values in order. Every lane receives the sums.
template <int DT>
__device__ __forceinline__ void q8_dotk(const unsigned char *row, int cols, const q8_tile &x, int nt, int lane,
                                        float *out) {
    constexpr int Q5 = DT == EB_DTYPE_Q5_K;
    constexpr int BYTES = DT == EB_DTYPE_Q4_K    ? 144
                          : DT == EB_DTYPE_Q5_K  ? 176
                          : DT == EB_DTYPE_Q6_K  ? 210
                          : DT == EB_DTYPE_Q2_K  ? 84
                          : DT == EB_DTYPE_Q3_K  ? 110
                                                 : 136; // IQ4_XS
    int gi = (lane >> 3) & 3, g = lane & 7, nb = cols / 256;
    bool a16 = ((uintptr_t)row & 15) == 0;
    float sum[DOT_TILE] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < nb; k0 += 4) {
        int k = k0 + gi < nb ? k0 + gi : k0; // a lane past the last block reads the first of these (not added)
        const unsigned char *b = row + (long long)k * BYTES;
        int isum[DOT_TILE] = {0, 0, 0, 0}, msum[DOT_TILE] = {0, 0, 0, 0};
        float dd, dm = 0.0f;
        if (DT == EB_DTYPE_Q2_K || DT == EB_DTYPE_Q3_K) {
            unsigned q[8];
            k16_chunk<DT>(b, g, q);
            int s0, s1, m0 = 0, m1 = 0; // sub-blocks 2g and 2g + 1: their scales (Q2_K: and minima)
            if (DT == EB_DTYPE_Q2_K) {
                unsigned sm = ld_u16(b + 2 * g);
                s0 = (int)(sm & 0xFu), m0 = (int)((sm >> 4) & 0xFu), s1 = (int)((sm >> 8) & 0xFu), m1 = (int)(sm >> 12);
                dd = half_bits(ld_u16(b + 80)), dm = half_bits(ld_u16(b + 82));
            } else { // eb_k16_scale: a nibble of bytes 96..103 and two bits of bytes 104..107, less 32
                int sub[2] = {2 * g, 2 * g + 1}, sc[2];
#pragma unroll
                for (int i = 0; i < 2; i++)
                    sc[i] = (int)(((ld_u8(b + 96 + sub[i] % 8) >> (4 * (sub[i] / 8))) & 0xFu) |
                                  ((ld_u8(b + 104 + sub[i] % 4) >> (2 * (sub[i] / 4))) & 3u) << 4) - 32;
                s0 = sc[0], s1 = sc[1], m0 = s0, m1 = s1;
                dd = half_bits(ld_u16(b + 108));
            }
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++)
                if (j < nt) {
                    const int *xi = (const int *)(x.q[1] + (long long)j * cols + 256 * k + 32 * g);
                    int p0 = 0, p1 = 0;
#pragma unroll
                    for (int w = 0; w < 4; w++) p0 = dot4((int)q[w], xi[w], p0), p1 = dot4((int)q[4 + w], xi[4 + w], p1);
                    const short *sp = x.s16[1] + (long long)j * (cols / 16) + 16 * k + 2 * g;
                    isum[j] = s0 * p0 + s1 * p1;
                    msum[j] = m0 * sp[0] + m1 * sp[1];
                }
        } else if (DT == EB_DTYPE_IQ4_XS) { // chunk g: 16 bytes of codes into IQ4_NL's grid, its 6-bit scale less 32
            unsigned lo[4], hi[4];
            nibbles16(ld_u64(b + 8 + 16 * g), ld_u64(b + 16 + 16 * g), lo, hi);
            int sc = (int)(((ld_u8(b + 4 + g / 2) >> (4 * (g & 1))) & 0xFu) | ((ld_u16(b + 2) >> (2 * g)) & 3u) << 4) - 32;
            dd = half_bits(ld_u16(b));
#pragma unroll
            for (int w = 0; w < 4; w++) {
                lo[w] = table4(lo[w], IQ4NL_T0, IQ4NL_T1, IQ4NL_T2, IQ4NL_T3) ^ 0x80808080u;
                hi[w] = table4(hi[w], IQ4NL_T0, IQ4NL_T1, IQ4NL_T2, IQ4NL_T3) ^ 0x80808080u;
            }
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++)
                if (j < nt) {
                    const int *xi = (const int *)(x.q[1] + (long long)j * cols + 256 * k + 32 * g);
                    int p = 0;
#pragma unroll
                    for (int w = 0; w < 4; w++) p = dot4((int)lo[w], xi[w], p), p = dot4((int)hi[w], xi[4 + w], p);
                    isum[j] = sc * p;
                }
        } else if (DT == EB_DTYPE_Q6_K) {
            int hh = g >> 2, tt = g & 3;
            uint2 qa = ld_u64(b + 64 * hh + 8 * tt), qb = ld_u64(b + 64 * hh + 32 + 8 * tt);
            uint2 qh = ld_u64(b + 128 + 32 * hh + 8 * tt), scw = ld_u64(b + 192 + 8 * hh);
            unsigned s2 = ld_u16(b + 192 + 2 * g); // scales 2g and 2g + 1, for msum
            dd = half_bits(ld_u16(b + 208));
            unsigned a[2] = {qa.x, qa.y}, c[2] = {qb.x, qb.y}, hq[2] = {qh.x, qh.y}, scs[2] = {scw.x, scw.y};
            unsigned qv[4][2];
            int sc[4];
#pragma unroll
            for (int s = 0; s < 4; s++) { // values 8tt.. of sub-block 4hh + s: scale 2 (4hh + s) + (tt >= 2)
                int kk = 2 * s + (tt >> 1);
                sc[s] = (int)(signed char)((scs[kk >> 2] >> (8 * (kk & 3))) & 0xffu);
#pragma unroll
                for (int w = 0; w < 2; w++) {
                    unsigned lw = s & 1 ? c[w] : a[w];
                    qv[s][w] = ((s & 2 ? lw >> 4 : lw) & 0x0F0F0F0Fu) | (((hq[w] >> (2 * s)) & 0x03030303u) << 4);
                }
            }
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++)
                if (j < nt) {
                    const int *xi = (const int *)(x.q[1] + (long long)j * cols + 256 * k);
                    int is = 0;
#pragma unroll
                    for (int s = 0; s < 4; s++) {
                        int at = (32 * (4 * hh + s) + 8 * tt) / 4;
                        is += sc[s] * dot4((int)qv[s][1], xi[at + 1], dot4((int)qv[s][0], xi[at], 0));
                    }
                    const short *sp = x.s16[1] + (long long)j * (cols / 16) + 16 * k + 2 * g;
                    isum[j] = is;
                    msum[j] = (int)(signed char)(s2 & 0xffu) * sp[0] + (int)(signed char)(s2 >> 8) * sp[1];
                }
        } else {
            int pp = g >> 1, h = g & 1;
            uint4 head = ld_u128(b, a16), qs = ld_u128(b + 16 + (Q5 ? 32 : 0) + 16 * g, a16);
            int sc0, m0, sc1, m1, scg, mg;
            k4_scale_min(head.y, head.z, head.w, 2 * pp, &sc0, &m0);
            k4_scale_min(head.y, head.z, head.w, 2 * pp + 1, &sc1, &m1);
            k4_scale_min(head.y, head.z, head.w, g, &scg, &mg); // sub-block g's minimum, for msum
            dd = half_bits(head.x & 0xffffu), dm = half_bits(head.x >> 16);
            unsigned q[4] = {qs.x, qs.y, qs.z, qs.w}, hb[4] = {0u, 0u, 0u, 0u}, lo[4], hi[4];
            if (Q5) {
                uint4 qh = ld_u128(b + 16 + 16 * h, a16);
                hb[0] = qh.x, hb[1] = qh.y, hb[2] = qh.z, hb[3] = qh.w;
            }
#pragma unroll
            for (int w = 0; w < 4; w++) {
                lo[w] = (q[w] & 0x0F0F0F0Fu) | (((hb[w] >> (2 * pp)) & 0x01010101u) << 4);
                hi[w] = ((q[w] >> 4) & 0x0F0F0F0Fu) | (((hb[w] >> (2 * pp + 1)) & 0x01010101u) << 4);
            }
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++)
                if (j < nt) {
                    const int *xi = (const int *)(x.q[1] + (long long)j * cols + 256 * k);
                    int plo = 0, phi = 0;
#pragma unroll
                    for (int w = 0; w < 4; w++) {
                        plo = dot4((int)lo[w], xi[(64 * pp + 16 * h) / 4 + w], plo);
                        phi = dot4((int)hi[w], xi[(64 * pp + 32 + 16 * h) / 4 + w], phi);
                    }
                    const short *sp = x.s16[1] + (long long)j * (cols / 16) + 16 * k + 2 * g;
                    isum[j] = sc0 * plo + sc1 * phi;
                    msum[j] = mg * (sp[0] + sp[1]);
                }
            (void)m0, (void)m1, (void)scg;
        }
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++)
            for (int o = 1; o < 8; o *= 2) isum[j] += SHFL_XOR32(isum[j], o), msum[j] += SHFL_XOR32(msum[j], o);
        float v[DOT_TILE];
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) {
            float dx = x.d[1][j < nt ? j * nb + k : k];
            if (DT == EB_DTYPE_Q6_K || DT == EB_DTYPE_Q3_K)
                v[j] = q8_mul(q8_mul(dd, dx), (float)(isum[j] - (DT == EB_DTYPE_Q6_K ? 32 : 4) * msum[j]));
            else if (DT == EB_DTYPE_IQ4_XS)
                v[j] = q8_mul(q8_mul(dd, dx), (float)isum[j]);
            else
                v[j] = q8_sub(q8_mul(q8_mul(dd, dx), (float)isum[j]), q8_mul(q8_mul(dm, dx), (float)msum[j]));
        }
        for (int s = 0; s < 4 && k0 + s < nb; s++)
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++) sum[j] = q8_add(sum[j], SHFL_FROM32(v[j], 8 * s));
    }
#pragma unroll
    for (int j = 0; j < DOT_TILE; j++) out[j] = sum[j];
}

// IQ2_XXS, IQ3_XXS, IQ2_XS, IQ3_S, IQ2_S, IQ1_S and IQ1_M against blocks of 256: the x86 kernels' arithmetic
// (cpu_kernels_avx2.c dot_q8, block_k_q8's expression), one loop for the seven that reads each chunk by its format
// (iq_q8_chunk), where seven copies of it would only be more code in every kernel. Per weight block two exact int32
// sums: isum, each half chunk's signed grid values times their activations times 2 s + 1, and for IQ1_S and IQ1_M
// msum, their groups' delta signs times the activations times the same 2 s + 1; the block's f32 value d * xd * isum
// (the 1-bit ones' d * xd * (isum + msum / 8)); the values added into one sum in block order, then (all but the 1-bit
// ones) times eb_iq_row_scale once, as dot_q8 applies it. The lanes as q8_dotk's: lane 8i + g takes chunk g of block
// k0 + i, the block's 8 lanes add their sums by shuffles, every lane adds the four values in order, and every lane
// receives the sums.
__device__ __forceinline__ void q8_dot_iq(const unsigned char *row, int dtype, int cols, const q8_tile &x, int nt,
                                          int lane, float *out) {
    int gi = (lane >> 3) & 3, g = lane & 7, nb = cols / 256, bytes = (int)gpu_row_bytes(dtype, 256);
    bool one = gpu_iq1(dtype);
    float sum[DOT_TILE] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < nb; k0 += 4) {
        int k = k0 + gi < nb ? k0 + gi : k0; // a lane past the last block reads the first of these (not added)
        unsigned q[8], neg;
        int s[2];
        float dd = iq_q8_chunk(row + (long long)k * bytes, dtype, g, q, &neg, s);
        int ls0 = 2 * s[0] + 1, ls1 = 2 * s[1] + 1, dw[4]; // dw: group l's delta sign in each of 4 bytes
#pragma unroll
        for (int l = 0; l < 4; l++) dw[l] = (neg >> l) & 1u ? -1 : 0x01010101;
        int isum[DOT_TILE] = {0, 0, 0, 0}, msum[DOT_TILE] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++)
            if (j < nt) {
                const int *xi = (const int *)(x.q[1] + (long long)j * cols + 256 * k + 32 * g);
                int p0 = 0, p1 = 0, m0 = 0, m1 = 0;
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    p0 = dot4((int)q[w], xi[w], p0);
                    p1 = dot4((int)q[4 + w], xi[4 + w], p1);
                    if (one) m0 = dot4(dw[w / 2], xi[w], m0), m1 = dot4(dw[2 + w / 2], xi[4 + w], m1);
                }
                isum[j] = ls0 * p0 + ls1 * p1;
                msum[j] = ls0 * m0 + ls1 * m1;
            }
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++)
            for (int o = 1; o < 8; o *= 2) {
                isum[j] += SHFL_XOR32(isum[j], o);
                if (one) msum[j] += SHFL_XOR32(msum[j], o); // (one is the same on every lane)
            }
        float v[DOT_TILE];
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) {
            float dx = x.d[1][j < nt ? j * nb + k : k];
            v[j] = one ? q8_mul(q8_mul(dd, dx), q8_add((float)isum[j], q8_mul(0.125f, (float)msum[j])))
                       : q8_mul(q8_mul(dd, dx), (float)isum[j]);
        }
        for (int i = 0; i < 4 && k0 + i < nb; i++)
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++) sum[j] = q8_add(sum[j], SHFL_FROM32(v[j], 8 * i));
    }
    float scale = dtype == EB_DTYPE_IQ3_S ? 1.0f : dtype == EB_DTYPE_IQ3_XXS ? 0.25f : 0.125f; // eb_iq_row_scale
#pragma unroll
    for (int j = 0; j < DOT_TILE; j++) out[j] = one ? sum[j] : q8_mul(scale, sum[j]);
}

// out[j] (j < nt) = weight row `row` . x row j in the q8 precision, on every lane of the row's lanes: the integer
// products where the format has them (x quantized in t), else the f32 product of x (xs) that warp_dot_tile computes.
__device__ __forceinline__ void q8_product(const void *w, int dtype, long long row, int cols, const q8_tile &t,
                                           const float *const *xs, int nt, int lane, float *out) {
    const unsigned char *rp = (const unsigned char *)w + (unsigned long long)row * gpu_row_bytes(dtype, cols);
    switch (dtype) {
    case EB_DTYPE_Q8_0: q8_dot32<EB_DTYPE_Q8_0>(rp, cols, t, nt, lane, out); return;
    case EB_DTYPE_MXFP4: q8_dot32<EB_DTYPE_MXFP4>(rp, cols, t, nt, lane, out); return;
    case EB_DTYPE_Q4_K: q8_dotk<EB_DTYPE_Q4_K>(rp, cols, t, nt, lane, out); return;
    case EB_DTYPE_Q5_K: q8_dotk<EB_DTYPE_Q5_K>(rp, cols, t, nt, lane, out); return;
    case EB_DTYPE_Q6_K: q8_dotk<EB_DTYPE_Q6_K>(rp, cols, t, nt, lane, out); return;
    case EB_DTYPE_Q2_K: q8_dotk<EB_DTYPE_Q2_K>(rp, cols, t, nt, lane, out); return;
    case EB_DTYPE_Q3_K: q8_dotk<EB_DTYPE_Q3_K>(rp, cols, t, nt, lane, out); return;
    case EB_DTYPE_IQ4_XS: q8_dotk<EB_DTYPE_IQ4_XS>(rp, cols, t, nt, lane, out); return;
    case EB_DTYPE_IQ2_XXS:
    case EB_DTYPE_IQ3_XXS:
    case EB_DTYPE_IQ2_XS:
    case EB_DTYPE_IQ3_S:
    case EB_DTYPE_IQ2_S:
    case EB_DTYPE_IQ1_S:
    case EB_DTYPE_IQ1_M: q8_dot_iq(rp, dtype, cols, t, nt, lane, out); return;
    case EB_DTYPE_Q4_0: q8_dot32<EB_DTYPE_Q4_0>(rp, cols, t, nt, lane, out); return;
    case EB_DTYPE_Q4_1: q8_dot32<EB_DTYPE_Q4_1>(rp, cols, t, nt, lane, out); return;
    case EB_DTYPE_IQ4_NL: q8_dot32<EB_DTYPE_IQ4_NL>(rp, cols, t, nt, lane, out); return;
    default: {
        float s[DOT_TILE];
        warp_dot_tile(w, dtype, row, cols, xs, nt, lane, 32, s);
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) out[j] = SHFL_FROM32(s[j], 0);
    }
    }
}

// The block's rows [r0, r1) over its groups of 32 lanes, `lanes` lanes a row (16: two rows a group): fn(row, live,
// lane) on every lane of the group, live false on the half of a group past r1 (which runs its first row again, so
// that the group's shuffles see every lane; it must not write).
template <class F> __device__ __forceinline__ void q8_rows(int r0, int r1, int lanes, F fn) {
    int lane = (int)threadIdx.x & 31, group = (int)threadIdx.x >> 5, groups = (int)blockDim.x >> 5, per = 32 / lanes;
    for (int rb = r0 + group * per; rb < r1; rb += groups * per) {
        int r = rb + (lanes == 16 ? lane >> 4 : 0);
        fn(r < r1 ? r : rb, r < r1, lane);
    }
}

// Pass by pass over up to nt_max rows of x at a time (the products of a pass read them quantized in the shared
// memory's tile): the rows xs[0 .. nt) are quantized in the layouts need, then body(nt) runs the block's products.
template <class B>
__device__ __forceinline__ void q8_pass(const float *const *xs, int nt, int cols, int need, const q8_tile &t, B body) {
    __syncthreads(); // the previous pass's products have read the tile
    if (need) q8_quantize(xs, nt, cols, need, t);
    __syncthreads();
    body(nt);
}

extern __shared__ __align__(16) unsigned char q8_shared[];

// One product of the primary's matmul, y[t][r] = w[r] . x[t] (accumulate: y + it), rows_per_block rows a block.
struct q8_mm {
    const void *w;
    const float *x;
    float *y;
    int dtype, rows, cols, n, accumulate, rows_per_block, nt_max;
};

__global__ void __launch_bounds__(Q8_THREADS) q8_matmul_kernel(q8_mm a) {
    q8_tile t;
    int need = q8_layout(a.dtype), lanes = q8_lanes(a.dtype);
    q8_carve(q8_shared, a.nt_max, a.cols, need, &t);
    int r0 = blockIdx.x * a.rows_per_block, r1 = min(a.rows, r0 + a.rows_per_block);
    for (int t0 = 0; t0 < a.n; t0 += a.nt_max) {
        int nt = min(a.nt_max, a.n - t0);
        const float *xs[DOT_TILE];
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) xs[j] = a.x + (long long)(t0 + (j < nt ? j : 0)) * a.cols;
        q8_pass(xs, nt, a.cols, need, t, [&](int) {
            q8_rows(r0, r1, lanes, [&](int r, bool live, int lane) {
                float s[DOT_TILE];
                q8_product(a.w, a.dtype, r, a.cols, t, xs, nt, lane, s);
                if (live && (lane & (lanes - 1)) == 0)
#pragma unroll
                    for (int j = 0; j < DOT_TILE; j++)
                        if (j < nt) {
                            float *y = a.y + (long long)(t0 + j) * a.rows + r;
                            *y = a.accumulate ? q8_add(*y, s[j]) : s[j];
                        }
            });
        });
    }
}

// An expert's gate and up products for rows [r0, r1) and the rows of x of nt pairs (xs), the activation into
// h_rows[j] + i: eb_q8_act where both products are q8 ones (the CPU module's choice), else expert_act. q8_gate_up_rows
// is q8_pass's body and q8_gate_up_row q8_rows' row: functors, whose calls are forced inline, where the other kernels
// pass lambdas. Two products with the cases of every format are more code than the compiler inlines a lambda with,
// and a call holds the kernel to 128 registers (spills in every format's products).
struct q8_gate_up_row {
    const void *gate, *up;
    int gdt, udt;
    const float *bias;
    const eb_rt_act *act;
    int hidden, inter;
    const q8_tile *t;
    const float *const *xs;
    int nt;
    float *const *h_rows;
    int lanes;
    bool q8act;
    __device__ __forceinline__ void operator()(int i, bool live, int lane) const {
        float gs[DOT_TILE], us[DOT_TILE];
        q8_product(gate, gdt, i, hidden, *t, xs, nt, lane, gs);
        q8_product(up, udt, i, hidden, *t, xs, nt, lane, us);
        if (live && (lane & (lanes - 1)) == 0)
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++)
                if (j < nt) {
                    float g = biased(gs[j], bias, i), u = biased(us[j], bias, (long long)inter + i);
                    h_rows[j][i] =
                        q8act ? eb_q8_act(act->kind, act->alpha, act->limit, g, u) : expert_act(*act, g, u);
                }
    }
};

struct q8_gate_up_rows {
    const void *gate, *up;
    int gdt, udt;
    const float *bias;
    const eb_rt_act *act;
    int hidden, inter, r0, r1;
    const q8_tile *t;
    const float *const *xs;
    float *const *h_rows;
    __device__ __forceinline__ void operator()(int nt) const {
        int lanes = q8_lanes(gdt) == 16 && q8_lanes(udt) == 16 ? 16 : 32; // else a 16-lane product runs twice a row
        bool q8act = q8_products(gdt) && q8_products(udt);
        q8_rows(r0, r1, lanes,
                q8_gate_up_row{gate, up, gdt, udt, bias, act, hidden, inter, t, xs, nt, h_rows, lanes, q8act});
    }
};

// An expert's down products for rows [r0, r1) and the rows of h of nt pairs (hs), its down biases added, into
// out_rows[j] + r.
__device__ __forceinline__ void q8_down_rows(const void *down, int ddt, const float *bias, int inter, int r0, int r1,
                                             const q8_tile &t, const float *const *hs, int nt, float *const *out_rows) {
    int lanes = q8_lanes(ddt);
    q8_rows(r0, r1, lanes, [&](int r, bool live, int lane) {
        float v[DOT_TILE];
        q8_product(down, ddt, r, inter, t, hs, nt, lane, v);
        if (live && (lane & (lanes - 1)) == 0)
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++)
                if (j < nt) out_rows[j][r] = biased(v[j], bias, 2LL * inter + r);
    });
}

// expert_ffn in q8 (every expert of the batch in one launch each, grid.y = expert): the gate and up products and the
// activation of each pair, then the down products, each pair's row of out (y in reference mode; owner_local: its
// rows before they are weighted and summed, q8_owner_local_sum).
__global__ void __launch_bounds__(Q8_THREADS) q8_gate_up_grouped(const gpu_expert_slot *slots, eb_rt_act act,
                                                                 int hidden, int inter, const float *x,
                                                                 const int *pair_token, float *h, int rows_per_block,
                                                                 int nt_max) {
    const gpu_expert_slot s = slots[blockIdx.y];
    if (s.m <= 0) return;
    q8_tile t;
    int need = q8_layout(s.gate_dtype) | q8_layout(s.up_dtype);
    q8_carve(q8_shared, nt_max, hidden, need, &t);
    int r0 = blockIdx.x * rows_per_block, r1 = min(inter, r0 + rows_per_block);
    for (int p = 0; p < s.m; p += nt_max) {
        int nt = min(nt_max, s.m - p);
        const float *xs[DOT_TILE];
        float *hr[DOT_TILE];
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) {
            int pair = s.p0 + p + (j < nt ? j : 0);
            xs[j] = x + (long long)pair_token[pair] * hidden;
            hr[j] = h + (long long)pair * inter;
        }
        q8_pass(xs, nt, hidden, need, t,
                q8_gate_up_rows{s.gate, s.up, s.gate_dtype, s.up_dtype, s.bias, &act, hidden, inter, r0, r1, &t, xs,
                                hr});
    }
}

__global__ void __launch_bounds__(Q8_THREADS) q8_down_grouped(const gpu_expert_slot *slots, int hidden, int inter,
                                                              const float *h, float *out, int rows_per_block,
                                                              int nt_max) {
    const gpu_expert_slot s = slots[blockIdx.y];
    if (s.m <= 0) return;
    q8_tile t;
    int need = q8_layout(s.down_dtype);
    q8_carve(q8_shared, nt_max, inter, need, &t);
    int r0 = blockIdx.x * rows_per_block, r1 = min(hidden, r0 + rows_per_block);
    for (int p = 0; p < s.m; p += nt_max) {
        int nt = min(nt_max, s.m - p);
        const float *hs[DOT_TILE];
        float *yr[DOT_TILE];
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) {
            int pair = s.p0 + p + (j < nt ? j : 0);
            hs[j] = h + (long long)pair * inter;
            yr[j] = out + (long long)pair * hidden;
        }
        q8_pass(hs, nt, inter, need, t,
                [&](int n) { q8_down_rows(s.down, s.down_dtype, s.bias, inter, r0, r1, t, hs, n, yr); });
    }
}

// owner_local: y[tok(p)] += w(p) * yp[p] over the pairs in order (ascending expert id), y zeroed first: the cpu
// module's sum, a product then an addition per pair.
__global__ void q8_owner_local_sum(const float *yp, const int *pair_token, const float *pair_weight, int n_pairs,
                                   int hidden, float *y) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= hidden) return;
    for (int p = 0; p < n_pairs; p++) {
        float *o = y + (long long)pair_token[p] * hidden + j;
        *o = q8_add(*o, q8_mul(yp[(long long)p * hidden + j], pair_weight[p]));
    }
}

// The next (up to limit) selections of expert e from q on: their indices, q moved past them.
__device__ __forceinline__ int q8_next_pairs(const int *topk_id, int total, int e, int &q, int *pairs, int limit) {
    int nt = 0;
    for (; q < total && nt < limit; q++)
        if (topk_id[q] == e) {
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++) // constant indices: pairs stays in registers
                if (j == nt) pairs[j] = q;
            nt++;
        }
    return nt;
}

// The primary's experts in q8 (EB_MOE_EXPERTS; moe_combine_kernel adds them up): grid.y = a selected pair (per_pair,
// few rows) or an expert with the pairs routed to it, up to nt_max a pass. The gate/up products into h, the down
// products into pair_out. stats as the f32 kernels count them.
__device__ __forceinline__ bool q8_moe_expert(const eb_rt_moe &b, int per_pair, eb_rt_expert &ex, int &e) {
    e = per_pair ? b.topk_id[blockIdx.y] : (int)blockIdx.y;
    ex = b.experts[e];
    return ex.gate != NULL;
}

__global__ void __launch_bounds__(Q8_THREADS) q8_moe_gate_up_kernel(eb_rt_moe b, int per_pair, int rows_per_block,
                                                                    int nt_max) {
    eb_rt_expert ex;
    int e, total = b.n * b.top_k;
    if (!q8_moe_expert(b, per_pair, ex, e)) return;
    if (b.stats && blockIdx.x == 0 && threadIdx.x == 0) {
        if (per_pair) { // an expert counts once per layer step: at its first pair
            int first = 1;
            for (int q = 0; q < (int)blockIdx.y; q++) first &= b.topk_id[q] != e;
            atomicAdd(&b.stats[1], 1ULL);
            if (first) atomicAdd(&b.stats[0], 1ULL);
        } else {
            int rows = 0;
            for (int q = 0; q < total; q++) rows += b.topk_id[q] == e;
            if (rows) atomicAdd(&b.stats[0], 1ULL), atomicAdd(&b.stats[1], (unsigned long long)rows);
        }
    }
    q8_tile t;
    int need = q8_layout(ex.gate_dtype) | q8_layout(ex.up_dtype);
    q8_carve(q8_shared, nt_max, b.hidden, need, &t);
    int r0 = blockIdx.x * rows_per_block, r1 = min(b.inter, r0 + rows_per_block), q = per_pair ? blockIdx.y : 0;
    for (;;) {
        int pairs[DOT_TILE] = {q, q, q, q};
        int nt = per_pair ? (q == (int)blockIdx.y ? (q++, 1) : 0) : q8_next_pairs(b.topk_id, total, e, q, pairs, nt_max);
        if (!nt) break;
        const float *xs[DOT_TILE];
        float *hr[DOT_TILE];
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) {
            int pair = j < nt ? pairs[j] : pairs[0];
            xs[j] = b.xn + (long long)(pair / b.top_k) * b.hidden;
            hr[j] = b.h + (long long)pair * b.inter;
        }
        q8_pass(xs, nt, b.hidden, need, t,
                q8_gate_up_rows{ex.gate, ex.up, ex.gate_dtype, ex.up_dtype, ex.bias, &b.act, b.hidden, b.inter, r0, r1,
                                &t, xs, hr});
    }
}

__global__ void __launch_bounds__(Q8_THREADS) q8_moe_down_kernel(eb_rt_moe b, int per_pair, int rows_per_block,
                                                                 int nt_max) {
    eb_rt_expert ex;
    int e, total = b.n * b.top_k;
    if (!q8_moe_expert(b, per_pair, ex, e)) return;
    q8_tile t;
    int need = q8_layout(ex.down_dtype);
    q8_carve(q8_shared, nt_max, b.inter, need, &t);
    int r0 = blockIdx.x * rows_per_block, r1 = min(b.hidden, r0 + rows_per_block), q = per_pair ? blockIdx.y : 0;
    for (;;) {
        int pairs[DOT_TILE] = {q, q, q, q};
        int nt = per_pair ? (q == (int)blockIdx.y ? (q++, 1) : 0) : q8_next_pairs(b.topk_id, total, e, q, pairs, nt_max);
        if (!nt) break;
        const float *hs[DOT_TILE];
        float *yr[DOT_TILE];
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) {
            int pair = j < nt ? pairs[j] : pairs[0];
            hs[j] = b.h + (long long)pair * b.inter;
            yr[j] = b.pair_out + (long long)pair * b.hidden;
        }
        q8_pass(hs, nt, b.inter, need, t,
                [&](int n) { q8_down_rows(ex.down, ex.down_dtype, ex.bias, b.inter, r0, r1, t, hs, n, yr); });
    }
}

// The shared memory a q8 kernel's block may have for its rows of x (on the current device): CUDA's opt-in limit, raised
// for each q8 kernel (beyond the 48 KiB a launch gets unasked), or HIP's per-block limit. 48 KiB where raising fails.
static int q8_allow_shared(const gpuDeviceProp &prop) {
#ifdef EB_GPU_HIP
    return (int)prop.sharedMemPerBlock;
#else
    int bytes = (int)(prop.sharedMemPerBlockOptin > prop.sharedMemPerBlock ? prop.sharedMemPerBlockOptin
                                                                            : prop.sharedMemPerBlock);
    cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
    if (cudaFuncSetAttribute(q8_matmul_kernel, a, bytes) != cudaSuccess ||
        cudaFuncSetAttribute(q8_gate_up_grouped, a, bytes) != cudaSuccess ||
        cudaFuncSetAttribute(q8_down_grouped, a, bytes) != cudaSuccess ||
        cudaFuncSetAttribute(q8_moe_gate_up_kernel, a, bytes) != cudaSuccess ||
        cudaFuncSetAttribute(q8_moe_down_kernel, a, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return 48 << 10;
    }
    return bytes;
#endif
}

// Timing of queued work: not while recording (events are recorded around a graph's launch instead).
static int work_begin(gpu_device *d, char *err, size_t errlen) {
    if (!d->capturing && !d->timing) GPU_TRY(gpuEventRecord(d->start, d->stream), "event");
    return 0;
}

static int work_end(gpu_device *d, char *err, size_t errlen) {
    GPU_TRY(gpuGetLastError(), "kernel launch");
    if (!d->capturing) {
        GPU_TRY(gpuEventRecord(d->stop, d->stream), "event");
        d->timing = 1;
    }
    return 0;
}

// Runs body (which launches on d->stream) with the device held and timed.
#define PRIMARY_OP(...)                                                                                          \
    gpu_device *d = get_dev((gpu_runtime *)rtp, dev, err, errlen);                                               \
    if (!d) return EB_ERR_RANGE;                                                                                 \
    pthread_mutex_lock(&d->lock);                                                                                \
    int st = 0;                                                                                                  \
    gpuError_t e_ = gpuSetDevice(dev);                                                                           \
    if (e_ != gpuSuccess)                                                                                        \
        st = eb_rt_fail(err, errlen, EB_ERR_DEVICE, API " set device: %s", gpuGetErrorString(e_));                \
    if (!st) st = work_begin(d, err, errlen);                                                                    \
    if (!st) {                                                                                                   \
        __VA_ARGS__;                                                                                             \
        if (!st) st = work_end(d, err, errlen);                                                                  \
    }                                                                                                            \
    pthread_mutex_unlock(&d->lock);                                                                              \
    return st;

static unsigned blocks(long long n, int per) { return (unsigned)((n + per - 1) / per); }
