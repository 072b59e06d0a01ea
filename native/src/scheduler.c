/* Expert placement and the per-layer expert scheduler.
 *
 * Per MoE layer: route on the primary; group the selected (token, expert) pairs by owner device, experts in
 * ascending id; for each owner that is not the primary, stage what it needs (one copy of its input rows and
 * routing plan when it cannot read host memory) and queue its branch; run the primary's own experts inline
 * meanwhile; join on each peer; reduce on the primary.
 *
 * reference mode: the primary sums every pair's output in ascending expert id (f32), exactly as the
 * single-device path does, so the result does not depend on the placement when the kernels are the same.
 * owner_local mode: each owner pre-sums its own experts and the primary adds the owners in device order.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eb_formats.h"
#include "eb_ops.h"
#include "eb_model.h"

static uint64_t expert_bytes(const eb_expert *e) { return eb_expert_bytes(e); }

static uint64_t bias_bytes(const eb_expert *e) {
    return e->host_bias ? (uint64_t)(2 * e->gate.rows + e->down.rows) * sizeof(float) : 0;
}

/* An owner's copy of an expert: gate | up | down | bias | gate's, up's and down's scale companions, each aligned. */
static uint64_t expert_copy_bytes(const eb_expert *e) {
    return eb_align(eb_weight_bytes(&e->gate)) + eb_align(eb_weight_bytes(&e->up)) + eb_align(eb_weight_bytes(&e->down)) +
           eb_align(bias_bytes(e)) + eb_align(eb_scale_bytes(&e->gate)) + eb_align(eb_scale_bytes(&e->up)) +
           eb_align(eb_scale_bytes(&e->down));
}

/* ---- placement --------------------------------------------------------------------------------------- */

/* formats: also that each owner's kernels read its experts' formats (what a placement needs, not its byte counts). */
static int validate_owners(const eb_model *m, const int32_t *owners, int64_t n, int formats) {
    const eb_model_config *c = &m->cfg;
    int64_t E = c->num_experts > 0 ? c->num_experts : 0, want = (int64_t)c->num_layers * E;
    if (!owners && n > 0) return eb_fail(EB_ERR_ARGUMENT, "placement: owners is NULL");
    if (E == 0) return eb_fail(EB_ERR_UNSUPPORTED, "placement: this model has no experts to place");
    if (n != want)
        return eb_fail(EB_ERR_ARGUMENT, "placement has %lld entries, expected %d layers x %lld experts = %lld",
                       (long long)n, c->num_layers, (long long)E, (long long)want);
    for (int l = 0; l < c->num_layers; l++) {
        for (int64_t e = 0; e < E; e++) {
            int32_t o = owners[l * E + e];
            if (!m->layers[l].is_moe) {
                if (o != -1)
                    return eb_fail(EB_ERR_ARGUMENT, "placement: layer %d is not an MoE layer, its entries must be -1 "
                                                    "(expert %lld has %d)", l, (long long)e, o);
                continue;
            }
            if (o < 0 || o >= m->engine->n_devices)
                return eb_fail(EB_ERR_RANGE, "placement: expert %lld of layer %d is given device index %d, expected "
                                             "0..%d (the engine's devices)", (long long)e, l, o,
                               m->engine->n_devices - 1);
            const eb_expert *x = &m->layers[l].experts[e];
            int st;
            if (formats && ((st = eb_check_format(m, o, x->gate.dtype, "placement: gate_proj", l, (int)e)) ||
                (st = eb_check_format(m, o, x->up.dtype, "placement: up_proj", l, (int)e)) ||
                (st = eb_check_format(m, o, x->down.dtype, "placement: down_proj", l, (int)e))))
                return st;
        }
    }
    return EB_OK;
}

int eb_model_placement_bytes(const eb_model *m, const int32_t *owners, int64_t n, uint64_t *out, int32_t n_devices) {
    if (!m || !out) return eb_fail(EB_ERR_ARGUMENT, "placement bytes: NULL argument");
    if (n_devices < m->engine->n_devices)
        return eb_fail(EB_ERR_ARGUMENT, "placement bytes: room for %d devices, the engine has %d", n_devices,
                       m->engine->n_devices);
    int st = validate_owners(m, owners, n, 0);
    if (st) return st;
    memset(out, 0, (size_t)n_devices * sizeof *out);
    int64_t E = m->cfg.num_experts;
    for (int l = 0; l < m->cfg.num_layers; l++)
        if (m->layers[l].is_moe)
            for (int64_t e = 0; e < E; e++) out[owners[l * E + e]] += expert_bytes(&m->layers[l].experts[e]);
    return EB_OK;
}

int eb_model_get_placement(const eb_model *m, int32_t *owners, int64_t n) {
    if (!m || !owners) return eb_fail(EB_ERR_ARGUMENT, "get placement: NULL argument");
    int64_t E = m->cfg.num_experts;
    if (E <= 0) return eb_fail(EB_ERR_UNSUPPORTED, "placement: this model has no experts to place");
    if (n != (int64_t)m->cfg.num_layers * E)
        return eb_fail(EB_ERR_ARGUMENT, "get placement: room for %lld entries, expected %lld", (long long)n,
                       (long long)m->cfg.num_layers * E);
    for (int l = 0; l < m->cfg.num_layers; l++)
        for (int64_t e = 0; e < E; e++) owners[l * E + e] = m->layers[l].is_moe ? m->layers[l].experts[e].owner : -1;
    return EB_OK;
}

static void point_at_host(eb_expert *x) {
    x->gate.data = x->host_gate;
    x->up.data = x->host_up;
    x->down.data = x->host_down;
    x->bias = x->host_bias;
    x->gate.scale.data = x->host_scale[0];
    x->up.scale.data = x->host_scale[1];
    x->down.scale.data = x->host_scale[2];
}

static void point_at_copy(eb_expert *x, void *mem) {
    unsigned char *p = (unsigned char *)mem;
    x->gate.data = p;
    x->up.data = p + eb_align(eb_weight_bytes(&x->gate));
    x->down.data = p + eb_align(eb_weight_bytes(&x->gate)) + eb_align(eb_weight_bytes(&x->up));
    x->bias = x->host_bias ? (const float *)((const unsigned char *)x->down.data + eb_align(eb_weight_bytes(&x->down)))
                           : NULL;
    p = (unsigned char *)x->down.data + eb_align(eb_weight_bytes(&x->down)) + eb_align(bias_bytes(x));
    eb_weight *w[3] = {&x->gate, &x->up, &x->down};
    for (int k = 0; k < 3; k++) {
        uint64_t bytes = eb_scale_bytes(w[k]);
        w[k]->scale.data = x->host_scale[k] ? (const float *)p : NULL;
        p += eb_align(bytes);
    }
}

static void refresh_weight_counters(eb_model *m) {
    for (int d = 0; d < EB_MAX_DEVICES; d++) m->counters.dev[d].weight_bytes = 0;
    for (int l = 0; l < m->cfg.num_layers; l++)
        if (m->layers[l].is_moe)
            for (int e = 0; e < m->cfg.num_experts; e++) {
                const eb_expert *x = &m->layers[l].experts[e];
                m->counters.dev[x->owner].weight_bytes += expert_bytes(x);
            }
}

int eb_model_set_placement(eb_model *m, const int32_t *owners, int64_t n) {
    if (!m) return eb_fail(EB_ERR_ARGUMENT, "set placement: model is NULL");
    int st = validate_owners(m, owners, n, 1);
    if (st) return st;
    eb_engine *eng = m->engine;
    int64_t E = m->cfg.num_experts;
    int L = m->cfg.num_layers;
    /* memory needed on each device that cannot read the mapped files, before any allocation */
    uint64_t need[EB_MAX_DEVICES] = {0};
    for (int l = 0; l < L; l++) {
        if (!m->layers[l].is_moe) continue;
        for (int64_t e = 0; e < E; e++) {
            int32_t o = owners[l * E + e];
            const eb_expert *x = &m->layers[l].experts[e];
            if (o != x->owner && !eng->devices[o].host_addressable) need[o] += expert_copy_bytes(x);
        }
    }
    char err[512] = "";
    for (int d = 0; d < eng->n_devices; d++) {
        if (!need[d]) continue;
        const eb_runtime *r = eb_device_runtime(eng, d);
        eb_rt_device_info info;
        if ((st = r->table->device_info(r->rt, eng->devices[d].local, &info, err, sizeof err)) != 0)
            return eb_fail(st, "placement: device %s: %s", eng->devices[d].name, err);
        if (need[d] > info.memory_free)
            return eb_fail(EB_ERR_MEMORY, "placement needs %.1f MiB more on %s, which has %.1f MiB free (of %.1f MiB)",
                           need[d] / 1048576.0, eng->devices[d].name, info.memory_free / 1048576.0,
                           info.memory_total / 1048576.0);
    }
    /* phase 1: allocate and upload every copy; on any failure free them all and keep the old placement */
    void **fresh = calloc((size_t)(L * E), sizeof *fresh);
    if (!fresh) return eb_fail(EB_ERR_MEMORY, "placement: out of memory");
    for (int l = 0; l < L && st == EB_OK; l++) {
        if (!m->layers[l].is_moe) continue;
        for (int64_t e = 0; e < E && st == EB_OK; e++) {
            int32_t o = owners[l * E + e];
            eb_expert *x = &m->layers[l].experts[e];
            if (o == x->owner || eng->devices[o].host_addressable) continue;
            const eb_runtime *r = eb_device_runtime(eng, o);
            int local = eng->devices[o].local;
            void *mem = NULL;
            if ((st = r->table->mem_alloc(r->rt, local, expert_copy_bytes(x), &mem, err, sizeof err)) != 0) {
                st = eb_fail(st, "placement: expert %lld of layer %d on %s: %s", (long long)e, l, eng->devices[o].name,
                             err);
                break;
            }
            fresh[l * E + e] = mem;
            eb_expert tmp = *x;
            point_at_copy(&tmp, mem);
            const void *src[7] = {x->host_gate,     x->host_up,       x->host_down,    x->host_bias,
                                  x->host_scale[0], x->host_scale[1], x->host_scale[2]};
            void *dst[7] = {(void *)tmp.gate.data,       (void *)tmp.up.data,       (void *)tmp.down.data,
                            (void *)tmp.bias,            (void *)tmp.gate.scale.data, (void *)tmp.up.scale.data,
                            (void *)tmp.down.scale.data};
            uint64_t sz[7] = {eb_weight_bytes(&x->gate), eb_weight_bytes(&x->up),     eb_weight_bytes(&x->down),
                              bias_bytes(x),             eb_scale_bytes(&x->gate),    eb_scale_bytes(&x->up),
                              eb_scale_bytes(&x->down)};
            for (int k = 0; k < 7 && st == EB_OK; k++)
                if (sz[k] && (st = r->table->copy_to_device(r->rt, local, dst[k], src[k], sz[k], 0, err, sizeof err)) != 0)
                    st = eb_fail(st, "placement: uploading expert %lld of layer %d to %s: %s", (long long)e, l,
                                 eng->devices[o].name, err);
        }
    }
    /* the uploads read the mapped files: one cut short meanwhile gave zeros (mapping.c), not the weights */
    if (!st) st = eb_model_check_files(m);
    if (st) {
        for (int64_t i = 0; i < (int64_t)L * E; i++)
            if (fresh[i]) {
                int32_t o = owners[i];
                const eb_runtime *r = eb_device_runtime(eng, o);
                r->table->mem_free(r->rt, eng->devices[o].local, fresh[i]);
            }
        free(fresh);
        return st;
    }
    /* phase 2: commit, freeing the old copies */
    for (int l = 0; l < L; l++) {
        if (!m->layers[l].is_moe) continue;
        for (int64_t e = 0; e < E; e++) {
            int32_t o = owners[l * E + e];
            eb_expert *x = &m->layers[l].experts[e];
            if (o == x->owner) continue;
            if (x->dev_mem) {
                const eb_runtime *r = eb_device_runtime(eng, x->owner);
                r->table->mem_free(r->rt, eng->devices[x->owner].local, x->dev_mem);
                m->counters.dev[x->owner].allocated_bytes -= expert_copy_bytes(x);
                x->dev_mem = NULL;
            }
            x->owner = o;
            if (fresh[l * E + e]) {
                x->dev_mem = fresh[l * E + e];
                point_at_copy(x, x->dev_mem);
                m->counters.dev[o].allocated_bytes += expert_copy_bytes(x);
                m->counters.model.uploads++;
            } else {
                point_at_host(x);
            }
        }
    }
    free(fresh);
    refresh_weight_counters(m);
    return eb_primary_refresh(m);
}

void eb_placement_release(eb_model *m) {
    if (!m->layers) return;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        if (!m->layers[l].experts) continue;
        for (int e = 0; e < m->cfg.num_experts; e++) {
            eb_expert *x = &m->layers[l].experts[e];
            if (!x->dev_mem) continue;
            const eb_runtime *r = eb_device_runtime(m->engine, x->owner);
            r->table->mem_free(r->rt, m->engine->devices[x->owner].local, x->dev_mem);
            x->dev_mem = NULL;
        }
    }
}

/* Synchronous copies from and to the device primary's memory (counters kept there). */
static int device_read(const eb_model *m, void *dst, const void *src, size_t bytes) {
    const eb_runtime *r = eb_device_runtime(m->engine, m->primary);
    char err[512] = "";
    int st = r->table->copy_to_host(r->rt, m->engine->devices[m->primary].local, dst, src, bytes, 0, err, sizeof err);
    return st ? eb_fail(st, "reading counters from %s: %s", m->engine->devices[m->primary].name, err) : EB_OK;
}

static void device_write(const eb_model *m, void *dst, const void *src, size_t bytes) {
    const eb_runtime *r = eb_device_runtime(m->engine, m->primary);
    char err[512] = "";
    (void)r->table->copy_to_device(r->rt, m->engine->devices[m->primary].local, dst, src, bytes, 0, err, sizeof err);
}

/* ---- counters ---------------------------------------------------------------------------------------- */

int eb_model_device_counters(const eb_model *m, int32_t device, eb_device_counters *out) {
    if (!m || !out) return eb_fail(EB_ERR_ARGUMENT, "device counters: NULL argument");
    if (device < 0 || device >= m->engine->n_devices)
        return eb_fail(EB_ERR_RANGE, "device index %d out of range (%d devices)", device, m->engine->n_devices);
    *out = m->counters.dev[device];
    out->allocated_bytes += m->arena_bytes[device];
    if (device == m->primary) {
        /* the primary's own experts are counted on the device */
        unsigned long long stats[2];
        int st = device_read(m, stats, m->dp->stats, sizeof stats);
        if (st) return st;
        out->experts_run += stats[0];
        out->rows += stats[1];
        out->allocated_bytes += m->dp->bytes;
    }
    const eb_runtime *r = eb_device_runtime(m->engine, device);
    out->busy_ns = r->table->busy_ns(r->rt, m->engine->devices[device].local);
    return EB_OK;
}

int eb_model_get_counters(const eb_model *m, eb_model_counters *out) {
    if (!m || !out) return eb_fail(EB_ERR_ARGUMENT, "model counters: NULL argument");
    *out = m->counters.model;
    return EB_OK;
}

void eb_model_reset_counters(eb_model *m) {
    if (!m) return;
    unsigned long long zero[2] = {0, 0};
    device_write(m, m->dp->stats, zero, sizeof zero);
    for (int d = 0; d < EB_MAX_DEVICES; d++) {
        eb_device_counters *c = &m->counters.dev[d];
        c->experts_run = c->rows = c->bytes_to_device = c->bytes_from_device = c->waits = 0;
    }
    eb_model_counters *mc = &m->counters.model;
    mc->joins = mc->layer_steps = mc->host_round_trips = mc->graph_captures = mc->graph_launches = 0;
}

int eb_model_set_routing_counting(eb_model *m, int32_t enabled) {
    if (!m) return eb_fail(EB_ERR_ARGUMENT, "routing counting: model is NULL");
    if (enabled != 0 && enabled != 1) return eb_fail(EB_ERR_ARGUMENT, "routing counting: %d, expected 0 or 1", enabled);
    m->routing_off = !enabled;
    return EB_OK;
}

int eb_model_routing_counts(const eb_model *m, uint64_t *hits, int64_t n_hits, uint64_t *tokens, int32_t n_layers) {
    if (!m) return eb_fail(EB_ERR_ARGUMENT, "routing counts: model is NULL");
    int64_t want = (int64_t)m->cfg.num_layers * (m->cfg.num_experts > 0 ? m->cfg.num_experts : 0);
    if (hits) {
        if (n_hits != want)
            return eb_fail(EB_ERR_ARGUMENT, "routing counts: room for %lld entries, expected %lld", (long long)n_hits,
                           (long long)want);
        int st = device_read(m, hits, m->dp->hits, (size_t)want * sizeof *hits);
        if (st) return st;
    }
    if (tokens) {
        if (n_layers != m->cfg.num_layers)
            return eb_fail(EB_ERR_ARGUMENT, "routing counts: room for %d layers, expected %d", n_layers,
                           m->cfg.num_layers);
        memcpy(tokens, m->route_tokens, (size_t)n_layers * sizeof *tokens);
    }
    return EB_OK;
}

void eb_model_reset_routing(eb_model *m) {
    if (!m) return;
    size_t bytes = (size_t)m->cfg.num_layers * (size_t)m->cfg.num_experts * sizeof *m->dp->hits;
    unsigned long long *zero = calloc(1, bytes ? bytes : 1);
    if (zero) device_write(m, m->dp->hits, zero, bytes);
    free(zero);
    memset(m->route_tokens, 0, (size_t)m->cfg.num_layers * sizeof *m->route_tokens);
}

/* ---- the scheduler ----------------------------------------------------------------------------------- */

void eb_scheduler_release(eb_context *c) {
    eb_engine *eng = c->model->engine;
    for (int d = 0; d < eng->n_devices; d++) {
        eb_arena *a = &c->arena[d];
        const eb_runtime *r = eb_device_runtime(eng, d);
        if (a->host) r->table->host_free(r->rt, a->host);
        if (a->dev) {
            r->table->mem_free(r->rt, eng->devices[d].local, a->dev);
            c->model->arena_bytes[d] -= a->dev_cap;
        }
        memset(a, 0, sizeof *a);
    }
}

/* A device allocation for the arena: half as much again as asked, so that slightly larger batches reuse it, or, where
 * that does not fit, just what was asked. */
static int arena_alloc(const eb_runtime *r, int local, size_t bytes, void **mem, size_t *cap, char *err, size_t errlen) {
    size_t roomy = eb_align(bytes + bytes / 2);
    if (r->table->mem_alloc(r->rt, local, roomy, mem, err, errlen) == 0) {
        *cap = roomy;
        return 0;
    }
    *cap = eb_align(bytes);
    return r->table->mem_alloc(r->rt, local, *cap, mem, err, errlen);
}

/* The arenas of device d grown to hold a step of n tokens and n_pairs (token, expert) pairs. On failure the arena
 * that could not grow is left empty (the next step allocates it again) and the error names the device, what the step
 * needed and what the device had. */
static int grow(eb_context *c, int d, int64_t n, int64_t n_pairs, size_t host_bytes, size_t dev_bytes) {
    eb_model *m = c->model;
    eb_engine *eng = m->engine;
    eb_arena *a = &c->arena[d];
    const eb_runtime *r = eb_device_runtime(eng, d);
    const char *name = eng->devices[d].name;
    int local = eng->devices[d].local;
    char err[512] = "";
    int st;
    if (host_bytes > a->host_cap) {
        size_t cap = eb_align(host_bytes + host_bytes / 2);
        if (a->host) r->table->host_free(r->rt, a->host);
        a->host = NULL;
        a->host_cap = 0;
        if ((st = r->table->host_alloc(r->rt, cap, &a->host, err, sizeof err)) != 0)
            return eb_fail(st, "%s: out of host memory: the staging of a batch of %lld tokens (%lld expert rows) "
                               "needs %zu bytes: %s", name, (long long)n, (long long)n_pairs, cap, err);
        a->host_cap = cap;
        m->counters.model.arena_allocations++;
    }
    if (dev_bytes > a->dev_cap) {
        size_t cap = 0;
        if (a->dev) { /* freed first: where memory is tight, the larger one fits only in place of the old */
            r->table->mem_free(r->rt, local, a->dev);
            m->arena_bytes[d] -= a->dev_cap;
        }
        a->dev = NULL;
        a->dev_cap = 0;
        if ((st = arena_alloc(r, local, dev_bytes, &a->dev, &cap, err, sizeof err)) != 0) {
            eb_rt_device_info info;
            char ierr[512] = "";
            if (r->table->device_info(r->rt, local, &info, ierr, sizeof ierr) != 0)
                return eb_fail(st, "%s: out of device memory: the staging of a batch of %lld tokens (%lld expert "
                                   "rows) needs %zu bytes: %s", name, (long long)n, (long long)n_pairs,
                               eb_align(dev_bytes), err);
            return eb_fail(st, "%s: out of device memory: the staging of a batch of %lld tokens (%lld expert rows) "
                               "needs %zu bytes, %llu free (of %llu): evaluate fewer tokens at a time, or place fewer "
                               "experts on %s", name, (long long)n, (long long)n_pairs, eb_align(dev_bytes),
                           (unsigned long long)info.memory_free, (unsigned long long)info.memory_total, name);
        }
        a->dev_cap = cap;
        m->arena_bytes[d] += cap;
        m->counters.model.arena_allocations++;
    }
    return EB_OK;
}

int eb_context_event(eb_context *c, int d, void **slot) {
    if (*slot) return EB_OK;
    eb_engine *eng = c->model->engine;
    const eb_runtime *r = eb_device_runtime(eng, d);
    char err[512] = "";
    int st = r->table->event_create(r->rt, eng->devices[d].local, slot, err, sizeof err);
    return st ? eb_fail(st, "an event on %s: %s", eng->devices[d].name, err) : EB_OK;
}

/* Build one owner's plan (experts ascending, their pairs, its staged tokens), stage and submit its branch. Its step
 * counts pairs (n_pairs, what a join waits for and the reduction reads) only once the branch is queued whole: a
 * failure before leaves it at 0, and one after part of it was queued waits for that part to finish first. */
static int submit_owner(eb_context *c, const eb_layer *L, int d, int64_t n, int inline_run) {
    eb_model *m = c->model;
    eb_engine *eng = m->engine;
    const eb_model_config *cf = &m->cfg;
    int64_t H = cf->hidden_size, I = cf->moe_intermediate_size, K = c->top_k, E = cf->num_experts;
    int staged = !eng->devices[d].host_addressable;
    int owner_local = c->mode == EB_MODE_OWNER_LOCAL;
    eb_owner_step *s = &c->step[d];
    int32_t *tl = c->token_local + (size_t)d * (size_t)c->n_batch;

    /* count pairs and tokens */
    int64_t n_pairs = 0, n_tokens = 0;
    for (int64_t t = 0; t < n; t++) {
        int used = 0;
        for (int64_t k = 0; k < K; k++)
            if (L->experts[c->topk_id[t * K + k]].owner == d) n_pairs++, used = 1;
        tl[t] = used ? (int32_t)(staged ? n_tokens : t) : -1;
        n_tokens += used;
    }
    s->n_pairs = 0;
    s->staged = staged;
    s->inline_run = inline_run && !staged;
    s->parts_timed = staged && c->trace_cap > 0;
    if (n_pairs == 0) return EB_OK;
    int64_t x_rows = staged ? n_tokens : n; /* rows of x the owner indexes */
    int64_t y_rows = owner_local ? x_rows : n_pairs;
    s->n_tokens = (int32_t)x_rows;

    /* host arena: [x (staged only) | pair_token | pair_weight] [y] [scratch (host-addressable only)] */
    size_t x_bytes = staged ? eb_align((size_t)(n_tokens * H) * sizeof(float)) : 0;
    size_t pt_bytes = eb_align((size_t)n_pairs * sizeof(int32_t)), pw_bytes = eb_align((size_t)n_pairs * sizeof(float));
    size_t in_bytes = x_bytes + pt_bytes + pw_bytes;
    size_t y_bytes = eb_align((size_t)(y_rows * H) * sizeof(float));
    size_t scratch = eb_align(eb_rt_expert_scratch_bytes(n_pairs, H, I));
    int st = grow(c, d, n, n_pairs, in_bytes + y_bytes + (staged ? 0 : scratch),
                  staged ? in_bytes + y_bytes + scratch : 0);
    if (st) return st;
    unsigned char *hb = (unsigned char *)c->arena[d].host;
    float *hx = (float *)hb;
    int32_t *pt = (int32_t *)(hb + x_bytes);
    float *pw = (float *)(hb + x_bytes + pt_bytes);
    s->y = (float *)(hb + in_bytes);

    /* experts ascending; pairs of each expert in ascending token order */
    int32_t p = 0;
    int32_t ne = 0;
    for (int32_t e = 0; e < E; e++) {
        const eb_expert *x = &L->experts[e];
        if (x->owner != d) continue;
        int32_t first = p;
        p = eb_group_pairs(c->topk_id, n, K, e, pt, c->pair_index, p);
        for (int32_t i = first; i < p; i++) {
            int32_t slot = c->pair_index[i];
            pt[i] = tl[pt[i]]; /* the row of this owner's x */
            pw[i] = c->topk_w[slot];
            c->pair_slot[slot] = i;
        }
        if (p == first) continue;
        c->plan_experts[ne] = eb_rt_expert_of(x, e, 1);
        c->plan_start[ne] = (int32_t)first;
        ne++;
    }
    c->plan_start[ne] = (int32_t)p;
    s->n_experts = ne;
    if (staged)
        for (int64_t t = 0; t < n; t++)
            if (tl[t] >= 0) memcpy(hx + (int64_t)tl[t] * H, c->xn + t * H, (size_t)H * sizeof(float));

    const eb_runtime *r = eb_device_runtime(eng, d);
    int local = eng->devices[d].local;
    eb_rt_expert_batch b = {.n_experts = ne, .experts = c->plan_experts, .pair_start = c->plan_start,
                            .n_pairs = (int32_t)n_pairs, .n_tokens = (int32_t)x_rows, .hidden = (int32_t)H,
                            .inter = (int32_t)I, .mode = owner_local ? EB_REDUCE_OWNER_LOCAL : EB_REDUCE_REFERENCE,
                            .precision = c->precision, .act = eb_model_act(&m->cfg)};
    char err[512] = "";
    eb_device_counters *ctr = &m->counters.dev[d];
    if (s->inline_run) {
        s->t0 = eb_now_ns();
    } else {
        if ((st = eb_context_event(c, d, &c->begun[d])) || (st = eb_context_event(c, d, &c->done[d])) ||
            (s->parts_timed && ((st = eb_context_event(c, d, &c->up[d])) || (st = eb_context_event(c, d, &c->down[d])))))
            return st;
        if ((st = r->table->event_record(r->rt, local, c->begun[d], err, sizeof err)))
            return eb_fail(st, "layer experts on %s: %s", eng->devices[d].name, err);
    }
    size_t y_used = 0;
    if (!staged) {
        b.x = c->xn;
        b.pair_token = pt;
        b.pair_weight = pw;
        b.y = s->y;
        b.scratch = hb + in_bytes + y_bytes;
        b.scratch_bytes = scratch;
        st = r->table->expert_ffn(r->rt, local, &b, !s->inline_run, err, sizeof err);
    } else {
        unsigned char *db = (unsigned char *)c->arena[d].dev;
        b.x = (const float *)db;
        b.pair_token = (const int32_t *)(db + x_bytes);
        b.pair_weight = (const float *)(db + x_bytes + pt_bytes);
        b.y = (float *)(db + in_bytes);
        b.scratch = db + in_bytes + y_bytes;
        b.scratch_bytes = scratch;
        y_used = (size_t)(y_rows * H) * sizeof(float);
        /* while tracing, the upload and the experts end at events of their own: the trace splits the branch into
         * its staging each way and its experts */
        if (!(st = r->table->copy_to_device(r->rt, local, db, hb, in_bytes, 1, err, sizeof err)) &&
            !(st = s->parts_timed ? r->table->event_record(r->rt, local, c->up[d], err, sizeof err) : EB_OK) &&
            !(st = r->table->expert_ffn(r->rt, local, &b, 1, err, sizeof err)) &&
            !(st = s->parts_timed ? r->table->event_record(r->rt, local, c->down[d], err, sizeof err) : EB_OK))
            st = r->table->copy_to_host(r->rt, local, s->y, b.y, y_used, 1, err, sizeof err);
    }
    if (s->inline_run) s->t1 = eb_now_ns();
    else if (!st) st = r->table->event_record(r->rt, local, c->done[d], err, sizeof err);
    if (st) {
        st = eb_fail(st, "layer experts on %s: %s", eng->devices[d].name, err);
        if (!s->inline_run) { /* what was queued before the failure reads this context's buffers */
            char ignored[512] = "";
            (void)r->table->synchronize(r->rt, local, ignored, sizeof ignored);
        }
        return st;
    }
    s->n_pairs = (int32_t)n_pairs;
    ctr->experts_run += (uint64_t)ne;
    ctr->rows += (uint64_t)n_pairs;
    ctr->bytes_to_device += staged ? in_bytes : 0;
    ctr->bytes_from_device += y_used;
    return EB_OK;
}

int eb_dispatch_peers(eb_context *c, const eb_layer *L, int64_t n, int inline_dev, int run_inline) {
    eb_model *m = c->model;
    eb_engine *eng = m->engine;
    int st = EB_OK;
    for (int d = 0; d < eng->n_devices; d++) c->step[d].n_pairs = 0;
    for (int d = 0; d < eng->n_devices && st == EB_OK; d++)
        if (d != m->primary && d != inline_dev) st = submit_owner(c, L, d, n, 0);
    if (st == EB_OK && inline_dev >= 0 && run_inline) st = submit_owner(c, L, inline_dev, n, 1);
    if (st) eb_drain_peers(c); /* what was queued reads this context's buffers: let it finish */
    return st;
}

int eb_run_inline_peer(eb_context *c, const eb_layer *L, int64_t n, int inline_dev) {
    int st = inline_dev >= 0 ? submit_owner(c, L, inline_dev, n, 1) : EB_OK;
    if (st) eb_drain_peers(c);
    return st;
}

void eb_drain_peers(eb_context *c) {
    char first[1024]; /* the error being reported, kept over the join's */
    eb_copy_str(first, sizeof first, eb_last_error());
    (void)eb_join_peers(c);
    (void)eb_fail(EB_OK, "%s", first);
}

int eb_join_peers(eb_context *c) {
    eb_model *m = c->model;
    eb_engine *eng = m->engine;
    int peers = 0, first_error = EB_OK, st;
    for (int d = 0; d < eng->n_devices; d++) {
        if (d == m->primary || c->step[d].n_pairs == 0) continue;
        peers++;
        if (c->step[d].inline_run) continue; /* done on this thread */
        const eb_runtime *r = eb_device_runtime(eng, d);
        char err[512] = "";
        m->counters.dev[d].waits++;
        if ((st = r->table->event_wait(r->rt, eng->devices[d].local, c->done[d], err, sizeof err)) &&
            first_error == EB_OK)
            first_error = eb_fail(st, "waiting for %s: %s", eng->devices[d].name, err);
    }
    if (first_error == EB_OK && peers) m->counters.model.joins++;
    return first_error;
}
