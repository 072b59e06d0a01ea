/* The forward pass on a primary device that cannot read host memory (a GPU).
 *
 * The architecture of forward.c's eval_batch, queued as the runtime's primary operations on the device's
 * stream: every weight but the experts', the KV cache and the activations live in the device's memory. A MoE
 * layer whose experts are all the primary's needs nothing from the host. A layer with experts elsewhere reads
 * its routing and normalised rows back (a host round trip), runs the other owners through the scheduler, and
 * sends their outputs to the primary, which adds every output in ascending expert id (reference mode) or adds
 * the owners' sums to its own (owner_local). A one-token step is recorded into graphs, one per part between host
 * round trips (one graph when every expert is the primary's), and replayed while the placement and the reduction
 * mode stay.
 */
#include <stdlib.h>
#include <string.h>

#include "eb_convert.h"
#include "eb_model.h"

typedef struct {
    const eb_runtime *r;
    const eb_rt_primary_ops *ops;
    int local;
    const char *name;
} primary;

static primary get_primary(const eb_model *m) {
    const eb_engine *e = m->engine;
    const eb_runtime *r = eb_device_runtime(e, m->primary);
    return (primary){r, r->table->primary, e->devices[m->primary].local, e->devices[m->primary].name};
}

/* ---- weights ----------------------------------------------------------------------------------------- */

/* Lays out one device allocation: a first pass (base NULL) only sizes it, a second places and uploads. */
typedef struct {
    eb_model *m;
    primary p;
    unsigned char *base;
    size_t off;
    int st;
    const void *zeros; /* host zeros as large as the largest counter array */
} layout;

static void *place(layout *a, const void *src, size_t bytes) {
    size_t at = a->off;
    a->off += eb_align(bytes ? bytes : 1);
    if (!a->base) return NULL;
    void *dst = a->base + at;
    char err[512] = "";
    if (src && !a->st && (a->st = a->p.r->table->copy_to_device(a->p.r->rt, a->p.local, dst, src, bytes, 0, err,
                                                                  sizeof err)))
        a->st = eb_fail(a->st, "uploading the model's weights to %s: %s", a->p.name, err);
    return dst;
}

static eb_weight place_weight(layout *a, const eb_weight *w) {
    eb_weight out = *w;
    out.data = w->data ? place(a, w->data, (size_t)eb_weight_bytes(w)) : NULL;
    return out;
}

static const float *place_vector(layout *a, const float *v, int64_t n) {
    return v ? place(a, v, (size_t)n * sizeof(float)) : NULL;
}

static void lay_out(layout *a) {
    eb_model *m = a->m;
    eb_dev_primary *dp = m->dp;
    const eb_model_config *cf = &m->cfg;
    int64_t H = cf->hidden_size, hd = cf->head_dim, qd = (int64_t)cf->num_heads * hd, kvd = (int64_t)cf->num_kv_heads * hd;
    dp->embed = place_weight(a, &m->embed);
    dp->lm_head = m->lm_head.data == m->embed.data ? dp->embed : place_weight(a, &m->lm_head);
    dp->final_norm = place_vector(a, m->final_norm, H);
    for (int l = 0; l < cf->num_layers; l++) {
        const eb_layer *L = &m->layers[l];
        eb_dev_layer *D = &dp->layers[l];
        D->input_norm = place_vector(a, L->input_norm, H);
        D->post_norm = place_vector(a, L->post_norm, H);
        D->q = place_weight(a, &L->q);
        D->k = place_weight(a, &L->k);
        D->v = place_weight(a, &L->v);
        D->o = place_weight(a, &L->o);
        D->q_norm = place_vector(a, L->q_norm, hd);
        D->k_norm = place_vector(a, L->k_norm, hd);
        D->q_bias = place_vector(a, L->q_bias, qd);
        D->k_bias = place_vector(a, L->k_bias, kvd);
        D->v_bias = place_vector(a, L->v_bias, kvd);
        D->o_bias = place_vector(a, L->o_bias, H);
        if (L->is_moe) {
            D->router = place_weight(a, &L->router);
            D->experts = place(a, NULL, (size_t)cf->num_experts * sizeof(eb_rt_expert));
        } else {
            D->gate = place_weight(a, &L->gate);
            D->up = place_weight(a, &L->up);
            D->down = place_weight(a, &L->down);
        }
    }
    size_t n_hits = (size_t)cf->num_layers * (size_t)(cf->num_experts > 0 ? cf->num_experts : 1);
    dp->hits = place(a, a->zeros, n_hits * sizeof *dp->hits); /* counters start at zero */
    dp->stats = place(a, a->zeros, 2 * sizeof *dp->stats);
}

int eb_device_primary_init(eb_model *m) {
    primary p = get_primary(m);
    m->dp = calloc(1, sizeof *m->dp);
    if (!m->dp || !(m->dp->layers = calloc((size_t)m->cfg.num_layers, sizeof *m->dp->layers)))
        return eb_fail(EB_ERR_MEMORY, "out of memory");
    size_t n_hits = (size_t)m->cfg.num_layers * (size_t)(m->cfg.num_experts > 0 ? m->cfg.num_experts : 1);
    void *zeros = calloc(n_hits > 2 ? n_hits : 2, sizeof(unsigned long long));
    if (!zeros) return eb_fail(EB_ERR_MEMORY, "out of memory");
    layout a = {m, p, NULL, 0, EB_OK, zeros};
    lay_out(&a);
    char err[512] = "";
    int st = p.r->table->mem_alloc(p.r->rt, p.local, a.off, &m->dp->mem, err, sizeof err);
    if (st) {
        free(zeros);
        return eb_fail(st, "the model's weights (%.1f MiB but the experts) on %s: %s", a.off / 1048576.0, p.name, err);
    }
    m->dp->bytes = a.off;
    a.base = m->dp->mem;
    a.off = 0;
    lay_out(&a);
    free(zeros);
    if (a.st) return a.st;
    return eb_device_primary_refresh(m);
}

int eb_device_primary_refresh(eb_model *m) {
    primary p = get_primary(m);
    const eb_model_config *cf = &m->cfg;
    m->dp->stale = 1; /* until every table is written: the old ones may point at freed copies */
    eb_rt_expert *table = malloc((size_t)(cf->num_experts > 0 ? cf->num_experts : 1) * sizeof *table);
    if (!table) return eb_fail(EB_ERR_MEMORY, "out of memory");
    int st = EB_OK;
    char err[512] = "";
    for (int l = 0; l < cf->num_layers && st == EB_OK; l++) {
        const eb_layer *L = &m->layers[l];
        eb_dev_layer *D = &m->dp->layers[l];
        if (!L->is_moe) continue;
        D->n_foreign = 0;
        for (int e = 0; e < cf->num_experts; e++) {
            const eb_expert *x = &L->experts[e];
            int own = x->owner == m->primary;
            D->n_foreign += !own;
            table[e] = (eb_rt_expert){own ? x->gate.data : NULL, own ? x->up.data : NULL, own ? x->down.data : NULL,
                                      x->gate.dtype, e};
        }
        if ((st = p.r->table->copy_to_device(p.r->rt, p.local, D->experts, table,
                                             (size_t)cf->num_experts * sizeof *table, 0, err, sizeof err)))
            st = eb_fail(st, "expert table of layer %d on %s: %s", l, p.name, err);
    }
    free(table);
    m->dp->generation++;
    if (st == EB_OK) m->dp->stale = 0;
    return st;
}

void eb_device_primary_release(eb_model *m) {
    if (!m->dp) return;
    primary p = get_primary(m);
    if (m->dp->mem) p.r->table->mem_free(p.r->rt, p.local, m->dp->mem);
    free(m->dp->layers);
    free(m->dp);
    m->dp = NULL;
}

/* ---- context ----------------------------------------------------------------------------------------- */

static void lay_out_context(eb_context *c, layout *a) {
    eb_dev_context *dc = c->dc;
    const eb_model_config *cf = &c->model->cfg;
    size_t B = (size_t)c->n_batch, H = (size_t)cf->hidden_size, hd = (size_t)cf->head_dim;
    size_t qd = (size_t)cf->num_heads * hd, kvd = (size_t)cf->num_kv_heads * hd, F = sizeof(float);
    size_t I = (size_t)(cf->intermediate_size > cf->moe_intermediate_size ? cf->intermediate_size
                                                                           : cf->moe_intermediate_size);
    size_t E = cf->num_experts > 0 ? (size_t)cf->num_experts : 1, K = cf->top_k > 0 ? (size_t)cf->top_k : 1;
    size_t kv = (size_t)cf->num_layers * (size_t)c->n_ctx * kvd * F, rope = (size_t)c->n_ctx * (hd / 2) * F;
    dc->k_cache = place(a, NULL, kv);
    dc->v_cache = place(a, NULL, kv);
    dc->rope_cos = place(a, c->rope_cos, rope);
    dc->rope_sin = place(a, c->rope_sin, rope);
    dc->x = place(a, NULL, B * H * F);
    dc->xn = place(a, NULL, B * H * F);
    dc->proj = place(a, NULL, B * H * F);
    dc->q = place(a, NULL, B * qd * F);
    dc->att = place(a, NULL, B * qd * F);
    dc->k = place(a, NULL, B * kvd * F);
    dc->v = place(a, NULL, B * kvd * F);
    dc->gate = place(a, NULL, B * I * F);
    dc->up = place(a, NULL, B * I * F);
    dc->router = place(a, NULL, B * E * F);
    dc->topk_w = place(a, NULL, B * K * F);
    dc->topk_id = place(a, NULL, B * K * sizeof(int32_t));
    dc->pair_out = place(a, NULL, B * K * H * F);
    dc->h = place(a, NULL, B * K * I * F);
    dc->foreign = place(a, NULL, B * K * H * F);
    dc->logits = place(a, NULL, B * (size_t)cf->vocab_size * F);
    dc->ids = place(a, NULL, (B + 1) * sizeof(int32_t));
}

int eb_device_context_init(eb_context *c) {
    eb_model *m = c->model;
    primary p = get_primary(m);
    const eb_model_config *cf = &m->cfg;
    if (!(c->dc = calloc(1, sizeof *c->dc))) return eb_fail(EB_ERR_MEMORY, "out of memory");
    eb_dev_context *dc = c->dc;
    dc->graphs = calloc((size_t)cf->num_layers + 1, sizeof *dc->graphs);
    dc->graph_stop = calloc((size_t)cf->num_layers + 1, sizeof *dc->graph_stop);
    if (!dc->graphs || !dc->graph_stop) return eb_fail(EB_ERR_MEMORY, "out of memory");
    layout a = {m, p, NULL, 0, EB_OK, NULL};
    lay_out_context(c, &a);
    char err[512] = "";
    int st = p.r->table->mem_alloc(p.r->rt, p.local, a.off, &dc->mem, err, sizeof err);
    if (st)
        return eb_fail(st, "a context of %d positions (KV cache and buffers, %.1f MiB) on %s: %s", c->n_ctx,
                       a.off / 1048576.0, p.name, err);
    dc->bytes = a.off;
    m->arena_bytes[m->primary] += dc->bytes;
    a.base = dc->mem;
    a.off = 0;
    lay_out_context(c, &a);
    if (a.st) return a.st;
    size_t K = cf->top_k > 0 ? (size_t)cf->top_k : 1, B = (size_t)c->n_batch, H = (size_t)cf->hidden_size;
    size_t sizes[5] = {eb_align((B + 1) * sizeof(int32_t)), eb_align(B * K * sizeof(int32_t)),
                       eb_align(B * K * sizeof(float)), eb_align(B * H * sizeof(float)), eb_align(B * K * H * sizeof(float))};
    if ((st = p.r->table->host_alloc(p.r->rt, sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4], &dc->host, err,
                                     sizeof err)))
        return eb_fail(st, "pinned host memory for %s: %s", p.name, err);
    unsigned char *h = dc->host;
    dc->host_ids = (int32_t *)h;
    dc->host_topk_id = (int32_t *)(h += sizes[0]);
    dc->host_topk_w = (float *)(h += sizes[1]);
    dc->host_xn = (float *)(h += sizes[2]);
    dc->foreign_host = (float *)(h + sizes[3]);
    return EB_OK;
}

void eb_device_context_release(eb_context *c) {
    eb_dev_context *dc = c->dc;
    if (!dc) return;
    eb_model *m = c->model;
    primary p = get_primary(m);
    for (int i = 0; dc->graphs && i <= m->cfg.num_layers; i++)
        if (dc->graphs[i]) p.ops->graph_free(p.r->rt, p.local, dc->graphs[i]);
    free(dc->graphs);
    free(dc->graph_stop);
    if (dc->mem) {
        p.r->table->mem_free(p.r->rt, p.local, dc->mem);
        m->arena_bytes[m->primary] -= dc->bytes;
    }
    if (dc->host) p.r->table->host_free(p.r->rt, dc->host);
    free(dc);
    c->dc = NULL;
}

/* ---- one batch --------------------------------------------------------------------------------------- */

/* The outputs of a layer's experts that live elsewhere: routing and rows back to the host, the other owners
 * run through the scheduler, their outputs to the primary's `foreign` buffer. */
static int foreign_experts(eb_context *c, int layer, int64_t n) {
    eb_model *m = c->model;
    eb_engine *eng = m->engine;
    primary p = get_primary(m);
    eb_dev_context *dc = c->dc;
    const eb_layer *L = &m->layers[layer];
    int64_t H = m->cfg.hidden_size, K = m->cfg.top_k;
    char err[512] = "";
    int st;
    size_t id_bytes = (size_t)(n * K) * sizeof(int32_t), w_bytes = (size_t)(n * K) * sizeof(float);
    size_t xn_bytes = (size_t)(n * H) * sizeof(float);
    /* into pinned memory (pageable copies cost several times more), then where the scheduler reads them */
    if ((st = p.r->table->copy_to_host(p.r->rt, p.local, dc->host_topk_id, dc->topk_id, id_bytes, 1, err, sizeof err)) ||
        (st = p.r->table->copy_to_host(p.r->rt, p.local, dc->host_topk_w, dc->topk_w, w_bytes, 1, err, sizeof err)) ||
        (st = p.r->table->copy_to_host(p.r->rt, p.local, dc->host_xn, dc->xn, xn_bytes, 0, err, sizeof err)))
        return eb_fail(st, "reading layer %d's routing back from %s: %s", layer, p.name, err);
    for (int64_t i = 0; i < n * K; i++) /* the host indexes its tables with these: never trust them blindly */
        if (dc->host_topk_id[i] < 0 || dc->host_topk_id[i] >= m->cfg.num_experts)
            return eb_fail(EB_ERR_DEVICE, "layer %d's routing on %s chose expert %d, expected 0..%d (NaN activations?)",
                           layer, p.name, dc->host_topk_id[i], m->cfg.num_experts - 1);
    memcpy(c->topk_id, dc->host_topk_id, id_bytes);
    memcpy(c->topk_w, dc->host_topk_w, w_bytes);
    memcpy(c->xn, dc->host_xn, xn_bytes);
    m->counters.model.host_round_trips++;
    /* the other owners queued, but the last CPU device, whose experts this thread runs (it would only wait) */
    int inline_peer = -1;
    for (int d = 0; d < eng->n_devices; d++)
        if (d != m->primary && eng->devices[d].host_addressable) inline_peer = d;
    if ((st = eb_run_owners(c, L, n, inline_peer, m->primary))) return st;
    float *f = dc->foreign_host;
    size_t rows;
    if (c->mode == EB_MODE_REFERENCE) {
        rows = (size_t)(n * K);
        for (int64_t i = 0; i < n * K; i++) {
            int owner = L->experts[c->topk_id[i]].owner;
            if (owner == m->primary) continue;
            const float *y = c->step[owner].y + (int64_t)c->pair_slot[i] * H;
            memcpy(f + i * H, y, (size_t)H * sizeof(float));
        }
    } else {
        rows = (size_t)n;
        memset(f, 0, (size_t)(n * H) * sizeof(float));
        for (int d = 0; d < eng->n_devices; d++) {
            const eb_owner_step *s = &c->step[d];
            if (d == m->primary || s->n_pairs == 0) continue;
            const int32_t *tl = c->token_local + (size_t)d * (size_t)c->n_batch;
            for (int64_t t = 0; t < n; t++)
                if (tl[t] >= 0)
                    for (int64_t h = 0; h < H; h++) f[t * H + h] += s->y[(int64_t)tl[t] * H + h];
        }
    }
    if ((st = p.r->table->copy_to_device(p.r->rt, p.local, dc->foreign, f, rows * (size_t)H * sizeof(float), 1, err,
                                         sizeof err)))
        return eb_fail(st, "sending layer %d's expert outputs to %s: %s", layer, p.name, err);
    return EB_OK;
}

#define OP(call)                                                                                                 \
    do {                                                                                                         \
        if ((st = (call)) != 0) return eb_fail(st, "%s: %s", p.name, err);                                      \
    } while (0)

/* Queue one part of the forward pass of n rows: from the embedding (resume < 0), or from the experts of layer
 * `resume` (its routing done and its other owners' outputs in dc->foreign). The part ends right after the routing
 * of the next MoE layer with experts elsewhere (*stop = that layer: the host must run them), or at the end of the
 * pass (*stop = -1), the last n - first rows' logits then in dc->logits when logits. */
static int queue_part(eb_context *c, int64_t n, int64_t first, int logits, int resume, int *stop) {
    eb_model *m = c->model;
    const eb_model_config *cf = &m->cfg;
    const eb_dev_primary *dp = m->dp;
    eb_dev_context *dc = c->dc;
    primary p = get_primary(m);
    const eb_rt_primary_ops *ops = p.ops;
    void *rt = p.r->rt;
    int dev = p.local, st;
    char err[512] = "";
    int64_t H = cf->hidden_size, hd = cf->head_dim, qd = (int64_t)cf->num_heads * hd, kvd = (int64_t)cf->num_kv_heads * hd;
    int64_t E = cf->num_experts, K = cf->top_k;
    float eps = (float)cf->rms_norm_eps;

    *stop = -1;
    if (resume < 0) OP(ops->embed(rt, dev, dp->embed.data, dp->embed.dtype, H, dc->ids + 1, n, dc->x, err, sizeof err));
    for (int l = resume < 0 ? 0 : resume; l < cf->num_layers; l++) {
        const eb_dev_layer *D = &dp->layers[l];
        if (l == resume) goto experts;
        eb_rt_norm input = {dc->x, D->input_norm, dc->xn, n, H, eps};
        eb_rt_matmul qkv[3] = {{D->q.data, D->q.dtype, D->q.rows, D->q.cols, dc->xn, n, dc->q},
                               {D->k.data, D->k.dtype, D->k.rows, D->k.cols, dc->xn, n, dc->k},
                               {D->v.data, D->v.dtype, D->v.rows, D->v.cols, dc->xn, n, dc->v}};
        OP(ops->matmul(rt, dev, &input, qkv, 3, 0, err, sizeof err));
        if (D->q_bias) {
            OP(ops->add(rt, dev, dc->q, D->q_bias, n, qd, 1, err, sizeof err));
            OP(ops->add(rt, dev, dc->k, D->k_bias, n, kvd, 1, err, sizeof err));
            OP(ops->add(rt, dev, dc->v, D->v_bias, n, kvd, 1, err, sizeof err));
        }
        size_t layer_kv = (size_t)l * (size_t)c->n_ctx * (size_t)kvd;
        eb_rt_attention at = {dc->q, dc->k, dc->v, D->q_norm, D->k_norm, dc->rope_cos, dc->rope_sin,
                              dc->k_cache + layer_kv, dc->v_cache + layer_kv, dc->ids, (int32_t)n,
                              cf->num_heads, cf->num_kv_heads, cf->head_dim, c->n_ctx, eps, dc->att};
        OP(ops->attention(rt, dev, &at, err, sizeof err));
        eb_rt_matmul o = {D->o.data, D->o.dtype, D->o.rows, D->o.cols, dc->att, n, dc->x};
        if (D->o_bias) { /* the CPU path's association: x += (o . att + bias) */
            o.y = dc->proj;
            OP(ops->matmul(rt, dev, NULL, &o, 1, 0, err, sizeof err));
            OP(ops->add(rt, dev, dc->proj, D->o_bias, n, H, 1, err, sizeof err));
            OP(ops->add(rt, dev, dc->x, dc->proj, n, H, 0, err, sizeof err));
        } else {
            OP(ops->matmul(rt, dev, NULL, &o, 1, 1, err, sizeof err));
        }
        eb_rt_norm post = {dc->x, D->post_norm, dc->xn, n, H, eps};
        if (m->layers[l].is_moe) {
            eb_rt_route r = {post, D->router.data, D->router.dtype, (int32_t)E, (int32_t)K, cf->norm_topk_prob,
                             dc->router, dc->topk_id, dc->topk_w, dp->hits + (size_t)l * (size_t)E};
            OP(ops->route(rt, dev, &r, err, sizeof err));
            if (D->n_foreign) {
                *stop = l;
                return EB_OK;
            }
        experts:;
            eb_rt_moe b = {D->experts, (int32_t)E, (int32_t)K, (int32_t)n, (int32_t)H, cf->moe_intermediate_size,
                           c->mode == EB_MODE_OWNER_LOCAL ? EB_REDUCE_OWNER_LOCAL : EB_REDUCE_REFERENCE,
                           dc->xn, dc->topk_id, dc->topk_w, D->n_foreign ? dc->foreign : NULL, dc->pair_out, dc->h,
                           dc->x, dp->stats};
            OP(ops->moe(rt, dev, &b, err, sizeof err));
        } else {
            eb_rt_matmul gu[2] = {{D->gate.data, D->gate.dtype, D->gate.rows, D->gate.cols, dc->xn, n, dc->gate},
                                  {D->up.data, D->up.dtype, D->up.rows, D->up.cols, dc->xn, n, dc->up}};
            OP(ops->matmul(rt, dev, &post, gu, 2, 0, err, sizeof err));
            OP(ops->silu_mul(rt, dev, dc->gate, dc->up, n * D->gate.rows, err, sizeof err));
            eb_rt_matmul dn = {D->down.data, D->down.dtype, D->down.rows, D->down.cols, dc->gate, n, dc->x};
            OP(ops->matmul(rt, dev, NULL, &dn, 1, 1, err, sizeof err));
        }
    }
    if (!logits) return EB_OK;
    eb_rt_norm final = {dc->x + first * H, dp->final_norm, dc->xn + first * H, n - first, H, eps};
    eb_rt_matmul lm = {dp->lm_head.data, dp->lm_head.dtype, dp->lm_head.rows, dp->lm_head.cols, dc->xn + first * H,
                       n - first, dc->logits};
    OP(ops->matmul(rt, dev, &final, &lm, 1, 0, err, sizeof err));
    return EB_OK;
}

/* Run one part (queue_part): a one-token part from its recorded graph when graphs are on (recorded on first use,
 * again after a placement or reduction-mode change; kept per resume layer, so a table cannot mix up parts),
 * otherwise queued anew. */
static int run_part(eb_context *c, int64_t n, int64_t first, int logits, int resume, int *stop) {
    int part = resume + 1;
    eb_model *m = c->model;
    eb_dev_context *dc = c->dc;
    primary p = get_primary(m);
    if (n != 1 || !c->use_graphs || !p.ops->graph_begin) return queue_part(c, n, first, logits, resume, stop);
    char err[512] = "";
    int st;
    if (dc->graph_generation != m->dp->generation || dc->graph_mode != c->mode) {
        /* the expert tables changed (so may the parts), or the reduction mode (recorded in the expert steps) */
        for (int i = 0; i <= m->cfg.num_layers; i++)
            if (dc->graphs[i]) p.ops->graph_free(p.r->rt, p.local, dc->graphs[i]), dc->graphs[i] = NULL;
        dc->graph_generation = m->dp->generation;
        dc->graph_mode = c->mode;
    }
    if (!dc->graphs[part]) {
        if ((st = p.ops->graph_begin(p.r->rt, p.local, err, sizeof err)))
            return eb_fail(st, "recording a step on %s: %s", p.name, err);
        int queued = queue_part(c, 1, 0, 1, resume, &dc->graph_stop[part]);
        void *graph = NULL;
        if ((st = p.ops->graph_end(p.r->rt, p.local, queued ? NULL : &graph, err, sizeof err)) && !queued)
            return eb_fail(st, "recording a step on %s: %s", p.name, err);
        if (queued) return queued;
        dc->graphs[part] = graph;
        m->counters.model.graph_captures++;
    }
    if ((st = p.ops->graph_launch(p.r->rt, p.local, dc->graphs[part], err, sizeof err)))
        return eb_fail(st, "running the recorded step on %s: %s", p.name, err);
    m->counters.model.graph_launches++;
    *stop = dc->graph_stop[part];
    return EB_OK;
}

int eb_device_eval_batch(eb_context *c, const int32_t *ids, int64_t n, float *logits, int all_rows) {
    eb_model *m = c->model;
    eb_engine *eng = m->engine;
    eb_dev_context *dc = c->dc;
    primary p = get_primary(m);
    const eb_model_config *cf = &m->cfg;
    char err[512] = "";
    int st;
    if (eng->n_devices > c->n_devices)
        return eb_fail(EB_ERR_STATE, "a runtime was loaded after this context was created: create a new context");
    if (m->dp->stale)
        return eb_fail(EB_ERR_STATE, "the expert tables on %s are out of date after a placement that failed to "
                                     "finish: set the placement again", p.name);
    dc->host_ids[0] = c->pos; /* the position, then the ids: one copy of n + 1 values */
    memcpy(dc->host_ids + 1, ids, (size_t)n * sizeof *ids);
    if ((st = p.r->table->copy_to_device(p.r->rt, p.local, dc->ids, dc->host_ids, ((size_t)n + 1) * sizeof(int32_t), 1,
                                         err, sizeof err)))
        return eb_fail(st, "sending token ids to %s: %s", p.name, err);
    int64_t first = all_rows ? 0 : n - 1;
    /* parts between the host round trips of layers with experts elsewhere (one part when there are none) */
    for (int resume = -1, stop; !st; resume = stop) {
        if ((st = run_part(c, n, first, logits != NULL, resume, &stop)) || stop < 0) break;
        st = foreign_experts(c, stop, n);
    }
    if (st) { /* let what was queued finish before the staging memory is written again (its error is st's) */
        (void)p.r->table->synchronize(p.r->rt, p.local, err, sizeof err);
        return st;
    }
    for (int l = 0; l < cf->num_layers; l++)
        if (m->layers[l].is_moe) {
            m->route_tokens[l] += (uint64_t)n;
            m->counters.model.layer_steps++;
        }
    if (logits)
        st = p.r->table->copy_to_host(p.r->rt, p.local, logits, dc->logits,
                                      (size_t)(n - first) * (size_t)cf->vocab_size * sizeof(float), 0, err, sizeof err);
    else
        st = p.r->table->synchronize(p.r->rt, p.local, err, sizeof err);
    return st ? eb_fail(st, "%s: %s", p.name, err) : EB_OK;
}
