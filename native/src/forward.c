/* The building blocks of the forward pass, the parts of a step between host round trips, and one batch.
 *
 * Every block queues the primary's operations through its runtime (eb_rt_forward_ops): the same code runs on a
 * CPU primary (operations run on the calling thread), on hostsim and on a GPU (operations queued on its stream).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eb_forward.h"

/* Every family the core runs: adding one is its file in models/ and its line here. */
const eb_family *const eb_families[] = {&eb_family_qwen3,     &eb_family_qwen3_moe,    &eb_family_deepseek_v3,
                                        &eb_family_gpt_oss,   &eb_family_deepseek_v4, &eb_family_deepseek_v3_mtp};
const int eb_n_families = (int)(sizeof eb_families / sizeof eb_families[0]);

const eb_family *eb_family_of(const eb_model_config *c) {
    for (int i = 0; i < eb_n_families; i++)
        if (eb_families[i]->arch == c->arch && eb_families[i]->next_token == (c->next_token_module != 0))
            return eb_families[i];
    return NULL;
}

uint64_t eb_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the trace ----------------------------------------------------------------------------------------- */

static void span(eb_context *c, int device, int layer, int kind, int64_t rows, uint64_t t0, uint64_t t1) {
    if (!c->trace_cap) return;
    if (c->trace_n == c->trace_cap) {
        c->trace_lost++;
        return;
    }
    c->trace[c->trace_n++] = (eb_span){t0, t1, device, layer, c->pos, kind, (int32_t)rows};
}

static uint64_t trace_now(const eb_context *c) { return c->trace_cap ? eb_now_ns() : 0; }

/* ---- parts of a step ------------------------------------------------------------------------------------ */

#define OP(s, call)                                                                                              \
    do {                                                                                                         \
        int st_ = (s)->replaying ? EB_OK : (call);                                                               \
        if (st_) return eb_fail(st_, "%s: %s", (s)->name, (s)->err);                                             \
    } while (0)

/* A part begins: replayed from its recording when there is one (its operations then skipped), else recorded. */
static int part_begin(eb_step *s) {
    if (!s->graphs) return EB_OK;
    eb_dev_context *dc = s->c->dc;
    void *g = dc->graphs[s->part];
    int st;
    if (g) {
        uint64_t t0 = trace_now(s->c);
        if ((st = s->graphs->launch(s->rt, s->dev, g, s->err, sizeof s->err)))
            return eb_fail(st, "running the recorded step on %s: %s", s->name, s->err);
        span(s->c, s->m->primary, -1, EB_SPAN_GRAPH, s->n, t0, trace_now(s->c));
        s->m->counters.model.graph_launches++;
        s->replaying = 1;
        return EB_OK;
    }
    if ((st = s->graphs->begin(s->rt, s->dev, s->err, sizeof s->err)))
        return eb_fail(st, "recording a step on %s: %s", s->name, s->err);
    s->recording = 1;
    return EB_OK;
}

/* A part ends: a recording is kept and launched (it has not run yet). */
static int part_end(eb_step *s) {
    eb_dev_context *dc = s->c->dc;
    int part = s->part++;
    s->replaying = 0;
    if (!s->recording) return EB_OK;
    void *g = NULL;
    s->recording = 0;
    int st = s->graphs->end(s->rt, s->dev, &g, s->err, sizeof s->err);
    if (st) return eb_fail(st, "recording a step on %s: %s", s->name, s->err);
    dc->graphs[part] = g;
    s->m->counters.model.graph_captures++;
    uint64_t t0 = trace_now(s->c);
    if ((st = s->graphs->launch(s->rt, s->dev, g, s->err, sizeof s->err)))
        return eb_fail(st, "running the recorded step on %s: %s", s->name, s->err);
    span(s->c, s->m->primary, -1, EB_SPAN_GRAPH, s->n, t0, trace_now(s->c));
    s->m->counters.model.graph_launches++;
    return EB_OK;
}

/* ---- blocks --------------------------------------------------------------------------------------------- */

/* The step's tokens' rows of the embedding table into x. */
static int embed_into(eb_step *s, float *x) {
    const eb_dev_primary *dp = s->m->dp;
    OP(s, s->ops->embed(s->rt, s->dev, dp->embed.data, dp->embed.dtype, &dp->embed.scale, s->m->cfg.hidden_size,
                        s->c->dc->ids + 1, s->n, x, s->err, sizeof s->err));
    return EB_OK;
}

int eb_block_embed(eb_step *s) {
    uint64_t t0 = trace_now(s->c);
    int st = embed_into(s, s->c->dc->x);
    if (st) return st;
    if (!s->replaying) span(s->c, s->m->primary, -1, EB_SPAN_EMBED, s->n, t0, trace_now(s->c));
    return EB_OK;
}

static eb_rt_matmul product(const eb_step *s, const eb_weight *w, const float *x, int64_t n, float *y) {
    return (eb_rt_matmul){w->data, w->dtype, w->rows, w->cols, x, n, y, s->c->precision, w->scale};
}

int eb_block_next_token_input(eb_step *s) {
    const eb_dev_primary *dp = s->m->dp;
    const eb_dev_layer *D = &dp->layers[0];
    eb_dev_context *dc = s->c->dc;
    int64_t n = s->n, H = s->m->cfg.hidden_size;
    float eps = (float)s->m->cfg.rms_norm_eps;
    uint64_t t0 = trace_now(s->c);
    int st = embed_into(s, dc->proj);
    if (st) return st;
    eb_rt_norm e = {dc->proj, D->enorm, dc->xn, n, H, eps}, h = {dc->hin, D->hnorm, dc->xn, n, H, eps};
    eb_rt_matmul from_e = product(s, &D->eh_embed, dc->xn, n, dc->x), from_h = product(s, &D->eh_hidden, dc->xn, n, dc->x);
    OP(s, s->ops->matmul(s->rt, s->dev, &e, &from_e, 1, 0, s->err, sizeof s->err));
    OP(s, s->ops->matmul(s->rt, s->dev, &h, &from_h, 1, 1, s->err, sizeof s->err));
    if (!s->replaying) span(s->c, s->m->primary, -1, EB_SPAN_EMBED, s->n, t0, trace_now(s->c));
    return EB_OK;
}

int eb_block_attention(eb_step *s, int l) {
    const eb_model_config *cf = &s->m->cfg;
    const eb_dev_layer *D = &s->m->dp->layers[l];
    eb_dev_context *dc = s->c->dc;
    int64_t n = s->n, H = cf->hidden_size, qd = (int64_t)cf->num_heads * cf->head_dim;
    int64_t kvd = (int64_t)cf->num_kv_heads * cf->head_dim;
    float eps = (float)cf->rms_norm_eps;
    uint64_t t0 = trace_now(s->c);
    eb_rt_norm input = {dc->x, D->input_norm, dc->xn, n, H, eps};
    eb_rt_matmul qkv[3] = {product(s, &D->q, dc->xn, n, dc->q), product(s, &D->k, dc->xn, n, dc->k),
                           product(s, &D->v, dc->xn, n, dc->v)};
    OP(s, s->ops->matmul(s->rt, s->dev, &input, qkv, 3, 0, s->err, sizeof s->err));
    if (D->q_bias) {
        OP(s, s->ops->add(s->rt, s->dev, dc->q, D->q_bias, n, qd, 1, s->err, sizeof s->err));
        OP(s, s->ops->add(s->rt, s->dev, dc->k, D->k_bias, n, kvd, 1, s->err, sizeof s->err));
        OP(s, s->ops->add(s->rt, s->dev, dc->v, D->v_bias, n, kvd, 1, s->err, sizeof s->err));
    }
    size_t layer_kv = s->c->cache_at[l] * (size_t)eb_row_bytes(s->c->kv_dtype, kvd);
    eb_rt_attention at = {dc->q,        dc->k,         dc->v,        D->q_norm,    D->k_norm,    dc->rope_cos,
                          dc->rope_sin, (char *)dc->k_cache + layer_kv, (char *)dc->v_cache + layer_kv, dc->ids,
                          (int32_t)n, cf->num_heads, cf->num_kv_heads, cf->head_dim, s->c->n_ctx, eps, dc->att,
                          D->sinks, s->m->layers[l].window, s->c->cache_rows[l], s->c->kv_dtype};
    OP(s, s->ops->attention(s->rt, s->dev, &at, s->err, sizeof s->err));
    if (D->o_bias) { /* x += (o . att + bias) */
        eb_rt_matmul o = product(s, &D->o, dc->att, n, dc->proj);
        OP(s, s->ops->matmul(s->rt, s->dev, NULL, &o, 1, 0, s->err, sizeof s->err));
        OP(s, s->ops->add(s->rt, s->dev, dc->proj, D->o_bias, n, H, 1, s->err, sizeof s->err));
        OP(s, s->ops->add(s->rt, s->dev, dc->x, dc->proj, n, H, 0, s->err, sizeof s->err));
    } else {
        eb_rt_matmul o = product(s, &D->o, dc->att, n, dc->x);
        OP(s, s->ops->matmul(s->rt, s->dev, NULL, &o, 1, 1, s->err, sizeof s->err));
    }
    if (!s->replaying) span(s->c, s->m->primary, l, EB_SPAN_ATTENTION, n, t0, trace_now(s->c));
    return EB_OK;
}

int eb_block_mla_attention(eb_step *s, int l) {
    const eb_model_config *cf = &s->m->cfg;
    const eb_dev_layer *D = &s->m->dp->layers[l];
    eb_dev_context *dc = s->c->dc;
    int64_t n = s->n, H = cf->hidden_size, qlr = cf->q_lora_rank;
    float eps = (float)cf->rms_norm_eps;
    uint64_t t0 = trace_now(s->c);
    eb_rt_norm input = {dc->x, D->input_norm, dc->xn, n, H, eps};
    if (qlr) { /* q through its low-rank bottleneck: q_a, its norm (into the second half of v), q_b */
        eb_rt_matmul first[2] = {product(s, &D->q_a, dc->xn, n, dc->v), product(s, &D->kv_a, dc->xn, n, dc->k)};
        OP(s, s->ops->matmul(s->rt, s->dev, &input, first, 2, 0, s->err, sizeof s->err));
        eb_rt_norm q_norm = {dc->v, D->q_a_norm, dc->v + n * qlr, n, qlr, 1e-6f}; /* transformers: always 1e-6 */
        eb_rt_matmul q = product(s, &D->q_b, dc->v + n * qlr, n, dc->q);
        OP(s, s->ops->matmul(s->rt, s->dev, &q_norm, &q, 1, 0, s->err, sizeof s->err));
    } else {
        eb_rt_matmul first[2] = {product(s, &D->q, dc->xn, n, dc->q), product(s, &D->kv_a, dc->xn, n, dc->k)};
        OP(s, s->ops->matmul(s->rt, s->dev, &input, first, 2, 0, s->err, sizeof s->err));
    }
    int64_t row = (int64_t)cf->kv_lora_rank + cf->qk_rope_head_dim;
    float scale = cf->attention_scale > 0.0 ? (float)cf->attention_scale
                                            : 1.0f / sqrtf((float)(cf->qk_nope_head_dim + cf->qk_rope_head_dim));
    eb_rt_mla at = {dc->q, dc->k, D->kv_a_norm, D->k_b.data, D->v_b.data, D->k_b.dtype, D->v_b.dtype,
                    s->m->layers[l].v_b_head_rows, dc->rope_cos, dc->rope_sin,
                    (float *)dc->k_cache + s->c->cache_at[l] * (size_t)row, dc->ids, (int32_t)n, cf->num_heads,
                    cf->qk_nope_head_dim, cf->qk_rope_head_dim, cf->v_head_dim, cf->kv_lora_rank, s->c->n_ctx,
                    cf->rope_interleave, 1e-6f /* kv_a_layernorm's, as q_a_layernorm's */, scale, dc->att};
    OP(s, s->mla->mla(s->rt, s->dev, &at, s->err, sizeof s->err));
    eb_rt_matmul o = product(s, &D->o, dc->att, n, dc->x);
    OP(s, s->ops->matmul(s->rt, s->dev, NULL, &o, 1, 1, s->err, sizeof s->err));
    if (!s->replaying) span(s->c, s->m->primary, l, EB_SPAN_ATTENTION, n, t0, trace_now(s->c));
    return EB_OK;
}

/* x += down(silu(gate(xn)) * up(xn)): xn written by the norm first where one is given (a dense layer), else as the
 * routing left it (shared experts). */
static int swiglu(eb_step *s, const eb_rt_norm *norm, const eb_weight *gate, const eb_weight *up,
                  const eb_weight *down) {
    eb_dev_context *dc = s->c->dc;
    int64_t n = s->n;
    eb_rt_matmul gu[2] = {product(s, gate, dc->xn, n, dc->gate), product(s, up, dc->xn, n, dc->up)};
    OP(s, s->ops->matmul(s->rt, s->dev, norm, gu, 2, 0, s->err, sizeof s->err));
    if (s->m->family->clamped_shared)
        OP(s, s->v4->swiglu(s->rt, s->dev, dc->gate, dc->up, n * gate->rows, (float)s->m->cfg.swiglu_limit, s->err,
                            sizeof s->err));
    else
        OP(s, s->ops->silu_mul(s->rt, s->dev, dc->gate, dc->up, n * gate->rows, s->err, sizeof s->err));
    eb_rt_matmul d = product(s, down, dc->gate, n, dc->x);
    OP(s, s->ops->matmul(s->rt, s->dev, NULL, &d, 1, 1, s->err, sizeof s->err));
    return EB_OK;
}

/* The shared experts of a MoE layer (none: nothing), one SwiGLU FFN of the routed experts' input rows xn (written by
 * the routing), added to x: before the routed experts' sum in every case, so x's association does not depend on
 * where the routed experts ran. */
static int shared_experts(eb_step *s, int l) {
    const eb_dev_layer *D = &s->m->dp->layers[l];
    if (!D->sh_gate.data) return EB_OK;
    uint64_t t0 = trace_now(s->c);
    int st = swiglu(s, NULL, &D->sh_gate, &D->sh_up, &D->sh_down);
    if (!st && !s->replaying) span(s->c, s->m->primary, l, EB_SPAN_SHARED, s->n, t0, trace_now(s->c));
    return st;
}

int eb_block_dense_ffn(eb_step *s, int l) {
    const eb_model_config *cf = &s->m->cfg;
    const eb_dev_layer *D = &s->m->dp->layers[l];
    eb_dev_context *dc = s->c->dc;
    uint64_t t0 = trace_now(s->c);
    eb_rt_norm post = {dc->x, D->post_norm, dc->xn, s->n, cf->hidden_size, (float)cf->rms_norm_eps};
    int st = swiglu(s, &post, &D->gate, &D->up, &D->down);
    if (!st && !s->replaying) span(s->c, s->m->primary, l, EB_SPAN_DENSE, s->n, t0, trace_now(s->c));
    return st;
}

/* A split layer's routing and rows, read back from the primary for the scheduler (pinned host memory). */
static int read_routing(eb_step *s, int l) {
    eb_model *m = s->m;
    eb_dev_context *dc = s->c->dc;
    const eb_runtime_table *t = s->r->table;
    int64_t n = s->n, H = m->cfg.hidden_size, K = s->c->top_k;
    size_t id_bytes = (size_t)(n * K) * sizeof(int32_t), w_bytes = (size_t)(n * K) * sizeof(float);
    int st;
    if ((st = t->copy_to_host(s->rt, s->dev, dc->host_topk_id, dc->topk_id, id_bytes, 1, s->err, sizeof s->err)) ||
        (st = t->copy_to_host(s->rt, s->dev, dc->host_topk_w, dc->topk_w, w_bytes, 1, s->err, sizeof s->err)) ||
        (st = t->copy_to_host(s->rt, s->dev, dc->host_xn, dc->xn, (size_t)(n * H) * sizeof(float), 0, s->err,
                              sizeof s->err)))
        return eb_fail(st, "reading layer %d's routing back from %s: %s", l, s->name, s->err);
    for (int64_t i = 0; i < n * K; i++) /* the host indexes its tables with these: never trust them blindly */
        if (dc->host_topk_id[i] < 0 || dc->host_topk_id[i] >= m->cfg.num_experts)
            return eb_fail(EB_ERR_DEVICE, "layer %d's routing on %s chose expert %d, expected 0..%d (NaN activations?)",
                           l, s->name, dc->host_topk_id[i], m->cfg.num_experts - 1);
    m->counters.model.host_round_trips++;
    return EB_OK;
}

/* The other owners' outputs to the primary: reference mode, each of their pairs' rows (row t * top_k + k);
 * owner_local, per row the sum of the owners' sums in device order. */
static int send_foreign(eb_step *s, int l) {
    eb_context *c = s->c;
    eb_model *m = s->m;
    eb_engine *eng = m->engine;
    eb_dev_context *dc = c->dc;
    const eb_layer *L = &m->layers[l];
    int64_t n = s->n, H = m->cfg.hidden_size, K = c->top_k;
    float *f = dc->foreign_host;
    size_t rows;
    if (c->mode == EB_MODE_REFERENCE) {
        rows = (size_t)(n * K);
        for (int64_t i = 0; i < n * K; i++) {
            int owner = L->experts[c->topk_id[i]].owner;
            if (owner != m->primary)
                memcpy(f + i * H, c->step[owner].y + (int64_t)c->pair_slot[i] * H, (size_t)H * sizeof(float));
        }
    } else {
        rows = (size_t)n;
        memset(f, 0, (size_t)(n * H) * sizeof(float));
        for (int d = 0; d < eng->n_devices; d++) {
            const eb_owner_step *o = &c->step[d];
            if (d == m->primary || o->n_pairs == 0) continue;
            const int32_t *tl = c->token_local + (size_t)d * (size_t)c->n_batch;
            for (int64_t t = 0; t < n; t++)
                if (tl[t] >= 0)
                    for (int64_t h = 0; h < H; h++) f[t * H + h] += o->y[(int64_t)tl[t] * H + h];
        }
    }
    int st = s->r->table->copy_to_device(s->rt, s->dev, dc->foreign, f, rows * (size_t)H * sizeof(float), 1, s->err,
                                         sizeof s->err);
    return st ? eb_fail(st, "sending layer %d's expert outputs to %s: %s", l, s->name, s->err) : EB_OK;
}

/* Each peer's branch of layer l as spans, from its events (this thread's clock for one run inline): its experts, and
 * for a staged branch its rows' upload before them and its outputs' download after (stage spans on the peer). */
static void trace_peers(eb_step *s, int l) {
    eb_context *c = s->c;
    const eb_engine *eng = s->m->engine;
    for (int d = 0; d < eng->n_devices; d++) {
        const eb_runtime *r = eb_device_runtime(eng, d);
        const eb_owner_step *o = &c->step[d];
        int local = eng->devices[d].local;
        uint64_t b0 = o->t0, b1 = o->t1, u = 0, w = 0;
        if (d == s->m->primary || o->n_pairs == 0) continue;
        if (!o->inline_run && (r->table->event_time(r->rt, local, c->begun[d], &b0, s->err, sizeof s->err) != EB_OK ||
                               r->table->event_time(r->rt, local, c->done[d], &b1, s->err, sizeof s->err) != EB_OK))
            continue;
        if (o->parts_timed && r->table->event_time(r->rt, local, c->up[d], &u, s->err, sizeof s->err) == EB_OK &&
            r->table->event_time(r->rt, local, c->down[d], &w, s->err, sizeof s->err) == EB_OK && b0 <= u && u <= w &&
            w <= b1) {
            span(c, d, l, EB_SPAN_STAGE, o->n_tokens, b0, u);
            span(c, d, l, EB_SPAN_EXPERTS, o->n_pairs, u, w);
            span(c, d, l, EB_SPAN_STAGE, o->n_pairs, w, b1);
        } else {
            span(c, d, l, EB_SPAN_EXPERTS, o->n_pairs, b0, b1);
        }
    }
}

int eb_block_moe(eb_step *s, int l) {
    eb_context *c = s->c;
    eb_model *m = s->m;
    const eb_model_config *cf = &m->cfg;
    const eb_dev_primary *dp = m->dp;
    const eb_dev_layer *D = &dp->layers[l];
    eb_dev_context *dc = c->dc;
    int64_t n = s->n, E = cf->num_experts, K = c->top_k;
    int st, prim = m->primary;
    uint64_t t0 = trace_now(c);
    eb_rt_norm post = {dc->x, D->post_norm, dc->xn, n, cf->hidden_size, (float)cf->rms_norm_eps};
    int scoring = m->family->routing;
    eb_rt_route r = {post,       D->router.data, D->router.dtype, (int32_t)E,  (int32_t)K,
                     scoring,    cf->norm_topk_prob, dc->router,
                     dc->topk_id, dc->topk_w, m->routing_off ? NULL : dp->hits + (size_t)l * (size_t)E,
                     D->router_bias, cf->n_group, cf->topk_group, (float)cf->routed_scaling_factor, D->router.scale};
    if (m->family->route) {
        if ((st = m->family->route(s, l, &post))) return st;
    } else {
        OP(s, s->ops->route(s->rt, s->dev, &r, s->err, sizeof s->err));
    }
    /* the tokens routed, with the hits the operation adds: a step that fails further on keeps both (one step
     * recorded or replayed counts them when it has run, eb_eval_batch) */
    if (!s->graphs && !m->routing_off) m->route_tokens[l] += (uint64_t)n;
    if (!s->replaying) span(c, prim, l, EB_SPAN_ROUTE, n, t0, trace_now(c));
    eb_rt_moe b = {D->experts, (int32_t)E, (int32_t)K, (int32_t)n, (int32_t)cf->hidden_size,
                   cf->moe_intermediate_size, c->mode == EB_MODE_OWNER_LOCAL ? EB_REDUCE_OWNER_LOCAL : EB_REDUCE_REFERENCE,
                   EB_MOE_ALL, dc->xn, dc->topk_id, dc->topk_w, NULL, dc->pair_out, dc->h, dc->x, dp->stats,
                   c->precision, eb_model_act(cf)};
    if (!D->n_foreign) { /* every expert is the primary's: nothing leaves the device */
        if ((st = shared_experts(s, l))) return st;
        t0 = trace_now(c);
        OP(s, s->ops->moe(s->rt, s->dev, &b, s->err, sizeof s->err));
        if (!s->replaying) span(c, prim, l, EB_SPAN_EXPERTS, n * K, t0, trace_now(c));
        return EB_OK;
    }
    /* the host round trip: the part so far runs and the routing comes back; then the primary's own experts run
     * while the peers run theirs (queued live, outside any recording), and the join. A primary whose operations run
     * on this thread (a CPU device, hostsim) runs its experts after queuing every peer; one whose operations are
     * queued (a GPU) queues the peers' branches first (a staged peer's is the longest: its upload, experts and
     * download), then its own experts, and this thread runs the last CPU peer's meanwhile. */
    if ((st = part_end(s))) return st;
    t0 = trace_now(c);
    if ((st = read_routing(s, l))) return st;
    span(c, prim, l, EB_SPAN_STAGE, n, t0, trace_now(c));
    int queued = m->engine->devices[prim].queued_ops, inline_dev = -1;
    for (int d = 0; queued && d < m->engine->n_devices; d++)
        if (d != prim && m->engine->devices[d].host_addressable) inline_dev = d;
    b.phase = EB_MOE_EXPERTS;
    uint64_t t1 = 0;
    void **ev = c->own_events + 2 * l;
    const eb_runtime_table *t = s->r->table;
    if (queued) { /* timed by events around it when tracing, read once the step is done */
        if ((st = eb_dispatch_peers(c, &m->layers[l], n, inline_dev, 0))) return st;
        if ((st = shared_experts(s, l))) {
            eb_drain_peers(c);
            return st;
        }
        if (c->trace_cap && ((st = eb_context_event(c, prim, &ev[0])) || (st = eb_context_event(c, prim, &ev[1])))) {
            eb_drain_peers(c);
            return st;
        }
        if ((c->trace_cap && (st = t->event_record(s->rt, s->dev, ev[0], s->err, sizeof s->err))) ||
            (st = s->ops->moe(s->rt, s->dev, &b, s->err, sizeof s->err)) ||
            (c->trace_cap && (st = t->event_record(s->rt, s->dev, ev[1], s->err, sizeof s->err)))) {
            st = eb_fail(st, "%s: %s", s->name, s->err);
            eb_drain_peers(c);
            return st;
        }
        if ((st = eb_run_inline_peer(c, &m->layers[l], n, inline_dev))) return st;
    } else {
        if ((st = eb_dispatch_peers(c, &m->layers[l], n, -1, 1))) return st;
        if ((st = shared_experts(s, l))) {
            eb_drain_peers(c);
            return st;
        }
        t0 = trace_now(c);
        if ((st = s->ops->moe(s->rt, s->dev, &b, s->err, sizeof s->err))) {
            (void)eb_join_peers(c); /* they read this context's buffers: let them finish first */
            return eb_fail(st, "%s: %s", s->name, s->err);
        }
        t1 = trace_now(c);
    }
    int64_t own = n * K;
    for (int d = 0; d < m->engine->n_devices; d++)
        if (d != prim) own -= c->step[d].n_pairs;
    if (own > 0 && !queued) span(c, prim, l, EB_SPAN_EXPERTS, own, t0, t1);
    if (own > 0 && queued && c->trace_cap) {
        c->own_pending[2 * c->n_own_pending] = l;
        c->own_pending[2 * c->n_own_pending++ + 1] = (int32_t)own;
    }
    uint64_t tj = trace_now(c);
    if ((st = eb_join_peers(c))) return st;
    uint64_t t2 = trace_now(c);
    span(c, prim, l, EB_SPAN_JOIN, n, tj, t2);
    if (c->trace_cap) trace_peers(s, l);
    if ((st = send_foreign(s, l)) || (st = part_begin(s))) return st;
    b.phase = EB_MOE_COMBINE;
    b.foreign = dc->foreign;
    OP(s, s->ops->moe(s->rt, s->dev, &b, s->err, sizeof s->err));
    if (!s->replaying) span(c, prim, l, EB_SPAN_COMBINE, n, t2, trace_now(c));
    return EB_OK;
}

/* ---- DeepSeek-V4's blocks --------------------------------------------------------------------------------- */

int eb_block_hc(eb_step *s, int kind, int l, int ffn) {
    const eb_model_config *cf = &s->m->cfg;
    eb_dev_context *dc = s->c->dc;
    int64_t H = cf->hidden_size, hc = cf->hc_mult;
    eb_rt_hc a = {kind, (int32_t)s->n, (int32_t)hc, (int32_t)H, cf->hc_sinkhorn_iters, dc->hc, dc->x,
                  dc->hc + (size_t)s->c->n_batch * (size_t)(hc * H), NULL, NULL, NULL, (float)cf->hc_eps,
                  (float)cf->rms_norm_eps};
    if (kind == EB_HC_HEAD) {
        a.fn = s->m->hc_head[0], a.base = s->m->hc_head[1], a.scale = s->m->hc_head[2];
    } else if (l >= 0) {
        const eb_dev_layer *D = &s->m->dp->layers[l];
        a.fn = ffn ? D->hc_ffn_fn : D->hc_attn_fn;
        a.base = ffn ? D->hc_ffn_base : D->hc_attn_base;
        a.scale = ffn ? D->hc_ffn_scale : D->hc_attn_scale;
    }
    OP(s, s->v4->hc(s->rt, s->dev, &a, s->err, sizeof s->err));
    return EB_OK;
}

int eb_block_v4_attention(eb_step *s, int l) {
    const eb_model_config *cf = &s->m->cfg;
    const eb_dev_layer *D = &s->m->dp->layers[l];
    eb_dev_context *dc = s->c->dc;
    int64_t n = s->n, H = cf->hidden_size, hd = cf->head_dim, qlr = cf->q_lora_rank;
    int64_t ihd = cf->index_head_dim, nih = cf->index_n_heads;
    int kind = cf->layer_kind[l];
    int32_t rate = kind == EB_V4_CSA ? cf->csa_rate : kind == EB_V4_HCA ? cf->hca_rate : 0;
    int64_t width = (kind == EB_V4_CSA ? 2 : 1) * hd;
    float eps = (float)cf->rms_norm_eps;
    uint64_t t0 = trace_now(s->c);
    /* the step's products, n rows each, one after the other in k (the key=value head, the compressors', the
     * indexer's) and v (q_a's output and its norm, the grouped projection's output) */
    float *kv = dc->k, *ckv = kv + n * hd, *cg = ckv + n * width, *ikv = cg + n * width, *ig = ikv + n * 2 * ihd;
    float *iq = ig + n * 2 * ihd, *iw = iq + n * nih * ihd;
    float *qa = dc->v, *qr = qa + n * qlr, *oa = qr + n * qlr;
    eb_rt_norm input = {dc->x, D->input_norm, dc->xn, n, H, eps};
    eb_rt_matmul first[7];
    int nt = 0;
    first[nt++] = product(s, &D->q_a, dc->xn, n, qa);
    first[nt++] = product(s, &D->kv, dc->xn, n, kv);
    if (kind != EB_V4_SLIDING) {
        first[nt++] = product(s, &D->cmp_kv, dc->xn, n, ckv);
        first[nt++] = product(s, &D->cmp_gate, dc->xn, n, cg);
    }
    if (kind == EB_V4_CSA) {
        first[nt++] = product(s, &D->idx_kv, dc->xn, n, ikv);
        first[nt++] = product(s, &D->idx_gate, dc->xn, n, ig);
        first[nt++] = product(s, &D->idx_w, dc->xn, n, iw);
    }
    OP(s, s->ops->matmul(s->rt, s->dev, &input, first, nt, 0, s->err, sizeof s->err));
    eb_rt_norm q_norm = {qa, D->q_a_norm, qr, n, qlr, eps};
    eb_rt_matmul second[2] = {product(s, &D->q_b, qr, n, dc->q), product(s, &D->idx_q, qr, n, iq)};
    OP(s, s->ops->matmul(s->rt, s->dev, &q_norm, second, kind == EB_V4_CSA ? 2 : 1, 0, s->err, sizeof s->err));
    size_t row = (size_t)eb_v4_cache_row(hd, ihd);
    eb_rt_v4_attention at = {
        dc->q, kv, D->kv_norm, D->sinks, kind == EB_V4_SLIDING ? s->m->rope_inv_freq : s->m->compress_inv_freq,
        s->m->compress_inv_freq, kind, rate, ckv, cg, D->cmp_ape, D->cmp_norm, ikv, ig, D->idx_ape, D->idx_norm, iq, iw,
        (float *)dc->k_cache + s->c->cache_at[l] * row, dc->ids, (int32_t)n, cf->num_heads, (int32_t)hd, cf->rope_dim,
        cf->sliding_window, s->c->n_ctx, (int32_t)nih, (int32_t)ihd, cf->index_topk, eps, (float)cf->attention_scale,
        dc->att};
    OP(s, s->v4->attention(s->rt, s->dev, &at, s->err, sizeof s->err));
    int64_t groups = cf->o_groups;
    eb_rt_grouped g = {D->o_a.data, D->o_a.dtype, (int32_t)groups, (int32_t)(cf->num_heads * hd / groups),
                       cf->o_lora_rank, n, dc->att, oa};
    OP(s, s->v4->grouped(s->rt, s->dev, &g, s->err, sizeof s->err));
    eb_rt_matmul o = product(s, &D->o, oa, n, dc->x);
    OP(s, s->ops->matmul(s->rt, s->dev, NULL, &o, 1, 0, s->err, sizeof s->err));
    if (!s->replaying) span(s->c, s->m->primary, l, EB_SPAN_ATTENTION, n, t0, trace_now(s->c));
    return EB_OK;
}

int eb_v4_route(eb_step *s, int l, const eb_rt_norm *post) {
    const eb_model_config *cf = &s->m->cfg;
    const eb_dev_primary *dp = s->m->dp;
    const eb_dev_layer *D = &dp->layers[l];
    eb_dev_context *dc = s->c->dc;
    int64_t E = cf->num_experts;
    eb_rt_v4_route r = {*post, D->router.data, D->router.dtype, (int32_t)E, s->c->top_k, D->router.scale, dc->router,
                        dc->topk_id, dc->topk_w, s->m->routing_off ? NULL : dp->hits + (size_t)l * (size_t)E,
                        cf->layer_hash[l] ? NULL : D->router_bias, cf->layer_hash[l] ? D->tid2eid : NULL, dc->ids + 1,
                        (float)cf->routed_scaling_factor, cf->top_k};
    OP(s, s->v4->route(s->rt, s->dev, &r, s->err, sizeof s->err));
    return EB_OK;
}

int eb_block_logits(eb_step *s, int64_t first) {
    const eb_model_config *cf = &s->m->cfg;
    const eb_dev_primary *dp = s->m->dp;
    eb_dev_context *dc = s->c->dc;
    int64_t H = cf->hidden_size;
    uint64_t t0 = trace_now(s->c);
    eb_rt_matmul lm = product(s, &dp->lm_head, dc->xn + first * H, s->n - first, dc->logits);
    if (s->hidden_out && first > 0) { /* every row's normed state is read back: the norm alone, then the head */
        eb_rt_norm all = {dc->x, dp->final_norm, dc->xn, s->n, H, (float)cf->rms_norm_eps};
        OP(s, s->ops->matmul(s->rt, s->dev, &all, NULL, 0, 0, s->err, sizeof s->err));
        OP(s, s->ops->matmul(s->rt, s->dev, NULL, &lm, 1, 0, s->err, sizeof s->err));
    } else {
        eb_rt_norm final = {dc->x + first * H, dp->final_norm, dc->xn + first * H, s->n - first, H,
                            (float)cf->rms_norm_eps};
        OP(s, s->ops->matmul(s->rt, s->dev, &final, &lm, 1, 0, s->err, sizeof s->err));
    }
    if (!s->replaying) span(s->c, s->m->primary, -1, EB_SPAN_LOGITS, s->n - first, t0, trace_now(s->c));
    return EB_OK;
}

/* ---- one batch ------------------------------------------------------------------------------------------ */

int eb_eval_batch(eb_context *c, const int32_t *ids, int64_t n, float *logits, int all_rows, const float *hidden_in,
                  float *hidden_out) {
    eb_model *m = c->model;
    eb_engine *eng = m->engine;
    eb_dev_context *dc = c->dc;
    const eb_model_config *cf = &m->cfg;
    const eb_runtime *r = eb_device_runtime(eng, m->primary);
    eb_step s = {.c = c, .m = m, .r = r, .ops = r->table->forward, .rt = r->rt, .dev = eng->devices[m->primary].local,
                 .name = eng->devices[m->primary].name, .n = n, .hidden_out = hidden_out != NULL};
    s.mla = (const eb_rt_mla_ops *)eb_rt_find_extension(r->table, (eb_rt_extension_id){EB_EXT_MLA, EB_EXT_MLA_VERSION});
    s.v4 = (const eb_rt_v4_ops *)eb_rt_find_extension(
        r->table, (eb_rt_extension_id){EB_EXT_DEEPSEEK_V4, EB_EXT_DEEPSEEK_V4_VERSION});
    int st;
    if (eng->n_devices > c->n_devices)
        return eb_fail(EB_ERR_STATE, "a runtime was loaded after this context was created: create a new context");
    if (m->dp->stale)
        return eb_fail(EB_ERR_STATE, "the expert tables on %s are out of date after a placement that failed to "
                                     "finish: set the placement again", s.name);
    if (dc->checked_precision != c->precision || dc->checked_generation != m->dp->generation) {
        /* each weight's format against its owner's q8 kernels walks every expert: once per placement and precision */
        if ((st = eb_check_precision(m, c->precision))) return st;
        dc->checked_generation = m->dp->generation;
        dc->checked_precision = c->precision;
    }
    if (n == 1 && c->use_graphs && r->table->graphs) {
        s.graphs = r->table->graphs;
        if (dc->graph_generation != m->dp->generation || dc->graph_mode != c->mode ||
            dc->graph_precision != c->precision || dc->graph_routing_off != m->routing_off ||
            dc->graph_top_k != c->top_k) {
            /* the expert tables changed (so may the parts), or the reduction mode (recorded in the expert steps), or
             * whether the routing counts (the recorded route operations write the counters or not), or the experts
             * per token (in the route and expert operations' arguments) */
            for (int i = 0; i <= cf->num_layers; i++)
                if (dc->graphs[i]) s.graphs->free(s.rt, s.dev, dc->graphs[i]), dc->graphs[i] = NULL;
            dc->graph_generation = m->dp->generation;
            dc->graph_mode = c->mode;
            dc->graph_precision = c->precision;
            dc->graph_routing_off = m->routing_off;
            dc->graph_top_k = c->top_k;
        }
    }
    dc->host_ids[0] = c->pos; /* the position, then the ids: one copy of n + 1 values */
    memcpy(dc->host_ids + 1, ids, (size_t)n * sizeof *ids);
    if ((st = r->table->copy_to_device(s.rt, s.dev, dc->ids, dc->host_ids, ((size_t)n + 1) * sizeof(int32_t), 1, s.err,
                                       sizeof s.err)))
        return eb_fail(st, "sending token ids to %s: %s", s.name, s.err);
    if (hidden_in && (st = r->table->copy_to_device(s.rt, s.dev, dc->hin, hidden_in,
                                                     (size_t)n * (size_t)cf->hidden_size * sizeof(float), 0, s.err,
                                                     sizeof s.err)))
        return eb_fail(st, "sending the target's hidden states to %s: %s", s.name, s.err);
    int64_t first = all_rows ? 0 : n - 1;
    c->n_own_pending = 0;
    st = part_begin(&s);
    if (!st) st = m->family->forward(&s, first, logits != NULL || hidden_out != NULL);
    if (!st) st = part_end(&s);
    if (st) { /* let what was queued finish before the staging memory is written again (its error is st's) */
        char err[512] = "";
        if (s.recording) (void)s.graphs->end(s.rt, s.dev, NULL, err, sizeof err);
        (void)r->table->synchronize(s.rt, s.dev, err, sizeof err);
        return st;
    }
    for (int l = 0; l < cf->num_layers; l++)
        if (m->layers[l].is_moe) {
            if (s.graphs && !m->routing_off) m->route_tokens[l] += (uint64_t)n; /* the others as they routed */
            m->counters.model.layer_steps++;
        }
    if (hidden_out &&
        (st = r->table->copy_to_host(s.rt, s.dev, hidden_out, dc->xn, (size_t)n * (size_t)cf->hidden_size * sizeof(float),
                                     0, s.err, sizeof s.err)))
        return eb_fail(st, "%s: %s", s.name, s.err);
    if (logits)
        st = r->table->copy_to_host(s.rt, s.dev, logits, dc->logits,
                                    (size_t)(n - first) * (size_t)cf->vocab_size * sizeof(float), 0, s.err,
                                    sizeof s.err);
    else
        st = r->table->synchronize(s.rt, s.dev, s.err, sizeof s.err);
    if (st) return eb_fail(st, "%s: %s", s.name, s.err);
    /* the primary's own experts of each split layer, from the events around them (the step is done) */
    for (int i = 0; i < c->n_own_pending; i++) {
        int l = c->own_pending[2 * i];
        uint64_t t0, t1;
        if (r->table->event_time(s.rt, s.dev, c->own_events[2 * l], &t0, s.err, sizeof s.err) == EB_OK &&
            r->table->event_time(s.rt, s.dev, c->own_events[2 * l + 1], &t1, s.err, sizeof s.err) == EB_OK)
            span(c, m->primary, l, EB_SPAN_EXPERTS, c->own_pending[2 * i + 1], t0, t1);
    }
    c->n_own_pending = 0;
    return EB_OK;
}
