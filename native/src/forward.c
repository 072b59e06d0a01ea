/* The decoding context and the forward pass of Qwen3 / Qwen3-MoE.
 *
 * One function, eval_batch, reads top to bottom like the architecture. Every buffer is allocated when the
 * context is created; evaluating tokens allocates nothing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eb_convert.h"
#include "eb_ops.h"
#include "eb_model.h"

static void *zalloc(size_t n, size_t size, int *failed) {
    void *p = calloc(n ? n : 1, size);
    if (!p) *failed = 1;
    return p;
}

void eb_context_free(eb_context *c) {
    if (!c) return;
    eb_scheduler_release(c);
    eb_device_context_release(c);
    eb_model *m = c->model;
    float *bufs[] = {c->k_cache, c->v_cache, c->rope_cos, c->rope_sin, c->x, c->xn, c->q, c->k, c->v, c->att,
                     c->proj, c->gate, c->up, c->moe_out, c->router, c->scores, c->topk_w, c->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(c->topk_id);
    free(c->plan_experts);
    free(c->plan_start);
    free(c->pair_slot);
    free(c->token_local);
    free(c);
    if (m && --m->n_contexts == 0 && m->free_requested) eb_model_release(m);
}

static void (*choose_attention(const eb_model *m))(void *, int64_t, int64_t);
static int32_t attention_heads_per_item(const eb_model *m);

int eb_context_create(eb_model *m, int32_t n_ctx, int32_t n_batch, eb_context **out) {
    if (!m || !out) return eb_fail(EB_ERR_ARGUMENT, "context: NULL argument");
    *out = NULL;
    const eb_model_config *cf = &m->cfg;
    if (n_ctx <= 0 || n_ctx > cf->max_position_embeddings)
        return eb_fail(EB_ERR_RANGE, "context length %d out of range: expected 1..%d (max_position_embeddings)", n_ctx,
                       cf->max_position_embeddings);
    if (n_batch <= 0 || n_batch > 65536)
        return eb_fail(EB_ERR_RANGE, "batch size %d out of range: expected 1..65536", n_batch);
    if (n_batch > n_ctx) n_batch = n_ctx;
    eb_context *c = calloc(1, sizeof *c);
    if (!c) return eb_fail(EB_ERR_MEMORY, "out of memory");
    c->model = m;
    c->attend = choose_attention(m);
    c->attend_heads = attention_heads_per_item(m);
    m->n_contexts++; /* eb_context_free gives it back, on the failure paths below too */
    c->n_ctx = n_ctx;
    c->n_batch = n_batch;
    size_t B = (size_t)n_batch, H = (size_t)cf->hidden_size, hd = (size_t)cf->head_dim;
    size_t qd = (size_t)cf->num_heads * hd, kvd = (size_t)cf->num_kv_heads * hd;
    size_t I = (size_t)(cf->intermediate_size > cf->moe_intermediate_size ? cf->intermediate_size
                                                                           : cf->moe_intermediate_size);
    size_t E = cf->num_experts > 0 ? (size_t)cf->num_experts : 1, K = cf->top_k > 0 ? (size_t)cf->top_k : 1;
    /* every buffer size below is a product of these: refuse what would overflow size_t */
    size_t kv_elems, probe;
    if (__builtin_mul_overflow((size_t)cf->num_layers, (size_t)n_ctx, &kv_elems) ||
        __builtin_mul_overflow(kv_elems, kvd, &kv_elems) || __builtin_mul_overflow(kv_elems, 2 * sizeof(float), &probe) ||
        __builtin_mul_overflow(B, qd > I ? (qd > H ? qd : H) : (I > H ? I : H), &probe) ||
        __builtin_mul_overflow(probe, 4 * sizeof(float), &probe) ||
        __builtin_mul_overflow((size_t)cf->num_heads, (size_t)n_ctx, &probe) ||
        __builtin_mul_overflow(probe, sizeof(float), &probe)) {
        eb_context_free(c);
        return eb_fail(EB_ERR_RANGE, "a context of %d positions for this model's sizes does not fit in memory", n_ctx);
    }
    int failed = 0;
    size_t kv_host = m->dp ? 0 : (size_t)cf->num_layers * (size_t)n_ctx * kvd; /* a device primary's is there */
    c->k_cache = zalloc(kv_host, sizeof(float), &failed);
    c->v_cache = zalloc(kv_host, sizeof(float), &failed);
    c->rope_cos = zalloc((size_t)n_ctx * hd / 2, sizeof(float), &failed);
    c->rope_sin = zalloc((size_t)n_ctx * hd / 2, sizeof(float), &failed);
    c->x = zalloc(B * H, sizeof(float), &failed);
    c->xn = zalloc(B * H, sizeof(float), &failed);
    c->q = zalloc(B * qd, sizeof(float), &failed);
    c->k = zalloc(B * kvd, sizeof(float), &failed);
    c->v = zalloc(B * kvd, sizeof(float), &failed);
    c->att = zalloc(B * qd, sizeof(float), &failed);
    c->proj = zalloc(B * H, sizeof(float), &failed);
    c->gate = zalloc(B * I, sizeof(float), &failed);
    c->up = zalloc(B * I, sizeof(float), &failed);
    c->moe_out = zalloc(B * H, sizeof(float), &failed);
    c->router = zalloc(B * E, sizeof(float), &failed);
    c->scores = zalloc((size_t)cf->num_heads * (size_t)n_ctx, sizeof(float), &failed);
    c->logits = zalloc((size_t)cf->vocab_size, sizeof(float), &failed);
    c->topk_id = zalloc(B * K, sizeof(int32_t), &failed);
    c->topk_w = zalloc(B * K, sizeof(float), &failed);
    c->n_devices = m->engine->n_devices;
    c->plan_experts = zalloc(B * K, sizeof(eb_rt_expert), &failed);
    c->plan_start = zalloc(B * K + 1, sizeof(int32_t), &failed);
    c->pair_slot = zalloc(B * K, sizeof(int32_t), &failed);
    c->token_local = zalloc((size_t)c->n_devices * B, sizeof(int32_t), &failed);
    if (failed) {
        eb_context_free(c);
        return eb_fail(EB_ERR_MEMORY, "out of memory for a context of %d positions", n_ctx);
    }
    /* RoPE tables computed as transformers does, in f32: inv_freq = 1 / theta^(2i/d), angle = pos * inv_freq. */
    size_t half = hd / 2;
    for (size_t i = 0; i < half; i++) {
        float inv_freq = 1.0f / powf((float)cf->rope_theta, (float)(2 * i) / (float)hd);
        for (int32_t p = 0; p < n_ctx; p++) {
            float angle = (float)p * inv_freq;
            c->rope_cos[(size_t)p * half + i] = cosf(angle);
            c->rope_sin[(size_t)p * half + i] = sinf(angle);
        }
    }
    c->use_graphs = 1;
    if (m->dp) {
        int st = eb_device_context_init(c);
        if (st) {
            eb_context_free(c);
            return st;
        }
    }
    *out = c;
    return EB_OK;
}

int32_t eb_context_position(const eb_context *c) { return c ? c->pos : -1; }

int eb_context_set_mode(eb_context *c, int32_t mode) {
    if (!c) return eb_fail(EB_ERR_ARGUMENT, "set mode: context is NULL");
    if (mode != EB_MODE_REFERENCE && mode != EB_MODE_OWNER_LOCAL)
        return eb_fail(EB_ERR_ARGUMENT, "reduction mode %d: expected %d (reference) or %d (owner_local)", mode,
                       EB_MODE_REFERENCE, EB_MODE_OWNER_LOCAL);
    c->mode = mode;
    return EB_OK;
}
int32_t eb_context_capacity(const eb_context *c) { return c ? c->n_ctx : -1; }

int eb_context_set_graphs(eb_context *c, int32_t enabled) {
    if (!c) return eb_fail(EB_ERR_ARGUMENT, "set graphs: context is NULL");
    if (enabled != 0 && enabled != 1) return eb_fail(EB_ERR_ARGUMENT, "set graphs: %d, expected 0 or 1", enabled);
    c->use_graphs = enabled;
    return EB_OK;
}

int eb_context_truncate(eb_context *c, int32_t pos) {
    if (!c) return eb_fail(EB_ERR_ARGUMENT, "truncate: context is NULL");
    if (pos < 0 || pos > c->pos)
        return eb_fail(EB_ERR_RANGE, "truncate to position %d: expected 0..%d (the current position)", pos, c->pos);
    c->pos = pos;
    return EB_OK;
}

static void add_bias(float *y, const float *bias, int64_t n, int64_t dim) {
    if (!bias) return;
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < dim; i++) y[t * dim + i] += bias[i];
}

static int matmul(eb_context *c, int device, const eb_weight *w, const float *x, int64_t n, float *y) {
    return eb_device_matmul(c->model->engine, device, w->data, w->dtype, w->rows, w->cols, x, n, y);
}

typedef struct {
    eb_context *c;
    int layer;
    int64_t n;
} attention_job;

/* Causal attention of work items [i0, i1) for the n new positions: each item is c->attend_heads query heads of
 * one GQA group, which read their key and value rows once together; each head has its own row of scores. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline void attend_heads(void *arg, int64_t i0, int64_t i1) {
    const attention_job *j = (const attention_job *)arg;
    eb_context *c = j->c;
    const eb_model_config *cf = &c->model->cfg;
    int64_t hd = cf->head_dim, nh = cf->num_heads, group = cf->num_heads / cf->num_kv_heads, g = c->attend_heads;
    int64_t qd = nh * hd, kvd = (int64_t)cf->num_kv_heads * hd;
    const float *kc = c->k_cache + (size_t)j->layer * (size_t)c->n_ctx * (size_t)kvd;
    const float *vc = c->v_cache + (size_t)j->layer * (size_t)c->n_ctx * (size_t)kvd;
    for (int64_t i = i0; i < i1; i++) {
        int64_t h = i * g, kvh = h / group;
        for (int64_t t = 0; t < j->n; t++)
            eb_attend_group(c->q + t * qd + h * hd, g, kc + kvh * hd, vc + kvh * hd, c->pos + t, kvd, hd,
                            c->scores + h * c->n_ctx, c->n_ctx, c->att + t * qd + h * hd);
    }
}

static void attention_heads(void *arg, int64_t i0, int64_t i1) { attend_heads(arg, i0, i1); }

/* The same built for AVX2 where the CPU has it: eb_attend_group's sums are written as eight lanes with nothing
 * reassociated or contracted (-ffp-contract=off), so the wider build gives the same bits with half the
 * instructions. Chosen at run time rather than through an ifunc, which the sanitizer runtimes do not survive,
 * and not where the CPU runtime was told to keep to its portable kernels. */
#if defined(__x86_64__) && defined(__GNUC__)
#define EB_ATTENTION_AVX2 1
__attribute__((target("avx2"))) static void attention_heads_avx2(void *arg, int64_t i0, int64_t i1) {
    attend_heads(arg, i0, i1);
}
#endif

/* The build of the attention a context uses: AVX2 where the CPU has it and the primary's runtime was not told to
 * keep to its portable kernels. Chosen once per context, not per layer. */
static void (*choose_attention(const eb_model *m))(void *, int64_t, int64_t) {
#ifdef EB_ATTENTION_AVX2
    const eb_runtime *r = eb_device_runtime(m->engine, m->primary);
    if (__builtin_cpu_supports("avx2") && strcmp(r->table->kernel_variant(r->rt), "portable") != 0)
        return attention_heads_avx2;
#else
    (void)m;
#endif
    return attention_heads;
}

/* Query heads per attention work item: a whole GQA group (its key and value rows read once per block of eight
 * heads) where there are at least as many groups as the primary has threads, else one head (more items than
 * threads). Either way the bits are the same; only the speed differs. */
static int32_t attention_heads_per_item(const eb_model *m) {
    const eb_engine *eng = m->engine;
    const eb_runtime *r = eb_device_runtime(eng, m->primary);
    eb_rt_device_info info;
    char err[64];
    int32_t groups = m->cfg.num_kv_heads, group = m->cfg.num_heads / m->cfg.num_kv_heads;
    if (r->table->device_info(r->rt, eng->devices[m->primary].local, &info, err, sizeof err) != 0) return 1;
    return info.threads <= groups ? group : 1;
}

static int attention(eb_context *c, int layer, int64_t n) {
    attention_job job = {c, layer, n};
    const eb_engine *eng = c->model->engine;
    const eb_runtime *r = eb_device_runtime(eng, c->model->primary);
    int64_t items = c->model->cfg.num_heads / c->attend_heads;
    if (r->table->parallel_for(r->rt, eng->devices[c->model->primary].local, c->attend, &job, items, 1) != EB_OK)
        c->attend(&job, 0, items);
    return EB_OK;
}

/* y = down(silu(gate(x)) * up(x)) for n rows (dense MLP layers, on the primary). */
static int ffn(eb_context *c, int device, const eb_weight *gate, const eb_weight *up, const eb_weight *down,
               const float *x, int64_t n, float *y) {
    int st;
    eb_rt_matmul gu[2] = {{gate->data, gate->dtype, gate->rows, gate->cols, x, n, c->gate},
                          {up->data, up->dtype, up->rows, up->cols, x, n, c->up}};
    if ((st = eb_device_matmul_multi(c->model->engine, device, gu, 2))) return st;
    int64_t I = gate->rows;
    for (int64_t i = 0; i < n * I; i++) c->gate[i] = eb_silu(c->gate[i]) * c->up[i];
    return matmul(c, device, down, c->gate, n, y);
}

static void embed_row(const eb_model *m, int32_t id, float *out) {
    int64_t H = m->cfg.hidden_size;
    const unsigned char *row = (const unsigned char *)m->embed.data + (size_t)id * (size_t)H * eb_dtype_size(m->embed.dtype);
    for (int64_t i = 0; i < H; i++) out[i] = eb_load_as_f32(row, m->embed.dtype, i);
}

/* n <= n_batch positions starting at c->pos; logits rows for all (all_rows) or only the last position. */
static int eval_batch(eb_context *c, const int32_t *ids, int64_t n, float *logits, int all_rows) {
    const eb_model *m = c->model;
    const eb_model_config *cf = &m->cfg;
    int64_t H = cf->hidden_size, hd = cf->head_dim, nh = cf->num_heads, nkv = cf->num_kv_heads;
    int64_t qd = nh * hd, kvd = nkv * hd;
    float eps = (float)cf->rms_norm_eps;
    int dev = m->primary, st;

    for (int64_t t = 0; t < n; t++) embed_row(m, ids[t], c->x + t * H);

    for (int l = 0; l < cf->num_layers; l++) {
        const eb_layer *L = &m->layers[l];
        /* attention block */
        for (int64_t t = 0; t < n; t++) eb_rmsnorm(c->xn + t * H, c->x + t * H, L->input_norm, H, eps);
        eb_rt_matmul qkv[3] = {{L->q.data, L->q.dtype, L->q.rows, L->q.cols, c->xn, n, c->q},
                               {L->k.data, L->k.dtype, L->k.rows, L->k.cols, c->xn, n, c->k},
                               {L->v.data, L->v.dtype, L->v.rows, L->v.cols, c->xn, n, c->v}};
        if ((st = eb_device_matmul_multi(m->engine, dev, qkv, 3))) return st;
        add_bias(c->q, L->q_bias, n, qd);
        add_bias(c->k, L->k_bias, n, kvd);
        add_bias(c->v, L->v_bias, n, kvd);
        float *kc = c->k_cache + (size_t)l * (size_t)c->n_ctx * (size_t)kvd;
        float *vc = c->v_cache + (size_t)l * (size_t)c->n_ctx * (size_t)kvd;
        for (int64_t t = 0; t < n; t++)
            eb_qk_rope_store(c->q + t * qd, c->k + t * kvd, c->v + t * kvd, L->q_norm, L->k_norm, c->rope_cos,
                             c->rope_sin, kc, vc, c->pos + t, nh, nkv, hd, eps);
        attention(c, l, n);
        if ((st = matmul(c, dev, &L->o, c->att, n, c->proj))) return st;
        add_bias(c->proj, L->o_bias, n, H);
        for (int64_t i = 0; i < n * H; i++) c->x[i] += c->proj[i];

        /* MLP block: dense or mixture of experts */
        for (int64_t t = 0; t < n; t++) eb_rmsnorm(c->xn + t * H, c->x + t * H, L->post_norm, H, eps);
        if (L->is_moe) {
            if ((st = eb_moe_forward(c, l, n))) return st;
            for (int64_t i = 0; i < n * H; i++) c->x[i] += c->moe_out[i];
        } else {
            if ((st = ffn(c, dev, &L->gate, &L->up, &L->down, c->xn, n, c->proj))) return st;
            for (int64_t i = 0; i < n * H; i++) c->x[i] += c->proj[i];
        }
    }
    if (!logits) return EB_OK;
    int64_t first = all_rows ? 0 : n - 1;
    for (int64_t t = first; t < n; t++) eb_rmsnorm(c->xn + t * H, c->x + t * H, m->final_norm, H, eps);
    return matmul(c, dev, &m->lm_head, c->xn + first * H, n - first, logits);
}

int eb_context_eval(eb_context *c, const int32_t *ids, int32_t n, float *logits, int32_t all_rows) {
    if (!c || !ids) return eb_fail(EB_ERR_ARGUMENT, "eval: NULL argument");
    if (n <= 0) return eb_fail(EB_ERR_ARGUMENT, "eval: %d tokens, expected at least one", n);
    const eb_model_config *cf = &c->model->cfg;
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= cf->vocab_size)
            return eb_fail(EB_ERR_RANGE, "token id %d (at index %d) out of range: the vocabulary has %d tokens "
                                         "(ids 0..%d)", ids[i], i, cf->vocab_size, cf->vocab_size - 1);
    if ((int64_t)c->pos + n > c->n_ctx)
        return eb_fail(EB_ERR_RANGE, "context of %lld positions is longer than the KV cache (%d positions); "
                                     "truncate or create a larger context", (long long)c->pos + n, c->n_ctx);
    int32_t start = c->pos;
    int64_t V = cf->vocab_size;
    for (int32_t done = 0; done < n;) {
        int32_t chunk = n - done < c->n_batch ? n - done : c->n_batch;
        int last_chunk = done + chunk == n;
        float *out = NULL;
        if (logits && all_rows) out = logits + (int64_t)done * V;
        else if (logits && last_chunk) out = logits;
        int st = c->dc ? eb_device_eval_batch(c, ids + done, chunk, out, all_rows)
                       : eval_batch(c, ids + done, chunk, out, all_rows);
        if (st) {
            c->pos = start;
            return st;
        }
        c->pos += chunk;
        done += chunk;
    }
    return EB_OK;
}

/* The index of the largest value, the first of equal ones; the first NaN where there is one (numpy's argmax). Two
 * branch-light passes (the largest value and whether a NaN is there, then its first index) rather than one that
 * carries the index of the best so far from element to element. */
static int32_t argmax(const float *v, int32_t n) {
    float mx = v[0];
    int nan = 0;
    for (int32_t i = 0; i < n; i++) {
        mx = v[i] > mx ? v[i] : mx;
        nan |= v[i] != v[i];
    }
    for (int32_t i = 0; i < n; i++)
        if (nan ? v[i] != v[i] : v[i] == mx) return i;
    return 0;
}

int eb_context_greedy(eb_context *c, int32_t first, int32_t n, const int32_t *stop_ids, int32_t n_stop, int32_t *out,
                      int32_t *n_out) {
    if (n_out) *n_out = 0;
    if (!c || !out || !n_out || (n_stop > 0 && !stop_ids)) return eb_fail(EB_ERR_ARGUMENT, "greedy: NULL argument");
    if (n < 1) return eb_fail(EB_ERR_ARGUMENT, "greedy: %d tokens to choose, expected at least one", n);
    if (n_stop < 0) return eb_fail(EB_ERR_ARGUMENT, "greedy: %d stop ids, expected 0 or more", n_stop);
    int32_t V = c->model->cfg.vocab_size;
    if (first < 0 || first >= V)
        return eb_fail(EB_ERR_RANGE, "greedy: first token id %d out of range: the vocabulary has %d tokens (ids 0..%d)",
                       first, V, V - 1);
    out[0] = first;
    *n_out = 1;
    for (;;) {
        int32_t last = out[*n_out - 1];
        for (int32_t i = 0; i < n_stop; i++)
            if (stop_ids[i] == last) return EB_OK;
        if (*n_out == n) return EB_OK;
        int st = eb_context_eval(c, &last, 1, c->logits, 0);
        if (st) return st;
        out[(*n_out)++] = argmax(c->logits, V);
    }
}
