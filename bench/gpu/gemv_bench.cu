// The primary's matrix-vector products (matmul_kernel's tile and matvec16_kernel, one token) against a bare
// warp-per-row product with every load of a row in flight at once, on bf16 matrices of the wide demo's shapes, timed
// with events over many launches; the matrices rotate through more memory than the L2 holds, as a decode step's
// weights do. Prints GB/s per case, and whether the two kernels' outputs (and normalised rows) have the same bits.
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90,code=sm_90 -Inative/include -o /tmp/gemv_bench \
//       bench/gpu/gemv_bench.cu && /tmp/gemv_bench
#include "../../native/runtime/gpu/gpu_runtime.cu"

#include <cstdio>
#include <vector>

#define CHECK(call)                                                                                              \
    do {                                                                                                         \
        cudaError_t e = (call);                                                                                  \
        if (e != cudaSuccess) {                                                                                  \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e));                                           \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)

// The bound: a warp per row, the row's CHUNKS 16-byte loads per lane issued before any use.
template <int CHUNKS> __global__ void bare_gemv(const unsigned short *W, const float *x, float *y, int rows) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const uint4 *w = (const uint4 *)(W + (size_t)row * CHUNKS * 256);
    uint4 v[CHUNKS];
#pragma unroll
    for (int u = 0; u < CHUNKS; u++) v[u] = w[lane + u * 32];
    float s = 0.0f;
#pragma unroll
    for (int u = 0; u < CHUNKS; u++) {
        float wv[8];
        unpack8(v[u], EB_DTYPE_BF16, wv);
        const float4 *x4 = (const float4 *)(x + (lane + u * 32) * 8);
        s = dot8_add(s, wv, x4[0], x4[1]);
    }
    for (int o = 16; o > 0; o /= 2) s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) y[row] = s;
}

struct shape {
    const char *name;
    int rows, cols, norm;
};

int main() {
    const shape shapes[] = {{"q+k+v 5120x2048, norm fused", 5120, 2048, 1}, {"q+k+v 5120x2048", 5120, 2048, 0},
                            {"o 2048x4096", 2048, 4096, 0}, {"lm_head 32000x2048, norm fused", 32000, 2048, 1},
                            {"router 128x2048", 128, 2048, 0}};
    const int copies = 12, reps = 50;
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    float *x, *y, *xn, *nw;
    CHECK(cudaMalloc(&x, 4096 * 4));
    CHECK(cudaMalloc(&xn, 4096 * 4));
    CHECK(cudaMalloc(&nw, 4096 * 4));
    CHECK(cudaMalloc(&y, 32000 * 4));
    std::vector<float> ones(4096, 0.5f);
    CHECK(cudaMemcpy(x, ones.data(), 4096 * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(nw, ones.data(), 4096 * 4, cudaMemcpyHostToDevice));
    // one product of the shape: weights wp, x xin (normalised by nw into xn first when the shape fuses a norm)
    auto batch = [&](const shape &s, const unsigned short *wp, const float *xin) {
        mm_batch m;
        memset(&m, 0, sizeof m);
        m.count = 1;
        m.t[0] = {wp, xin, y, EB_DTYPE_BF16, s.rows, s.cols, 1};
        for (int i = 1; i < 5; i++) m.start[i] = s.rows;
        if (s.norm) m.nx = xin, m.nw = nw, m.nxn = xn, m.eps = 1e-6f, m.norm_n = 1, m.norm_dim = s.cols;
        return m;
    };
    for (const shape &s : shapes) {
        size_t bytes = (size_t)s.rows * s.cols * 2;
        int n = (int)((300u << 20) / bytes) + 1; // beyond the L2 several times
        n = n > copies ? n : copies;
        std::vector<unsigned short *> w(n);
        for (auto &p : w) {
            CHECK(cudaMalloc(&p, bytes));
            CHECK(cudaMemset(p, 0x3c, bytes));
        }
        { // the same bits from both kernels, on random weights and x
            std::vector<unsigned short> hw((size_t)s.rows * s.cols);
            std::vector<float> hx(s.cols);
            unsigned state = 12345u;
            for (auto &v : hw) state = state * 1664525u + 1013904223u, v = (unsigned short)(0x3c00u + (state >> 24) - 128u);
            for (auto &v : hx) state = state * 1664525u + 1013904223u, v = (float)(int)(state >> 16) / 65536.0f - 0.5f;
            CHECK(cudaMemcpy(w[0], hw.data(), bytes, cudaMemcpyHostToDevice));
            float *xr;
            CHECK(cudaMalloc(&xr, s.cols * 4));
            CHECK(cudaMemcpy(xr, hx.data(), s.cols * 4, cudaMemcpyHostToDevice));
            std::vector<float> out[2], outn[2];
            for (int k = 0; k < 2; k++) {
                mm_batch m = batch(s, w[0], xr);
                if (k == 0)
                    matmul_kernel<<<blocks(s.rows, BLOCK / 32), BLOCK>>>(m, 32);
                else
                    matvec16_kernel<<<blocks(s.rows, BLOCK / 32), BLOCK>>>(m, 32);
                out[k].resize(s.rows), outn[k].resize(s.cols);
                CHECK(cudaMemcpy(out[k].data(), y, s.rows * 4, cudaMemcpyDeviceToHost));
                CHECK(cudaMemcpy(outn[k].data(), xn, s.cols * 4, cudaMemcpyDeviceToHost));
            }
            int same = memcmp(out[0].data(), out[1].data(), s.rows * 4) == 0 &&
                       (!s.norm || memcmp(outn[0].data(), outn[1].data(), s.cols * 4) == 0);
            printf("%-32s matvec16_kernel's bits equal matmul_kernel's: %s\n", s.name, same ? "yes" : "NO");
            CHECK(cudaFree(xr));
        }
        for (int variant = 0; variant < 3; variant++) {
            if (variant == 2 && (s.norm || (s.cols != 2048 && s.cols != 4096))) continue;
            int threads = BLOCK;
            for (int pass = 0; pass < 2; pass++) { // the first pass warms up
                CHECK(cudaEventRecord(a));
                for (int r = 0; r < reps; r++) {
                    const unsigned short *wp = w[r % n];
                    if (variant < 2) {
                        mm_batch m = batch(s, wp, x);
                        if (variant == 0)
                            matmul_kernel<<<blocks(s.rows, threads / 32), threads>>>(m, 32);
                        else
                            matvec16_kernel<<<blocks(s.rows, threads / 32), threads>>>(m, 32);
                    } else if (s.cols == 2048) {
                        bare_gemv<8><<<blocks(s.rows, 8), 256>>>(wp, x, y, s.rows);
                    } else {
                        bare_gemv<16><<<blocks(s.rows, 8), 256>>>(wp, x, y, s.rows);
                    }
                }
                CHECK(cudaEventRecord(b));
                CHECK(cudaEventSynchronize(b));
                float ms = 0;
                CHECK(cudaEventElapsedTime(&ms, a, b));
                if (pass)
                    printf("%-32s %-28s %8.2f us %8.0f GB/s\n", s.name,
                           variant == 0 ? "matmul_kernel (tile of 4)" : variant == 1 ? "matvec16_kernel"
                                                                                       : "bare warp per row",
                           1e3 * ms / reps, bytes * reps / (ms * 1e-3) / 1e9);
            }
            CHECK(cudaGetLastError());
        }
        for (auto p : w) CHECK(cudaFree(p));
    }
    return 0;
}
