/* The loaded model: plain structs in the shape of the architecture. */
#ifndef EB_MODEL_H
#define EB_MODEL_H

#include "eb_convert.h"
#include "eb_internal.h"

typedef struct {
    const void *data; /* rows x cols, row-major, in dtype */
    int dtype;
    int64_t rows;
    int64_t cols;
} eb_weight;

/* Device allocations are carved into pieces aligned to this many bytes (what GPU vector loads need). */
#define EB_ALIGN 256
static inline size_t eb_align(size_t n) { return (n + EB_ALIGN - 1) / EB_ALIGN * EB_ALIGN; }

static inline uint64_t eb_weight_bytes(const eb_weight *w) {
    return (uint64_t)w->rows * (uint64_t)w->cols * eb_dtype_size(w->dtype);
}

typedef struct {
    eb_weight gate, up, down; /* where the owner reads them: the mapped file, or the owner's copy */
    const void *host_gate, *host_up, *host_down; /* always the mapped file */
    void *dev_mem;            /* the owner's copy (gate | up | down), NULL when it reads the mapped file */
    int owner;                /* engine device index */
} eb_expert;

typedef struct {
    float *input_norm, *post_norm;
    eb_weight q, k, v, o;
    float *q_norm, *k_norm;
    float *q_bias, *k_bias, *v_bias, *o_bias; /* only with attention_bias */
    int is_moe;
    eb_weight gate, up, down; /* dense MLP */
    eb_weight router;         /* num_experts x hidden */
    eb_expert *experts;
} eb_layer;

/* A primary device that cannot read host memory (a GPU) keeps a copy of every weight but the experts' in its
 * memory (one allocation), and per MoE layer the table of experts its kernels read (owned ones only). */
typedef struct {
    eb_weight q, k, v, o, router, gate, up, down;
    const float *input_norm, *post_norm, *q_norm, *k_norm, *q_bias, *k_bias, *v_bias, *o_bias;
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
} eb_mapped_file;

typedef struct {
    eb_device_counters dev[EB_MAX_DEVICES];
    eb_model_counters model;
} eb_counters;

struct eb_model {
    eb_engine *engine;
    eb_model_config cfg;
    int32_t *mlp_only;
    int primary;
    int expert_home;    /* where experts start: the primary, or the first CPU device when the primary is a GPU */
    eb_dev_primary *dp; /* a primary that is not host-addressable, else NULL */
    eb_mapped_file *files;
    int n_files;
    eb_weight embed, lm_head;
    float *final_norm;
    eb_layer *layers;
    eb_model_info info;
    eb_counters counters;
    int n_contexts;     /* contexts alive; the model outlives them */
    int free_requested; /* eb_model_free was called while contexts were alive: done when the last goes */
    uint64_t *route_hits;   /* [layer][expert] */
    uint64_t *route_tokens; /* [layer] */
    uint64_t arena_bytes[EB_MAX_DEVICES]; /* device memory held by contexts' staging arenas */
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
} eb_owner_step;

/* A device primary's context: buffers in its memory (one allocation) and the step's graph. */
typedef struct {
    void *mem;
    size_t bytes;
    float *k_cache, *v_cache, *rope_cos, *rope_sin;
    float *x, *xn, *q, *k, *v, *att, *proj, *gate, *up, *router, *topk_w, *pair_out, *h, *foreign, *logits;
    int32_t *topk_id, *ids; /* ids: the position of the first row, then n_batch token ids */
    void *host;             /* pinned host staging, one allocation holding the five below */
    int32_t *host_ids;      /* the position of the first row, then up to n_batch ids */
    int32_t *host_topk_id;  /* a layer's routing and rows read back, n_batch * top_k and n_batch * hidden */
    float *host_topk_w, *host_xn;
    float *foreign_host;    /* n_batch * top_k rows of hidden: other owners' outputs */
    void **graphs;          /* per part of a one-token step, by resume layer + 1 (0: the first part): its
                               recording, or NULL */
    int *graph_stop;        /* per part: where it ends (queue_part's stop) */
    uint64_t graph_generation; /* the expert tables' generation and the mode the graphs were recorded with */
    int graph_mode;
} eb_dev_context;

struct eb_context {
    eb_model *model;
    int32_t n_ctx, n_batch, pos, mode, n_devices;
    float *k_cache, *v_cache;   /* [layer][n_ctx][kv_dim] */
    float *rope_cos, *rope_sin; /* [n_ctx][head_dim / 2] */
    /* scratch, n_batch rows each */
    float *x, *xn, *q, *k, *v, *att, *proj, *gate, *up, *moe_out;
    float *router, *scores;
    float *logits; /* one row of vocab_size, for greedy decoding */
    void (*attend)(void *job, int64_t i0, int64_t i1); /* the CPU primary's attention, chosen at creation */
    int32_t attend_heads; /* query heads per attention work item: 1, or a whole GQA group */
    int32_t *topk_id;
    float *topk_w;
    /* scheduler: per device plans and arenas (index = engine device) */
    eb_arena arena[EB_MAX_DEVICES];
    eb_owner_step step[EB_MAX_DEVICES];
    eb_rt_expert *plan_experts;  /* n_batch * top_k */
    int32_t *plan_start;         /* n_batch * top_k + 1 */
    int32_t *pair_slot;          /* per (token, k): the row of its owner's y */
    int32_t *token_local;        /* per token: its row in the owner's staged x, -1 if none */
    int32_t *local_tokens;       /* the owner's staged tokens */
    eb_dev_context *dc;          /* a device primary's buffers, else NULL */
    int use_graphs;              /* capture one-token steps into a graph where the primary's runtime can */
};

/* Free the model now (eb_model_free defers to this when no context is alive). */
void eb_model_release(eb_model *m);

/* The MoE block of one layer for n positions: c->xn in, c->moe_out out. */
int eb_moe_forward(eb_context *c, int layer, int64_t n);
/* Run one MoE layer step's experts on their owners from the routing in c->topk_id / c->topk_w and the rows in
 * c->xn (host memory): every owner but inline_dev and skip_dev is queued on its own threads or stream,
 * inline_dev (-1: none) runs on the calling thread meanwhile, then the queued ones are joined. c->step[d] says
 * how many pairs each owner ran and where its outputs are. Counts waits and joins. */
int eb_run_owners(eb_context *c, const eb_layer *L, int64_t n, int inline_dev, int skip_dev);

/* A device primary: upload the weights (model load), refresh the expert tables (after a placement), free. */
int eb_device_primary_init(eb_model *m);
int eb_device_primary_refresh(eb_model *m);
void eb_device_primary_release(eb_model *m);
/* A device primary's context buffers, and one batch of the forward pass on it. */
int eb_device_context_init(eb_context *c);
void eb_device_context_release(eb_context *c);
int eb_device_eval_batch(eb_context *c, const int32_t *ids, int64_t n, float *logits, int all_rows);

/* Free staging arenas of a context. */
void eb_scheduler_release(eb_context *c);
/* Free device copies of the model's experts. */
void eb_placement_release(eb_model *m);

#endif
