/* The loaded model: plain structs in the shape of the architecture. */
#ifndef EB_MODEL_H
#define EB_MODEL_H

#include <stdatomic.h>
#include <time.h>

#include "eb_formats.h"
#include "eb_internal.h"

typedef struct {
    const void *data; /* rows of cols values, each eb_row_bytes(dtype, cols) bytes */
    int dtype;
    int64_t rows;
    int64_t cols;
    eb_rt_scale scale; /* its scale companion where its format has one (EB_FORMATS), in the same memory as data */
} eb_weight;

/* Device allocations are carved into pieces aligned to this many bytes (what GPU vector loads need). */
#define EB_ALIGN 256
static inline size_t eb_align(size_t n) { return (n + EB_ALIGN - 1) / EB_ALIGN * EB_ALIGN; }

static inline uint64_t eb_weight_bytes(const eb_weight *w) {
    return (uint64_t)w->rows * eb_row_bytes(w->dtype, w->cols);
}

/* Bytes of a weight's scale companion (0 without). */
static inline uint64_t eb_scale_bytes(const eb_weight *w) {
    if (!w->scale.data || w->scale.rows <= 0 || w->scale.cols <= 0) return 0;
    uint64_t gr = (uint64_t)((w->rows + w->scale.rows - 1) / w->scale.rows);
    return gr * (uint64_t)((w->cols + w->scale.cols - 1) / w->scale.cols) * sizeof(float);
}

/* Row r of a weight as f32, its scales applied: the values its products compute with. */
static inline void eb_weight_row_f32(const eb_weight *w, int64_t r, float *out) {
    const unsigned char *row = (const unsigned char *)w->data + (size_t)r * eb_row_bytes(w->dtype, w->cols);
    eb_dequantize_scaled_row(row, w->dtype, eb_scale_row(w->scale.data, w->dtype, r, w->cols), w->cols, out);
}

typedef struct {
    eb_weight gate, up, down; /* where the owner reads them: the mapped file, or the owner's copy */
    const void *host_gate, *host_up, *host_down; /* always the mapped file (or the model's packed copy) */
    const float *host_scale[3]; /* gate's, up's and down's scale companions there (NULL: none) */
    const float *bias, *host_bias; /* gpt-oss: gate, up and down biases (eb_rt_expert), where the owner reads them and
                                      in host memory; NULL without */
    void *dev_mem;            /* the owner's copy (gate | up | down | bias), NULL when it reads the host's */
    int owner;                /* engine device index */
} eb_expert;

/* The experts' activation a config asks for. */
static inline eb_rt_act eb_model_act(const eb_model_config *c) {
    if (c->swiglu_limit > 0.0 && c->arch == EB_ARCH_DEEPSEEK_V4)
        return (eb_rt_act){EB_ACT_SILU_CLAMP, 0.0f, (float)c->swiglu_limit};
    if (c->swiglu_limit > 0.0) return (eb_rt_act){EB_ACT_SWIGLU_OAI, (float)c->swiglu_alpha, (float)c->swiglu_limit};
    return (eb_rt_act){EB_ACT_SILU, 0.0f, 0.0f};
}

/* An expert's bytes: its weights, their scale companions and its biases. */
static inline uint64_t eb_expert_bytes(const eb_expert *x) {
    uint64_t bias = x->host_bias || x->bias ? (uint64_t)(2 * x->gate.rows + x->down.rows) * sizeof(float) : 0;
    return eb_weight_bytes(&x->gate) + eb_weight_bytes(&x->up) + eb_weight_bytes(&x->down) + eb_scale_bytes(&x->gate) +
           eb_scale_bytes(&x->up) + eb_scale_bytes(&x->down) + bias;
}

/* An expert as its owner's kernels take it (gate NULL: another device owns it). */
static inline eb_rt_expert eb_rt_expert_of(const eb_expert *x, int e, int own) {
    return (eb_rt_expert){own ? x->gate.data : NULL, own ? x->up.data : NULL, own ? x->down.data : NULL,
                          x->gate.dtype, x->up.dtype, x->down.dtype, e, own ? x->bias : NULL,
                          x->gate.scale, x->up.scale, x->down.scale};
}

/* A layer's weights and vectors that the primary reads, one line each: the common core, then what a family adds. A
 * family that needs another adds its line here; the layer (eb_layer), the primary's view of it (eb_dev_layer), the
 * upload (primary.c) and the release (model.c) follow from these lists. EB_LAYER_VECTORS(X, c): X(field, length),
 * the length an expression of the config c (f32 vectors, owned by the layer). NULL or empty: the layer has none. */
#define EB_LAYER_WEIGHTS(X)                                                                                    \
    X(q) X(k) X(v) X(o)          /* grouped-query attention */                                                 \
    X(gate) X(up) X(down)        /* a dense layer's MLP */                                                     \
    X(router)                    /* num_experts x hidden (MoE layers) */                                       \
    X(sh_gate) X(sh_up) X(sh_down) /* the shared experts, as one FFN (MoE layers) */                           \
    X(q_a) X(q_b) X(kv_a) X(k_b) X(v_b) /* MLA (DeepSeek-V3): q_a then q_b, or q alone; kv_a; k_b, v_b */       \
    X(kv) X(o_a)                 /* DeepSeek-V4 (also q_a, q_b; o is o_b): the key=value head, the grouped o_a */ \
    X(cmp_kv) X(cmp_gate)        /* a compressed layer's compressor */                                          \
    X(idx_kv) X(idx_gate) X(idx_q) X(idx_w) /* a CSA layer's indexer: its compressor, q_b, weights_proj */ \
    X(eh_embed) X(eh_hidden) /* a next-token module's input projection: eh_proj's embedding and hidden columns */
#define EB_LAYER_VECTORS(X, c)                                                                                 \
    X(input_norm, (c)->hidden_size)                                                                            \
    X(post_norm, (c)->hidden_size)                                                                             \
    X(q_norm, (c)->head_dim)                                                                                   \
    X(k_norm, (c)->head_dim)                                                                                   \
    X(q_bias, (int64_t)(c)->num_heads * (c)->head_dim) /* the biases: only with attention_bias */              \
    X(k_bias, (int64_t)(c)->num_kv_heads * (c)->head_dim)                                                      \
    X(v_bias, (int64_t)(c)->num_kv_heads * (c)->head_dim)                                                      \
    X(o_bias, (c)->hidden_size)                                                                                \
    X(router_bias, (c)->num_experts) /* the router's bias: gpt-oss's, or grouped sigmoid routing's correction */ \
    X(q_a_norm, (c)->q_lora_rank)    /* MLA */                                                                 \
    X(kv_a_norm, (c)->kv_lora_rank)                                                                            \
    X(sinks, (c)->num_heads)         /* gpt-oss, DeepSeek-V4: one attention-sink logit per head */              \
    X(kv_norm, (c)->head_dim)        /* DeepSeek-V4 */                                                           \
    X(hc_attn_fn, eb_v4_hc_fn(c)) X(hc_attn_base, eb_v4_hc_mix(c)) X(hc_attn_scale, 3)                          \
    X(hc_ffn_fn, eb_v4_hc_fn(c)) X(hc_ffn_base, eb_v4_hc_mix(c)) X(hc_ffn_scale, 3)                             \
    X(cmp_ape, eb_v4_ape(c, (c)->head_dim)) X(cmp_norm, (c)->head_dim)                                         \
    X(idx_ape, eb_v4_ape(c, (c)->index_head_dim)) X(idx_norm, (c)->index_head_dim)                             \
    X(tid2eid, (int64_t)(c)->vocab_size * (c)->top_k) /* a hash layer's expert ids per token id, as floats */ \
    X(enorm, (c)->hidden_size) X(hnorm, (c)->hidden_size) /* a next-token module's norms of its two inputs */

/* DeepSeek-V4's vectors' lengths: mHC's mixes ((2 + hc) hc) and their projection (of hc * hidden values); a
 * compressor's position biases of the widest layer (a CSA layer's 2 dim for rate rows, an HCA layer's dim). */
static inline int64_t eb_v4_hc_mix(const eb_model_config *c) { return (int64_t)(2 + c->hc_mult) * c->hc_mult; }
static inline int64_t eb_v4_hc_fn(const eb_model_config *c) {
    return eb_v4_hc_mix(c) * c->hc_mult * c->hidden_size;
}
static inline int64_t eb_v4_ape(const eb_model_config *c, int64_t dim) {
    int64_t csa = (int64_t)c->csa_rate * 2 * dim, hca = (int64_t)c->hca_rate * dim;
    return csa > hca ? csa : hca;
}

#define EB_LAYER_WEIGHT_FIELD(f) eb_weight f;
#define EB_LAYER_VECTOR_FIELD(f, n) float *f;
#define EB_DEV_VECTOR_FIELD(f, n) const float *f;

typedef struct {
    EB_LAYER_WEIGHTS(EB_LAYER_WEIGHT_FIELD)
    EB_LAYER_VECTORS(EB_LAYER_VECTOR_FIELD, _)
    int is_moe;
    eb_expert *experts;
    int64_t v_b_head_rows;
    void *k_b_owned;          /* k_b transposed from kv_b_proj at load, or NULL (a file's split k_b is read in place) */
    void *v_b_owned;          /* v_b from a kv_b_proj in a scaled format, dequantized at load, or NULL */
    void *o_a_owned;          /* DeepSeek-V4's o_a in a scaled format, dequantized at load, or NULL */
    void *eh_owned;           /* a next-token module's eh_proj split into its two halves at load, or NULL */
    int32_t window;           /* attention window (0: every position) */
    void *experts_owned;      /* the experts packed at load from a layout the kernels do not read, or NULL */
    float *expert_bias;       /* the experts' biases, (2 inter + hidden) per expert, or NULL */
} eb_layer;

/* The primary's view of the weights other than the experts': on a device that cannot read host memory (a GPU) a
 * copy of each in its memory (one allocation); on a CPU device the weights where they are (uploads cost nothing).
 * Per MoE layer the table of experts its kernels read (owned ones only), and the routing counters, are in its
 * memory either way. */
typedef struct {
    EB_LAYER_WEIGHTS(EB_LAYER_WEIGHT_FIELD)
    EB_LAYER_VECTORS(EB_DEV_VECTOR_FIELD, _)
    eb_rt_expert *experts; /* device memory: num_experts entries, gate NULL where another device owns it */
    int n_foreign;         /* experts of this layer another device owns */
} eb_dev_layer;

typedef struct {
    void *mem;
    uint64_t bytes;
    eb_weight embed, lm_head;
    const float *final_norm;
    eb_dev_layer *layers;
    unsigned long long *hits;  /* device memory: [layer][expert] routing hits */
    unsigned long long *stats; /* device memory: experts run, rows (the primary's own experts) */
    uint64_t generation;       /* changes whenever the expert tables do */
    int stale;                 /* a table update failed: evaluation refuses until a placement succeeds */
} eb_dev_primary;

typedef struct {
    char *path;
    void *addr;         /* the file's bytes: a mapping of the file, or a private copy (EB_WEIGHTS_COPY) */
    uint64_t size;      /* of the file */
    uint64_t map_bytes; /* of the mapping at addr (munmap frees both kinds) */
    int fd;             /* a mapped file's, kept open to see it change (mapping.c); -1 for a copy */
    struct timespec mtime;
    int slot;           /* its entry in the SIGBUS guard's table, or -1 */
} eb_mapped_file;

typedef struct {
    eb_device_counters dev[EB_MAX_DEVICES];
    eb_model_counters model;
} eb_counters;

struct eb_model {
    eb_engine *engine;
    eb_model_config cfg;
    int32_t *mlp_only;
    int32_t *layer_window; /* the config's, copied */
    float *rope_inv_freq; /* the config's, copied */
    int primary;
    int expert_home;    /* where experts start: the primary, or the first CPU device when the primary is a GPU */
    int primary_host;   /* the primary reads host memory (a CPU device) */
    eb_dev_primary *dp; /* the weights as the primary reads them */
    eb_mapped_file *files;
    int n_files;
    eb_weight embed, lm_head;
    float *final_norm;
    float *hc_head[3]; /* DeepSeek-V4: the mHC head's fn, base and scale (host memory: its extension's primaries) */
    float *compress_inv_freq; /* DeepSeek-V4: the config's, copied */
    int32_t *layer_kind, *layer_hash;
    eb_layer *layers;
    eb_model_info info;
    eb_counters counters;
    int n_contexts;     /* contexts alive; the model outlives them */
    int free_requested; /* eb_model_free was called while contexts or borrowers were alive: done when the last goes */
    struct eb_model *head_of; /* the model whose primary copies of the embeddings and head this one reads, or NULL */
    int n_borrowers;          /* models reading this one's (head_of); the model outlives them */
    uint64_t *route_tokens; /* [layer] */
    uint64_t arena_bytes[EB_MAX_DEVICES]; /* device memory held by contexts' staging arenas */
    const struct eb_family *family;       /* the model family's forward pass */
    _Atomic int changed_file;             /* a mapped file changed under the model: its index + 1 (mapping.c) */
    int routing_off;                      /* evaluation does not count routing (eb_model_set_routing_counting) */
    float **scale_copies;                 /* scale companions copied at load from where a file holds them unaligned */
    int n_scale_copies;
};

/* A staging arena: host memory (pinned where the owner's runtime can) and device memory, grown on demand. */
typedef struct {
    void *host;
    size_t host_cap;
    void *dev;
    size_t dev_cap;
} eb_arena;

typedef struct {
    int32_t n_pairs, n_tokens, n_experts;
    float *y;            /* host: where this owner's outputs are read by the reduction */
    int staged;          /* inputs went through host staging */
    int inline_run;      /* run on the calling thread (done when dispatch returns), between host times t0, t1 */
    int parts_timed;     /* staged while tracing: its upload and its experts end at events (up, down) */
    uint64_t t0, t1;
} eb_owner_step;

/* A context's buffers in the primary's memory (one allocation), its pinned host staging and its recorded steps. */
typedef struct {
    void *mem;
    size_t bytes;
    void *k_cache, *v_cache; /* kv_dtype values (the context's); MLA's and DeepSeek-V4's state: f32 */
    float *rope_cos, *rope_sin;
    float *x, *xn, *q, *k, *v, *att, *proj, *gate, *up, *router, *topk_w, *pair_out, *h, *foreign, *logits;
    float *hc; /* DeepSeek-V4: n_batch rows of the mHC streams, then n_batch rows of their mixes; NULL elsewhere */
    float *hin; /* a next-token module: n_batch rows of the target's hidden states it reads; NULL elsewhere */
    int32_t *topk_id, *ids; /* ids: the position of the first row, then n_batch token ids */
    void *host;             /* pinned host staging, one allocation holding the five below */
    int32_t *host_ids;      /* the position of the first row, then up to n_batch ids */
    int32_t *host_topk_id;  /* a layer's routing and rows read back, n_batch * top_k and n_batch * hidden */
    float *host_topk_w, *host_xn;
    float *foreign_host;    /* n_batch * top_k rows of hidden: other owners' outputs */
    void **graphs;          /* per part of a one-token step (between host round trips): its recording, or NULL */
    uint64_t graph_generation; /* the expert tables' generation, the mode, the routing counting and the experts per */
    int graph_mode, graph_precision, graph_routing_off, graph_top_k; /* token the graphs were recorded with */
    uint64_t checked_generation; /* the expert tables' generation and the precision eb_check_precision last passed, */
    int checked_precision;       /* -1 before: a step re-checks only after a placement or a precision change */
} eb_dev_context;

/* One span of the per-token trace: what ran where, when (host CLOCK_MONOTONIC nanoseconds). */
typedef struct {
    uint64_t start_ns, end_ns;
    int32_t device, layer, token, kind, rows;
} eb_span;

struct eb_context {
    eb_model *model;
    int32_t n_ctx, n_batch, pos, mode, precision, n_devices;
    int32_t kv_dtype;    /* the KV cache's format (eb_context_create_kv): EB_DTYPE_F32, F16 or BF16 */
    int32_t top_k;       /* experts per token of its steps: 1..the model's cfg.top_k, which sizes its buffers */
    int32_t *cache_rows; /* per layer, the rows of its KV cache: n_ctx, or a window's ring (eb_cache_rows) */
    size_t *cache_at;    /* per layer, its first row in the caches */
    float *rope_cos, *rope_sin; /* [n_ctx][head_dim / 2], host: computed once, uploaded */
    /* a split MoE layer's routing and rows as the scheduler reads them (the pinned copies in dc) */
    float *xn, *topk_w;
    int32_t *topk_id;
    float *logits; /* one row of vocab_size, for greedy decoding */
    /* scheduler: per device plans, arenas and completion events (index = engine device) */
    eb_arena arena[EB_MAX_DEVICES];
    eb_owner_step step[EB_MAX_DEVICES];
    void *begun[EB_MAX_DEVICES]; /* a peer's branch: events before and after it, created when first needed */
    void *done[EB_MAX_DEVICES];
    void *up[EB_MAX_DEVICES];   /* a staged branch while tracing: after its rows' upload, after its experts */
    void *down[EB_MAX_DEVICES];
    eb_rt_expert *plan_experts;  /* n_batch * top_k */
    int32_t *plan_start;         /* n_batch * top_k + 1 */
    int32_t *pair_slot;          /* per (token, k): the row of its owner's y */
    int32_t *pair_index;         /* per pair of a plan: its (token, k) index */
    int32_t *token_local;        /* per token: its row in the owner's staged x, -1 if none */
    eb_dev_context *dc;          /* the buffers on the primary */
    int use_graphs;              /* record one-token steps into graphs where the primary's runtime can */
    /* the trace: spans of the steps since it was enabled, up to trace_cap (then counted in trace_lost) */
    eb_span *trace;
    int64_t trace_n, trace_cap, trace_lost;
    /* a primary whose operations are queued (a GPU): events around its own experts of each split layer, read at
     * the end of the step (pending: the layers and their rows) */
    void **own_events; /* 2 per layer */
    int32_t *own_pending, n_own_pending;
};

/* The weights a load checks for values no weight holds (NaN, inf, or a magnitude past EB_WEIGHT_LIMIT), collected
 * while binding in binding order (weight_check.c): each as its kernels read it, with the tensor it comes from. */
#define EB_WEIGHT_LIMIT 0x1p64f
typedef struct {
    char *name;        /* the tensor's name in the checkpoint (owned) */
    int file;          /* its file's index */
    eb_weight w;       /* what the kernels read: w.rows rows of w.cols values (a vector: one row), its scales applied */
    int ndim;          /* the tensor's shape, to name an index in it */
    int64_t shape[4];
    int64_t base, row_stride; /* value (r, c) of w is element base + r * row_stride + c / col_div of the tensor */
    int64_t col_div;          /* (a packed copy: the elements of its source that hold the value's scale) */
} eb_checked_weight;

typedef struct {
    eb_checked_weight *items;
    int64_t n, cap;
} eb_weight_checks;

/* Append one (its name copied), free the list. */
int eb_checks_add(eb_weight_checks *list, const eb_checked_weight *item);
void eb_checks_free(eb_weight_checks *list);
/* Every listed weight dequantized in row parts by a thread per CPU (at most 32): EB_OK, or EB_ERR_FORMAT naming the
 * file, the tensor and the index of the first bad value of the first bad weight in the list's order. */
int eb_check_weights(const eb_model *m, const eb_weight_checks *list);

/* The SIGBUS guard of mapped weight files (mapping.c): register a model's mapped file, withdraw it before unmapping;
 * whether any of its files changed (check_files: their size and time too, before a step; file_faulted: only whether
 * a read faulted, after one), EB_ERR_IO naming it, for every step from then on. */
int eb_mapping_register(eb_model *m, int index);
void eb_mapping_unregister(eb_mapped_file *f);
int eb_model_check_files(eb_model *m);
int eb_model_file_faulted(const eb_model *m);

/* The widths of a step's attention buffers and KV cache, per row or position (floats): q, k and v the products
 * (MLA: q, the latent and rope key, q_a's output in v), att attention's output; cache_k and cache_v one layer's
 * cache per position (MLA: the latent and rope key, no values). */
typedef struct {
    int64_t q, k, v, att, cache_k, cache_v, ffn;
    int64_t hc; /* DeepSeek-V4: the mHC streams and mixes (0 elsewhere) */
} eb_dims;
eb_dims eb_model_dims(const eb_model_config *c);
/* Rows of layer l's KV cache in a context of n_ctx positions and batches of up to n_batch: n_ctx, or for a layer with
 * a window w the ring that holds what a batch's rows attend to (w + n_batch - 1 rows, at most n_ctx). */
static inline int32_t eb_cache_rows(const eb_model_config *c, int l, int32_t n_ctx, int32_t n_batch) {
    int64_t w = c->layer_window ? c->layer_window[l] : 0;
    return w > 0 && w + n_batch - 1 < n_ctx ? (int32_t)(w + n_batch - 1) : n_ctx;
}

/* Free the model now (eb_model_free defers to this when no context is alive). */
void eb_model_release(eb_model *m);

/* The other owners' experts of one MoE layer step, from the routing in c->topk_id / c->topk_w and the rows in
 * c->xn (host memory): dispatch queues every owner but the primary on its own threads or stream (staging what it
 * cannot read) and records its completion event, but inline_dev (-1: none), which it runs on the calling thread
 * after the others are queued; join waits on the events. c->step[d] then says how many pairs each owner ran and
 * where its outputs are. eb_run_inline_peer runs inline_dev alone, after an eb_dispatch_peers(..., inline_dev,
 * 0) that queued the others: a primary whose operations are queued (a GPU) queues the peers' branches, then its own
 * experts, then runs the CPU's on this thread. */
int eb_dispatch_peers(eb_context *c, const eb_layer *L, int64_t n, int inline_dev, int run_inline);
int eb_run_inline_peer(eb_context *c, const eb_layer *L, int64_t n, int inline_dev);
int eb_join_peers(eb_context *c);
/* The same join on a failure's path: what was queued is waited for, and the error being reported is kept. */
void eb_drain_peers(eb_context *c);
/* A device's event in *slot, created the first time (a context's events are kept until it is freed). */
int eb_context_event(eb_context *c, int d, void **slot);

/* The weights as the primary reads them (model load), its expert tables (after a placement), free. */
int eb_primary_init(eb_model *m);
int eb_primary_refresh(eb_model *m);
/* EB_OK when device d's kernels read dtype, else an error naming the weight (layer, expert: -1 where none). */
int eb_check_format(const eb_model *m, int d, int dtype, const char *what, int layer, int expert);
/* EB_OK when every device a step uses (the primary, each expert's owner) runs this activation precision, else an error
 * naming the first that does not. */
int eb_check_precision(const eb_model *m, int precision);
void eb_primary_release(eb_model *m);
/* A context's buffers on the primary, and one batch of the forward pass. */
int eb_context_buffers_init(eb_context *c);
void eb_context_buffers_release(eb_context *c);
/* hidden_in / hidden_out: eb_context_eval_hidden's n rows (NULL: none) */
int eb_eval_batch(eb_context *c, const int32_t *ids, int64_t n, float *logits, int all_rows, const float *hidden_in,
                  float *hidden_out);

/* Free staging arenas of a context. */
void eb_scheduler_release(eb_context *c);
/* Free device copies of the model's experts. */
void eb_placement_release(eb_model *m);

#endif
