// The cuda and hip runtime modules, from one source.
//
// Built with nvcc as "cuda" and with hipcc (-DEB_GPU_HIP) as "hip". Devices own their memory; each has one
// non-blocking stream on which copies and expert batches are queued in order, and a pair of events that time
// the work queued since the last synchronize (busy time). Staging memory is pinned (cudaMallocHost).
// Completion events are the runtime's, timed against a reference event whose host time is known (event_time).
// A device can also be the primary: the whole forward pass (eb_rt_forward_ops) then runs here, and a one-token
// step can be recorded into a graph and replayed (eb_rt_graph_ops).
#include <pthread.h>
#include <time.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
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
#define gpuMemset hipMemset
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
#define gpuErrorNotReady hipErrorNotReady
#define gpuGetLastError hipGetLastError
#define SHFL_DOWN(v, o) __shfl_down((v), (o))
#define SHFL_XOR32(v, o) __shfl_xor((v), (o), 32)
#define SHFL_FROM(v, l) __shfl((v), (l))
#define SHFL_FROM32(v, l) __shfl((v), (l), 32)
#define WARP_SYNC() __builtin_amdgcn_wave_barrier() // a wavefront runs in lockstep: order its shared memory accesses
#define gpuGraph_t hipGraph_t
#define gpuGraphExec_t hipGraphExec_t
#define gpuStreamBeginCapture hipStreamBeginCapture
#define gpuStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define gpuStreamEndCapture hipStreamEndCapture
#define gpuGraphInstantiateWithFlags hipGraphInstantiateWithFlags
#define gpuGraphDestroy hipGraphDestroy
#define gpuGraphExecDestroy hipGraphExecDestroy
#define gpuGraphLaunch hipGraphLaunch
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
#define gpuMemset cudaMemset
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
#define gpuErrorNotReady cudaErrorNotReady
#define gpuGetLastError cudaGetLastError
#define SHFL_DOWN(v, o) __shfl_down_sync(0xffffffffu, (v), (o))
#define SHFL_XOR32(v, o) __shfl_xor_sync(0xffffffffu, (v), (o), 32)
#define SHFL_FROM(v, l) __shfl_sync(0xffffffffu, (v), (l))
#define SHFL_FROM32(v, l) __shfl_sync(0xffffffffu, (v), (l), 32)
#define WARP_SYNC() __syncwarp()
#define gpuGraph_t cudaGraph_t
#define gpuGraphExec_t cudaGraphExec_t
#define gpuStreamBeginCapture cudaStreamBeginCapture
#define gpuStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
#define gpuStreamEndCapture cudaStreamEndCapture
#define gpuGraphInstantiateWithFlags cudaGraphInstantiateWithFlags
#define gpuGraphDestroy cudaGraphDestroy
#define gpuGraphExecDestroy cudaGraphExecDestroy
#define gpuGraphLaunch cudaGraphLaunch
#endif

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
// silu(g) * u, or gpt-oss's clamped SwiGLU (u' + 1) * g' * sigmoid(alpha * g'), g' = min(g, limit),
// u' = clamp(u, -limit, limit). Every expert kernel (expert_ffn's and the forward moe's) applies it here.
__device__ __forceinline__ float expert_act(const eb_rt_act &act, float g, float u) {
    if (act.kind != EB_ACT_SWIGLU_OAI) return g / (1.0f + expf(-g)) * u;
    float lim = act.limit;
    g = g < lim ? g : lim;
    u = u < -lim ? -lim : u > lim ? lim : u;
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
    info->queued_ops = 1;
    // the formats with kernels here: the float ones and the quantized ones of QUANT_CASES (dequantized in f32, qfmt).
    // The others (F8_E4M3_B128 with its scale companion, the formats after it in EB_FORMATS) have none yet, so the
    // core refuses such a weight on this device by name.
    info->formats = GPU_FORMATS;
    info->precisions = 1u << EB_PRECISION_F32 | 1u << EB_PRECISION_Q8; // q8: the cpu module's bits (q8_* kernels)
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
        if (i < hd) a.v_cache[row * kvd + vh * hd + i] = a.v[(long long)t * kvd + vh * hd + i];
        return;
    }
    int is_q = h < a.n_heads;
    float *v = is_q ? a.q + (long long)t * qd + h * hd : a.k + (long long)t * kvd + (h - a.n_heads) * hd;
    norm_rope(v, is_q ? a.q_norm : a.k_norm, a.rope_cos + p * half, a.rope_sin + p * half, hd, a.eps, vec, out, sh,
              warp);
    if (i < hd) {
        v[i] = out[i];
        if (!is_q) a.k_cache[row * kvd + (h - a.n_heads) * hd + i] = out[i];
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
    const float *kc = a.k_cache + kvh * hd, *vc = a.v_cache + kvh * hd;
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
        a.k_cache[row * kvd + kvh * hd + i] = kn[i];
        a.v_cache[row * kvd + kvh * hd + i] = vn[i];
    }
    __syncthreads();
    attend(a, h, 0, qn, kn, vn);
}

// ---- MLA attention (DeepSeek-V3), the absorbed form over a cache of the latent and the rope key ----------

#define MAX_MLA_RANK 512 // kv_lora_rank
#define MAX_MLA_ROW 640  // kv_lora_rank + qk_rope_head_dim: a cache row

// The rotation of one head vector of rope values by the block's threads (i < rope / 2 each take a pair): interleaved
// pairs (x[2i], x[2i+1]) written de-interleaved, or halves (x[i], x[i + rope/2]), as the CPU's eb_rope_interleaved
// and eb_rope.
__device__ __forceinline__ void mla_rope(const float *x, const float *cs, const float *sn, int rope, int interleave,
                                         float *out) {
    int half = rope / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float a = interleave ? x[2 * i] : x[i], b = interleave ? x[2 * i + 1] : x[i + half];
        out[i] = a * cs[i] - b * sn[i];
        out[i + half] = b * cs[i] + a * sn[i];
    }
}

// One block per new row: the latent's RMSNorm and the rope key's rotation into the cache at the row's position.
__global__ void mla_cache_kernel(eb_rt_mla a, int warp) {
    __shared__ float sh[33];
    int t = blockIdx.x, R = a.rank, P = a.rope, C = R + P;
    long long p = *a.pos + t;
    const float *kv = a.kv + (long long)t * C;
    float *row = a.cache + p * C;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < R; i += blockDim.x) ss += kv[i] * kv[i];
    float inv = rsqrtf(block_sum(ss, sh, warp) / (float)R + a.eps);
    for (int i = threadIdx.x; i < R; i += blockDim.x) row[i] = a.kv_norm[i] * (kv[i] * inv);
    mla_rope(kv + R, a.rope_cos + p * (P / 2), a.rope_sin + p * (P / 2), P, a.interleave, row + R);
}

// One block per (head, row), ATT_GROUPS groups of 32 lanes: the absorbed query (q_nope through the head's k_b rows,
// a warp per latent dimension; q_pe rotated) in shared memory, then groups of lanes take cache positions in turn
// with a running softmax over the latent (each lane holds row / 32 of it), merged; then out = v_b . the latent mix,
// a warp per value dimension.
__global__ void mla_attend_kernel(eb_rt_mla a, int warp) {
    __shared__ float qs[MAX_MLA_ROW], mix[MAX_MLA_RANK];
    __shared__ float gm[ATT_GROUPS], gl[ATT_GROUPS];
    __shared__ float gacc[ATT_GROUPS][MAX_MLA_RANK];
    int h = blockIdx.x, t = blockIdx.y, R = a.rank, P = a.rope, N = a.nope, C = R + P;
    long long p = *a.pos + t;
    const float *q = a.q + ((long long)t * a.n_heads + h) * (N + P);
    int wl = threadIdx.x % warp, wid = threadIdx.x / warp, nw = blockDim.x / warp;
    for (int r = wid; r < R; r += nw) {
        float v = warp_dot(a.k_b, a.k_b_dtype, (long long)h * R + r, N, q, wl, warp);
        if (wl == 0) qs[r] = v * a.scale;
    }
    mla_rope(q + N, a.rope_cos + p * (P / 2), a.rope_sin + p * (P / 2), P, a.interleave, qs + R);
    __syncthreads();
    for (int i = R + threadIdx.x; i < C; i += blockDim.x) qs[i] *= a.scale;
    __syncthreads();
    int lane = threadIdx.x % 32, g = threadIdx.x / 32, ng = blockDim.x / 32;
    float qv[MAX_MLA_ROW / 32], acc[MAX_MLA_RANK / 32];
#pragma unroll
    for (int i = 0; i < MAX_MLA_ROW / 32; i++) qv[i] = lane + 32 * i < C ? qs[lane + 32 * i] : 0.0f;
#pragma unroll
    for (int i = 0; i < MAX_MLA_RANK / 32; i++) acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (long long s = g; s <= p; s += ng) {
        const float *row = a.cache + s * C;
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < MAX_MLA_ROW / 32; i++) {
            int c = lane + 32 * i;
            if (c < C) d += qv[i] * row[c];
        }
        for (int o = 16; o > 0; o /= 2) d += SHFL_XOR32(d, o);
        float mn = fmaxf(m, d), corr = expf(m - mn), e = expf(d - mn);
        l = l * corr + e;
#pragma unroll
        for (int i = 0; i < MAX_MLA_RANK / 32; i++) {
            int c = lane + 32 * i;
            if (c < R) acc[i] = acc[i] * corr + e * row[c];
        }
        m = mn;
    }
    if (lane == 0) gm[g] = m, gl[g] = l;
#pragma unroll
    for (int i = 0; i < MAX_MLA_RANK / 32; i++)
        if (lane + 32 * i < R) gacc[g][lane + 32 * i] = acc[i];
    __syncthreads();
    float M = -INFINITY, L = 0.0f;
    for (int j = 0; j < ng; j++) M = fmaxf(M, gm[j]);
    for (int j = 0; j < ng; j++) L += gm[j] == -INFINITY ? 0.0f : gl[j] * expf(gm[j] - M);
    for (int c = threadIdx.x; c < R; c += blockDim.x) {
        float o = 0.0f;
        for (int j = 0; j < ng; j++)
            if (gm[j] != -INFINITY) o += gacc[j][c] * expf(gm[j] - M);
        mix[c] = o / L;
    }
    __syncthreads();
    float *out = a.out + ((long long)t * a.n_heads + h) * a.v_dim;
    for (int j = wid; j < a.v_dim; j += nw) {
        float v = warp_dot(a.v_b, a.v_b_dtype, (long long)h * a.v_b_head_rows + j, R, mix, wl, warp);
        if (wl == 0) out[j] = v;
    }
}

#define MAX_EXPERTS 512
// EB_ROUTE_SIGMOID_GROUP by one warp (lanes 0..31) over a row's logits in shared memory, as the CPU's
// eb_route_sigmoid_group_row: sigmoid scores, the biased scores for the choice (the groups not kept at 0), the group
// choice and the top k on lane 0 in ascending index order (ties to the lower), the weights the chosen scores.
__device__ void route_sigmoid_group(const eb_rt_route &r, int t, float *scores, unsigned char *taken, int lane) {
    __shared__ float choice[MAX_EXPERTS], group[256];
    int E = r.n_experts, K = r.top_k, G = r.n_group, per = E / G;
    for (int e = lane; e < E; e += 32) {
        scores[e] = 1.0f / (1.0f + expf(-scores[e]));
        choice[e] = scores[e] + r.bias[e];
    }
    WARP_SYNC();
    if (r.topk_group < G) {
        for (int g = lane; g < G; g += 32) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (choice[e] > b1) b2 = b1, b1 = choice[e];
                else if (choice[e] > b2) b2 = choice[e];
            }
            group[g] = b1 + b2;
        }
        WARP_SYNC();
        if (lane == 0) {
            for (int g = 0; g < G; g++) taken[g] = 0;
            for (int k = 0; k < r.topk_group; k++) {
                int best = 0;
                while (taken[best]) best++;
                for (int g = best + 1; g < G; g++)
                    if (!taken[g] && group[g] > group[best]) best = g;
                taken[best] = 1;
            }
            for (int g = 0; g < G; g++)
                if (!taken[g])
                    for (int e = g * per; e < (g + 1) * per; e++) choice[e] = 0.0f;
        }
        WARP_SYNC();
    }
    if (lane != 0) return;
    for (int e = 0; e < E; e++) taken[e] = 0;
    int ids[MAX_TOPK];
    float w[MAX_TOPK], total = 0.0f;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || choice[e] > choice[best])) best = e;
        taken[best] = 1;
        ids[k] = best;
        w[k] = scores[best];
        if (r.norm_topk) total += w[k];
    }
    for (int k = 0; k < K; k++) {
        r.topk_id[(long long)t * K + k] = ids[k];
        r.topk_w[(long long)t * K + k] = (r.norm_topk ? w[k] / (total + 1e-20f) : w[k]) * r.scale;
        if (r.hits) atomicAdd(&r.hits[ids[k]], 1ULL);
    }
}

#define ROUTE_THREADS 128 // the threads of each of a decode row's blocks

// Per row: its RMSNorm (block x 0 writes xn), the router's logits (a warp per expert row, the row normalised on the
// fly exactly as xn is written), then warp 0 takes the top k by k rounds of a warp arg-max (ties to the lower id):
// of the softmax over every expert (EB_ROUTE_SOFTMAX_TOPK), or of the logits plus the router's bias, their weights
// the softmax over the k chosen (EB_ROUTE_TOPK_SOFTMAX, as the CPU's eb_route_topk_softmax_row).
// grid.y = row. A prefill's many rows: one block of 1024 threads per row (grid.x = 1). Decode's few rows (at most
// DOT_TILE): a row's expert rows spread over grid.x blocks of ROUTE_THREADS, so that many SMs read the router
// (one SM alone read it at about 20 GB/s), and the last block to arrive (arrivals[row]) makes the choice.
// THREADS: the block's (1024 for a prefill's rows, ROUTE_THREADS for decode's), which bounds its registers.
template <int THREADS>
__global__ void __launch_bounds__(THREADS) route_kernel(eb_rt_route r, unsigned int *arrivals, int warp) {
    __shared__ float logits[MAX_EXPERTS];
    __shared__ unsigned char taken[MAX_EXPERTS];
    __shared__ int last;
    int t = blockIdx.y, H = (int)r.norm.dim, E = r.n_experts, K = r.top_k;
    int lane = threadIdx.x % warp, wid = threadIdx.x / warp, nw = blockDim.x / warp;
    int first = blockIdx.x * nw, stride = gridDim.x * nw; // this block's expert rows: first + wid + k * stride
    const float *xr = r.norm.x + (long long)t * H;
    if (gridDim.y <= DOT_TILE) // router rows on their way meanwhile (a few rows: not once per row of a prefill)
        for (int e = first + wid; e < E; e += stride) prefetch_row(r.router, r.router_dtype, e, H, lane, warp);
    int dot16 = !quantized(r.router_dtype) && r.router_dtype != EB_DTYPE_F32 && (H % 8) == 0;
    float row_inv = 0.0f;
    long long warps = (long long)gridDim.x * nw, g = (long long)blockIdx.x * nw + wid; // the row's warps write xn
    auto scale = [&]() { // every warp its own scale (no barrier); with dot16, its first router loads in flight
        row_inv = warp_row_inv(xr, H, r.norm.eps, lane, warp);
        write_normed(xr, r.norm.w, 1, H, &row_inv, r.norm.xn + (long long)t * H, g, warps, lane, warp);
        return row_inv;
    };
    int e = first + wid;
    float v0 = dot16 && e < E ? warp_dot16(r.router, r.router_dtype, e, H, xr, lane, warp, r.norm.w, scale) : scale();
    float inv[DOT_TILE] = {row_inv, row_inv, row_inv, row_inv};
    const float *xs[DOT_TILE] = {xr, xr, xr, xr};
    int chosen_logits = r.scoring == EB_ROUTE_TOPK_SOFTMAX; // the top k of the (biased) logits themselves
    float *row_logits = r.logits + (long long)t * E;
    for (; e < E; e += stride) {
        float v[DOT_TILE];
        if (dot16 && e == first + wid)
            v[0] = v0;
        else if (dot16)
            v[0] = warp_dot16(r.router, r.router_dtype, e, H, xr, lane, warp, r.norm.w, [&]() { return row_inv; });
        else
            warp_dot_tile(r.router, r.router_dtype, e, H, xs, 1, lane, warp, v, r.norm.w, inv);
        if (chosen_logits && r.bias) v[0] += r.bias[e];
        if (lane == 0) row_logits[e] = v[0];
    }
    if (gridDim.x > 1) { // the last block of the row to arrive goes on; it sets the count back for the next launch
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            last = atomicAdd(&arrivals[t], 1u) == gridDim.x - 1;
            if (last) arrivals[t] = 0;
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
    } else {
        __syncthreads(); // the block's writes of the logits are visible to the block
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x) logits[e] = ((volatile const float *)row_logits)[e];
    __syncthreads();
    if (threadIdx.x >= 32) return;
    lane = threadIdx.x;
    if (r.scoring == EB_ROUTE_SIGMOID_GROUP) {
        route_sigmoid_group(r, t, logits, taken, lane);
        return;
    }
    float mx = -INFINITY, sum = 0.0f;
    if (!chosen_logits) {
        for (int e = lane; e < E; e += 32) mx = fmaxf(mx, logits[e]);
        for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, SHFL_XOR32(mx, o));
        for (int e = lane; e < E; e += 32) sum += expf(logits[e] - mx);
        for (int o = 16; o > 0; o /= 2) sum += SHFL_XOR32(sum, o);
        // the probabilities once, each lane its own entries (the rounds below read only those): the same values
        // every round would compute again
        for (int e = lane; e < E; e += 32) logits[e] = expf(logits[e] - mx) / sum;
    }
    for (int e = lane; e < E; e += 32) taken[e] = 0;
    float total = 0.0f, top[MAX_TOPK];
    for (int k = 0; k < K; k++) {
        // the first candidate is always taken (id == E), so NaN probabilities still select a valid expert
        float best = 0.0f;
        int id = E;
        for (int e = lane; e < E; e += 32) {
            float pe = logits[e]; // the probability, or the (biased) logit itself
            if (!taken[e] && (id == E || pe > best)) best = pe, id = e; // ascending e: the first of equals stays
        }
        for (int o = 16; o > 0; o /= 2) {
            float ob = SHFL_XOR32(best, o);
            int oid = SHFL_XOR32(id, o);
            if (oid != E && (id == E || ob > best || (ob == best && oid < id))) best = ob, id = oid;
        }
        if (lane == id % 32) taken[id] = 1; // only this lane reads that entry
        if (lane == 0) {
            r.topk_id[(long long)t * K + k] = id;
            top[k] = best;
            if (r.hits) atomicAdd(&r.hits[id], 1ULL);
        }
        total += best;
    }
    if (lane != 0) return;
    if (chosen_logits) { // the softmax over the chosen, from the first (the largest), in the order chosen
        float first = top[0], denom = 0.0f;
        for (int k = 0; k < K; k++) denom += top[k] = expf(top[k] - first);
        for (int k = 0; k < K; k++) r.topk_w[(long long)t * K + k] = top[k] / denom;
        return;
    }
    for (int k = 0; k < K; k++) r.topk_w[(long long)t * K + k] = r.norm_topk ? top[k] / total : top[k];
}

// The next (up to DOT_TILE) selections of expert e from q on: their indices into pairs, q moved past them.
__device__ __forceinline__ int next_pairs(const int *topk_id, int total, int e, int &q, int *pairs) {
    int nt = 0;
    for (; q < total && nt < DOT_TILE; q++)
        if (topk_id[q] == e) {
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++) // constant indices: pairs stays in registers
                if (j == nt) pairs[j] = q;
            nt++;
        }
    return nt;
}

// grid.y = expert: the pairs routed to it (found by scanning the selections), DOT_TILE at a time per weight row.
__global__ void moe_gate_up_kernel(eb_rt_moe b, int warp) {
    const eb_rt_expert ex = b.experts[blockIdx.y];
    if (!ex.gate) return;
    int lane = threadIdx.x % warp;
    int i = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    int total = b.n * b.top_k, e = blockIdx.y;
    if (b.stats && blockIdx.x == 0 && threadIdx.x == 0) {
        int rows = 0;
        for (int q = 0; q < total; q++) rows += b.topk_id[q] == e;
        if (rows) atomicAdd(&b.stats[0], 1ULL), atomicAdd(&b.stats[1], (unsigned long long)rows);
    }
    if (i >= b.inter) return;
    int q = 0;
    while (q < total) {
        int pairs[DOT_TILE] = {0, 0, 0, 0};
        int nt = next_pairs(b.topk_id, total, e, q, pairs);
        if (!nt) break;
        const float *xs[DOT_TILE];
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) xs[j] = b.xn + (long long)((j < nt ? pairs[j] : pairs[0]) / b.top_k) * b.hidden;
        float gs[DOT_TILE], us[DOT_TILE];
        warp_dot_tile(ex.gate, ex.gate_dtype, i, b.hidden, xs, nt, lane, warp, gs);
        warp_dot_tile(ex.up, ex.up_dtype, i, b.hidden, xs, nt, lane, warp, us);
        if (lane == 0)
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++)
                if (j < nt)
                    b.h[(long long)pairs[j] * b.inter + i] =
                        expert_act(b.act, biased(gs[j], ex.bias, i), biased(us[j], ex.bias, (long long)b.inter + i));
    }
}

__global__ void moe_down_kernel(eb_rt_moe b, int warp) {
    const eb_rt_expert ex = b.experts[blockIdx.y];
    if (!ex.gate) return;
    int lane = threadIdx.x % warp;
    int j0 = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    if (j0 >= b.hidden) return;
    int total = b.n * b.top_k, e = blockIdx.y, q = 0;
    while (q < total) {
        int pairs[DOT_TILE] = {0, 0, 0, 0};
        int nt = next_pairs(b.topk_id, total, e, q, pairs);
        if (!nt) break;
        const float *hs[DOT_TILE];
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++) hs[j] = b.h + (long long)(j < nt ? pairs[j] : pairs[0]) * b.inter;
        float ys[DOT_TILE];
        warp_dot_tile(ex.down, ex.down_dtype, j0, b.inter, hs, nt, lane, warp, ys);
        if (lane == 0)
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++)
                if (j < nt)
                    b.pair_out[(long long)pairs[j] * b.hidden + j0] = biased(ys[j], ex.bias, 2LL * b.inter + j0);
    }
}

// One weighted output added to a row's sum, rounded once (what nvcc and hipcc made of `s += v * w`): the one
// expression of both combinations, moe_combine_kernel's and moe_pair_down_kernel's, so that EB_MOE_ALL gives the
// bits of EB_MOE_EXPERTS then EB_MOE_COMBINE whether a compiler would have contracted it or not.
__device__ __forceinline__ float combine_term(float s, float v, float w) { return fmaf(v, w, s); }

// x[t] += the row's expert outputs, weighted, in ascending expert id (the other owners' from foreign).
__global__ void moe_combine_kernel(eb_rt_moe b) {
    int t = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= b.hidden) return;
    const int *ids = b.topk_id + (long long)t * b.top_k;
    int owner_local = b.mode == EB_REDUCE_OWNER_LOCAL;
    float s = 0.0f;
    int done = -1;
    for (int n = 0; n < b.top_k; n++) {
        int k = -1;
        for (int i = 0; i < b.top_k; i++)
            if (ids[i] > done && (k < 0 || ids[i] < ids[k])) k = i;
        done = ids[k];
        long long pair = (long long)t * b.top_k + k;
        const float *row = b.experts[done].gate ? b.pair_out : owner_local ? NULL : b.foreign;
        if (row) s = combine_term(s, row[pair * b.hidden + j], b.topk_w[pair]);
    }
    if (owner_local && b.foreign) s += b.foreign[(long long)t * b.hidden + j];
    b.x[(long long)t * b.hidden + j] += s;
}

// Few rows (decode, short verify batches): a block per (rows, selected pair) instead of per (rows, expert).
__global__ void moe_pair_gate_up_kernel(eb_rt_moe b, int warp) {
    int pair = blockIdx.y, e = b.topk_id[pair];
    const eb_rt_expert ex = b.experts[e];
    if (!ex.gate) return;
    if (b.stats && blockIdx.x == 0 && threadIdx.x == 0) {
        int first = 1; // an expert counts once per layer step: at its first pair
        for (int q = 0; q < pair; q++) first &= b.topk_id[q] != e;
        atomicAdd(&b.stats[1], 1ULL);
        if (first) atomicAdd(&b.stats[0], 1ULL);
    }
    int lane = threadIdx.x % warp;
    int i = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    if (i >= b.inter) return;
    const float *x = b.xn + (long long)(pair / b.top_k) * b.hidden;
    const float *xs[DOT_TILE] = {x, x, x, x};
    const void *ws[DOT_TILE] = {ex.gate, ex.up, ex.up, ex.up};
    float gu[DOT_TILE];
    if (ex.gate_dtype == ex.up_dtype) {
        warp_dot_rows(ws, ex.gate_dtype, i, b.hidden, xs, 2, lane, warp, gu); // gate and up rows in one pass
    } else {
        float us[DOT_TILE];
        warp_dot_tile(ex.gate, ex.gate_dtype, i, b.hidden, xs, 1, lane, warp, gu);
        warp_dot_tile(ex.up, ex.up_dtype, i, b.hidden, xs, 1, lane, warp, us);
        gu[1] = us[0];
    }
    if (lane == 0)
        b.h[(long long)pair * b.inter + i] =
            expert_act(b.act, biased(gu[0], ex.bias, i), biased(gu[1], ex.bias, (long long)b.inter + i));
}

// The down products of a row's pairs and their sum in one: a warp per output element j of row t. The pairs are
// put in ascending expert id (the order moe_combine_kernel adds them in), their products computed four at a time
// with the loads in flight together, then added in that order (combine = 1: EB_MOE_ALL). combine = 0
// (EB_MOE_EXPERTS): the same products, written to pair_out instead of added, so that moe_combine_kernel
// (EB_MOE_COMBINE) then adds the same values in the same order with the same combine_term: the same bits.
// combine is a template parameter, so that the EB_MOE_ALL build is the fused kernel alone, with no branch on it.
template <int combine> __global__ void __launch_bounds__(BLOCK, 2) moe_pair_down_kernel(eb_rt_moe b, int warp) {
    int t = blockIdx.y, lane = threadIdx.x % warp;
    int j = blockIdx.x * (blockDim.x / warp) + threadIdx.x / warp;
    if (j >= b.hidden) return;
    const int *ids = b.topk_id + (long long)t * b.top_k;
    int owner_local = b.mode == EB_REDUCE_OWNER_LOCAL;
    int order[MAX_TOPK];
    int done = -1;
    for (int n = 0; n < b.top_k; n++) {
        int k = -1;
        for (int i = 0; i < b.top_k; i++)
            if (ids[i] > done && (k < 0 || ids[i] < ids[k])) k = i;
        order[n] = k;
        done = ids[k];
    }
    float s = 0.0f;
    for (int n0 = 0; n0 < b.top_k; n0 += DOT_TILE) {
        const void *ws[DOT_TILE];
        const float *hs[DOT_TILE], *bs[DOT_TILE];
        float v[DOT_TILE];
        int nt = 0, dtype = -1, same = 1;
#pragma unroll
        for (int q = 0; q < DOT_TILE; q++) {
            int k = n0 + q < b.top_k ? order[n0 + q] : order[n0];
            const eb_rt_expert ex = b.experts[ids[k]];
            ws[q] = ex.gate ? ex.down : NULL;
            bs[q] = ex.gate ? ex.bias : NULL;
            hs[q] = b.h + ((long long)t * b.top_k + k) * b.inter;
            if (n0 + q < b.top_k) {
                nt = q + 1;
                if (ex.gate) same &= dtype < 0 || ex.down_dtype == dtype, dtype = ex.down_dtype;
            }
        }
        // experts elsewhere have no weights here: give them an owned row to read (the value is not used)
        const void *any = NULL;
#pragma unroll
        for (int q = 0; q < DOT_TILE; q++)
            if (!any && ws[q]) any = ws[q];
        if (any) {
            if (same) {
                const void *wr[DOT_TILE];
#pragma unroll
                for (int q = 0; q < DOT_TILE; q++) wr[q] = ws[q] ? ws[q] : any;
                warp_dot_rows(wr, dtype, j, b.inter, hs, nt, lane, warp, v);
            } else {
                // not unrolled (hipcc could not): the rare path of experts whose down weights differ in format
                for (int q = 0; q < DOT_TILE; q++) {
                    const float *h1[DOT_TILE] = {hs[q], hs[q], hs[q], hs[q]};
                    float y[DOT_TILE];
                    const eb_rt_expert ex = b.experts[ids[n0 + q < b.top_k ? order[n0 + q] : order[n0]]];
                    if (q < nt && ws[q]) warp_dot_tile(ws[q], ex.down_dtype, j, b.inter, h1, 1, lane, warp, y);
                    float vq = q < nt && ws[q] ? y[0] : 0.0f;
#pragma unroll
                    for (int r = 0; r < DOT_TILE; r++) // constant indices: v stays in registers
                        if (r == q) v[r] = vq;
                }
            }
#pragma unroll
            for (int q = 0; q < DOT_TILE; q++) // the down biases, before the output is stored or weighted
                if (q < nt && ws[q]) v[q] = biased(v[q], bs[q], 2LL * b.inter + j);
        }
#pragma unroll
        for (int q = 0; q < DOT_TILE; q++) {
            if (q >= nt) continue;
            long long pair = (long long)t * b.top_k + order[n0 + q];
            if (!combine) {
                if (ws[q] && lane == 0) b.pair_out[pair * b.hidden + j] = v[q];
                continue;
            }
            float val;
            if (ws[q]) val = v[q];
            else if (!owner_local && b.foreign) val = b.foreign[pair * b.hidden + j]; // NULL: as moe_combine_kernel
            else continue;
            s = combine_term(s, val, b.topk_w[pair]);
        }
    }
    if (!combine) return;
    if (owner_local && b.foreign) s += b.foreign[(long long)t * b.hidden + j];
    if (lane == 0) b.x[(long long)t * b.hidden + j] += s;
}

// ---- the q8 precision: the CPU module's q8 products, bit for bit ---------------------------------------------
//
// As the CPU module runs them (its x86 kernels, cpu_kernels_avx2.c and cpu_kernels_avx512.c, which give the same
// bits; the portable C kernels sum Q8_0 and MXFP4 blocks in another order): each row of x quantized per block of 32
// values (against Q8_0 and MXFP4 weights) or 256 (the K formats) exactly as eb_cpu_quantize_q8 does it, the integer
// sums of the products per block (exact, so in any order: dp4a here), the same float expression around each
// block's integer sum and the same order of the float sums (below, per format), and the experts' activation of
// eb_q8.h. Every float operation is an explicit one of the q8_* helpers (or eb_q8.h's), so that no compiler contracts
// a multiply and an add into a fused one where the CPU has two roundings (or the reverse).
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

// Four bytes at any alignment, from the aligned words that hold them (never a word none of whose bytes is wanted).
__device__ __forceinline__ unsigned ld_u32(const unsigned char *p) {
    const unsigned char *a = word_of(p);
    unsigned r = (unsigned)((uintptr_t)p & 3);
    return funnel(word_at(a), word_at(a + (r ? 4 : 0)), 8u * r);
}

// Four MXFP4 codes (one a byte, in its low nibble) as their values (eb_mxfp4_values), one signed byte each.
__device__ __forceinline__ int mxfp4_x4(unsigned n) {
    unsigned t = n | (n >> 4);
    unsigned sel = ((t & 0xffu) | ((t >> 8) & 0xff00u)) & 0x7777u;
    unsigned pos = __byte_perm(0x03020100u, 0x0C080604u, sel), neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, sel);
    unsigned mask = ((n >> 3) & 0x01010101u) * 0xffu;
    return (int)((pos & ~mask) | (neg & mask));
}

__host__ __device__ __forceinline__ bool q8_products(int dtype) { // the formats with integer products (the CPU's)
    return dtype == EB_DTYPE_Q8_0 || dtype == EB_DTYPE_MXFP4 || dtype == EB_DTYPE_Q4_K || dtype == EB_DTYPE_Q5_K ||
           dtype == EB_DTYPE_Q6_K;
}

// The layouts of quantized x a format's products read (bits: 1 blocks of 32, 2 blocks of 256; 0: f32 products).
enum { Q8_L32 = 1, Q8_L256 = 2 };
__host__ __device__ __forceinline__ int q8_layout(int dtype) {
    if (!q8_products(dtype)) return 0;
    return dtype == EB_DTYPE_Q8_0 || dtype == EB_DTYPE_MXFP4 ? Q8_L32 : Q8_L256;
}
// Lanes per weight row of its products.
__host__ __device__ __forceinline__ int q8_lanes(int dtype) {
    return dtype == EB_DTYPE_Q8_0 || dtype == EB_DTYPE_MXFP4 ? 16 : 32;
}
__host__ __device__ __forceinline__ bool q8_uses(int precision, int dtype) {
    return precision == EB_PRECISION_Q8 && q8_products(dtype);
}

// Up to DOT_TILE rows of x quantized (eb_cpu_q8_rows' layout, per block size): layout l's row j has its quants at
// q[l] + j * cols, its scales at d[l] + j * cols / B and (256 only) its sums of 16 quants at s16 + j * cols / 16.
struct q8_tile {
    signed char *q[2];
    float *d[2];
    short *s16;
};

// Carve a tile of nt rows of cols values in the layouts `need` out of base (NULL: only measure); its bytes.
__host__ __device__ __forceinline__ size_t q8_carve(unsigned char *base, int nt, int cols, int need, q8_tile *t) {
    size_t off = 0, n = (size_t)nt * (size_t)cols;
    for (int l = 0; l < 2; l++) {
        if (t) t->q[l] = NULL, t->d[l] = NULL;
        if (!(need & (1 << l))) continue;
        if (t) t->q[l] = (signed char *)(base + off);
        off += n;
        if (t) t->d[l] = (float *)(base + off);
        off += (n / (l ? 256 : 32) * sizeof(float) + 15) / 16 * 16;
        if (l) {
            if (t) t->s16 = (short *)(base + off);
            off += (n / 16 * sizeof(short) + 15) / 16 * 16;
        }
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
            if (l) {
                sum += SHFL_XOR32(sum, 1);
                if (live && !(it & 1)) t.s16[at / 16] = (short)sum;
            }
            if (live && it % lanes == 0) t.d[l][at / B] = d;
        }
    }
}

// Q8_0 and MXFP4 against blocks of 32: the x86 kernels' arithmetic (cpu_kernels_avx2.c dot_q8; the AVX-512 one gives
// its bits). Lane 8p + l of a row's 16 is their accumulator lane l for the blocks of parity p: per block, the exact sum
// of the products of values 4l .. 4l + 3, converted to f32 and added times the block's scale dw * xd in one fma, block
// after block; at the end the lanes are added as hsum adds them, v_l (lane l's two accumulators added) in
// ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)) (each add commutes: the butterfly of shuffles gives it). Each half
// of a group of 32 lanes runs its own row (or both the same); every lane of the half receives the sums.
template <int DT>
__device__ __forceinline__ void q8_dot32(const unsigned char *row, int cols, const q8_tile &x, int nt, int lane,
                                         float *out) {
    constexpr int BYTES = DT == EB_DTYPE_Q8_0 ? 34 : 17;
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
            dw = e8m0_half(ld_u8(b));
            unsigned n = ld_u32(b + 1 + 4 * (l & 3)); // values 4l..: low nibbles (l < 4), else high ones
            w = mxfp4_x4(((l & 4) ? n >> 4 : n) & 0x0F0F0F0Fu);
        }
#pragma unroll
        for (int j = 0; j < DOT_TILE; j++)
            if (j < nt) {
                int xv = *(const int *)(xq + (long long)j * cols + 32 * k);
                acc[j] = q8_fma((float)dot4(w, xv, 0), q8_mul(dw, xd[j * nb + k]), acc[j]);
            }
    }
#pragma unroll
    for (int j = 0; j < DOT_TILE; j++) {
        float v = q8_add(acc[j], SHFL_XOR32(acc[j], 8));
        v = q8_add(v, SHFL_XOR32(v, 4));
        v = q8_add(v, SHFL_XOR32(v, 2));
        out[j] = q8_add(v, SHFL_XOR32(v, 1));
    }
}

// Q4_K, Q5_K and Q6_K against blocks of 256: the x86 kernels' arithmetic (cpu_kernels_avx2.c dot_q8 and
// cpu_kernels_x86.h). Per weight block two exact int32 sums: isum, every quant times its sub-block's scale times its
// activation, and msum, the minima (Q4_K, Q5_K) or the scales (Q6_K, whose quants are offset by 32) times the
// activations' sums of 16; the block's f32 value from them by the CPU's expression (k4_block_value, k16_block_value);
// the values added into one sum in block order. 32 lanes a row, four blocks at a time: lane 8i + g takes group g of
// block k0 + i (qfmt's groups), the block's 8 lanes add their partial sums by shuffles, then every lane adds the four
// values in order. Every lane receives the sums.
template <int DT>
__device__ __forceinline__ void q8_dotk(const unsigned char *row, int cols, const q8_tile &x, int nt, int lane,
                                        float *out) {
    constexpr int Q5 = DT == EB_DTYPE_Q5_K, BYTES = DT == EB_DTYPE_Q4_K ? 144 : DT == EB_DTYPE_Q5_K ? 176 : 210;
    int gi = (lane >> 3) & 3, g = lane & 7, nb = cols / 256;
    bool a16 = ((uintptr_t)row & 15) == 0;
    float sum[DOT_TILE] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < nb; k0 += 4) {
        int k = k0 + gi < nb ? k0 + gi : k0; // a lane past the last block reads the first of these (not added)
        const unsigned char *b = row + (long long)k * BYTES;
        int isum[DOT_TILE] = {0, 0, 0, 0}, msum[DOT_TILE] = {0, 0, 0, 0};
        float dd, dm = 0.0f;
        if (DT == EB_DTYPE_Q6_K) {
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
                    const short *sp = x.s16 + (long long)j * (cols / 16) + 16 * k + 2 * g;
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
                    const short *sp = x.s16 + (long long)j * (cols / 16) + 16 * k + 2 * g;
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
            v[j] = DT == EB_DTYPE_Q6_K ? q8_mul(q8_mul(dd, dx), (float)(isum[j] - 32 * msum[j]))
                                       : q8_sub(q8_mul(q8_mul(dd, dx), (float)isum[j]),
                                                q8_mul(q8_mul(dm, dx), (float)msum[j]));
        }
        for (int s = 0; s < 4 && k0 + s < nb; s++)
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++) sum[j] = q8_add(sum[j], SHFL_FROM32(v[j], 8 * s));
    }
#pragma unroll
    for (int j = 0; j < DOT_TILE; j++) out[j] = sum[j];
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
// h_rows[j] + i: eb_q8_act where both products are q8 ones (the CPU module's choice), else expert_act.
__device__ __forceinline__ void q8_gate_up_rows(const void *gate, const void *up, int gdt, int udt, const float *bias,
                                                const eb_rt_act &act, int hidden, int inter, int r0, int r1,
                                                const q8_tile &t, const float *const *xs, int nt, float *const *h_rows) {
    int lanes = q8_lanes(gdt) == 16 && q8_lanes(udt) == 16 ? 16 : 32; // else a 16-lane product runs twice a row
    bool q8act = q8_products(gdt) && q8_products(udt);
    q8_rows(r0, r1, lanes, [&](int i, bool live, int lane) {
        float gs[DOT_TILE], us[DOT_TILE];
        q8_product(gate, gdt, i, hidden, t, xs, nt, lane, gs);
        q8_product(up, udt, i, hidden, t, xs, nt, lane, us);
        if (live && (lane & (lanes - 1)) == 0)
#pragma unroll
            for (int j = 0; j < DOT_TILE; j++)
                if (j < nt) {
                    float g = biased(gs[j], bias, i), u = biased(us[j], bias, (long long)inter + i);
                    h_rows[j][i] = q8act ? eb_q8_act(act.kind, act.alpha, act.limit, g, u) : expert_act(act, g, u);
                }
    });
}

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
        q8_pass(xs, nt, hidden, need, t, [&](int n) {
            q8_gate_up_rows(s.gate, s.up, s.gate_dtype, s.up_dtype, s.bias, act, hidden, inter, r0, r1, t, xs, n, hr);
        });
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
        q8_pass(xs, nt, b.hidden, need, t, [&](int n) {
            q8_gate_up_rows(ex.gate, ex.up, ex.gate_dtype, ex.up_dtype, ex.bias, b.act, b.hidden, b.inter, r0, r1, t,
                            xs, n, hr);
        });
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
        int fuse = norm && norm->n <= DOT_TILE && !q8;
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
