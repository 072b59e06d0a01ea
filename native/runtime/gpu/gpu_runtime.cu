// The cuda and hip runtime modules, from one source.
//
// Built with nvcc as "cuda" and with hipcc (-DEB_GPU_HIP) as "hip". Devices own their memory; each has one
// non-blocking stream on which copies and expert batches are queued in order, and a pair of events that time
// the work queued since the last synchronize (busy time). Staging memory is pinned (cudaMallocHost).
// Completion events are the runtime's, timed against a reference event whose host time is known (event_time).
// A device can also be the primary: the whole forward pass (eb_rt_forward_ops) then runs here, and a one-token
// step can be recorded into a graph and replayed (eb_rt_graph_ops).
//
// One translation unit in parts: this file (devices, memory, copies, events, the expert batches, the operations'
// launches and the table) includes gpu_platform.h (the CUDA or HIP names), gpu_formats.cuh (reading the quantized
// formats on the device), gpu_forward.cuh (the primary's kernels), gpu_mla.cuh (the "mla" extension's) and
// gpu_q8.cuh (the q8 precision's kernels).
#include <pthread.h>
#include <time.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gpu_platform.h"

extern "C" {
#include "eb_formats.h"
#include "eb_q8.h"
#include "eb_runtime.h"
}

#define BLOCK 256
#define DOT_TILE 4 // rows of x one pass over a weight row serves

// One expert of a grouped launch: its weights, its biases (NULL: none) and its pairs [p0, p0 + m).
struct gpu_expert_slot {
    const void *gate, *up, *down;
    const float *bias;
    int gate_dtype, up_dtype, down_dtype, p0, m;
};

struct gpu_device {
    // One driver at a time: the expert table, the timing events, the event clock and busy_ns are per device.
    // Recursive: a recording (graphs->begin .. end) holds it, so other threads wait instead of being recorded.
    pthread_mutex_t lock;
    int capturing;
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
    int q8_smem; // bytes of shared memory a block of the q8 kernels may have (their quantized rows of x)
    int sms;
    // route_kernel's arrivals per row when a row's experts are spread over blocks (the last block to arrive makes
    // the choice and sets its count back to 0): DOT_TILE counters, zero between launches.
    unsigned int *route_arrivals;
    unsigned long long busy_ns;
    // The event clock: clock_ref, recorded on clock_stream (which nothing else uses, so it is reached at once),
    // was reached at host time clock_host_ns (CLOCK_MONOTONIC); valid once clock_ready. clock_try: a calibration's
    // other round.
    gpuStream_t clock_stream;
    gpuEvent_t clock_ref, clock_try;
    unsigned long long clock_host_ns;
    int clock_ready;
    char name[EB_MAX_NAME];
    // Under a memory limit: the bytes of each live allocation of mem_alloc (what mem_free gives back) and their sum.
    // Guarded by lock.
    struct gpu_alloc *allocs;
    int n_allocs, allocs_capacity;
    unsigned long long allocated;
};

// One allocation of mem_alloc, kept while a memory limit is set.
struct gpu_alloc {
    void *ptr;
    size_t bytes;
};

struct gpu_runtime {
    int n_devices;
    gpu_device *devices;
    // eb_runtime_options.memory_limit: the bytes mem_alloc may hand out per device (0: what the card has). A card
    // lent whole can then stand in for a smaller one (a 24 GiB card on an H100), and a staging that does not fit is
    // the error it is on that card. The module's own small tables (the expert table, the router's counters) are
    // outside it.
    unsigned long long memory_limit;
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

// Eight 16-bit weights (bf16 or f16) of one 16-byte load as floats.
__device__ __forceinline__ void unpack8(uint4 v, int dtype, float *wv) {
    unsigned int parts[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (dtype == EB_DTYPE_BF16) {
            wv[2 * k] = __uint_as_float(parts[k] << 16);
            wv[2 * k + 1] = __uint_as_float(parts[k] & 0xffff0000u);
        } else {
            wv[2 * k] = __half2float(__ushort_as_half((unsigned short)(parts[k] & 0xffffu)));
            wv[2 * k + 1] = __half2float(__ushort_as_half((unsigned short)(parts[k] >> 16)));
        }
    }
}

#include "gpu_formats.cuh"

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
        if (d->route_arrivals) (void)gpuFree(d->route_arrivals);
        free(d->allocs);
        if (d->slots_copied) (void)gpuEventDestroy(d->slots_copied);
        if (d->start) (void)gpuEventDestroy(d->start);
        if (d->stop) (void)gpuEventDestroy(d->stop);
        if (d->clock_ref) (void)gpuEventDestroy(d->clock_ref);
        if (d->clock_try) (void)gpuEventDestroy(d->clock_try);
        if (d->clock_stream) (void)gpuStreamDestroy(d->clock_stream);
        if (d->stream) (void)gpuStreamDestroy(d->stream);
        pthread_mutex_destroy(&d->lock);
    }
    free(rt->devices);
    free(rt);
}

static int q8_allow_shared(const gpuDeviceProp &prop);

static int gpu_init(const eb_runtime_options *opt, void **out, char *err, size_t errlen) {
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
    rt->memory_limit = opt ? opt->memory_limit : 0;
    for (int i = 0; i < count; i++) {
        gpu_device *d = &rt->devices[i];
        pthread_mutexattr_t attr;
        pthread_mutexattr_init(&attr);
        pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
        pthread_mutex_init(&d->lock, &attr);
        pthread_mutexattr_destroy(&attr);
        gpuDeviceProp prop;
        if ((e = gpuSetDevice(i)) != gpuSuccess || (e = gpuGetDeviceProperties(&prop, i)) != gpuSuccess ||
            (e = gpuStreamCreateWithFlags(&d->stream, gpuStreamNonBlocking)) != gpuSuccess ||
            (e = gpuEventCreate(&d->start)) != gpuSuccess || (e = gpuEventCreate(&d->stop)) != gpuSuccess ||
            (e = gpuEventCreate(&d->slots_copied)) != gpuSuccess ||
            (e = gpuStreamCreateWithFlags(&d->clock_stream, gpuStreamNonBlocking)) != gpuSuccess ||
            (e = gpuEventCreate(&d->clock_ref)) != gpuSuccess || (e = gpuEventCreate(&d->clock_try)) != gpuSuccess ||
            (e = gpuMalloc((void **)&d->route_arrivals, DOT_TILE * sizeof(unsigned int))) != gpuSuccess ||
            (e = gpuMemset(d->route_arrivals, 0, DOT_TILE * sizeof(unsigned int))) != gpuSuccess) {
            rt->n_devices = i + 1; // shutdown releases what device i did create
            gpu_shutdown(rt);
            return eb_rt_fail(err, errlen, EB_ERR_DEVICE, API " device %d: %s (error %d)", i, gpuGetErrorString(e), (int)e);
        }
        d->warp = prop.warpSize > 0 ? prop.warpSize : 32;
        d->sms = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
        d->q8_smem = q8_allow_shared(prop);
        snprintf(d->name, sizeof d->name, "%.60s", prop.name);
        rt->n_devices = i + 1;
    }
    *out = rt;
    return 0;
}

static const char *gpu_kernel_variant(void *rtp) {
    (void)rtp;
    return RUNTIME_NAME " warp-per-row" PLATFORM;
}

static int gpu_device_count(void *rtp) { return ((gpu_runtime *)rtp)->n_devices; }

static uint32_t gpu_q8_formats(void); // after gpu_q8.cuh, which says which formats have q8 products

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
    unsigned long long limit = ((gpu_runtime *)rtp)->memory_limit;
    if (limit) {
        pthread_mutex_lock(&d->lock);
        unsigned long long left = d->allocated < limit ? limit - d->allocated : 0;
        pthread_mutex_unlock(&d->lock);
        if (limit < info->memory_total) info->memory_total = limit;
        if (left < info->memory_free) info->memory_free = left;
    }
    info->threads = 0;
    info->host_addressable = 0;
    info->queued_ops = 1;
    // the formats with kernels here: the float ones and the quantized ones of QUANT_CASES (dequantized in f32, qfmt),
    // the i-quants among them. The other (F8_E4M3_B128, with its scale companion) has none yet, so the core refuses
    // such a weight on this device by name.
    info->formats = GPU_FORMATS;
    info->precisions = 1u << EB_PRECISION_F32 | 1u << EB_PRECISION_Q8; // q8: the cpu module's bits (q8_* kernels)
    // in q8: the formats with q8 kernels (q8_products), and those the table reads with f32 activations in either
    // precision (no q8 block: the float ones, Q5_0, Q5_1); the others are read in f32 only, so the core refuses a
    // q8 step with their weights here
    info->q8_formats = gpu_q8_formats();
    return 0;
}

static int gpu_mem_alloc(void *rtp, int dev, size_t bytes, void **ptr, char *err, size_t errlen) {
    gpu_runtime *rt = (gpu_runtime *)rtp;
    *ptr = NULL;
    gpu_device *d = get_dev(rt, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    GPU_TRY(gpuSetDevice(dev), "set device");
    if (rt->memory_limit) {
        pthread_mutex_lock(&d->lock);
        int st = 0;
        if (bytes > rt->memory_limit || d->allocated > rt->memory_limit - bytes)
            st = eb_rt_fail(err, errlen, EB_ERR_MEMORY,
                            RUNTIME_NAME ":%d: cannot allocate %zu bytes: %llu of the limit %llu in use", dev, bytes,
                            d->allocated, rt->memory_limit);
        if (!st && d->n_allocs == d->allocs_capacity) {
            int cap = d->allocs_capacity ? 2 * d->allocs_capacity : 64;
            gpu_alloc *grown = (gpu_alloc *)realloc(d->allocs, (size_t)cap * sizeof *grown);
            if (grown) d->allocs = grown, d->allocs_capacity = cap;
            else st = eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of host memory");
        }
        if (!st) {
            gpuError_t e = gpuMalloc(ptr, bytes ? bytes : 1);
            if (e == gpuSuccess) {
                d->allocs[d->n_allocs++] = {*ptr, bytes};
                d->allocated += bytes;
            } else {
                (void)gpuGetLastError();
                *ptr = NULL;
                st = eb_rt_fail(err, errlen, EB_ERR_MEMORY, API " could not allocate %zu bytes on device %d: %s", bytes,
                                dev, gpuGetErrorString(e));
            }
        }
        pthread_mutex_unlock(&d->lock);
        return st;
    }
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
    gpu_runtime *rt = (gpu_runtime *)rtp;
    if (!ptr || dev < 0 || dev >= rt->n_devices) return;
    (void)gpuSetDevice(dev);
    (void)gpuFree(ptr);
    if (!rt->memory_limit) return;
    gpu_device *d = &rt->devices[dev];
    pthread_mutex_lock(&d->lock);
    for (int i = d->n_allocs - 1; i >= 0; i--)
        if (d->allocs[i].ptr == ptr) {
            d->allocated -= d->allocs[i].bytes;
            d->allocs[i] = d->allocs[--d->n_allocs];
            break;
        }
    pthread_mutex_unlock(&d->lock);
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

static int synchronize_locked(void *rtp, int dev, char *err, size_t errlen);

static int copy(void *rtp, int dev, void *dst, const void *src, size_t bytes, int async, int to_device, char *err,
                size_t errlen) {
    gpu_device *d = get_dev((gpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    if (!bytes) return 0;
    pthread_mutex_lock(&d->lock); // never into another thread's recording
    gpuError_t e = gpuSetDevice(dev);
    if (e == gpuSuccess)
        e = gpuMemcpyAsync(dst, src, bytes, to_device ? gpuMemcpyHostToDevice : gpuMemcpyDeviceToHost, d->stream);
    int st = 0;
    if (e != gpuSuccess)
        st = eb_rt_fail(err, errlen, EB_ERR_DEVICE, API " copy of %zu bytes: %s (error %d)", bytes, gpuGetErrorString(e),
                        (int)e);
    else if (!async)
        st = synchronize_locked(rtp, dev, err, errlen); // also closes the busy-time interval: idle gaps are not busy
    pthread_mutex_unlock(&d->lock);
    return st;
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

// The batch's expert table into d->slots_dev for the grouped launches: written into pinned host memory once its
// last copy has read it, copied on the stream.
static int upload_slots(gpu_device *d, const eb_rt_expert_batch *b, char *err, size_t errlen) {
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
        d->slots_host[i] = {e->gate, e->up, e->down, e->bias, e->gate_dtype, e->up_dtype, e->down_dtype,
                            b->pair_start[i], b->pair_start[i + 1] - b->pair_start[i]};
    }
    GPU_TRY(gpuMemcpyAsync(d->slots_dev, d->slots_host, b->n_experts * sizeof(gpu_expert_slot), gpuMemcpyHostToDevice,
                           d->stream),
            "copy expert table");
    GPU_TRY(gpuEventRecord(d->slots_copied, d->stream), "event");
    d->slots_pending = 1;
    return 0;
}

static int expert_batch_q8(const eb_rt_expert_batch *b);
static int expert_ffn_q8(gpu_device *d, const eb_rt_expert_batch *b, char *err, size_t errlen);

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
    if (expert_batch_q8(b)) {
        int st = expert_ffn_q8(d, b, err, errlen);
        if (st) return st;
    } else if (!owner_local && b->n_experts > 0) {
        // reference mode: two launches for the whole batch
        int st = upload_slots(d, b, err, errlen);
        if (st) return st;
        dim3 gu((b->inter + rows_per_block - 1) / rows_per_block, b->n_experts);
        dim3 dn((b->hidden + rows_per_block - 1) / rows_per_block, b->n_experts);
        gate_up_grouped<<<gu, BLOCK, 0, d->stream>>>(d->slots_dev, b->act, b->hidden, b->inter, b->x, b->pair_token,
                                                     h, d->warp);
        down_grouped<<<dn, BLOCK, 0, d->stream>>>(d->slots_dev, b->hidden, b->inter, h, b->y, d->warp);
    } else {
        if (owner_local) {
            long long n = (long long)b->n_tokens * b->hidden;
            zero_kernel<<<(unsigned)((n + BLOCK - 1) / BLOCK), BLOCK, 0, d->stream>>>(b->y, n);
        }
        for (int i = 0; i < b->n_experts; i++) {
            int p0 = b->pair_start[i], m = b->pair_start[i + 1] - p0;
            if (m <= 0) continue;
            const eb_rt_expert *e = &b->experts[i];
            gate_up_kernel<<<(b->inter + rows_per_block - 1) / rows_per_block, BLOCK, 0, d->stream>>>(
                e->gate, e->up, e->gate_dtype, e->up_dtype, e->bias, b->act, b->hidden, b->inter, b->x, b->pair_token,
                p0, m, h, d->warp);
            down_kernel<<<(b->hidden + rows_per_block - 1) / rows_per_block, BLOCK, 0, d->stream>>>(
                e->down, e->down_dtype, e->bias, b->hidden, b->inter, h, b->pair_token, b->pair_weight, p0, m, b->y,
                owner_local, d->warp);
        }
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

static uint64_t gpu_busy_ns(void *rtp, int dev) {
    gpu_runtime *rt = (gpu_runtime *)rtp;
    return dev >= 0 && dev < rt->n_devices ? rt->devices[dev].busy_ns : 0;
}

// ---- completion events ---------------------------------------------------------------------------------

// An event of one device, created with timing (event_time measures it from the device's clock reference).
struct gpu_event {
    gpuEvent_t ev;
    int dev;
    int recorded;
};

// Elapsed times come as float milliseconds, whose step is 0.06 us at a second from the reference and doubles with
// each doubling of the span: event_time takes a new reference past a second.
#define CLOCK_SPAN_MS 1000.0f

static unsigned long long host_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

// The device's clock against the host's: a reference is recorded on the idle clock stream, waited for, and the
// host's clock read right after, late by the host's wake-up. That is a few us, but now and then tens (seen on an
// H200), so the best of three rounds is kept: the one with the shortest time from its record to the reading. Not
// on a thread that is recording a graph on the device: a host wait there could break the capture.
static int calibrate_locked(gpu_device *d, int dev, char *err, size_t errlen) {
    if (d->capturing)
        return eb_rt_fail(err, errlen, EB_ERR_STATE,
                          RUNTIME_NAME ":%d: the event clock cannot be calibrated while a graph is recorded on it",
                          dev);
    GPU_TRY(gpuSetDevice(dev), "set device");
    unsigned long long best = 0;
    for (int round = 0; round < 3; round++) {
        unsigned long long before = host_now_ns();
        GPU_TRY(gpuEventRecord(d->clock_try, d->clock_stream), "clock reference event");
        GPU_TRY(gpuEventSynchronize(d->clock_try), "clock reference event");
        unsigned long long after = host_now_ns();
        if (round == 0 || after - before < best) { // the reference and its host time change together
            gpuEvent_t kept = d->clock_ref;
            d->clock_ref = d->clock_try;
            d->clock_try = kept;
            d->clock_host_ns = after;
            best = after - before;
        }
    }
    d->clock_ready = 1;
    return 0;
}

// The device and the event of a call, or a status with its message.
static int event_args(void *rtp, int dev, void *event, gpu_device **d, gpu_event **ev, char *err, size_t errlen) {
    *d = get_dev((gpu_runtime *)rtp, dev, err, errlen);
    if (!*d) return EB_ERR_RANGE;
    *ev = (gpu_event *)event;
    if (!*ev) return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT, RUNTIME_NAME ":%d: no event (NULL)", dev);
    if ((*ev)->dev != dev)
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT, RUNTIME_NAME ":%d: the event belongs to device %d", dev,
                          (*ev)->dev);
    return 0;
}

static int gpu_event_create(void *rtp, int dev, void **event, char *err, size_t errlen) {
    *event = NULL;
    gpu_device *d = get_dev((gpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    gpu_event *ev = (gpu_event *)calloc(1, sizeof *ev);
    if (!ev) return eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory");
    ev->dev = dev;
    pthread_mutex_lock(&d->lock); // the clock is the device's
    int st = 0;
    gpuError_t e = gpuSetDevice(dev);
    if (e == gpuSuccess) e = gpuEventCreate(&ev->ev); // default flags: timing on
    if (e != gpuSuccess) {
        ev->ev = NULL;
        st = eb_rt_fail(err, errlen, EB_ERR_DEVICE, API " create event: %s (error %d)", gpuGetErrorString(e), (int)e);
    } else if (!d->clock_ready && !d->capturing) { // calibrated now, or at the first event_time after a recording
        st = calibrate_locked(d, dev, err, errlen);
    }
    pthread_mutex_unlock(&d->lock);
    if (st) {
        if (ev->ev) (void)gpuEventDestroy(ev->ev);
        free(ev);
        return st;
    }
    *event = ev;
    return 0;
}

static void gpu_event_destroy(void *rtp, int dev, void *event) {
    (void)rtp, (void)dev;
    gpu_event *ev = (gpu_event *)event;
    if (!ev) return;
    // Work still queued before it runs on: the runtime releases the event once it has been reached.
    (void)gpuSetDevice(ev->dev);
    (void)gpuEventDestroy(ev->ev);
    free(ev);
}

static int gpu_event_record(void *rtp, int dev, void *event, char *err, size_t errlen) {
    gpu_device *d;
    gpu_event *ev;
    int st = event_args(rtp, dev, event, &d, &ev, err, errlen);
    if (st) return st;
    pthread_mutex_lock(&d->lock); // never into another thread's recording
    if (d->capturing) { // this thread's recording: the event would become part of the graph, not be reached
        st = eb_rt_fail(err, errlen, EB_ERR_STATE, RUNTIME_NAME ":%d: no event is recorded while a graph is recorded",
                        dev);
    } else {
        gpuError_t e = gpuSetDevice(dev);
        if (e == gpuSuccess) e = gpuEventRecord(ev->ev, d->stream);
        if (e != gpuSuccess) {
            (void)gpuGetLastError(); // reported here, not again by the next launch check
            st = eb_rt_fail(err, errlen, EB_ERR_DEVICE, API " record event: %s (error %d)", gpuGetErrorString(e),
                            (int)e);
        } else {
            ev->recorded = 1;
        }
    }
    pthread_mutex_unlock(&d->lock);
    return st;
}

// An event never recorded counts as reached (as in the runtime), so waiting for it returns at once.
static int gpu_event_wait(void *rtp, int dev, void *event, char *err, size_t errlen) {
    gpu_device *d;
    gpu_event *ev;
    int st = event_args(rtp, dev, event, &d, &ev, err, errlen);
    if (st) return st;
    pthread_mutex_lock(&d->lock); // as synchronize: never during another thread's recording
    if (d->capturing) {
        st = eb_rt_fail(err, errlen, EB_ERR_STATE,
                        RUNTIME_NAME ":%d: no event is waited for while a graph is recorded on the device", dev);
    } else {
        gpuError_t e = gpuSetDevice(dev);
        if (e == gpuSuccess) e = gpuEventSynchronize(ev->ev);
        if (e != gpuSuccess) {
            (void)gpuGetLastError(); // reported here, not again by the next launch check
            st = eb_rt_fail(err, errlen, EB_ERR_DEVICE, API " wait for event: %s (error %d)", gpuGetErrorString(e),
                            (int)e);
        }
    }
    pthread_mutex_unlock(&d->lock);
    return st;
}

// host time of the reference + the device's time from the reference to the event.
static int event_time_locked(gpu_device *d, int dev, gpu_event *ev, uint64_t *ns, char *err, size_t errlen) {
    if (!ev->recorded)
        return eb_rt_fail(err, errlen, EB_ERR_STATE, RUNTIME_NAME ":%d: the event has no time: it was never recorded",
                          dev);
    GPU_TRY(gpuSetDevice(dev), "set device");
    int st = 0;
    if (!d->clock_ready && (st = calibrate_locked(d, dev, err, errlen))) return st;
    float ms = 0.0f;
    gpuError_t e = gpuEventElapsedTime(&ms, d->clock_ref, ev->ev);
    if (e == gpuSuccess && !d->capturing && (ms > CLOCK_SPAN_MS || ms < -CLOCK_SPAN_MS)) {
        if ((st = calibrate_locked(d, dev, err, errlen))) return st;
        e = gpuEventElapsedTime(&ms, d->clock_ref, ev->ev); // negative (the event came first), and small
    }
    if (e != gpuSuccess) {
        (void)gpuGetLastError(); // reported here, not again by the next launch check
        if (e == gpuErrorNotReady)
            return eb_rt_fail(err, errlen, EB_ERR_STATE,
                              RUNTIME_NAME ":%d: the event has not been reached yet (wait for it first)", dev);
        return eb_rt_fail(err, errlen, EB_ERR_DEVICE, API " event time: %s (error %d)", gpuGetErrorString(e), (int)e);
    }
    long long t = (long long)d->clock_host_ns + llrint((double)ms * 1e6);
    *ns = t > 0 ? (uint64_t)t : 0;
    return 0;
}

static int gpu_event_time(void *rtp, int dev, void *event, uint64_t *ns, char *err, size_t errlen) {
    *ns = 0;
    gpu_device *d;
    gpu_event *ev;
    int st = event_args(rtp, dev, event, &d, &ev, err, errlen);
    if (st) return st;
    pthread_mutex_lock(&d->lock); // the clock is the device's
    st = event_time_locked(d, dev, ev, ns, err, errlen);
    pthread_mutex_unlock(&d->lock);
    return st;
}

#include "gpu_forward.cuh"

#include "gpu_mla.cuh"

#include "gpu_q8.cuh"

// The formats this module runs in the q8 precision as the cpu module does (eb_rt_device_info.q8_formats): those
// with q8 products, and those the format table reads with f32 activations in either precision.
static uint32_t gpu_q8_formats(void) {
    uint32_t out = 0;
    for (int dt = 0; dt < EB_DTYPE_COUNT; dt++)
        if ((GPU_FORMATS >> dt & 1u) && (q8_products(dt) || eb_format(dt)->q8_block == 0)) out |= 1u << dt;
    return out;
}

// ---- the q8 precision's launches --------------------------------------------------------------------------

// Rows of x a pass of a q8 kernel quantizes (up to DOT_TILE, as many as a block's shared memory holds for rows of
// cols values in the layouts need) and the bytes of shared memory that takes; an error naming the device and the
// sizes where not even one row fits (the q8 precision refused for that product, never read in f32 instead).
static int q8_plan(gpu_device *d, int cols, int need, int *nt, size_t *bytes, char *err, size_t errlen) {
    for (*nt = DOT_TILE; *nt > 0; (*nt)--)
        if ((*bytes = q8_carve(NULL, *nt, cols, need, NULL)) <= (size_t)d->q8_smem) return 0;
    return eb_rt_fail(err, errlen, EB_ERR_UNSUPPORTED,
                      RUNTIME_NAME " runtime: q8 products of rows of %d values need %zu bytes of shared memory for a "
                                   "row of x quantized, more than the %d bytes a block may have on %s: the q8 "
                                   "precision is refused for them",
                      cols, q8_carve(NULL, 1, cols, need, NULL), d->q8_smem, d->name);
}

// Weight rows per block: a few blocks for every multiprocessor (each block quantizes its rows of x once per pass),
// between 16 and 128 rows. columns: the grid's other dimension.
static int q8_rows_per_block(const gpu_device *d, long long rows, long long columns) {
    long long want = 4LL * d->sms, per = (rows * columns + want - 1) / want;
    per = (per + 15) / 16 * 16;
    return (int)(per < 16 ? 16 : per > 128 ? 128 : per);
}

static int q8_matmul_launch(gpu_device *d, const eb_rt_matmul *t, int accumulate, char *err, size_t errlen) {
    int nt;
    size_t bytes;
    int st = q8_plan(d, (int)t->cols, q8_layout(t->dtype), &nt, &bytes, err, errlen);
    if (st) return st;
    q8_mm a = {t->w, t->x, t->y, t->dtype, (int)t->rows, (int)t->cols, (int)t->n, accumulate,
               q8_rows_per_block(d, t->rows, 1), nt};
    q8_matmul_kernel<<<blocks(t->rows, a.rows_per_block), Q8_THREADS, bytes, d->stream>>>(a);
    return 0;
}

// Whether an expert batch has a q8 product (else it runs as in f32: the same products).
static int expert_batch_q8(const eb_rt_expert_batch *b) {
    int any = 0;
    for (int i = 0; b->precision == EB_PRECISION_Q8 && i < b->n_experts; i++)
        any |= b->pair_start[i + 1] > b->pair_start[i] &&
               (q8_products(b->experts[i].gate_dtype) || q8_products(b->experts[i].up_dtype) ||
                q8_products(b->experts[i].down_dtype));
    return any;
}

// expert_ffn in the q8 precision: the expert table copied, then the gate/up products and the down products of every
// expert in one launch each (h, then the pairs' output rows: y in reference mode, the scratch after h in owner_local,
// whose rows are then weighted and added up in pair order as the cpu module adds them).
static int expert_ffn_q8(gpu_device *d, const eb_rt_expert_batch *b, char *err, size_t errlen) {
    int gu_need = 0, dn_need = 0, gu_nt, dn_nt;
    size_t gu_bytes, dn_bytes;
    for (int i = 0; i < b->n_experts; i++)
        if (b->pair_start[i + 1] > b->pair_start[i]) {
            gu_need |= q8_layout(b->experts[i].gate_dtype) | q8_layout(b->experts[i].up_dtype);
            dn_need |= q8_layout(b->experts[i].down_dtype);
        }
    int st = q8_plan(d, b->hidden, gu_need, &gu_nt, &gu_bytes, err, errlen);
    if (!st) st = q8_plan(d, b->inter, dn_need, &dn_nt, &dn_bytes, err, errlen);
    if (!st) st = upload_slots(d, b, err, errlen);
    if (st) return st;
    float *h = (float *)b->scratch;
    int owner_local = b->mode == EB_REDUCE_OWNER_LOCAL;
    float *out = owner_local ? h + (size_t)b->n_pairs * (size_t)b->inter : b->y;
    int gu_rows = q8_rows_per_block(d, b->inter, b->n_experts), dn_rows = q8_rows_per_block(d, b->hidden, b->n_experts);
    q8_gate_up_grouped<<<dim3(blocks(b->inter, gu_rows), b->n_experts), Q8_THREADS, gu_bytes, d->stream>>>(
        d->slots_dev, b->act, b->hidden, b->inter, b->x, b->pair_token, h, gu_rows, gu_nt);
    q8_down_grouped<<<dim3(blocks(b->hidden, dn_rows), b->n_experts), Q8_THREADS, dn_bytes, d->stream>>>(
        d->slots_dev, b->hidden, b->inter, h, out, dn_rows, dn_nt);
    if (owner_local) {
        long long n = (long long)b->n_tokens * b->hidden;
        zero_kernel<<<blocks(n, BLOCK), BLOCK, 0, d->stream>>>(b->y, n);
        q8_owner_local_sum<<<blocks(b->hidden, BLOCK), BLOCK, 0, d->stream>>>(out, b->pair_token, b->pair_weight,
                                                                             b->n_pairs, b->hidden, b->y);
    }
    return 0;
}

// The primary's experts in q8 (the EXPERTS part of gpu_moe): their formats are in device memory, so the shared memory
// holds the rows of x in both block sizes (256 where the width is a multiple of it) and each block quantizes the ones
// its expert's formats read.
static int q8_moe_launch(gpu_device *d, const eb_rt_moe *b, int per_pair, char *err, size_t errlen) {
    int gu_need = Q8_L32 | (b->hidden % 256 ? 0 : Q8_L256), dn_need = Q8_L32 | (b->inter % 256 ? 0 : Q8_L256);
    int gu_nt, dn_nt;
    size_t gu_bytes, dn_bytes;
    int st = q8_plan(d, b->hidden, gu_need, &gu_nt, &gu_bytes, err, errlen);
    if (!st) st = q8_plan(d, b->inter, dn_need, &dn_nt, &dn_bytes, err, errlen);
    if (st) return st;
    if (per_pair) { // one pair a block: one row of x
        gu_nt = dn_nt = 1;
        gu_bytes = q8_carve(NULL, 1, b->hidden, gu_need, NULL), dn_bytes = q8_carve(NULL, 1, b->inter, dn_need, NULL);
    }
    unsigned cols = per_pair ? (unsigned)(b->n * b->top_k) : (unsigned)b->n_experts;
    int gu_rows = q8_rows_per_block(d, b->inter, cols), dn_rows = q8_rows_per_block(d, b->hidden, cols);
    q8_moe_gate_up_kernel<<<dim3(blocks(b->inter, gu_rows), cols), Q8_THREADS, gu_bytes, d->stream>>>(
        *b, per_pair, gu_rows, gu_nt);
    q8_moe_down_kernel<<<dim3(blocks(b->hidden, dn_rows), cols), Q8_THREADS, dn_bytes, d->stream>>>(*b, per_pair,
                                                                                                    dn_rows, dn_nt);
    return 0;
}

static int gpu_embed(void *rtp, int dev, const void *table, int dtype, const eb_rt_scale *scale, int64_t hidden,
                     const int32_t *ids, int64_t n, float *x, char *err, size_t errlen) {
    (void)scale; // no scaled format on this device (its formats)
    PRIMARY_OP(embed_kernel<<<(unsigned)n, BLOCK, 0, d->stream>>>(table, dtype, (int)hidden, ids, x))
}

static int gpu_matmul(void *rtp, int dev, const eb_rt_norm *norm, const eb_rt_matmul *tasks, int n_tasks,
                      int accumulate, char *err, size_t errlen) {
    PRIMARY_OP({
        int rows_per_block = BLOCK / d->warp, q8 = 0;
        for (int i = 0; i < n_tasks; i++) q8 |= q8_uses(tasks[i].precision, tasks[i].dtype);
        // more rows, or q8 products (which quantize the normalised rows): a norm launch first (each block of a fused
        // norm would redo them all)
        int fuse = norm && n_tasks > 0 && norm->n <= DOT_TILE && !q8; // none: the norm alone
        if (norm && !fuse)
            rmsnorm_kernel<<<(unsigned)norm->n, BLOCK, 0, d->stream>>>(norm->x, norm->w, (int)norm->dim, norm->eps,
                                                                      norm->xn, d->warp);
        for (int first = 0; first < n_tasks && !st;) {
            mm_batch b;
            memset(&b, 0, sizeof b);
            b.accumulate = accumulate;
            if (fuse && first == 0) { // later batches read the rows the first one wrote
                b.nx = norm->x, b.nw = norm->w, b.nxn = norm->xn, b.eps = norm->eps;
                b.norm_n = (int)norm->n, b.norm_dim = (int)norm->dim;
            }
            for (; first < n_tasks && b.count < 4 && !st; first++) { // up to four f32 products; the q8 ones alone
                const eb_rt_matmul *t = &tasks[first];
                if (q8_uses(t->precision, t->dtype)) {
                    st = q8_matmul_launch(d, t, accumulate, err, errlen);
                    continue;
                }
                b.t[b.count] = {t->w, t->x, t->y, t->dtype, (int)t->rows, (int)t->cols, (int)t->n};
                b.start[b.count + 1] = b.start[b.count] + (int)t->rows;
                b.count++;
            }
            if (!b.count) continue;
            for (int i = b.count + 1; i < 5; i++) b.start[i] = b.start[b.count]; // the kernel's task search needs these
            int vec16 = 1; // decode's one row of x and 16-bit weights: the kernel of one sum per lane
            for (int i = 0; i < b.count; i++)
                vec16 &= b.t[i].n == 1 && !quantized(b.t[i].dtype) && b.t[i].dtype != EB_DTYPE_F32 &&
                         b.t[i].cols % 8 == 0;
            if (vec16)
                matvec16_kernel<<<blocks(b.start[b.count], rows_per_block), BLOCK, 0, d->stream>>>(b, d->warp);
            else
                matmul_kernel<<<blocks(b.start[b.count], rows_per_block), BLOCK, 0, d->stream>>>(b, d->warp);
        }
    })
}

static int gpu_add(void *rtp, int dev, float *y, const float *b, int64_t n, int64_t dim, int broadcast, char *err,
                   size_t errlen) {
    PRIMARY_OP(add_kernel<<<blocks(n * dim, BLOCK), BLOCK, 0, d->stream>>>(y, b, n * dim, (int)dim, broadcast))
}

static int gpu_silu_mul(void *rtp, int dev, float *g, const float *u, int64_t n, char *err, size_t errlen) {
    PRIMARY_OP(silu_mul_kernel<<<blocks(n, BLOCK), BLOCK, 0, d->stream>>>(g, u, n))
}

static int gpu_attention(void *rtp, int dev, const eb_rt_attention *a, char *err, size_t errlen) {
    if (a->head_dim % 2 != 0 || a->head_dim > MAX_HEAD_DIM)
        return eb_rt_fail(err, errlen, EB_ERR_UNSUPPORTED,
                          RUNTIME_NAME " runtime: head_dim %d is not supported: expected an even number up to %d",
                          a->head_dim, MAX_HEAD_DIM);
    if (!a->q_norm != !a->k_norm)
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT,
                          RUNTIME_NAME " runtime: q_norm %s and k_norm %s: expected both or neither",
                          a->q_norm ? "given" : "NULL", a->k_norm ? "given" : "NULL");
    // A ring must keep every position a row of the step reads, the step's own rows written first: window + n - 1
    // rows (a cache of n_ctx rows never wraps); a full layer's cache holds every position.
    if (a->window < 0 || a->n_cache < 1 ||
        (a->n_cache < a->n_ctx && (a->window == 0 || (long long)a->n_cache < (long long)a->window + a->n - 1)))
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT,
                          RUNTIME_NAME " runtime: attention window %d over a cache of %d rows (n_ctx %d, %d new rows): "
                                       "expected a window >= 0 and a cache of n_ctx rows, or of at least window + "
                                       "n - 1 rows for a window",
                          a->window, a->n_cache, a->n_ctx, a->n);
    PRIMARY_OP({
        if (a->n == 1) {
            attention_one_row_kernel<<<(unsigned)a->n_heads, ATT_GROUPS * 32, 0, d->stream>>>(*a, d->warp);
        } else { // the rows attend to each other's keys: all of them into the cache first
            dim3 rope((unsigned)a->n, (unsigned)(a->n_heads + 2 * a->n_kv_heads));
            qk_rope_store_kernel<<<rope, MAX_HEAD_DIM, 0, d->stream>>>(*a, d->warp);
            attention_kernel<<<dim3((unsigned)a->n_heads, (unsigned)a->n), ATT_GROUPS * 32, 0, d->stream>>>(*a);
        }
    })
}

static int gpu_route(void *rtp, int dev, const eb_rt_route *r, char *err, size_t errlen) {
    if (r->scoring != EB_ROUTE_SOFTMAX_TOPK && r->scoring != EB_ROUTE_SIGMOID_GROUP &&
        r->scoring != EB_ROUTE_TOPK_SOFTMAX)
        return eb_rt_fail(err, errlen, EB_ERR_UNSUPPORTED,
                          RUNTIME_NAME " runtime: router scoring %d is not supported: expected %d (softmax top-k), "
                                       "%d (sigmoid, grouped) or %d (top-k softmax)",
                          r->scoring, EB_ROUTE_SOFTMAX_TOPK, EB_ROUTE_SIGMOID_GROUP, EB_ROUTE_TOPK_SOFTMAX);
    if (r->scoring == EB_ROUTE_SIGMOID_GROUP && (r->n_group < 1 || r->n_group > 256 || r->n_experts % r->n_group ||
                                                 r->topk_group < 1 || r->topk_group > r->n_group || !r->bias))
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT,
                          RUNTIME_NAME " runtime: grouped routing of %d experts in %d groups, %d kept%s: expected "
                                       "1..256 groups dividing the experts, 1..groups kept and a correction bias",
                          r->n_experts, r->n_group, r->topk_group, r->bias ? "" : ", no bias");
    if (r->n_experts > MAX_EXPERTS || r->top_k > MAX_TOPK || r->top_k > r->n_experts)
        return eb_rt_fail(err, errlen, EB_ERR_UNSUPPORTED,
                          RUNTIME_NAME " runtime: %d experts, top_k %d: expected at most %d experts and top_k at most "
                                       "%d",
                          r->n_experts, r->top_k, MAX_EXPERTS, MAX_TOPK);
    PRIMARY_OP({ // a warp per expert row; decode's rows spread over blocks of ROUTE_THREADS
        int spread = r->norm.n <= DOT_TILE;
        dim3 grid(spread ? blocks(r->n_experts, ROUTE_THREADS / d->warp) : 1, (unsigned)r->norm.n);
        if (spread)
            route_kernel<ROUTE_THREADS><<<grid, ROUTE_THREADS, 0, d->stream>>>(*r, d->route_arrivals, d->warp);
        else
            route_kernel<1024><<<grid, 1024, 0, d->stream>>>(*r, d->route_arrivals, d->warp);
    })
}

static int gpu_mla(void *rtp, int dev, const eb_rt_mla *a, char *err, size_t errlen) {
    if (a->rank > MAX_MLA_RANK || a->rank + a->rope > MAX_MLA_ROW || a->rope % 2 || a->rank < 1 || a->rope < 2)
        return eb_rt_fail(err, errlen, EB_ERR_UNSUPPORTED,
                          RUNTIME_NAME " runtime: MLA with kv_lora_rank %d and qk_rope_head_dim %d: expected a rank of "
                                       "1..%d, an even rope dimension and at most %d in all",
                          a->rank, a->rope, MAX_MLA_RANK, MAX_MLA_ROW);
    PRIMARY_OP({ // the new rows into the cache first: every row attends to those before it
        mla_cache_kernel<<<(unsigned)a->n, BLOCK, 0, d->stream>>>(*a, d->warp);
        mla_attend_kernel<<<dim3((unsigned)a->n_heads, (unsigned)a->n), ATT_GROUPS * 32, 0, d->stream>>>(*a,
                                                                                                        d->warp);
    })
}

// The phases share their kernels: EXPERTS is the gate/up and down launches (the only ones that add stats), COMBINE
// is moe_combine_kernel, and ALL is the two, except that with few pairs its down launch also adds them up
// (moe_pair_down_kernel, combine = 1) in the order and with the arithmetic of moe_combine_kernel: the same bits.
static int gpu_moe(void *rtp, int dev, const eb_rt_moe *b, char *err, size_t errlen) {
    if (b->top_k > MAX_TOPK)
        return eb_rt_fail(err, errlen, EB_ERR_UNSUPPORTED, RUNTIME_NAME " runtime: top_k %d: expected at most %d",
                          b->top_k, MAX_TOPK);
    if (b->phase != EB_MOE_ALL && b->phase != EB_MOE_EXPERTS && b->phase != EB_MOE_COMBINE)
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT,
                          RUNTIME_NAME " runtime: MoE phase %d: expected %d (all), %d (experts) or %d (combine)",
                          b->phase, EB_MOE_ALL, EB_MOE_EXPERTS, EB_MOE_COMBINE);
    PRIMARY_OP({
        int rows_per_block = BLOCK / d->warp;
        int experts = b->phase != EB_MOE_COMBINE, q8 = experts && b->precision == EB_PRECISION_Q8;
        // Fewer pairs than experts: one block column per pair. The choice depends on the shape only, so that the
        // EXPERTS and COMBINE calls of one layer make the same one.
        int per_pair = b->n * b->top_k <= b->n_experts;
        if (q8) { // the outputs into pair_out, then moe_combine_kernel (ALL): the bits of EXPERTS then COMBINE
            st = q8_moe_launch(d, b, per_pair, err, errlen);
        } else if (experts && per_pair) {
            moe_pair_gate_up_kernel<<<dim3(blocks(b->inter, rows_per_block), (unsigned)(b->n * b->top_k)), BLOCK, 0,
                                      d->stream>>>(*b, d->warp);
            dim3 grid(blocks(b->hidden, rows_per_block), (unsigned)b->n);
            if (b->phase == EB_MOE_ALL) moe_pair_down_kernel<1><<<grid, BLOCK, 0, d->stream>>>(*b, d->warp);
            else moe_pair_down_kernel<0><<<grid, BLOCK, 0, d->stream>>>(*b, d->warp);
        } else if (experts) { // a block column per expert: its weights read once for all of its pairs
            moe_gate_up_kernel<<<dim3(blocks(b->inter, rows_per_block), (unsigned)b->n_experts), BLOCK, 0,
                                 d->stream>>>(*b, d->warp);
            moe_down_kernel<<<dim3(blocks(b->hidden, rows_per_block), (unsigned)b->n_experts), BLOCK, 0, d->stream>>>(
                *b, d->warp);
        }
        if (!st && (b->phase == EB_MOE_COMBINE || (b->phase == EB_MOE_ALL && (q8 || !per_pair))))
            moe_combine_kernel<<<dim3(blocks(b->hidden, BLOCK), (unsigned)b->n), BLOCK, 0, d->stream>>>(*b);
    })
}

static int gpu_graph_begin(void *rtp, int dev, char *err, size_t errlen) {
    gpu_device *d = get_dev((gpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    pthread_mutex_lock(&d->lock); // held until graph_end: other threads wait rather than being recorded
    gpuError_t e = gpuSetDevice(dev);
    if (e == gpuSuccess) e = gpuStreamBeginCapture(d->stream, gpuStreamCaptureModeThreadLocal);
    if (e != gpuSuccess) {
        pthread_mutex_unlock(&d->lock);
        return eb_rt_fail(err, errlen, EB_ERR_DEVICE, API " begin recording: %s (error %d)", gpuGetErrorString(e),
                          (int)e);
    }
    d->capturing = 1;
    return 0;
}

static int gpu_graph_end(void *rtp, int dev, void **graph, char *err, size_t errlen) {
    gpu_device *d = get_dev((gpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    gpuGraph_t g = NULL;
    gpuGraphExec_t exec = NULL;
    gpuError_t e = gpuStreamEndCapture(d->stream, &g);
    d->capturing = 0;
    if (e == gpuSuccess && graph) e = gpuGraphInstantiateWithFlags(&exec, g, 0);
    if (g) (void)gpuGraphDestroy(g);
    pthread_mutex_unlock(&d->lock);
    if (e != gpuSuccess) {
        (void)gpuGetLastError();
        return eb_rt_fail(err, errlen, EB_ERR_DEVICE, API " end recording: %s (error %d)", gpuGetErrorString(e),
                          (int)e);
    }
    if (graph) *graph = (void *)exec;
    return 0;
}

static int gpu_graph_launch(void *rtp, int dev, void *graph, char *err, size_t errlen) {
    PRIMARY_OP({
        gpuError_t ge = gpuGraphLaunch((gpuGraphExec_t)graph, d->stream);
        if (ge != gpuSuccess)
            st = eb_rt_fail(err, errlen, EB_ERR_DEVICE, API " graph launch: %s (error %d)", gpuGetErrorString(ge),
                            (int)ge);
    })
}

static void gpu_graph_free(void *rtp, int dev, void *graph) {
    (void)rtp;
    (void)dev;
    if (graph) (void)gpuGraphExecDestroy((gpuGraphExec_t)graph);
}

static int gpu_check_model(void *rtp, int dev, const eb_rt_model_shape *shape, char *err, size_t errlen) {
    if (!get_dev((gpu_runtime *)rtp, dev, err, errlen)) return EB_ERR_RANGE;
    if (shape->head_dim % 2 != 0 || shape->head_dim > MAX_HEAD_DIM)
        return eb_rt_fail(err, errlen, EB_ERR_UNSUPPORTED,
                          RUNTIME_NAME " runtime: head_dim %d is not supported: expected an even number up to %d",
                          shape->head_dim, MAX_HEAD_DIM);
    if (shape->n_experts > MAX_EXPERTS || shape->top_k > MAX_TOPK)
        return eb_rt_fail(err, errlen, EB_ERR_UNSUPPORTED,
                          RUNTIME_NAME " runtime: %d experts, top_k %d: expected at most %d experts and top_k at most "
                                       "%d",
                          shape->n_experts, shape->top_k, MAX_EXPERTS, MAX_TOPK);
    return 0;
}

static const eb_rt_forward_ops gpu_forward_ops = {
    .check_model = gpu_check_model,
    .embed = gpu_embed,
    .matmul = gpu_matmul,
    .add = gpu_add,
    .silu_mul = gpu_silu_mul,
    .attention = gpu_attention,
    .route = gpu_route,
    .moe = gpu_moe,
};

static const eb_rt_mla_ops gpu_mla_ops = {.mla = gpu_mla};
static const eb_rt_extension gpu_extensions[] = {
    {{EB_EXT_MLA, EB_EXT_MLA_VERSION}, &gpu_mla_ops},
    {{NULL, 0}, NULL},
};

static const eb_rt_graph_ops gpu_graph_ops = {
    .begin = gpu_graph_begin,
    .end = gpu_graph_end,
    .launch = gpu_graph_launch,
    .free = gpu_graph_free,
};

// Every member named, in the header's order (C++20 designated initialisers require it; g++'s -Wextra reports one
// left out).
static const eb_runtime_table gpu_table = {
    .abi_version = EB_RUNTIME_ABI_VERSION,
    .table_size = sizeof(eb_runtime_table),
    .name = RUNTIME_NAME,
    .init = gpu_init,
    .shutdown = gpu_shutdown,
    .kernel_variant = gpu_kernel_variant,
    .device_count = gpu_device_count,
    .device_info = gpu_device_info,
    .busy_ns = gpu_busy_ns,
    .mem_alloc = gpu_mem_alloc,
    .mem_free = gpu_mem_free,
    .host_alloc = gpu_host_alloc,
    .host_free = gpu_host_free,
    .copy_to_device = gpu_copy_to_device,
    .copy_to_host = gpu_copy_to_host,
    .synchronize = gpu_synchronize,
    .event_create = gpu_event_create,
    .event_destroy = gpu_event_destroy,
    .event_record = gpu_event_record,
    .event_wait = gpu_event_wait,
    .event_time = gpu_event_time,
    .expert_ffn = gpu_expert_ffn,
    .forward = &gpu_forward_ops,
    .graphs = &gpu_graph_ops,
    .extensions = gpu_extensions,
};

extern "C" EB_EXPORT const eb_runtime_table *eb_runtime_module(void) { return &gpu_table; }
