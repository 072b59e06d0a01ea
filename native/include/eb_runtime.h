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

#define EB_RUNTIME_ABI_VERSION 3u
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

/* ---- the primary's forward pass on a device that cannot read host memory (a GPU) ----------------------
 *
 * Every pointer is device memory of that device unless said otherwise. Every call is queued on the device's
 * stream in order with its other work and returns without waiting, so that the core can capture a decode step
 * into a graph; the core synchronizes (and reads results back) itself. Positions are read from device memory
 * (pos: the position of the first of the n rows) so that one captured step serves every position. */

/* Attention of n new rows at positions *pos .. *pos + n - 1 for one layer. */
typedef struct {
    float *q;                         /* n rows of n_heads * head_dim; scratch afterwards */
    float *k;                         /* n rows of n_kv_heads * head_dim; scratch afterwards */
    const float *v;                   /* n rows of n_kv_heads * head_dim */
    const float *q_norm, *k_norm;     /* head_dim each (Qwen3's per-head RMSNorm) */
    const float *rope_cos, *rope_sin; /* n_ctx rows of head_dim / 2 */
    float *k_cache, *v_cache;         /* this layer's: n_ctx rows of n_kv_heads * head_dim */
    const int32_t *pos;
    int32_t n, n_heads, n_kv_heads, head_dim, n_ctx;
    float eps;
    float *out; /* n rows of n_heads * head_dim */
} eb_rt_attention;

/* The experts of one MoE layer routed on the device. experts: device memory, n_experts entries, indexed by
 * expert id; gate == NULL marks an expert this device does not own (its outputs come in `foreign`).
 *   reference:   x[t] += sum over t's top_k experts in ascending id of weight * output, the sum begun at 0.
 *   owner_local: x[t] += (that sum over the experts this device owns) + foreign[t].
 * foreign: reference: n * top_k rows of hidden (row t * top_k + k: the unweighted output of pair (t, k) when
 * its expert is not owned); owner_local: n rows (the other owners' weighted sums); NULL when every selected
 * expert is owned. pair_out (n * top_k * hidden) and h (n * top_k * inter) are scratch.
 * stats (nullable, 2 entries): += experts run, rows computed. */
typedef struct {
    const eb_rt_expert *experts;
    int32_t n_experts, top_k, n, hidden, inter, mode;
    const float *xn;
    const int32_t *topk_id;
    const float *topk_w;
    const float *foreign;
    float *pair_out, *h;
    float *x;
    unsigned long long *stats;
} eb_rt_moe;

/* RMSNorm of rows before a product: xn[r] = w * x[r] / rms(x[r]), written, and the products read xn. */
typedef struct {
    const float *x, *w;
    float *xn;
    int64_t n, dim;
    float eps;
} eb_rt_norm;

/* A MoE layer's routing: xn = RMSNorm(x) (written), logits = router . xn (scratch), then per row the softmax over
 * n_experts, the top_k (ties to the lower id) renormalised when norm_topk; hits (nullable, n_experts entries)
 * += one per selection. */
typedef struct {
    eb_rt_norm norm;
    const void *router;
    int32_t router_dtype, n_experts, top_k, norm_topk;
    float *logits;
    int32_t *topk_id;
    float *topk_w;
    unsigned long long *hits;
} eb_rt_route;

typedef struct {
    /* Whether the module's kernels take a model of this shape (nullable: any): checked at load, before any
     * weight is uploaded, so that a limit is reported at once and not at the first evaluation. */
    int (*check_model)(void *rt, int dev, const eb_model_config *cfg, char *err, size_t errlen);
    /* x[t] = row ids[t] of the embedding table (dtype), n rows of hidden */
    int (*embed)(void *rt, int dev, const void *table, int dtype, int64_t hidden, const int32_t *ids, int64_t n,
                 float *x, char *err, size_t errlen);
    /* The products of matmul (y = w x per task), queued; accumulate = 1: y += w x instead. norm (nullable):
     * first xn = RMSNorm(x), and every task's x is norm->xn (a module may fuse the two). */
    int (*matmul)(void *rt, int dev, const eb_rt_norm *norm, const eb_rt_matmul *tasks, int n_tasks, int accumulate,
                  char *err, size_t errlen);
    /* y[r][i] += b[i] (broadcast = 1) or b[r][i] (broadcast = 0), rows r < n of dim */
    int (*add)(void *rt, int dev, float *y, const float *b, int64_t n, int64_t dim, int broadcast, char *err,
               size_t errlen);
    /* g = silu(g) * u, n elements */
    int (*silu_mul)(void *rt, int dev, float *g, const float *u, int64_t n, char *err, size_t errlen);
    /* q/k norm, rotary embedding, k and v into the cache, then causal attention into out. */
    int (*attention)(void *rt, int dev, const eb_rt_attention *a, char *err, size_t errlen);
    int (*route)(void *rt, int dev, const eb_rt_route *r, char *err, size_t errlen);
    int (*moe)(void *rt, int dev, const eb_rt_moe *b, char *err, size_t errlen);
    /* Graphs (all four or none: the core then queues each step's work anew). Between graph_begin and graph_end the
     * calling thread's work queued on dev is recorded instead of run; other threads' work is never recorded (a
     * GPU module makes them wait, hostsim runs it); graph_launch queues a recorded step. graph_end with
     * graph == NULL abandons the recording. */
    int (*graph_begin)(void *rt, int dev, char *err, size_t errlen);
    int (*graph_end)(void *rt, int dev, void **graph, char *err, size_t errlen);
    int (*graph_launch)(void *rt, int dev, void *graph, char *err, size_t errlen);
    void (*graph_free)(void *rt, int dev, void *graph);
} eb_rt_primary_ops;

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
    /* The primary's forward pass on devices that are not host-addressable; NULL where the module cannot run
     * it (host-addressable devices run the core's own forward pass). */
    const eb_rt_primary_ops *primary;
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
