/* What the primary device holds: the weights other than the experts' as its kernels read them, the expert tables
 * and routing counters, and each context's buffers (KV cache, activations) and pinned host staging.
 *
 * A device that cannot read host memory (a GPU) gets a copy of every such weight in one allocation; a CPU device
 * reads them where they are (the mapped or copied files): its "uploads" cost nothing. Everything else is allocated
 * on the primary through its runtime either way, so one forward driver serves every primary.
 */
#include <stdlib.h>
#include <string.h>

#include "eb_formats.h"
#include "eb_model.h"

typedef struct {
    const eb_runtime *r;
    int local;
    const char *name;
} primary;

static primary get_primary(const eb_model *m) {
    const eb_engine *e = m->engine;
    return (primary){eb_device_runtime(e, m->primary), e->devices[m->primary].local, e->devices[m->primary].name};
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
    int in_place;      /* the primary reads host memory: weights are used where they are */
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

/* A weight and its scale companion, each its own piece of the allocation. */
static eb_weight place_weight(layout *a, const eb_weight *w) {
    eb_weight out = *w;
    if (a->in_place) return out;
    out.data = w->data ? place(a, w->data, (size_t)eb_weight_bytes(w)) : NULL;
    if (w->data && w->scale.data) out.scale.data = place(a, w->scale.data, (size_t)eb_scale_bytes(w));
    return out;
}

static const float *place_vector(layout *a, const float *v, int64_t n) {
    if (a->in_place) return v;
    return v ? place(a, v, (size_t)n * sizeof(float)) : NULL;
}

static void lay_out(layout *a) {
    eb_model *m = a->m;
    eb_dev_primary *dp = m->dp;
    const eb_model_config *cf = &m->cfg;
    int64_t H = cf->hidden_size;
    if (m->head_of) { /* (the same primary, not in place: model.c's borrow_head) */
        dp->embed = m->head_of->dp->embed;
        dp->lm_head = m->head_of->dp->lm_head;
    } else {
        dp->embed = place_weight(a, &m->embed);
        dp->lm_head = m->lm_head.data == m->embed.data ? dp->embed : place_weight(a, &m->lm_head);
    }
    dp->final_norm = place_vector(a, m->final_norm, H);
    for (int l = 0; l < cf->num_layers; l++) {
        const eb_layer *L = &m->layers[l];
        eb_dev_layer *D = &dp->layers[l];
#define PLACE_WEIGHT(f) D->f = place_weight(a, &L->f);
#define PLACE_VECTOR(f, n) D->f = place_vector(a, L->f, n);
        EB_LAYER_WEIGHTS(PLACE_WEIGHT)
        EB_LAYER_VECTORS(PLACE_VECTOR, cf)
#undef PLACE_WEIGHT
#undef PLACE_VECTOR
        if (L->is_moe) D->experts = place(a, NULL, (size_t)cf->num_experts * sizeof(eb_rt_expert));
    }
    size_t n_hits = (size_t)cf->num_layers * (size_t)(cf->num_experts > 0 ? cf->num_experts : 1);
    dp->hits = place(a, a->zeros, n_hits * sizeof *dp->hits); /* counters start at zero */
    dp->stats = place(a, a->zeros, 2 * sizeof *dp->stats);
}

int eb_primary_init(eb_model *m) {
    primary p = get_primary(m);
    m->dp = calloc(1, sizeof *m->dp);
    if (!m->dp || !(m->dp->layers = calloc((size_t)m->cfg.num_layers, sizeof *m->dp->layers)))
        return eb_fail(EB_ERR_MEMORY, "out of memory");
    size_t n_hits = (size_t)m->cfg.num_layers * (size_t)(m->cfg.num_experts > 0 ? m->cfg.num_experts : 1);
    void *zeros = calloc(n_hits > 2 ? n_hits : 2, sizeof(unsigned long long));
    if (!zeros) return eb_fail(EB_ERR_MEMORY, "out of memory");
    layout a = {m, p, NULL, 0, EB_OK, zeros, m->primary_host};
    lay_out(&a);
    char err[512] = "";
    int st = p.r->table->mem_alloc(p.r->rt, p.local, a.off, &m->dp->mem, err, sizeof err);
    if (st) {
        free(zeros);
        return eb_fail(st, "the model's weights (%.1f MiB but the experts) on %s: %s", a.off / 1048576.0, p.name,
                       err);
    }
    m->dp->bytes = a.off;
    a.base = m->dp->mem;
    a.off = 0;
    lay_out(&a);
    free(zeros);
    if (a.st) return a.st;
    return eb_primary_refresh(m);
}

int eb_primary_refresh(eb_model *m) {
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
            table[e] = eb_rt_expert_of(x, e, own);
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

void eb_primary_release(eb_model *m) {
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
    eb_dims d = eb_model_dims(cf);
    size_t B = (size_t)c->n_batch, H = (size_t)cf->hidden_size, F = sizeof(float), I = (size_t)d.ffn;
    size_t E = cf->num_experts > 0 ? (size_t)cf->num_experts : 1, K = cf->top_k > 0 ? (size_t)cf->top_k : 1;
    size_t rope_dim = (size_t)(cf->rope_dim ? cf->rope_dim : cf->head_dim);
    size_t positions = c->cache_at[cf->num_layers], rope = (size_t)c->n_ctx * (rope_dim / 2) * F;
    /* a value of the cache's format, from the format table (a half cache: refused where the cache is other state) */
    size_t kv = (size_t)eb_row_bytes(c->kv_dtype, 1);
    dc->k_cache = place(a, NULL, positions * (size_t)d.cache_k * kv);
    dc->v_cache = d.cache_v ? place(a, NULL, positions * (size_t)d.cache_v * kv) : NULL;
    dc->rope_cos = place(a, c->rope_cos, rope);
    dc->rope_sin = place(a, c->rope_sin, rope);
    dc->x = place(a, NULL, B * H * F);
    dc->xn = place(a, NULL, B * H * F);
    dc->proj = place(a, NULL, B * H * F);
    dc->q = place(a, NULL, B * (size_t)d.q * F);
    dc->att = place(a, NULL, B * (size_t)d.att * F);
    dc->k = place(a, NULL, B * (size_t)d.k * F);
    dc->v = d.v ? place(a, NULL, B * (size_t)d.v * F) : NULL;
    dc->gate = place(a, NULL, B * I * F);
    dc->up = place(a, NULL, B * I * F);
    dc->router = place(a, NULL, B * E * F);
    dc->topk_w = place(a, NULL, B * K * F);
    dc->topk_id = place(a, NULL, B * K * sizeof(int32_t));
    dc->pair_out = place(a, NULL, B * K * H * F);
    dc->h = place(a, NULL, B * K * I * F);
    dc->foreign = place(a, NULL, B * K * H * F);
    dc->logits = place(a, NULL, B * (size_t)cf->vocab_size * F);
    dc->hc = d.hc ? place(a, NULL, B * (size_t)d.hc * F) : NULL;
    dc->hin = cf->next_token_module ? place(a, NULL, B * H * F) : NULL;
    dc->ids = place(a, NULL, (B + 1) * sizeof(int32_t));
}

int eb_context_buffers_init(eb_context *c) {
    eb_model *m = c->model;
    primary p = get_primary(m);
    const eb_model_config *cf = &m->cfg;
    if (!(c->dc = calloc(1, sizeof *c->dc))) return eb_fail(EB_ERR_MEMORY, "out of memory");
    eb_dev_context *dc = c->dc;
    dc->checked_precision = -1; /* the first step checks the precision against the placement */
    dc->graphs = calloc((size_t)cf->num_layers + 1, sizeof *dc->graphs);
    if (!dc->graphs) return eb_fail(EB_ERR_MEMORY, "out of memory");
    layout a = {m, p, NULL, 0, EB_OK, NULL, 0};
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
    c->topk_id = dc->host_topk_id;
    c->topk_w = dc->host_topk_w;
    c->xn = dc->host_xn;
    return EB_OK;
}

void eb_context_buffers_release(eb_context *c) {
    eb_dev_context *dc = c->dc;
    if (!dc) return;
    eb_model *m = c->model;
    primary p = get_primary(m);
    for (int i = 0; dc->graphs && i <= m->cfg.num_layers; i++)
        if (dc->graphs[i]) p.r->table->graphs->free(p.r->rt, p.local, dc->graphs[i]);
    free(dc->graphs);
    if (dc->mem) {
        p.r->table->mem_free(p.r->rt, p.local, dc->mem);
        m->arena_bytes[m->primary] -= dc->bytes;
    }
    if (dc->host) p.r->table->host_free(p.r->rt, dc->host);
    free(dc);
    c->dc = NULL;
}

