// The cuda and hip runtime modules, from one source.
//
// Built with nvcc as "cuda" and with hipcc (-DEB_GPU_HIP) as "hip". Devices own their memory; each has one
// non-blocking stream on which copies and expert batches are queued in order, and a pair of events that time
// the work queued since the last synchronize (busy time). Staging memory is pinned (cudaMallocHost).
// Only the expert FFN runs here: attention, router and norms stay on the (CPU) primary device.
#include <pthread.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifdef EB_GPU_HIP
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#define RUNTIME_NAME "hip"
#define API "HIP"
#define gpuError_t hipError_t
#define gpuSuccess hipSuccess
#define gpuGetErrorString hipGetErrorString
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuSetDevice hipSetDevice
#define gpuDeviceProp hipDeviceProp_t
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuMemGetInfo hipMemGetInfo
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMallocHost hipHostMalloc
#define gpuFreeHost hipHostFree
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuStream_t hipStream_t
#define gpuStreamCreateWithFlags hipStreamCreateWithFlags
#define gpuStreamNonBlocking hipStreamNonBlocking
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuStreamDestroy hipStreamDestroy
#define gpuEvent_t hipEvent_t
#define gpuEventCreate hipEventCreate
#define gpuEventRecord hipEventRecord
#define gpuEventElapsedTime hipEventElapsedTime
#define gpuEventDestroy hipEventDestroy
#define gpuEventSynchronize hipEventSynchronize
#define gpuGetLastError hipGetLastError
#define SHFL_DOWN(v, o) __shfl_down((v), (o))
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define RUNTIME_NAME "cuda"
#define API "CUDA"
#define gpuError_t cudaError_t
#define gpuSuccess cudaSuccess
#define gpuGetErrorString cudaGetErrorString
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuSetDevice cudaSetDevice
#define gpuDeviceProp cudaDeviceProp
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuMemGetInfo cudaMemGetInfo
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMallocHost cudaMallocHost
#define gpuFreeHost cudaFreeHost
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuStream_t cudaStream_t
#define gpuStreamCreateWithFlags cudaStreamCreateWithFlags
#define gpuStreamNonBlocking cudaStreamNonBlocking
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuStreamDestroy cudaStreamDestroy
#define gpuEvent_t cudaEvent_t
#define gpuEventCreate cudaEventCreate
#define gpuEventRecord cudaEventRecord
#define gpuEventElapsedTime cudaEventElapsedTime
#define gpuEventDestroy cudaEventDestroy
#define gpuEventSynchronize cudaEventSynchronize
#define gpuGetLastError cudaGetLastError
#define SHFL_DOWN(v, o) __shfl_down_sync(0xffffffffu, (v), (o))
#endif

extern "C" {
#include "eb_convert.h"
#include "eb_runtime.h"
}

#define BLOCK 256

// One expert of a grouped launch: its weights and its pairs [p0, p0 + m).
struct gpu_expert_slot {
    const void *gate, *up, *down;
    int dtype, p0, m;
};

struct gpu_device {
    pthread_mutex_t lock; // one driver at a time: the expert table, the timing events and busy_ns are per device
    gpuStream_t stream;
    gpuEvent_t start, stop;
    // The expert table of grouped launches: written on the host (pinned), copied on the stream. slots_copied
    // marks when the last copy has read the host table, before it is written again.
    gpu_expert_slot *slots_host, *slots_dev;
    int slots_capacity;
    gpuEvent_t slots_copied;
    int slots_pending;
    int timing; // events recorded since the last synchronize
    int warp;
    unsigned long long busy_ns;
    char name[EB_MAX_NAME];
};

struct gpu_runtime {
    int n_devices;
    gpu_device *devices;
};


#define GPU_TRY(call, what)                                                                                      \
    do {                                                                                                         \
        gpuError_t e_ = (call);                                                                                  \
        if (e_ != gpuSuccess)                                                                                    \
            return eb_rt_fail(err, errlen, EB_ERR_DEVICE, API " %s: %s (error %d)", what, gpuGetErrorString(e_), (int)e_); \
    } while (0)

// ---- kernels -------------------------------------------------------------------------------------------

__device__ __forceinline__ float load_w(const void *w, int dtype, long long i) {
    if (dtype == EB_DTYPE_BF16) {
        unsigned short h = ((const unsigned short *)w)[i];
        return __uint_as_float((unsigned int)h << 16);
    }
    if (dtype == EB_DTYPE_F16) return __half2float(((const __half *)w)[i]);
    return ((const float *)w)[i];
}

// The dot product of weight row `row` (cols long) with x, reduced over one warp; lane 0 holds the result.
__device__ __forceinline__ float warp_dot(const void *w, int dtype, long long row, int cols, const float *x, int lane,
                                          int warp) {
    float s = 0.0f;
    long long base = row * (long long)cols;
    if (dtype != EB_DTYPE_F32 && (cols % 8) == 0) {
        // 8 x 16-bit weights per 16-byte load
        const uint4 *w4 = (const uint4 *)((const unsigned short *)w + base);
        for (int c = lane; c < cols / 8; c += warp) {
            uint4 v = w4[c];
            unsigned int parts[4] = {v.x, v.y, v.z, v.w};
            const float *xc = x + c * 8;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float lo, hi;
                if (dtype == EB_DTYPE_BF16) {
                    lo = __uint_as_float(parts[k] << 16);
                    hi = __uint_as_float(parts[k] & 0xffff0000u);
                } else {
                    lo = __half2float(__ushort_as_half((unsigned short)(parts[k] & 0xffffu)));
                    hi = __half2float(__ushort_as_half((unsigned short)(parts[k] >> 16)));
                }
                s += lo * xc[2 * k] + hi * xc[2 * k + 1];
            }
        }
    } else {
        for (int c = lane; c < cols; c += warp) s += load_w(w, dtype, base + c) * x[c];
    }
    for (int o = warp / 2; o > 0; o /= 2) s += SHFL_DOWN(s, o);
    return s;
}

// h[p][i] = silu(gate_i . x[tok(p)]) * (up_i . x[tok(p)]) for the m pairs of one expert; one warp per row i.
__global__ void gate_up_kernel(const void *gate, const void *up, int dtype, int hidden, int inter, const float *x,
                               const int *pair_token, int p0, int m, float *h, int warp) {
    int lane = threadIdx.x % warp;
    int i = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    if (i >= inter) return;
    for (int p = 0; p < m; p++) {
        const float *xr = x + (long long)pair_token[p0 + p] * hidden;
        float g = warp_dot(gate, dtype, i, hidden, xr, lane, warp);
        float u = warp_dot(up, dtype, i, hidden, xr, lane, warp);
        if (lane == 0) h[(long long)p * inter + i] = g / (1.0f + expf(-g)) * u;
    }
}

// reference: y[p0 + p][j] = down_j . h[p];  owner_local: y[tok(p)][j] += w(p) * (down_j . h[p]).
__global__ void down_kernel(const void *down, int dtype, int hidden, int inter, const float *h, const int *pair_token,
                            const float *pair_weight, int p0, int m, float *y, int owner_local, int warp) {
    int lane = threadIdx.x % warp;
    int j = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    if (j >= hidden) return;
    for (int p = 0; p < m; p++) {
        float v = warp_dot(down, dtype, j, inter, h + (long long)p * inter, lane, warp);
        if (lane != 0) continue;
        if (owner_local) y[(long long)pair_token[p0 + p] * hidden + j] += pair_weight[p0 + p] * v;
        else y[(long long)(p0 + p) * hidden + j] = v;
    }
}

// The same products for every expert of a batch in one launch each (grid.y = expert): reference mode, where every
// pair writes its own row, so experts never write the same memory.
__global__ void gate_up_grouped(const gpu_expert_slot *slots, int hidden, int inter, const float *x,
                                const int *pair_token, float *h, int warp) {
    const gpu_expert_slot s = slots[blockIdx.y];
    int lane = threadIdx.x % warp;
    int i = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    if (i >= inter) return;
    for (int p = 0; p < s.m; p++) {
        const float *xr = x + (long long)pair_token[s.p0 + p] * hidden;
        float g = warp_dot(s.gate, s.dtype, i, hidden, xr, lane, warp);
        float u = warp_dot(s.up, s.dtype, i, hidden, xr, lane, warp);
        if (lane == 0) h[(long long)(s.p0 + p) * inter + i] = g / (1.0f + expf(-g)) * u;
    }
}

__global__ void down_grouped(const gpu_expert_slot *slots, int hidden, int inter, const float *h, float *y, int warp) {
    const gpu_expert_slot s = slots[blockIdx.y];
    int lane = threadIdx.x % warp;
    int j = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    if (j >= hidden) return;
    for (int p = 0; p < s.m; p++) {
        float v = warp_dot(s.down, s.dtype, j, inter, h + (long long)(s.p0 + p) * inter, lane, warp);
        if (lane == 0) y[(long long)(s.p0 + p) * hidden + j] = v;
    }
}

__global__ void zero_kernel(float *y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = 0.0f;
}

// ---- the table's functions ----------------------------------------------------------------------------

static gpu_device *get_dev(gpu_runtime *rt, int dev, char *err, size_t errlen) {
    if (dev < 0 || dev >= rt->n_devices) {
        eb_rt_fail(err, errlen, EB_ERR_RANGE, RUNTIME_NAME " runtime: no device %d (it has %d)", dev, rt->n_devices);
        return NULL;
    }
    return &rt->devices[dev];
}

static void gpu_shutdown(void *rtp) {
    gpu_runtime *rt = (gpu_runtime *)rtp;
    if (!rt) return;
    // Errors here have nowhere to go: the runtime is going away either way.
    for (int i = 0; i < rt->n_devices; i++) {
        gpu_device *d = &rt->devices[i];
        (void)gpuSetDevice(i);
        if (d->stream) (void)gpuStreamSynchronize(d->stream);
        if (d->slots_host) (void)gpuFreeHost(d->slots_host);
        if (d->slots_dev) (void)gpuFree(d->slots_dev);
        if (d->slots_copied) (void)gpuEventDestroy(d->slots_copied);
        if (d->start) (void)gpuEventDestroy(d->start);
        if (d->stop) (void)gpuEventDestroy(d->stop);
        if (d->stream) (void)gpuStreamDestroy(d->stream);
        pthread_mutex_destroy(&d->lock);
    }
    free(rt->devices);
    free(rt);
}

static int gpu_init(const eb_runtime_options *opt, void **out, char *err, size_t errlen) {
    (void)opt;
    *out = NULL;
    int count = 0;
    gpuError_t e = gpuGetDeviceCount(&count);
    if (e != gpuSuccess)
        return eb_rt_fail(err, errlen, EB_ERR_DEVICE, "no device: " API " reports %s (error %d)", gpuGetErrorString(e),
                    (int)e);
    if (count <= 0) return eb_rt_fail(err, errlen, EB_ERR_DEVICE, "no device: " API " reports 0 devices");
    gpu_runtime *rt = (gpu_runtime *)calloc(1, sizeof *rt);
    if (!rt) return eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory");
    rt->devices = (gpu_device *)calloc((size_t)count, sizeof *rt->devices);
    if (!rt->devices) {
        free(rt);
        return eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory");
    }
    for (int i = 0; i < count; i++) {
        gpu_device *d = &rt->devices[i];
        pthread_mutex_init(&d->lock, NULL);
        gpuDeviceProp prop;
        if ((e = gpuSetDevice(i)) != gpuSuccess || (e = gpuGetDeviceProperties(&prop, i)) != gpuSuccess ||
            (e = gpuStreamCreateWithFlags(&d->stream, gpuStreamNonBlocking)) != gpuSuccess ||
            (e = gpuEventCreate(&d->start)) != gpuSuccess || (e = gpuEventCreate(&d->stop)) != gpuSuccess ||
            (e = gpuEventCreate(&d->slots_copied)) != gpuSuccess) {
            rt->n_devices = i + 1; // shutdown releases what device i did create
            gpu_shutdown(rt);
            return eb_rt_fail(err, errlen, EB_ERR_DEVICE, API " device %d: %s (error %d)", i, gpuGetErrorString(e), (int)e);
        }
        d->warp = prop.warpSize > 0 ? prop.warpSize : 32;
        snprintf(d->name, sizeof d->name, "%.60s", prop.name);
        rt->n_devices = i + 1;
    }
    *out = rt;
    return 0;
}

static const char *gpu_kernel_variant(void *rtp) {
    (void)rtp;
    return RUNTIME_NAME " warp-per-row";
}

static int gpu_device_count(void *rtp) { return ((gpu_runtime *)rtp)->n_devices; }

static int gpu_device_info(void *rtp, int dev, eb_rt_device_info *info, char *err, size_t errlen) {
    gpu_device *d = get_dev((gpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    memset(info, 0, sizeof *info);
    size_t free_b = 0, total_b = 0;
    GPU_TRY(gpuSetDevice(dev), "set device");
    GPU_TRY(gpuMemGetInfo(&free_b, &total_b), "memory info");
    snprintf(info->name, sizeof info->name, "%s", d->name);
    snprintf(info->kind, sizeof info->kind, "gpu");
    info->memory_total = total_b;
    info->memory_free = free_b;
    info->threads = 0;
    info->host_addressable = 0;
    return 0;
}

static int gpu_mem_alloc(void *rtp, int dev, size_t bytes, void **ptr, char *err, size_t errlen) {
    *ptr = NULL;
    if (!get_dev((gpu_runtime *)rtp, dev, err, errlen)) return EB_ERR_RANGE;
    GPU_TRY(gpuSetDevice(dev), "set device");
    gpuError_t e = gpuMalloc(ptr, bytes ? bytes : 1);
    if (e != gpuSuccess) {
        (void)gpuGetLastError();
        *ptr = NULL;
        return eb_rt_fail(err, errlen, EB_ERR_MEMORY, API " could not allocate %zu bytes on device %d: %s", bytes, dev,
                    gpuGetErrorString(e));
    }
    return 0;
}

static void gpu_mem_free(void *rtp, int dev, void *ptr) {
    (void)rtp;
    if (!ptr) return;
    (void)gpuSetDevice(dev);
    (void)gpuFree(ptr);
}

static int gpu_host_alloc(void *rtp, size_t bytes, void **ptr, char *err, size_t errlen) {
    (void)rtp;
    GPU_TRY(gpuMallocHost(ptr, bytes ? bytes : 1), "pinned host allocation");
    return 0;
}

static void gpu_host_free(void *rtp, void *ptr) {
    (void)rtp;
    if (ptr) (void)gpuFreeHost(ptr);
}

static int copy(void *rtp, int dev, void *dst, const void *src, size_t bytes, int async, int to_device, char *err,
                size_t errlen) {
    gpu_device *d = get_dev((gpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    if (!bytes) return 0;
    GPU_TRY(gpuSetDevice(dev), "set device");
    GPU_TRY(gpuMemcpyAsync(dst, src, bytes, to_device ? gpuMemcpyHostToDevice : gpuMemcpyDeviceToHost, d->stream),
            "copy");
    if (!async) GPU_TRY(gpuStreamSynchronize(d->stream), "synchronize");
    return 0;
}

static int gpu_copy_to_device(void *rtp, int dev, void *dst, const void *src, size_t bytes, int async, char *err,
                              size_t errlen) {
    return copy(rtp, dev, dst, src, bytes, async, 1, err, errlen);
}

static int gpu_copy_to_host(void *rtp, int dev, void *dst, const void *src, size_t bytes, int async, char *err,
                            size_t errlen) {
    return copy(rtp, dev, dst, src, bytes, async, 0, err, errlen);
}

static int synchronize_locked(void *rtp, int dev, char *err, size_t errlen) {
    gpu_device *d = get_dev((gpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    GPU_TRY(gpuSetDevice(dev), "set device");
    GPU_TRY(gpuStreamSynchronize(d->stream), "synchronize");
    if (d->timing) {
        float ms = 0.0f;
        if (gpuEventElapsedTime(&ms, d->start, d->stop) == gpuSuccess) d->busy_ns += (unsigned long long)(ms * 1e6f);
        d->timing = 0;
    }
    return 0;
}

static int gpu_matmul(void *rtp, int dev, const void *w, int dtype, int64_t rows, int64_t cols, const float *x,
                      int64_t n, float *y, char *err, size_t errlen) {
    (void)rtp, (void)w, (void)dtype, (void)rows, (void)cols, (void)x, (void)n, (void)y;
    return eb_rt_fail(err, errlen, EB_ERR_UNSUPPORTED,
                RUNTIME_NAME ":%d cannot be the primary device (attention and the router run on a CPU device)", dev);
}

static int gpu_matmul_multi(void *rtp, int dev, const eb_rt_matmul *tasks, int n_tasks, char *err, size_t errlen) {
    (void)rtp, (void)tasks, (void)n_tasks;
    return eb_rt_fail(err, errlen, EB_ERR_UNSUPPORTED,
                RUNTIME_NAME ":%d cannot be the primary device (attention and the router run on a CPU device)", dev);
}

static int expert_ffn_locked(void *rtp, int dev, const eb_rt_expert_batch *b, int async, char *err, size_t errlen) {
    gpu_device *d = get_dev((gpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    if (b->scratch_bytes < eb_rt_expert_scratch_bytes(b->n_pairs, b->hidden, b->inter))
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT, RUNTIME_NAME " runtime: expert scratch of %zu bytes is too small",
                    b->scratch_bytes);
    GPU_TRY(gpuSetDevice(dev), "set device");
    if (!d->timing) GPU_TRY(gpuEventRecord(d->start, d->stream), "event");
    float *h = (float *)b->scratch;
    int owner_local = b->mode == EB_REDUCE_OWNER_LOCAL;
    int rows_per_block = BLOCK / d->warp;
    for (int i = 0; i < b->n_experts; i++)
        if (eb_dtype_size(b->experts[i].dtype) == 0)
            return eb_rt_fail(err, errlen, EB_ERR_UNSUPPORTED, RUNTIME_NAME " runtime: unknown weight dtype %d",
                        b->experts[i].dtype);
    if (!owner_local && b->n_experts > 0) {
        // reference mode: two launches for the whole batch
        if (d->slots_pending) GPU_TRY(gpuEventSynchronize(d->slots_copied), "event");
        d->slots_pending = 0;
        if (b->n_experts > d->slots_capacity) {
            int cap = b->n_experts < 64 ? 64 : b->n_experts;
            (void)gpuFreeHost(d->slots_host);
            (void)gpuFree(d->slots_dev);
            d->slots_host = NULL;
            d->slots_dev = NULL;
            d->slots_capacity = 0;
            GPU_TRY(gpuMallocHost((void **)&d->slots_host, cap * sizeof(gpu_expert_slot)), "pinned expert table");
            GPU_TRY(gpuMalloc((void **)&d->slots_dev, cap * sizeof(gpu_expert_slot)), "device expert table");
            d->slots_capacity = cap;
        }
        for (int i = 0; i < b->n_experts; i++) {
            const eb_rt_expert *e = &b->experts[i];
            d->slots_host[i] = {e->gate, e->up, e->down, e->dtype, b->pair_start[i],
                                b->pair_start[i + 1] - b->pair_start[i]};
        }
        GPU_TRY(gpuMemcpyAsync(d->slots_dev, d->slots_host, b->n_experts * sizeof(gpu_expert_slot),
                               gpuMemcpyHostToDevice, d->stream),
                "copy expert table");
        GPU_TRY(gpuEventRecord(d->slots_copied, d->stream), "event");
        d->slots_pending = 1;
        dim3 gu((b->inter + rows_per_block - 1) / rows_per_block, b->n_experts);
        dim3 dn((b->hidden + rows_per_block - 1) / rows_per_block, b->n_experts);
        gate_up_grouped<<<gu, BLOCK, 0, d->stream>>>(d->slots_dev, b->hidden, b->inter, b->x, b->pair_token, h,
                                                     d->warp);
        down_grouped<<<dn, BLOCK, 0, d->stream>>>(d->slots_dev, b->hidden, b->inter, h, b->y, d->warp);
        GPU_TRY(gpuGetLastError(), "kernel launch");
        GPU_TRY(gpuEventRecord(d->stop, d->stream), "event");
        d->timing = 1;
        if (!async) return synchronize_locked(rtp, dev, err, errlen);
        return 0;
    }
    if (owner_local) {
        long long n = (long long)b->n_tokens * b->hidden;
        zero_kernel<<<(unsigned)((n + BLOCK - 1) / BLOCK), BLOCK, 0, d->stream>>>(b->y, n);
    }
    for (int i = 0; i < b->n_experts; i++) {
        int p0 = b->pair_start[i], m = b->pair_start[i + 1] - p0;
        if (m <= 0) continue;
        const eb_rt_expert *e = &b->experts[i];
        gate_up_kernel<<<(b->inter + rows_per_block - 1) / rows_per_block, BLOCK, 0, d->stream>>>(
            e->gate, e->up, e->dtype, b->hidden, b->inter, b->x, b->pair_token, p0, m, h, d->warp);
        down_kernel<<<(b->hidden + rows_per_block - 1) / rows_per_block, BLOCK, 0, d->stream>>>(
            e->down, e->dtype, b->hidden, b->inter, h, b->pair_token, b->pair_weight, p0, m, b->y, owner_local,
            d->warp);
    }
    GPU_TRY(gpuGetLastError(), "kernel launch");
    GPU_TRY(gpuEventRecord(d->stop, d->stream), "event");
    d->timing = 1;
    if (!async) return synchronize_locked(rtp, dev, err, errlen);
    return 0;
}

static int gpu_synchronize(void *rtp, int dev, char *err, size_t errlen) {
    gpu_device *d = get_dev((gpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    pthread_mutex_lock(&d->lock);
    int st = synchronize_locked(rtp, dev, err, errlen);
    pthread_mutex_unlock(&d->lock);
    return st;
}

static int gpu_expert_ffn(void *rtp, int dev, const eb_rt_expert_batch *b, int async, char *err, size_t errlen) {
    gpu_device *d = get_dev((gpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    pthread_mutex_lock(&d->lock);
    int st = expert_ffn_locked(rtp, dev, b, async, err, errlen);
    pthread_mutex_unlock(&d->lock);
    return st;
}

static int gpu_parallel_for(void *rtp, int dev, void (*fn)(void *, int64_t, int64_t), void *arg, int64_t n,
                            int64_t chunk) {
    (void)rtp, (void)dev, (void)fn, (void)arg, (void)n, (void)chunk;
    return EB_ERR_UNSUPPORTED;
}

static uint64_t gpu_busy_ns(void *rtp, int dev) {
    gpu_runtime *rt = (gpu_runtime *)rtp;
    return dev >= 0 && dev < rt->n_devices ? rt->devices[dev].busy_ns : 0;
}

static eb_runtime_table make_table(void) {
    eb_runtime_table t;
    memset(&t, 0, sizeof t);
    t.abi_version = EB_RUNTIME_ABI_VERSION;
    t.table_size = sizeof(eb_runtime_table);
    t.name = RUNTIME_NAME;
    t.init = gpu_init;
    t.shutdown = gpu_shutdown;
    t.kernel_variant = gpu_kernel_variant;
    t.device_count = gpu_device_count;
    t.device_info = gpu_device_info;
    t.mem_alloc = gpu_mem_alloc;
    t.mem_free = gpu_mem_free;
    t.host_alloc = gpu_host_alloc;
    t.host_free = gpu_host_free;
    t.copy_to_device = gpu_copy_to_device;
    t.copy_to_host = gpu_copy_to_host;
    t.synchronize = gpu_synchronize;
    t.matmul = gpu_matmul;
    t.matmul_multi = gpu_matmul_multi;
    t.expert_ffn = gpu_expert_ffn;
    t.parallel_for = gpu_parallel_for;
    t.busy_ns = gpu_busy_ns;
    return t;
}

static const eb_runtime_table gpu_table = make_table();

extern "C" EB_EXPORT const eb_runtime_table *eb_runtime_module(void) { return &gpu_table; }
