// Part of gpu_runtime.cu (included there, one translation unit): the primary's forward pass kernels.

// ---- the primary's forward pass ------------------------------------------------------------------------

#define MAX_TOPK 16
#define MAX_HEAD_DIM 256
#define ATT_GROUPS 8 // groups of 32 lanes per attention block

#define LOADS 4 // 16-byte weight loads a lane has in flight in the 16-bit products

// s + one chunk of 8 16-bit weights (wv) times 8 values of x (a, b): the one expression of every 16-bit product, so
// that warp_dot_tile and warp_dot_rows give the same bits.
__device__ __forceinline__ float dot8_add(float s, const float *wv, float4 a, float4 b) {
    return s + (wv[0] * a.x + wv[1] * a.y + wv[2] * a.z + wv[3] * a.w + wv[4] * b.x + wv[5] * b.y + wv[6] * b.z +
                wv[7] * b.w);
}

// Chunk c (8 weights, v) of a 16-bit row added to the sums of up to DOT_TILE rows of x (normalised on the fly when
// nw is given).
__device__ __forceinline__ void tile16_add(uint4 v, int dtype, int c, const float *const *xs, int nt, float *s,
                                           const float *nw, const float *inv) {
    float wv[8];
    unpack8(v, dtype, wv);
#pragma unroll
    for (int j = 0; j < DOT_TILE; j++) {
        if (j >= nt) continue;
        const float4 *x4 = (const float4 *)(xs[j] + c * 8);
        float4 a = x4[0], b = x4[1];
        if (nw) a = normed(a, nw, c * 8, inv[j]), b = normed(b, nw, c * 8 + 4, inv[j]);
        s[j] = dot8_add(s[j], wv, a, b);
    }
}

// Partial dot products of weight row `row` with up to DOT_TILE rows of x (xs[j], j < nt), one load of the
// weights serving all of them; reduced over the warp (lane 0 holds the sums).
// nw (nullable): the rows of x are normalised on the fly, x[c] -> nw[c] * (x[c] * inv[j]), exactly as the
// rmsnorm kernel writes them.
__device__ __forceinline__ void warp_dot_tile(const void *w, int dtype, long long row, int cols,
                                              const float *const *xs, int nt, int lane, int warp, float *out,
                                              const float *nw = NULL, const float *inv = NULL) {
    float s[DOT_TILE] = {0.0f, 0.0f, 0.0f, 0.0f};
    long long base = row * (long long)cols;
    if (quantized(dtype)) {
        qdot_tile_any(w, dtype, row, cols, xs, nt, lane, warp, s, nw, inv);
    } else if (dtype != EB_DTYPE_F32 && (cols % 8) == 0) {
        const uint4 *w4 = (const uint4 *)((const unsigned short *)w + base);
        int n8 = cols / 8, c = lane;
        // LOADS chunks' loads issued before their sums: a load behind the loop's bound check waits for the sum
        // before it, one load in flight per lane, which held a row of 2048 to about a quarter of the HBM's read.
        // The sums still go in column order, as one chunk at a time adds them: the same bits.
        for (; c + (LOADS - 1) * warp < n8; c += LOADS * warp) {
            uint4 v[LOADS];
#pragma unroll
            for (int u = 0; u < LOADS; u++) v[u] = w4[c + u * warp];
#pragma unroll
            for (int u = 0; u < LOADS; u++) tile16_add(v[u], dtype, c + u * warp, xs, nt, s, nw, inv);
        }
        for (; c < n8; c += warp) tile16_add(w4[c], dtype, c, xs, nt, s, nw, inv);
    } else if (dtype == EB_DTYPE_F32 && (cols % 4) == 0) {
        const float4 *w4 = (const float4 *)((const float *)w + base);
#pragma unroll 4
        for (int c = lane; c < cols / 4; c += warp) {
            float4 v = w4[c];
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++) {
                if (j >= nt) continue;
                float4 a = ((const float4 *)xs[j])[c];
                if (nw) a = normed(a, nw, c * 4, inv[j]);
                s[j] += v.x * a.x + v.y * a.y + v.z * a.z + v.w * a.w;
            }
        }
    } else {
        for (int c = lane; c < cols; c += warp) {
            float v = load_w(w, dtype, base + c);
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++)
                if (j < nt) s[j] += v * (nw ? nw[c] * (xs[j][c] * inv[j]) : xs[j][c]);
        }
    }
    for (int o = warp / 2; o > 0; o /= 2)
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) s[j] += SHFL_DOWN(s[j], o);
#pragma unroll
    for (int j = 0; j < DOT_TILE; j++) out[j] = s[j];
}

// Chunk c (8 weights, v) of a 16-bit row added to the sum s of its row of x.
__device__ __forceinline__ void rows16_add(uint4 v, int dtype, int c, const float *x, float &s) {
    float wv[8];
    unpack8(v, dtype, wv);
    const float4 *x4 = (const float4 *)(x + c * 8);
    s = dot8_add(s, wv, x4[0], x4[1]);
}

// Dot products of distinct weight rows with distinct inputs, their loads in flight together:
// out[j] = ws[j][row] . xs[j] for j < nt (one dtype); reduced over the warp (lane 0 holds the sums).
__device__ __forceinline__ void warp_dot_rows(const void *const *ws, int dtype, long long row, int cols,
                                              const float *const *xs, int nt, int lane, int warp, float *out) {
    float s[DOT_TILE] = {0.0f, 0.0f, 0.0f, 0.0f};
    long long base = row * (long long)cols;
    if (quantized(dtype)) {
        qdot_rows_any(ws, dtype, row, cols, xs, nt, lane, warp, s);
    } else if (dtype != EB_DTYPE_F32 && (cols % 8) == 0) {
        int n8 = cols / 8, c = lane;
        // two chunks of every row in flight before their sums (as in warp_dot_tile), added in column order
        for (; c + warp < n8; c += 2 * warp) {
            uint4 v[2][DOT_TILE];
#pragma unroll
            for (int u = 0; u < 2; u++)
#pragma unroll
                for (int j = 0; j < DOT_TILE; j++)
                    if (j < nt) v[u][j] = ((const uint4 *)((const unsigned short *)ws[j] + base))[c + u * warp];
#pragma unroll
            for (int u = 0; u < 2; u++)
#pragma unroll
                for (int j = 0; j < DOT_TILE; j++)
                    if (j < nt) rows16_add(v[u][j], dtype, c + u * warp, xs[j], s[j]);
        }
        for (; c < n8; c += warp)
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++)
                if (j < nt) rows16_add(((const uint4 *)((const unsigned short *)ws[j] + base))[c], dtype, c, xs[j], s[j]);
    } else {
        for (int c = lane; c < cols; c += warp)
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++)
                if (j < nt) s[j] += load_w(ws[j], dtype, base + c) * xs[j][c];
    }
    for (int o = warp / 2; o > 0; o /= 2)
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) s[j] += SHFL_DOWN(s[j], o);
#pragma unroll
    for (int j = 0; j < DOT_TILE; j++) out[j] = s[j];
}

// Ask for a weight row into L2 (no registers held): its loads then wait less after a reduction.
__device__ __forceinline__ void prefetch_row(const void *w, int dtype, long long row, int cols, int lane, int warp) {
#ifndef EB_GPU_HIP
    size_t bytes = (size_t)gpu_row_bytes(dtype, cols);
    const char *p = (const char *)w + (size_t)row * bytes;
    for (size_t off = (size_t)lane * 128; off < bytes; off += (size_t)warp * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
#else
    (void)w, (void)dtype, (void)row, (void)cols, (void)lane, (void)warp;
#endif
}

// Up to four products in one launch: the rows of all tasks are numbered one after another.
struct mm_task {
    const void *w;
    const float *x;
    float *y;
    int dtype, rows, cols, n;
};
struct mm_batch {
    mm_task t[4];
    int start[5];
    int count, accumulate;
    // a fused RMSNorm of the tasks' common input (nw non-NULL): x rows nx, at most DOT_TILE of them, written to xn
    const float *nx, *nw;
    float *nxn;
    float eps;
    int norm_n, norm_dim;
};

#define NORM_LOADS 8 // 16-byte loads of x a lane has in flight in warp_row_inv (a row of 2048: two rounds)

// 1 / RMS of a row of x (the scale of its RMSNorm), by one warp, every lane receiving the same bits: lane l adds the
// squares of its chunks of 4 values (l, l + warp, ...) in column order with explicit fmaf, NORM_LOADS chunks' loads in
// flight, then the warp's tree. The one computation of every hidden row's norm scale (rmsnorm_kernel, the norms
// fused into matmul_kernel and matvec16_kernel, route_kernel), so that whichever kernel normalises a row, the row
// is the same. A warp of its own needs no block barrier: a block's warps start on their weight rows at once.
__device__ __forceinline__ float warp_row_inv(const float *xr, int dim, float eps, int lane, int warp) {
    float ss = 0.0f;
    if ((dim & 3) == 0) { // rows of a multiple of 4 floats start 16-byte aligned in the core's buffers
        const float4 *x4 = (const float4 *)xr;
        int n4 = dim / 4, c = lane;
        for (; c + (NORM_LOADS - 1) * warp < n4; c += NORM_LOADS * warp) {
            float4 a[NORM_LOADS];
#pragma unroll
            for (int u = 0; u < NORM_LOADS; u++) a[u] = x4[c + u * warp];
#pragma unroll
            for (int u = 0; u < NORM_LOADS; u++)
                ss = fmaf(a[u].w, a[u].w, fmaf(a[u].z, a[u].z, fmaf(a[u].y, a[u].y, fmaf(a[u].x, a[u].x, ss))));
        }
        for (; c < n4; c += warp) {
            float4 a = x4[c];
            ss = fmaf(a.w, a.w, fmaf(a.z, a.z, fmaf(a.y, a.y, fmaf(a.x, a.x, ss))));
        }
    } else {
        for (int i = lane; i < dim; i += warp) ss = fmaf(xr[i], xr[i], ss);
    }
    for (int o = warp / 2; o > 0; o /= 2) ss += SHFL_DOWN(ss, o);
    return rsqrtf(SHFL_FROM(ss, 0) / (float)dim + eps);
}

// The normalised rows y = w * (x * inv[t]) of n rows of x (dim values each), written by the lanes of `warps` warps
// (this one is warp g of them): a share of the values each, as rmsnorm_kernel writes them.
__device__ __forceinline__ void write_normed(const float *x, const float *w, int n, int dim, const float *inv,
                                             float *y, long long g, long long warps, int lane, int warp) {
    long long per = dim, step = warps * warp;
    for (int t = 0; t < n; t++)
        for (long long i = g * warp + lane; i < per; i += step) {
            long long k = (long long)t * dim + i;
            y[k] = w[i] * (x[k] * inv[t]);
        }
}

// The sum of v over the block (every thread must call it; blockDim a multiple of the warp).
__device__ float block_sum(float v, float *sh, int warp) {
    for (int o = warp / 2; o > 0; o /= 2) v += SHFL_DOWN(v, o);
    int lane = threadIdx.x % warp, wid = threadIdx.x / warp, nw = blockDim.x / warp;
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int i = 0; i < nw; i++) t += sh[i];
        sh[32] = t;
    }
    __syncthreads();
    float total = sh[32];
    __syncthreads();
    return total;
}

// The scales of the fused norm's rows (every warp its own, warp_row_inv), and this warp's share of the normalised
// rows written to nxn.
__device__ __forceinline__ void fused_norm(const mm_batch &b, float *inv, long long g, int lane, int warp) {
#pragma unroll
    for (int t = 0; t < DOT_TILE; t++)
        if (t < b.norm_n) inv[t] = warp_row_inv(b.nx + (long long)t * b.norm_dim, b.norm_dim, b.eps, lane, warp);
    long long warps = (long long)gridDim.x * (blockDim.x / warp);
    write_normed(b.nx, b.nw, b.norm_n, b.norm_dim, inv, b.nxn, g, warps, lane, warp);
}

// The task and weight row of the batch's row g (the rows of all tasks numbered one after another); false past the
// last. Constant indices only: a dynamic index into the parameters would copy them to local memory.
__device__ __forceinline__ bool batch_row(const mm_batch &b, int g, mm_task &t, int &r) {
    int ti = (g >= b.start[1]) + (g >= b.start[2]) + (g >= b.start[3]);
    t = ti == 0 ? b.t[0] : ti == 1 ? b.t[1] : ti == 2 ? b.t[2] : b.t[3];
    r = g - (ti == 0 ? 0 : ti == 1 ? b.start[1] : ti == 2 ? b.start[2] : b.start[3]);
    return g < b.start[b.count];
}

__global__ void matmul_kernel(mm_batch b, int warp) {
    float inv[DOT_TILE] = {0.0f, 0.0f, 0.0f, 0.0f};
    int lane = threadIdx.x % warp;
    int g = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp, r;
    mm_task t;
    bool live = batch_row(b, g, t, r);
    // The weight row on its way while the norm's reduction runs, and a Q8_0 row always (its loads then wait less:
    // 1.2x for rows of 2048 on an H200, where the other formats gained nothing).
    if (live && (b.nw || t.dtype == EB_DTYPE_Q8_0)) prefetch_row(t.w, t.dtype, r, t.cols, lane, warp);
    if (b.nw) fused_norm(b, inv, g, lane, warp);
    if (!live) return;
    for (int t0 = 0; t0 < t.n; t0 += DOT_TILE) {
        int nt = t.n - t0 < DOT_TILE ? t.n - t0 : DOT_TILE;
        const float *xs[DOT_TILE];
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) xs[j] = (b.nw ? b.nx : t.x) + (long long)(t0 + (j < nt ? j : 0)) * t.cols;
        float s[DOT_TILE];
        warp_dot_tile(t.w, t.dtype, r, t.cols, xs, nt, lane, warp, s, b.nw, inv);
        if (lane == 0)
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++)
                if (j < nt) {
                    float *y = t.y + (long long)(t0 + j) * t.rows + r;
                    *y = b.accumulate ? *y + s[j] : s[j];
                }
    }
}

#define MV_LOADS 8 // 16-byte weight loads a lane has in flight in matvec16_kernel

// Weight row `row` (16-bit, cols a multiple of 8) times one row of x (normalised on the fly when nw is given), by
// one warp: warp_dot_tile's per-lane order and expression for one row of x (the same bits), with MV_LOADS loads in
// flight and one sum held (lane 0 holds the total). scale() gives the norm's scale (0 without a norm); it is called
// once the row's first loads are on their way, so that the norm's reduction overlaps them.
template <class Scale>
__device__ __forceinline__ float warp_dot16(const void *w, int dtype, long long row, int cols, const float *x,
                                            int lane, int warp, const float *nw, Scale scale) {
    const uint4 *w4 = (const uint4 *)((const unsigned short *)w + row * (long long)cols);
    int n8 = cols / 8, c = lane;
    uint4 v[MV_LOADS];
    bool full = c + (MV_LOADS - 1) * warp < n8;
    if (full)
#pragma unroll
        for (int u = 0; u < MV_LOADS; u++) v[u] = w4[c + u * warp];
    float inv = scale(), s = 0.0f;
    while (full) {
#pragma unroll
        for (int u = 0; u < MV_LOADS; u++) tile16_add(v[u], dtype, c + u * warp, &x, 1, &s, nw, &inv);
        c += MV_LOADS * warp;
        full = c + (MV_LOADS - 1) * warp < n8;
        if (full)
#pragma unroll
            for (int u = 0; u < MV_LOADS; u++) v[u] = w4[c + u * warp];
    }
    for (; c < n8; c += warp) tile16_add(w4[c], dtype, c, &x, 1, &s, nw, &inv);
    for (int o = warp / 2; o > 0; o /= 2) s += SHFL_DOWN(s, o);
    return s;
}

// matmul_kernel for one row of x (decode's n = 1) and 16-bit weights whose cols are multiples of 8: a warp per
// weight row holding one sum instead of DOT_TILE (fewer registers, more warps per SM, more loads in flight); the
// same bits as matmul_kernel. Measured on an H200 (5120 x 2048 BF16): see bench/gpu/gemv_bench.cu.
__global__ void matvec16_kernel(mm_batch b, int warp) {
    int lane = threadIdx.x % warp;
    int g = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp, r;
    mm_task t;
    bool live = batch_row(b, g, t, r);
    float inv[DOT_TILE] = {0.0f, 0.0f, 0.0f, 0.0f};
    auto scale = [&]() { // the norm's scale and this warp's share of the normalised row, the first loads in flight
        if (b.nw) fused_norm(b, inv, g, lane, warp);
        return inv[0];
    };
    if (!live) {
        scale();
        return;
    }
    float s = warp_dot16(t.w, t.dtype, r, t.cols, b.nw ? b.nx : t.x, lane, warp, b.nw, scale);
    if (lane == 0) t.y[r] = b.accumulate ? t.y[r] + s : s;
}

__global__ void embed_kernel(const void *table, int dtype, int hidden, const int *ids, float *x) {
    long long row = ids[blockIdx.x];
    if (quantized(dtype)) { // a row of whole blocks, dequantized group by group
        const unsigned char *rp = (const unsigned char *)table + (unsigned long long)row * gpu_row_bytes(dtype, hidden);
        float *out = x + (long long)blockIdx.x * hidden;
#define EMBED_ROW(F) embed_row<F>(rp, hidden, out)
        switch (dtype) { QUANT_CASES(EMBED_ROW) }
#undef EMBED_ROW
        return;
    }
    for (int i = threadIdx.x; i < hidden; i += blockDim.x)
        x[(long long)blockIdx.x * hidden + i] = load_w(table, dtype, row * hidden + i);
}

__global__ void rmsnorm_kernel(const float *x, const float *w, int dim, float eps, float *y, int warp) {
    const float *xr = x + (long long)blockIdx.x * dim;
    int lane = threadIdx.x % warp, wid = threadIdx.x / warp;
    float inv = warp_row_inv(xr, dim, eps, lane, warp); // every warp its own: no barrier
    write_normed(xr, w, 1, dim, &inv, y + (long long)blockIdx.x * dim, wid, blockDim.x / warp, lane, warp);
}

__global__ void add_kernel(float *y, const float *b, long long n, int dim, int broadcast) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] += b[broadcast ? i % dim : i];
}

__global__ void silu_mul_kernel(float *g, const float *u, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// A head vector's RMSNorm (w NULL: none) and rotation, by a block of at least head_dim threads (every thread
// calls it): out (shared memory, head_dim floats) receives the result; vec is shared scratch of head_dim floats.
__device__ void norm_rope(const float *src, const float *w, const float *cs, const float *sn, int hd, float eps,
                          float *vec, float *out, float *sh, int warp) {
    int i = threadIdx.x, half = hd / 2;
    float x = i < hd ? src[i] : 0.0f;
    if (w) { // the same w for the whole block: block_sum is called by every thread or by none
        float inv = rsqrtf(block_sum(x * x, sh, warp) / (float)hd + eps);
        if (i < hd) vec[i] = w[i] * (x * inv);
    } else if (i < hd) {
        vec[i] = x;
    }
    __syncthreads();
    if (i < half) {
        float lo = vec[i], hi = vec[i + half];
        out[i] = lo * cs[i] - hi * sn[i];
        out[i + half] = hi * cs[i] + lo * sn[i];
    }
    __syncthreads();
}

// The cache row of position p: p % n_cache (a sliding-window layer's ring; a full layer's p, without a division).
__device__ __forceinline__ long long cache_row(long long p, int n_cache) { return p < n_cache ? p : p % n_cache; }

// Per (row, head): q/k RMSNorm (when given) and rotation in place, k and v written into the cache at the row's
// position's cache row.
// grid.y: n_heads q heads, then n_kv_heads k heads, then n_kv_heads v heads.
__global__ void qk_rope_store_kernel(eb_rt_attention a, int warp) {
    __shared__ float sh[33];
    __shared__ float vec[MAX_HEAD_DIM], out[MAX_HEAD_DIM];
    int t = blockIdx.x, h = blockIdx.y, hd = a.head_dim, half = hd / 2, i = threadIdx.x;
    int qd = a.n_heads * hd, kvd = a.n_kv_heads * hd;
    long long p = *a.pos + t, row = cache_row(p, a.n_cache);
    if (h >= a.n_heads + a.n_kv_heads) { // v: into the cache as it is
        int vh = h - a.n_heads - a.n_kv_heads;
        if (i < hd) ((float *)a.v_cache)[row * kvd + vh * hd + i] = a.v[(long long)t * kvd + vh * hd + i];
        return;
    }
    int is_q = h < a.n_heads;
    float *v = is_q ? a.q + (long long)t * qd + h * hd : a.k + (long long)t * kvd + (h - a.n_heads) * hd;
    norm_rope(v, is_q ? a.q_norm : a.k_norm, a.rope_cos + p * half, a.rope_sin + p * half, hd, a.eps, vec, out, sh,
              warp);
    if (i < hd) {
        v[i] = out[i];
        if (!is_q) ((float *)a.k_cache)[row * kvd + (h - a.n_heads) * hd + i] = out[i];
    }
}

// q . k for one position, over the 32 lanes of a group (lane holds dims lane, lane + 32, ...; every lane gets it).
__device__ __forceinline__ float head_dot(const float *qv, const float *k, int lane, int hd) {
    float d = 0.0f;
#pragma unroll
    for (int i = 0; i < MAX_HEAD_DIM / 32; i++) {
        int c = lane + 32 * i;
        if (c < hd) d += qv[i] * k[c];
    }
    for (int o = 16; o > 0; o /= 2) d += SHFL_XOR32(d, o);
    return d;
}

__device__ __forceinline__ void attend_update(float d, const float *v, int lane, int hd, float &m, float &l,
                                              float *acc) {
    float mn = fmaxf(m, d), corr = expf(m - mn), e = expf(d - mn);
    l = l * corr + e;
#pragma unroll
    for (int i = 0; i < MAX_HEAD_DIM / 32; i++) {
        int c = lane + 32 * i;
        if (c < hd) acc[i] = acc[i] * corr + e * v[c];
    }
    m = mn;
}

// One block per (head, row): groups of 32 lanes take the attended positions in turn (group g the g-th of them and
// every ng-th after), two at a time (their loads in flight together), with a running softmax (each lane holds
// head_dim / 32 of the output); then the groups are merged, with the head's sink logit (when given) in the maximum
// and the denominator only. Row t at position p attends to max(0, p - window + 1) .. p (window 0: 0 .. p), position
// s read from cache row s % n_cache.
// q: this head's rotated query; kl, vl (nullable): the last position's key and value, read from there instead of
// the cache (the fused one-row kernel, whose cache writes other blocks may not have made yet).
__device__ void attend(const eb_rt_attention &a, int h, int t, const float *q, const float *kl, const float *vl) {
    __shared__ float gm[ATT_GROUPS], gl[ATT_GROUPS];
    __shared__ float gacc[ATT_GROUPS][MAX_HEAD_DIM];
    int hd = a.head_dim, nc = a.n_cache;
    int lane = threadIdx.x % 32, g = threadIdx.x / 32, ng = blockDim.x / 32;
    int kvd = a.n_kv_heads * hd, kvh = h / (a.n_heads / a.n_kv_heads);
    long long last = *a.pos + t, cached = kl ? last - 1 : last; // positions read from the cache: first..cached
    long long first = a.window > 0 && last - a.window + 1 > 0 ? last - a.window + 1 : 0;
    float scale = rsqrtf((float)hd);
    const float *kc = (const float *)a.k_cache + kvh * hd, *vc = (const float *)a.v_cache + kvh * hd;
    float qv[MAX_HEAD_DIM / 32], acc[MAX_HEAD_DIM / 32];
#pragma unroll
    for (int i = 0; i < MAX_HEAD_DIM / 32; i++) {
        int c = lane + 32 * i;
        qv[i] = c < hd ? q[c] * scale : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    long long s = first + g;
    for (; s + ng <= cached; s += 2 * ng) {
        long long r0 = cache_row(s, nc) * kvd, r1 = cache_row(s + ng, nc) * kvd;
        float d0 = head_dot(qv, kc + r0, lane, hd), d1 = head_dot(qv, kc + r1, lane, hd);
        attend_update(d0, vc + r0, lane, hd, m, l, acc);
        attend_update(d1, vc + r1, lane, hd, m, l, acc);
    }
    if (s <= cached) {
        long long r0 = cache_row(s, nc) * kvd;
        attend_update(head_dot(qv, kc + r0, lane, hd), vc + r0, lane, hd, m, l, acc);
    }
    if (kl && g == (int)((last - first) % ng)) // the last position, in the turn of the group it falls to
        attend_update(head_dot(qv, kl, lane, hd), vl, lane, hd, m, l, acc);
    if (lane == 0) gm[g] = m, gl[g] = l;
#pragma unroll
    for (int i = 0; i < MAX_HEAD_DIM / 32; i++)
        if (lane + 32 * i < hd) gacc[g][lane + 32 * i] = acc[i];
    __syncthreads();
    if (g != 0) return;
    float sink = a.sinks ? a.sinks[h] : -INFINITY;
    float M = sink;
    for (int j = 0; j < ng; j++) M = fmaxf(M, gm[j]);
    float L = 0.0f;
    for (int j = 0; j < ng; j++) L += gl[j] * expf(gm[j] - M);
    if (a.sinks) L += expf(sink - M); // the sink's share of the softmax, which goes to no value
    float *out = a.out + (long long)t * a.n_heads * hd + h * hd;
    for (int c = lane; c < hd; c += 32) {
        float o = 0.0f;
        for (int j = 0; j < ng; j++) o += gacc[j][c] * expf(gm[j] - M);
        out[c] = o / L;
    }
}

__global__ void attention_kernel(eb_rt_attention a) {
    int h = blockIdx.x, t = blockIdx.y;
    attend(a, h, t, a.q + (long long)t * a.n_heads * a.head_dim + h * a.head_dim, NULL, NULL);
}

// One row (decode): every block normalises (when given) and rotates its query head and its group's key itself,
// and reads the new key and value from shared memory; the first block of each group writes them to the cache (at
// row p % n_cache: in a window's ring, that row held position p - n_cache, which no block reads, n_cache being at
// least the window).
__global__ void attention_one_row_kernel(eb_rt_attention a, int warp) {
    __shared__ float sh[33];
    __shared__ float vec[MAX_HEAD_DIM], qn[MAX_HEAD_DIM], kn[MAX_HEAD_DIM], vn[MAX_HEAD_DIM];
    int h = blockIdx.x, hd = a.head_dim, half = hd / 2, i = threadIdx.x, group = a.n_heads / a.n_kv_heads;
    int kvh = h / group, kvd = a.n_kv_heads * hd;
    long long p = *a.pos, row = cache_row(p, a.n_cache);
    const float *cs = a.rope_cos + p * half, *sn = a.rope_sin + p * half;
    norm_rope(a.q + h * hd, a.q_norm, cs, sn, hd, a.eps, vec, qn, sh, warp);
    norm_rope(a.k + kvh * hd, a.k_norm, cs, sn, hd, a.eps, vec, kn, sh, warp);
    if (i < hd) vn[i] = a.v[kvh * hd + i];
    if (h % group == 0 && i < hd) {
        ((float *)a.k_cache)[row * kvd + kvh * hd + i] = kn[i]; // f32 only: the module has no kv_formats
        ((float *)a.v_cache)[row * kvd + kvh * hd + i] = vn[i];
    }
    __syncthreads();
    attend(a, h, 0, qn, kn, vn);
}
