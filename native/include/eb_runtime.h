/* The runtime-module ABI: what a module (cpu, cuda, hip) exports and the core calls.
 *
 * A module is a shared library loaded with dlopen(RTLD_NOW | RTLD_LOCAL). It exports exactly one symbol,
 * EB_RUNTIME_ENTRY, a function returning a pointer to a const table. The core checks abi_version and
 * table_size before using anything else in it. Every function returns 0 on success or an eb_status, with
 * a message written into err (errlen bytes, always NUL-terminated). The core checks every weight's format and
 * shape once, at load: the operations take them as given.
 */
#ifndef EB_RUNTIME_H
#define EB_RUNTIME_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "expertbench.h"

/* 13: a matmul of no tasks is the norm alone (a module of 12 fused the norm into its tasks and skipped it) */
#define EB_RUNTIME_ABI_VERSION 13u
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
    int32_t queued_ops;            /* 1: the forward operations return before they have run (a GPU's stream);
                                      0: they run on the calling thread (a CPU device, hostsim) */
    uint32_t formats;              /* the weight formats its kernels read: bit (1 << dtype) per eb_dtype. The core
                                      places no weight of another format there (a clear error at load or placement) */
    uint32_t precisions;           /* the activation precisions its kernels run: bit (1 << precision) per
                                      eb_precision. The core runs no step in another precision on it (a clear error,
                                      never the operation reading the precision it has instead) */
    uint32_t q8_formats;           /* of formats, those it runs in the q8 precision as the cpu module does: integer
                                      products against activations quantized per the format's q8 block where the
                                      format table gives one, f32 products where it gives none. The core runs no q8
                                      step with a weight of another format there (a clear error naming the weight),
                                      never the f32 products under the q8 precision's name */
    uint32_t kv_formats;           /* the KV cache formats its attention keeps besides f32: bit (1 << dtype) of
                                      EB_DTYPE_F16 / EB_DTYPE_BF16 (0: f32 only). The core refuses a context with
                                      another cache format on a primary without it */
} eb_rt_device_info;

/* A weight's scale companion (a format whose EB_FORMATS row has a scale block): f32 scales, one per block of rows x
 * cols values of the weight, row-major over its grid of ceil(weight rows / rows) x ceil(weight cols / cols); the value
 * at (r, c) is the format's value times data[(r / rows) * ceil(weight cols / cols) + c / cols]. In the owner's memory
 * beside the weight. data NULL (rows = cols = 0): none, as for every format without a scale block. The core binds the
 * block of the format's row, so a module may read the block from its table instead. */
typedef struct {
    const float *data;
    int32_t rows, cols;
} eb_rt_scale;

/* One expert's weights on its owner device (device pointers for a GPU). gate/up: inter x hidden,
 * down: hidden x inter, each in its own format (a GGUF Q4_K_M file stores gate and up as Q4_K, down as Q6_K in some
 * layers). bias (gpt-oss; NULL: none): inter gate biases, inter up biases, hidden down biases, f32, each added to its
 * product before anything else reads it. */
typedef struct {
    const void *gate, *up, *down;
    int32_t gate_dtype, up_dtype, down_dtype;
    int32_t expert_id;
    const float *bias;
    eb_rt_scale gate_scale, up_scale, down_scale;
} eb_rt_expert;

/* The experts' activation between the gate/up products and down:
 *   EB_ACT_SILU:        silu(g) * u
 *   EB_ACT_SWIGLU_OAI:  gpt-oss's clamped SwiGLU: g' = min(g, limit), u' = clamp(u, -limit, limit),
 *                       (u' + 1) * g' * sigmoid(alpha * g')
 *   EB_ACT_SILU_CLAMP:  DeepSeek-V4's: silu(g') * u' with g' and u' clamped as above */
enum { EB_ACT_SILU = 0, EB_ACT_SWIGLU_OAI = 1, EB_ACT_SILU_CLAMP = 2 };
typedef struct {
    int32_t kind;
    float alpha, limit;
} eb_rt_act;

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
    int32_t precision; /* eb_precision */
    eb_rt_act act;
} eb_rt_expert_batch;

static inline size_t eb_rt_expert_scratch_bytes(int64_t n_pairs, int64_t hidden, int64_t inter) {
    /* gathered rows, gate and up outputs, one down output row per pair (owner_local) */
    return (size_t)n_pairs * (size_t)(hidden + 2 * inter + hidden) * sizeof(float) + 256;
}

/* One matrix product of a group run together: y[t][r] = w[r] . x[t] for t < n, r < rows (w: rows of
 * eb_row_bytes(dtype, cols) bytes, its values times scale's where its format has a scale companion). */
typedef struct {
    const void *w;
    int32_t dtype;
    int64_t rows, cols;
    const float *x;
    int64_t n;
    float *y;
    int32_t precision; /* eb_precision: how x meets a quantized w (one the device's info lists) */
    eb_rt_scale scale;
} eb_rt_matmul;

/* ---- the forward pass: the primary's operations ----------------------------------------------------------
 *
 * A module that can be the primary device implements these; the core's one forward driver per model family
 * calls them whatever the primary is (a CPU device's "device memory" is host memory: its uploads cost nothing).
 * Every pointer is memory of that device. A call is queued on the device in order with its other work and may
 * return before it has run (a GPU) or after (a CPU device runs it on the calling thread); the core waits through
 * copies, events and synchronize. Positions are read from device memory (pos: the position of the first of the n
 * rows) so that one recorded step serves every position. */

/* Attention of n new rows at positions *pos .. *pos + n - 1 for one layer: grouped-query attention with an
 * optional per-head RMSNorm of q and k (Qwen3) and rotate-half RoPE; k and v go into this layer's cache first.
 * Position p's cache row is p % n_cache (n_cache = n_ctx: row p; a sliding-window layer's cache is a ring of at least
 * window + n - 1 rows). Row t (position p) attends to positions max(0, p - window + 1) .. p (window 0: 0 .. p); with
 * sinks (gpt-oss), head h's softmax has one more logit, sinks[h], whose share goes nowhere:
 * out = sum_j e^(s_j - m) v_j / (sum_j e^(s_j - m) + e^(sinks[h] - m)), m the largest of the s_j and sinks[h]. */
typedef struct {
    float *q;                         /* n rows of n_heads * head_dim; scratch afterwards */
    float *k;                         /* n rows of n_kv_heads * head_dim; scratch afterwards */
    const float *v;                   /* n rows of n_kv_heads * head_dim */
    const float *q_norm, *k_norm;     /* head_dim each, or both NULL: no per-head norm */
    const float *rope_cos, *rope_sin; /* n_ctx rows of head_dim / 2 */
    void *k_cache, *v_cache;          /* this layer's: n_cache rows of n_kv_heads * head_dim values of kv_dtype */
    const int32_t *pos;
    int32_t n, n_heads, n_kv_heads, head_dim, n_ctx;
    float eps;
    float *out; /* n rows of n_heads * head_dim */
    const float *sinks; /* n_heads, or NULL */
    int32_t window;     /* 0: every position */
    int32_t n_cache;    /* rows of this layer's k_cache and v_cache */
    int32_t kv_dtype;   /* the caches' format: EB_DTYPE_F32, or F16 / BF16 where the module's kv_formats has it */
} eb_rt_attention;

/* The routed experts of one MoE layer that the primary owns, and the combination of every selected expert's
 * output. experts: device memory, n_experts entries indexed by expert id; gate == NULL marks an expert another
 * device owns. pair_out: n * top_k rows of hidden, row t * top_k + k holding the unweighted output of pair
 * (t, k) when its expert is owned; h (n * top_k * inter) is scratch.
 *   EB_MOE_EXPERTS: compute the owned pairs' rows of pair_out (nothing else is written).
 *   EB_MOE_COMBINE: reference:   x[t] += sum over t's top_k experts in ascending id of weight * output, the sum
 *                                begun at 0; an owned pair's output from pair_out, another's from foreign (row
 *                                t * top_k + k, NULL when every selected expert is owned).
 *                   owner_local: x[t] += (that sum over the owned experts) + foreign[t] (n rows: the other
 *                                owners' weighted sums; NULL when there are none).
 *   EB_MOE_ALL:     EXPERTS then COMBINE, which a module may fuse.
 * stats (nullable, 2 entries): += experts run, rows computed (EXPERTS and ALL). */
enum { EB_MOE_ALL = 0, EB_MOE_EXPERTS = 1, EB_MOE_COMBINE = 2 };
typedef struct {
    const eb_rt_expert *experts;
    int32_t n_experts, top_k, n, hidden, inter, mode, phase;
    const float *xn;
    const int32_t *topk_id;
    const float *topk_w;
    const float *foreign;
    float *pair_out, *h;
    float *x;
    unsigned long long *stats;
    int32_t precision; /* eb_precision */
    eb_rt_act act;
} eb_rt_moe;

/* RMSNorm of rows before a product: xn[r] = w * x[r] / rms(x[r]), written, and the products read xn. */
typedef struct {
    const float *x, *w;
    float *xn;
    int64_t n, dim;
    float eps;
} eb_rt_norm;

/* How a router turns a row of logits into top_k choices and their weights. */
enum {
    EB_ROUTE_SOFTMAX_TOPK = 0, /* softmax over every expert, top_k (ties to the lower id), renormalised when norm_topk */
    EB_ROUTE_SIGMOID_GROUP = 1,/* DeepSeek-V3's: scores sigmoid(logit); for the choice only, score + bias, the experts
                                  in n_group equal groups, a group's value the sum of its two best, the topk_group best
                                  groups kept (the others' experts count 0), top_k of those (ties to the lower id);
                                  weights the chosen scores, renormalised when norm_topk, times scale */
    EB_ROUTE_TOPK_SOFTMAX = 2  /* gpt-oss's: logits + bias (the router's own bias; NULL: none), their top_k (ties to
                                  the lower id), weights the softmax over the chosen logits */
};

/* A MoE layer's routing: xn = RMSNorm(x) (written), logits = router . xn (scratch), then per row the choice that
 * `scoring` names; hits (nullable, n_experts entries) += one per selection. */
typedef struct {
    eb_rt_norm norm;
    const void *router;
    int32_t router_dtype, n_experts, top_k, scoring, norm_topk;
    float *logits;
    int32_t *topk_id;
    float *topk_w;
    unsigned long long *hits;
    const float *bias;          /* SIGMOID_GROUP: n_experts, added for the choice only; TOPK_SOFTMAX: to the logits */
    int32_t n_group, topk_group; /* EB_ROUTE_SIGMOID_GROUP */
    float scale;                /* EB_ROUTE_SIGMOID_GROUP: the weights' factor */
    eb_rt_scale router_scale;   /* the router's scale companion (none: data NULL) */
} eb_rt_route;

/* Multi-head latent attention (DeepSeek-V3's MLA) of n new rows at positions *pos .. *pos + n - 1 for one layer, in
 * the absorbed form: the cache holds per position the normalised latent (rank values) and the rotated rope key
 * (rope values), shared by every head. Per head h the query's first nope values meet the latent through k_b (the
 * key half of kv_b_proj, transposed: rank rows of nope), its last rope values meet the rope key after rotation, and
 * the latent mix of the softmax goes out through v_b (v_dim rows of rank). kv's rows go into the cache first. */
typedef struct {
    float *q;                         /* n rows of n_heads * (nope + rope); scratch afterwards */
    float *kv;                        /* n rows of rank + rope: the latent and the rope key before norm and rotation */
    const float *kv_norm;             /* rank: the latent's RMSNorm weight */
    const void *k_b;                  /* head h's rank rows of nope values start at row h * rank (k_b and v_b are in
                                         formats without a scale companion: the core dequantizes a scaled kv_b) */
    const void *v_b;                  /* head h's v_dim rows of rank values start at row h * v_b_head_rows */
    int32_t k_b_dtype, v_b_dtype;
    int64_t v_b_head_rows;
    const float *rope_cos, *rope_sin; /* n_ctx rows of rope / 2 */
    float *cache;                     /* this layer's: n_ctx rows of rank + rope */
    const int32_t *pos;
    int32_t n, n_heads, nope, rope, v_dim, rank, n_ctx, interleave;
    float eps, scale;
    float *out;                       /* n rows of n_heads * v_dim */
} eb_rt_mla;

/* The sizes a model asks of a primary's kernels (checked at load, before any weight is uploaded). */
typedef struct {
    int32_t hidden, head_dim, n_heads, n_kv_heads, n_experts, top_k, inter, max_positions;
} eb_rt_model_shape;

typedef struct {
    /* Whether the kernels take a model of this shape: a limit is reported at load, not at the first step. */
    int (*check_model)(void *rt, int dev, const eb_rt_model_shape *shape, char *err, size_t errlen);
    /* x[t] = row ids[t] of the embedding table (dtype; its values times scale's where its format has a scale
     * companion), n rows of hidden */
    int (*embed)(void *rt, int dev, const void *table, int dtype, const eb_rt_scale *scale, int64_t hidden,
                 const int32_t *ids, int64_t n, float *x, char *err, size_t errlen);
    /* The products of tasks (y = w x per task); accumulate = 1: y += w x (the product first, then one addition per
     * element). norm (nullable): first xn = RMSNorm(x), and every task's x is norm->xn (a module may fuse them);
     * n_tasks 0 (tasks NULL): the norm alone. */
    int (*matmul)(void *rt, int dev, const eb_rt_norm *norm, const eb_rt_matmul *tasks, int n_tasks, int accumulate,
                  char *err, size_t errlen);
    /* y[r][i] += b[i] (broadcast = 1) or b[r][i] (broadcast = 0), rows r < n of dim */
    int (*add)(void *rt, int dev, float *y, const float *b, int64_t n, int64_t dim, int broadcast, char *err,
               size_t errlen);
    /* g = silu(g) * u, n elements */
    int (*silu_mul)(void *rt, int dev, float *g, const float *u, int64_t n, char *err, size_t errlen);
    int (*attention)(void *rt, int dev, const eb_rt_attention *a, char *err, size_t errlen);
    int (*route)(void *rt, int dev, const eb_rt_route *r, char *err, size_t errlen);
    int (*moe)(void *rt, int dev, const eb_rt_moe *b, char *err, size_t errlen);
} eb_rt_forward_ops;

/* Extensions: the operations only some families need, each a named table with its own version, beside the common
 * ones above. A module lists those it has (eb_runtime_table.extensions); a family names those it needs (the core's
 * eb_family.extensions), and a load on a primary whose module lacks one is refused, naming both. Adding a family's
 * operation is a new extension in the modules that run it: the ABI version and the other modules stay as they are.
 * A change of an extension's table is a new version of it. */
typedef struct {
    const char *name; /* "mla" */
    uint32_t version; /* of its table's layout */
} eb_rt_extension_id;

typedef struct {
    eb_rt_extension_id id;
    const void *ops; /* the table: eb_rt_mla_ops for "mla" version 1 */
} eb_rt_extension;

/* "mla" 1: multi-head latent attention (DeepSeek-V3's), eb_rt_mla above. */
#define EB_EXT_MLA "mla"
#define EB_EXT_MLA_VERSION 1u
typedef struct {
    int (*mla)(void *rt, int dev, const eb_rt_mla *a, char *err, size_t errlen);
} eb_rt_mla_ops;

/* "deepseek_v4" 1: DeepSeek-V4's own operations. Every pointer is memory of the device; positions and token ids are
 * read from it (pos: the position of the first of the n rows) so that one recorded step serves every position.
 *
 * hc, the mHC residual streams (streams: n rows of hc values of hidden each; mix: n rows of (2 + hc) * hc):
 *   EB_HC_EXPAND: every stream of row t is x[t].
 *   EB_HC_PRE:    f = fn . rmsnorm(streams[t]) (no weight, norm_eps), split into pre [hc], post [hc], comb [hc][hc];
 *                 pre = sigmoid(scale[0] f_pre + base_pre) + eps, post = 2 sigmoid(scale[1] f_post + base_post),
 *                 comb = softmax over each row of (scale[2] f_comb + base_comb) + eps, then its columns divided by
 *                 their sums (+ eps), then sinkhorn_iters - 1 times its rows then its columns; x[t] = sum_j pre_j
 *                 streams[t][j]; post and comb into mix[t].
 *   EB_HC_POST:   streams[t][k] = post_k x[t] + sum_j comb[j][k] streams[t][j] (x: the sublayer's output).
 *   EB_HC_HEAD:   pre = sigmoid(scale[0] (fn . rmsnorm(streams[t])) + base) + eps (hc values), x[t] = sum_j pre_j
 *                 streams[t][j]. */
enum { EB_HC_EXPAND = 0, EB_HC_PRE = 1, EB_HC_POST = 2, EB_HC_HEAD = 3 };
typedef struct {
    int32_t kind, n, hc, hidden, sinkhorn_iters;
    float *streams, *x, *mix;
    const float *fn, *base, *scale;
    float eps, norm_eps;
} eb_rt_hc;

/* One V4 layer's attention of n new rows at positions *pos .. *pos + n - 1, between its products and its output
 * projection. The layer's state (cache: n_ctx rows of eb_v4_cache_row floats, row p the position's) holds per
 * position its key=value row and its compressors' projections, and per compressed entry w (in row w) the entry: every
 * entry is a function of the rows of its window, so a context truncated and evaluated again computes the same bits.
 * q heads get an RMSNorm without weight (eps), kv the norm kv_norm; both the RoPE of interleaved pairs on their last
 * rope_dim channels (inv_freq: the layer's RoPE). A compressed layer (kind EB_V4_CSA / EB_V4_HCA, rate positions per
 * entry) makes entry w when position (w + 1) rate - 1 arrives: per channel the softmax over its slots of gate + ape
 * weighs kv, then cmp_norm and the compress RoPE at w rate (CSA: 2 rate slots, the first halves of window w - 1's rows
 * and the second halves of window w's; the indexer's compressor alike at idx_dim). Row t at position p attends to
 * the window's keys (p - window < s <= p), then HCA: every entry w < (p + 1) / rate; CSA: the idx_topk of those with
 * the best index score sum_h idx_w[t][h] / sqrt(idx_heads) relu(idx_q[t][h] . entry) / sqrt(idx_dim) (idx_q rotated by
 * the compress RoPE at p); each head's softmax scale * q.k with its sink; the output's last rope_dim channels rotated
 * back (the inverse rotation at p). */
typedef struct {
    float *q;                       /* n rows of n_heads * head_dim: q_b's output, scratch afterwards */
    float *kv;                      /* n rows of head_dim: kv_proj's output, scratch afterwards */
    const float *kv_norm, *sinks;   /* head_dim, n_heads */
    const float *inv_freq;          /* rope_dim / 2: the layer's RoPE */
    const float *compress_inv_freq; /* rope_dim / 2: the compressed entries' and the indexer's */
    int32_t kind, rate;
    const float *cmp_kv, *cmp_gate; /* n rows of (CSA 2, HCA 1) * head_dim */
    const float *cmp_ape, *cmp_norm;/* rate rows of that width, head_dim */
    const float *idx_kv, *idx_gate; /* CSA: n rows of 2 * idx_dim */
    const float *idx_ape, *idx_norm;/* rate rows of 2 * idx_dim, idx_dim */
    float *idx_q;                   /* n rows of idx_heads * idx_dim, scratch afterwards */
    const float *idx_w;             /* n rows of idx_heads */
    float *cache;
    const int32_t *pos;
    int32_t n, n_heads, head_dim, rope_dim, window, n_ctx, idx_heads, idx_dim, idx_topk;
    float eps, scale;
    float *out;                     /* n rows of n_heads * head_dim */
} eb_rt_v4_attention;

/* The floats of one position's row of a V4 layer's state (eb_rt_v4_attention.cache). */
static inline int64_t eb_v4_cache_row(int64_t head_dim, int64_t idx_dim) { return 6 * head_dim + 5 * idx_dim; }

/* The grouped output projection: y[t][g * rank + r] = w[g * rank + r] . x[t][g * in .. (g + 1) * in), w groups * rank
 * rows of in values (a format without a scale companion). */
typedef struct {
    const void *w;
    int32_t dtype, groups, in, rank;
    int64_t n;
    const float *x;
    float *y;
} eb_rt_grouped;

/* A V4 MoE layer's routing: xn = RMSNorm(x) (written; then x is set to 0, where the shared and routed experts' outputs
 * are added), logits = router . xn, scores sqrt(softplus(logits)); the choice: tid2eid's row of the token id
 * (ids[t]; hash layers: vocab rows of top_k expert ids, as floats) or the top_k of scores + bias (ties to the lower
 * id); weights the chosen scores over their sum (+ 1e-20) times scale; hits (nullable) += one per selection. */
typedef struct {
    eb_rt_norm norm;
    const void *router;
    int32_t router_dtype, n_experts, top_k;
    eb_rt_scale router_scale;
    float *logits;
    int32_t *topk_id;
    float *topk_w;
    unsigned long long *hits;
    const float *bias, *tid2eid;
    const int32_t *ids;
    float scale;
    int32_t hash_k; /* tid2eid's ids per token id (top_k may be fewer: the first top_k of them) */
} eb_rt_v4_route;

#define EB_EXT_DEEPSEEK_V4 "deepseek_v4"
#define EB_EXT_DEEPSEEK_V4_VERSION 1u
typedef struct {
    int (*hc)(void *rt, int dev, const eb_rt_hc *a, char *err, size_t errlen);
    int (*attention)(void *rt, int dev, const eb_rt_v4_attention *a, char *err, size_t errlen);
    int (*grouped)(void *rt, int dev, const eb_rt_grouped *a, char *err, size_t errlen);
    int (*route)(void *rt, int dev, const eb_rt_v4_route *r, char *err, size_t errlen);
    /* g = silu(min(g, limit)) * clamp(u, -limit, limit), n elements (the shared expert's activation) */
    int (*swiglu)(void *rt, int dev, float *g, const float *u, int64_t n, float limit, char *err, size_t errlen);
} eb_rt_v4_ops;

/* Graphs: between begin and end the calling thread's work queued on dev is recorded instead of run; other threads'
 * work is never recorded (a GPU module makes them wait, hostsim runs it); launch queues a recorded step. end with
 * graph == NULL abandons the recording. */
typedef struct {
    int (*begin)(void *rt, int dev, char *err, size_t errlen);
    int (*end)(void *rt, int dev, void **graph, char *err, size_t errlen);
    int (*launch)(void *rt, int dev, void *graph, char *err, size_t errlen);
    void (*free)(void *rt, int dev, void *graph);
} eb_rt_graph_ops;

/* The table. Its groups: identity and devices, memory and copies, completion events and the experts' FFN are
 * required of every module; `forward` (the primary's operations) and `graphs` are capability groups, NULL where
 * the module has none, and complete where it has them. */
typedef struct eb_runtime_table {
    uint32_t abi_version;          /* EB_RUNTIME_ABI_VERSION */
    uint32_t table_size;           /* sizeof(eb_runtime_table) as the module was built */
    const char *name;              /* "cpu" */

    /* identity and devices */
    int (*init)(const eb_runtime_options *options, void **rt, char *err, size_t errlen);
    void (*shutdown)(void *rt);
    const char *(*kernel_variant)(void *rt);
    int (*device_count)(void *rt);
    int (*device_info)(void *rt, int dev, eb_rt_device_info *info, char *err, size_t errlen);
    /* Nanoseconds the device has spent running kernels since init (monotonic). */
    uint64_t (*busy_ns)(void *rt, int dev);

    /* Device memory, and host memory for staging (pinned where the runtime can). */
    int (*mem_alloc)(void *rt, int dev, size_t bytes, void **ptr, char *err, size_t errlen);
    void (*mem_free)(void *rt, int dev, void *ptr);
    int (*host_alloc)(void *rt, size_t bytes, void **ptr, char *err, size_t errlen);
    void (*host_free)(void *rt, void *ptr);
    /* Copies between host and device memory. async = 1: queued on the device in order with its other queued work;
     * the source must stay valid until it has run (an event recorded after it, or synchronize). */
    int (*copy_to_device)(void *rt, int dev, void *dst, const void *src, size_t bytes, int async, char *err,
                          size_t errlen);
    int (*copy_to_host)(void *rt, int dev, void *dst, const void *src, size_t bytes, int async, char *err,
                        size_t errlen);
    /* Wait until everything queued on the device has finished. */
    int (*synchronize)(void *rt, int dev, char *err, size_t errlen);

    /* Completion events: record queues one on the device after the work queued so far; wait blocks the calling
     * thread until the device has reached it; time gives when it did, in nanoseconds of the host's
     * CLOCK_MONOTONIC (for the trace), once waited for. An event is re-recorded freely. */
    int (*event_create)(void *rt, int dev, void **event, char *err, size_t errlen);
    void (*event_destroy)(void *rt, int dev, void *event);
    int (*event_record)(void *rt, int dev, void *event, char *err, size_t errlen);
    int (*event_wait)(void *rt, int dev, void *event, char *err, size_t errlen);
    int (*event_time)(void *rt, int dev, void *event, uint64_t *ns, char *err, size_t errlen);

    /* The expert FFN down(act(gate(x), up(x))) for an owner's pairs (biases added where an expert has them). async = 1: queued on the device;
     * async = 0: done when the call returns (the calling thread may take part). */
    int (*expert_ffn)(void *rt, int dev, const eb_rt_expert_batch *batch, int async, char *err, size_t errlen);

    const eb_rt_forward_ops *forward; /* NULL: the module's devices cannot be the primary */
    const eb_rt_graph_ops *graphs;    /* NULL: every step is queued anew */
    const eb_rt_extension *extensions; /* the primary's extensions, ended by an entry whose name is NULL; NULL: none */
} eb_runtime_table;

/* The table of extension id (that name at that version) in a module, or NULL. */
static inline const void *eb_rt_find_extension(const eb_runtime_table *t, eb_rt_extension_id id) {
    for (const eb_rt_extension *e = t->extensions; e && e->id.name; e++)
        if (strcmp(e->id.name, id.name) == 0 && e->id.version == id.version && e->ops)
            return e->ops;
    return NULL;
}

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
