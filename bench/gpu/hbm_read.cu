// The GPU's memory read ceiling: a float4 read-and-reduce over 4 GiB (far beyond the caches), timed with
// events, best of 20 runs after a warm-up. Prints one line: "hbm_read_gbs <GB/s>".
//   nvcc -O3 -o /tmp/hbm_read bench/gpu/hbm_read.cu && /tmp/hbm_read
#include <cstdio>
#include <cuda_runtime.h>

#define TRY(call)                                                                                                \
    do {                                                                                                         \
        cudaError_t e = (call);                                                                                  \
        if (e != cudaSuccess) {                                                                                  \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e));                                           \
            return 1;                                                                                            \
        }                                                                                                        \
    } while (0)

__global__ void fill(float4 *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = make_float4(1.0f, (float)(i & 7), 0.5f, -1.0f);
}

__global__ void read_sum(const float4 *p, size_t n, float *out) {
    float s = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = p[i];
        s += v.x + v.y + v.z + v.w;
    }
    if (s == 12345.0f) *out = s; // never true: keeps the loads
}

int main() {
    size_t bytes = (size_t)4 << 30, n = bytes / sizeof(float4);
    float4 *p;
    float *out;
    TRY(cudaMalloc(&p, bytes));
    TRY(cudaMalloc(&out, sizeof(float)));
    int sms = 0;
    TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    fill<<<sms * 8, 512>>>(p, n);
    TRY(cudaGetLastError());
    cudaEvent_t a, b;
    TRY(cudaEventCreate(&a));
    TRY(cudaEventCreate(&b));
    float best = 1e30f;
    for (int r = 0; r < 21; r++) {
        TRY(cudaEventRecord(a));
        read_sum<<<sms * 8, 512>>>(p, n, out);
        TRY(cudaEventRecord(b));
        TRY(cudaEventSynchronize(b));
        TRY(cudaGetLastError());
        float ms;
        TRY(cudaEventElapsedTime(&ms, a, b));
        if (r > 0 && ms < best) best = ms;
    }
    printf("hbm_read_gbs %.0f\n", bytes / (best * 1e-3) / 1e9);
    return 0;
}
