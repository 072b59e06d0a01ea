// Part of gpu_runtime.cu (included there, one translation unit): the quantized formats' device-side reading: the
// blocks and the per-lane products over them (gpu_blocks.cuh), and what the kernels build on them.
#include "gpu_blocks.cuh"

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
