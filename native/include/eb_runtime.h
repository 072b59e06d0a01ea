/* The runtime-module ABI: what a module (cpu, cuda, hip) exports and the core calls.
 *
 * A module is a shared library loaded with dlopen(RTLD_NOW | RTLD_LOCAL). It exports exactly one symbol,
 * EB_RUNTIME_ENTRY, a function returning a pointer to a const table. The core checks abi_version and
 * table_size before using anything else in it. Every function returns 0 on success or an eb_status, with
 * a message written into err (errlen bytes, always NUL-terminated).
 */
#ifndef EB_RUNTIME_H
#define EB_RUNTIME_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "expertbench.h"

#define EB_RUNTIME_ABI_VERSION 2u
#define EB_RUNTIME_ENTRY "eb_runtime_module"

#if defined(__GNUC__)
#define EB_EXPORT __attribute__((visibility("default")))
#else
#define EB_EXPORT
#endif

typedef struct {
    char name[EB_MAX_NAME];        /* local name, e.g. "EPYC 7B13 (2 threads)" */
    char kind[EB_MAX_NAME];        /* "cpu" or "gpu" */
    uint64_t memory_total;
    uint64_t memory_free;
    int32_t threads;
    int32_t host_addressable;      /* 1: device memory is ordinary host memory (weights can stay mapped) */
} eb_rt_device_info;

/* One expert's weights on its owner device (device pointers for a GPU). gate/up: inter x hidden,
 * down: hidden x inter, all of one dtype. */
typedef struct {
    const void *gate, *up, *down;
    int32_t dtype;
    int32_t expert_id;
} eb_rt_expert;

enum { EB_REDUCE_REFERENCE = 0, EB_REDUCE_OWNER_LOCAL = 1 };

/* The experts one owner runs for one MoE layer. The selected (token, expert) pairs are grouped by expert in
 * ascending expert id: pairs [pair_start[i], pair_start[i + 1]) belong to experts[i].
 *   x:          device memory, n_tokens rows of hidden floats (the staged input rows this owner needs)
 *   pair_token: device memory, n_pairs ints: the row of x each pair reads
 *   pair_weight:device memory, n_pairs floats: routing weights (used by owner_local only)
 *   y:          device memory. reference: n_pairs rows, the unweighted output of each pair.
 *               owner_local: n_tokens rows, sum over this owner's experts (ascending id) of weight * output.
 *   scratch:    device memory of scratch_bytes >= eb_rt_expert_scratch_bytes(n_pairs, hidden, inter)
 * Host-side arrays (experts, pair_start) are read during the call only. */
typedef struct {
    int32_t n_experts;
    const eb_rt_expert *experts;
    const int32_t *pair_start; /* host, n_experts + 1 */
    int32_t n_pairs, n_tokens, hidden, inter, mode;
    const float *x;
    const int32_t *pair_token;
    const float *pair_weight;
    float *y;
    void *scratch;
    size_t scratch_bytes;
} eb_rt_expert_batch;

static inline size_t eb_rt_expert_scratch_bytes(int64_t n_pairs, int64_t hidden, int64_t inter) {
    /* gathered rows, gate and up outputs, one down output row per pair (owner_local) */
    return (size_t)n_pairs * (size_t)(hidden + 2 * inter + hidden) * sizeof(float) + 256;
}

/* One matrix product of a group run together: y[t][r] = w[r] . x[t] for t < n, r < rows. */
typedef struct {
    const void *w;
    int32_t dtype;
    int64_t rows, cols;
    const float *x;
    int64_t n;
    float *y;
} eb_rt_matmul;

typedef struct eb_runtime_table {
    uint32_t abi_version;          /* EB_RUNTIME_ABI_VERSION */
    uint32_t table_size;           /* sizeof(eb_runtime_table) as the module was built */
    const char *name;              /* "cpu" */

    int (*init)(const eb_runtime_options *options, void **rt, char *err, size_t errlen);
    void (*shutdown)(void *rt);
    const char *(*kernel_variant)(void *rt);

    int (*device_count)(void *rt);
    int (*device_info)(void *rt, int dev, eb_rt_device_info *info, char *err, size_t errlen);

    /* Device memory. */
    int (*mem_alloc)(void *rt, int dev, size_t bytes, void **ptr, char *err, size_t errlen);
    void (*mem_free)(void *rt, int dev, void *ptr);
    /* Host memory for staging, pinned where the runtime can. */
    int (*host_alloc)(void *rt, size_t bytes, void **ptr, char *err, size_t errlen);
    void (*host_free)(void *rt, void *ptr);

    /* Copies between host and device memory. async = 1: queued on the device's stream, in order with the
     * device's other queued work; the source must stay valid until synchronize. */
    int (*copy_to_device)(void *rt, int dev, void *dst, const void *src, size_t bytes, int async, char *err,
                          size_t errlen);
    int (*copy_to_host)(void *rt, int dev, void *dst, const void *src, size_t bytes, int async, char *err,
                        size_t errlen);
    /* Wait until everything queued on the device has finished. */
    int (*synchronize)(void *rt, int dev, char *err, size_t errlen);

    /* y[t][r] = sum_c x[t][c] * w[r][c] for t < n, r < rows; w of dtype eb_dtype, x and y f32; synchronous,
     * host-addressable devices only. Each output element is computed with the same arithmetic whatever n is. */
    int (*matmul)(void *rt, int dev, const void *w, int dtype, int64_t rows, int64_t cols, const float *x,
                  int64_t n, float *y, char *err, size_t errlen);
    /* Several independent products in one pass over the device's threads (one hand-off instead of one each);
     * synchronous, host-addressable devices only. Results are those of matmul for each. */
    int (*matmul_multi)(void *rt, int dev, const eb_rt_matmul *tasks, int n_tasks, char *err, size_t errlen);
    /* The expert FFN down(silu(gate(x)) * up(x)) for an owner's pairs. async = 1: queued on the device;
     * async = 0: done when the call returns (the calling thread may take part). */
    int (*expert_ffn)(void *rt, int dev, const eb_rt_expert_batch *batch, int async, char *err, size_t errlen);
    /* Run fn(arg, begin, end) over [0, n) in chunks of `chunk` on the device's threads, the caller taking part;
     * synchronous. Host-addressable devices only (others return EB_ERR_UNSUPPORTED). */
    int (*parallel_for)(void *rt, int dev, void (*fn)(void *arg, int64_t begin, int64_t end), void *arg, int64_t n,
                        int64_t chunk);
    /* Nanoseconds the device has spent running kernels since init (monotonic). */
    uint64_t (*busy_ns)(void *rt, int dev);
} eb_runtime_table;

typedef const eb_runtime_table *(*eb_runtime_entry_fn)(void);

/* For modules: write a message into err (when given) and return status. */
static inline int eb_rt_fail(char *err, size_t errlen, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static inline int eb_rt_fail(char *err, size_t errlen, int status, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return status;
}

#endif
