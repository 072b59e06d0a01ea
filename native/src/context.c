/* The decoding context: its buffers, evaluation in batches, greedy decoding, the per-token trace.
 *
 * Every buffer is allocated when the context is created (in the primary's memory, through its runtime);
 * evaluating tokens allocates nothing. The forward pass itself is the model family's (forward.c, models/).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eb_forward.h"
#include "eb_model.h"
#include "eb_ops.h"

static void *zalloc(size_t n, size_t size, int *failed) {
    void *p = calloc(n ? n : 1, size);
    if (!p) *failed = 1;
    return p;
}

void eb_context_free(eb_context *c) {
    if (!c) return;
    eb_model *m = c->model;
    eb_engine *eng = m->engine;
    eb_scheduler_release(c);
    eb_context_buffers_release(c);
    for (int d = 0; d < EB_MAX_DEVICES; d++)
        for (int k = 0; k < 4; k++) {
            void *ev = k == 0 ? c->begun[d] : k == 1 ? c->done[d] : k == 2 ? c->up[d] : c->down[d];
            const eb_runtime *r = eb_device_runtime(eng, d);
            if (ev) r->table->event_destroy(r->rt, eng->devices[d].local, ev);
        }
    for (int i = 0; c->own_events && i < 2 * m->cfg.num_layers; i++)
        if (c->own_events[i]) {
            const eb_runtime *r = eb_device_runtime(eng, m->primary);
            r->table->event_destroy(r->rt, eng->devices[m->primary].local, c->own_events[i]);
        }
    free(c->own_events);
    free(c->own_pending);
    free(c->cache_rows);
    free(c->cache_at);
    free(c->rope_cos);
    free(c->rope_sin);
    free(c->logits);
    free(c->plan_experts);
    free(c->plan_start);
    free(c->pair_slot);
    free(c->pair_index);
    free(c->token_local);
    free(c->trace);
    free(c);
    if (m && --m->n_contexts == 0 && m->free_requested && m->n_borrowers == 0) eb_model_release(m);
}

int eb_context_create(eb_model *m, int32_t n_ctx, int32_t n_batch, eb_context **out) {
    return eb_context_create_kv(m, n_ctx, n_batch, EB_DTYPE_F32, out);
}

/* Whether this model's primary keeps its KV cache in kv_dtype; an error saying why not. */
static int check_kv_dtype(const eb_model *m, int32_t kv_dtype) {
    const eb_model_config *cf = &m->cfg;
    if (kv_dtype == EB_DTYPE_F32) return EB_OK;
    if (kv_dtype != EB_DTYPE_F16 && kv_dtype != EB_DTYPE_BF16)
        return eb_fail(EB_ERR_ARGUMENT, "KV cache format %d: expected %d (F32), %d (F16) or %d (BF16)", kv_dtype,
                       EB_DTYPE_F32, EB_DTYPE_F16, EB_DTYPE_BF16);
    const char *name = kv_dtype == EB_DTYPE_F16 ? "f16" : "bf16";
    if (cf->kv_lora_rank > 0 || cf->arch == EB_ARCH_DEEPSEEK_V4)
        return eb_fail(EB_ERR_UNSUPPORTED, "a %s KV cache: %s keeps its attention state (%s) in f32 only", name,
                       m->family->title, cf->kv_lora_rank > 0 ? "MLA's compressed latent" : "its compressed entries");
    if (cf->head_dim > EB_KV_MAX_HEAD_DIM)
        return eb_fail(EB_ERR_UNSUPPORTED, "a %s KV cache: heads of %d values, expected at most %d", name,
                       cf->head_dim, EB_KV_MAX_HEAD_DIM);
    const eb_device *p = &m->engine->devices[m->primary];
    if (!(p->kv_formats & (1u << kv_dtype)))
        return eb_fail(EB_ERR_UNSUPPORTED, "a %s KV cache: the primary device %s keeps its cache in f32 only", name,
                       p->name);
    return EB_OK;
}

int eb_context_create_kv(eb_model *m, int32_t n_ctx, int32_t n_batch, int32_t kv_dtype, eb_context **out) {
    if (!m || !out) return eb_fail(EB_ERR_ARGUMENT, "context: NULL argument");
    *out = NULL;
    const eb_model_config *cf = &m->cfg;
    int kst = check_kv_dtype(m, kv_dtype);
    if (kst) return kst;
    if (n_ctx <= 0 || n_ctx > cf->max_position_embeddings)
        return eb_fail(EB_ERR_RANGE, "context length %d out of range: expected 1..%d (max_position_embeddings)", n_ctx,
                       cf->max_position_embeddings);
    if (n_batch <= 0 || n_batch > 65536)
        return eb_fail(EB_ERR_RANGE, "batch size %d out of range: expected 1..65536", n_batch);
    if (n_batch > n_ctx) n_batch = n_ctx;
    eb_context *c = calloc(1, sizeof *c);
    if (!c) return eb_fail(EB_ERR_MEMORY, "out of memory");
    c->model = m;
    m->n_contexts++; /* eb_context_free gives it back, on the failure paths below too */
    c->n_ctx = n_ctx;
    c->n_batch = n_batch;
    c->kv_dtype = kv_dtype;
    eb_dims d = eb_model_dims(cf);
    size_t B = (size_t)n_batch, H = (size_t)cf->hidden_size, hd = (size_t)(cf->rope_dim ? cf->rope_dim : cf->head_dim);
    size_t qd = (size_t)(d.q > d.att ? d.q : d.att), kvd = (size_t)(d.cache_k + d.cache_v), I = (size_t)d.ffn;
    size_t K = cf->top_k > 0 ? (size_t)cf->top_k : 1;
    /* every buffer size is a product of these: refuse what would overflow size_t */
    size_t kv_elems, probe;
    int failed = 0;
    c->cache_rows = zalloc((size_t)cf->num_layers, sizeof *c->cache_rows, &failed);
    c->cache_at = zalloc((size_t)cf->num_layers + 1, sizeof *c->cache_at, &failed);
    if (failed) {
        eb_context_free(c);
        return eb_fail(EB_ERR_MEMORY, "out of memory for a context of %d positions", n_ctx);
    }
    for (int l = 0; l < cf->num_layers; l++) { /* each layer's rows, then where they start: at most layers * n_ctx */
        c->cache_rows[l] = eb_cache_rows(cf, l, n_ctx, n_batch);
        c->cache_at[l + 1] = c->cache_at[l] + (size_t)c->cache_rows[l];
    }
    if (__builtin_mul_overflow((size_t)cf->num_layers, (size_t)n_ctx, &kv_elems) ||
        __builtin_mul_overflow(kv_elems, kvd, &kv_elems) || __builtin_mul_overflow(kv_elems, sizeof(float), &probe) ||
        __builtin_mul_overflow(B * K, qd > I ? (qd > H ? qd : H) : (I > H ? I : H), &probe) ||
        __builtin_mul_overflow(probe, 4 * sizeof(float), &probe) ||
        __builtin_mul_overflow((size_t)cf->num_heads, (size_t)n_ctx, &probe) ||
        __builtin_mul_overflow(probe, sizeof(float), &probe) ||
        __builtin_mul_overflow(B, (size_t)cf->vocab_size * sizeof(float), &probe)) {
        eb_context_free(c);
        return eb_fail(EB_ERR_RANGE, "a context of %d positions for this model's sizes does not fit in memory", n_ctx);
    }
    c->rope_cos = zalloc((size_t)n_ctx * hd / 2, sizeof(float), &failed);
    c->rope_sin = zalloc((size_t)n_ctx * hd / 2, sizeof(float), &failed);
    c->logits = zalloc((size_t)cf->vocab_size, sizeof(float), &failed);
    c->n_devices = m->engine->n_devices;
    c->plan_experts = zalloc(B * K, sizeof(eb_rt_expert), &failed);
    c->plan_start = zalloc(B * K + 1, sizeof(int32_t), &failed);
    c->pair_slot = zalloc(B * K, sizeof(int32_t), &failed);
    c->pair_index = zalloc(B * K, sizeof(int32_t), &failed);
    c->token_local = zalloc((size_t)c->n_devices * B, sizeof(int32_t), &failed);
    c->own_events = zalloc(2 * (size_t)cf->num_layers, sizeof(void *), &failed);
    c->own_pending = zalloc(2 * (size_t)cf->num_layers, sizeof(int32_t), &failed);
    if (failed) {
        eb_context_free(c);
        return eb_fail(EB_ERR_MEMORY, "out of memory for a context of %d positions", n_ctx);
    }
    /* RoPE tables computed as transformers does, in f32: inv_freq = 1 / theta^(2i/d) (or the config's scaled
     * frequencies), angle = pos * inv_freq, cos and sin times the scaled RoPE's attention factor */
    size_t half = hd / 2;
    float factor = cf->rope_attention_factor > 0.0 ? (float)cf->rope_attention_factor : 1.0f;
    for (size_t i = 0; i < half; i++) {
        float inv_freq = cf->rope_inv_freq ? cf->rope_inv_freq[i]
                                           : 1.0f / powf((float)cf->rope_theta, (float)(2 * i) / (float)hd);
        for (int32_t p = 0; p < n_ctx; p++) {
            float angle = (float)p * inv_freq;
            c->rope_cos[(size_t)p * half + i] = cosf(angle) * factor;
            c->rope_sin[(size_t)p * half + i] = sinf(angle) * factor;
        }
    }
    c->use_graphs = 1;
    c->top_k = cf->top_k;
    int st = eb_context_buffers_init(c);
    if (st) {
        eb_context_free(c);
        return st;
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
int eb_context_set_precision(eb_context *c, int32_t precision) {
    if (!c) return eb_fail(EB_ERR_ARGUMENT, "set precision: context is NULL");
    if (precision != EB_PRECISION_F32 && precision != EB_PRECISION_Q8)
        return eb_fail(EB_ERR_ARGUMENT, "precision %d: expected %d (f32) or %d (q8)", precision, EB_PRECISION_F32,
                       EB_PRECISION_Q8);
    int st = eb_check_precision(c->model, precision); /* said now; each step checks again (placements change) */
    if (st) return st;
    c->precision = precision;
    return EB_OK;
}
int32_t eb_context_capacity(const eb_context *c) { return c ? c->n_ctx : -1; }

int eb_context_set_graphs(eb_context *c, int32_t enabled) {
    if (!c) return eb_fail(EB_ERR_ARGUMENT, "set graphs: context is NULL");
    if (enabled != 0 && enabled != 1) return eb_fail(EB_ERR_ARGUMENT, "set graphs: %d, expected 0 or 1", enabled);
    c->use_graphs = enabled;
    return EB_OK;
}

int eb_context_set_top_k(eb_context *c, int32_t top_k) {
    if (!c) return eb_fail(EB_ERR_ARGUMENT, "set top_k: context is NULL");
    const eb_model_config *cf = &c->model->cfg;
    if (cf->num_experts <= 0 || cf->top_k <= 0)
        return eb_fail(EB_ERR_ARGUMENT, "experts per token (top_k) %d: the model has no experts", top_k);
    if (top_k < 1 || top_k > cf->top_k)
        return eb_fail(EB_ERR_RANGE, "experts per token (top_k) %d: expected 1..%d (the count the model was loaded "
                                     "with; load it with more to decode with more)", top_k, cf->top_k);
    int per = cf->n_group > 1 ? cf->num_experts / cf->n_group : 0;
    if (per && top_k > cf->topk_group * per)
        return eb_fail(EB_ERR_RANGE, "experts per token (top_k) %d: expected at most %d (the %d kept groups of %d "
                                     "experts)", top_k, cf->topk_group * per, cf->topk_group, per);
    c->top_k = top_k;
    return EB_OK;
}
int32_t eb_context_top_k(const eb_context *c) { return c ? c->top_k : -1; }

int eb_context_truncate(eb_context *c, int32_t pos) {
    if (!c) return eb_fail(EB_ERR_ARGUMENT, "truncate: context is NULL");
    if (pos < 0 || pos > c->pos)
        return eb_fail(EB_ERR_RANGE, "truncate to position %d: expected 0..%d (the current position)", pos, c->pos);
    c->pos = pos;
    return EB_OK;
}

int eb_context_eval(eb_context *c, const int32_t *ids, int32_t n, float *logits, int32_t all_rows) {
    return eb_context_eval_hidden(c, ids, n, logits, all_rows, NULL, NULL);
}

int eb_context_eval_hidden(eb_context *c, const int32_t *ids, int32_t n, float *logits, int32_t all_rows,
                           const float *hidden_in, float *hidden_out) {
    if (!c || !ids) return eb_fail(EB_ERR_ARGUMENT, "eval: NULL argument");
    if (n <= 0) return eb_fail(EB_ERR_ARGUMENT, "eval: %d tokens, expected at least one", n);
    const eb_model_config *cf = &c->model->cfg;
    if (cf->next_token_module && !hidden_in)
        return eb_fail(EB_ERR_ARGUMENT, "eval: a multi-token-prediction module reads the target's hidden state at "
                                        "each position: hidden_in is NULL");
    if (!cf->next_token_module && hidden_in)
        return eb_fail(EB_ERR_ARGUMENT, "eval: hidden_in is for a multi-token-prediction module; this %s model "
                                        "reads token ids alone", c->model->family->title);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= cf->vocab_size)
            return eb_fail(EB_ERR_RANGE, "token id %d (at index %d) out of range: the vocabulary has %d tokens "
                                         "(ids 0..%d)", ids[i], i, cf->vocab_size, cf->vocab_size - 1);
    if ((int64_t)c->pos + n > c->n_ctx)
        return eb_fail(EB_ERR_RANGE, "context of %lld positions is longer than the KV cache (%d positions); "
                                     "truncate or create a larger context", (long long)c->pos + n, c->n_ctx);
    int st = eb_model_check_files(c->model); /* a weight file changed under a mapping: refused from then on */
    if (st) return st;
    int64_t V = cf->vocab_size;
    for (int32_t done = 0; done < n;) {
        int32_t chunk = n - done < c->n_batch ? n - done : c->n_batch;
        int last_chunk = done + chunk == n;
        float *out = NULL;
        if (logits && all_rows) out = logits + (int64_t)done * V;
        else if (logits && last_chunk) out = logits;
        int64_t at = (int64_t)done * cf->hidden_size;
        st = eb_eval_batch(c, ids + done, chunk, out, all_rows, hidden_in ? hidden_in + at : NULL,
                           hidden_out ? hidden_out + at : NULL);
        if (!st) st = eb_model_file_faulted(c->model); /* this step may have read zeros in place of the file */
        if (st) {
            if (done == 0) return st; /* nothing of this eval is in the cache: the position is where it was */
            /* The earlier chunks' rows are in the cache, and a sliding-window layer's ring (window + n_batch - 1
             * rows) no longer holds every row before them: the context keeps them rather than go back to start,
             * where the ring would be read with rows of later positions in it. The error says so. */
            char first[768];
            eb_copy_str(first, sizeof first, eb_last_error());
            return eb_fail(st, "%s (the first %d of the %d tokens were evaluated: the context's position is now %d)",
                           first, done, n, c->pos);
        }
        c->pos += chunk;
        done += chunk;
    }
    return EB_OK;
}

/* The index of the largest value, the first of equal ones (numpy's argmax), of a row with no NaN (greedy refuses
 * those first). Two branch-light passes (the largest value, then its first index) rather than one that carries the
 * index of the best so far from element to element. */
static int32_t argmax(const float *v, int32_t n) {
    float mx = v[0];
    for (int32_t i = 0; i < n; i++) mx = v[i] > mx ? v[i] : mx;
    for (int32_t i = 0; i < n; i++)
        if (v[i] == mx) return i;
    return 0;
}

/* The first value that is NaN or inf, or -1: one pass that only ORs, a second only where one is there. */
static int32_t first_nonfinite(const float *v, int32_t n) {
    int bad = 0;
    for (int32_t i = 0; i < n; i++) bad |= !isfinite(v[i]);
    for (int32_t i = 0; bad && i < n; i++)
        if (!isfinite(v[i])) return i;
    return -1;
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
        int st = eb_context_eval_hidden(c, &last, 1, c->logits, 0, NULL, NULL);
        if (st) return st;
        int32_t bad = first_nonfinite(c->logits, V);
        if (bad >= 0)
            return eb_fail(EB_ERR_NUMERIC, "step %d (position %d): the logits hold %s at token id %d: the model's "
                                           "numbers overflowed or a weight is damaged", *n_out, c->pos - 1,
                           isnan(c->logits[bad]) ? "NaN" : c->logits[bad] > 0 ? "inf" : "-inf", bad);
        out[(*n_out)++] = argmax(c->logits, V);
    }
}

int eb_context_set_trace(eb_context *c, int64_t capacity) {
    if (!c) return eb_fail(EB_ERR_ARGUMENT, "set trace: context is NULL");
    if (capacity < 0 || capacity > (int64_t)1 << 26)
        return eb_fail(EB_ERR_RANGE, "trace capacity %lld: expected 0 (off) .. %lld spans", (long long)capacity,
                       (long long)1 << 26);
    eb_span *t = NULL;
    if (capacity > 0 && !(t = malloc((size_t)capacity * sizeof *t)))
        return eb_fail(EB_ERR_MEMORY, "out of memory for a trace of %lld spans", (long long)capacity);
    free(c->trace);
    c->trace = t;
    c->trace_cap = capacity;
    c->trace_n = c->trace_lost = 0;
    return EB_OK;
}

int eb_context_read_trace(eb_context *c, eb_trace_span *out, int64_t room, int64_t *n_out, int64_t *lost) {
    if (!c || !n_out || (room > 0 && !out)) return eb_fail(EB_ERR_ARGUMENT, "read trace: NULL argument");
    int64_t n = c->trace_n < room ? c->trace_n : room;
    for (int64_t i = 0; i < n; i++) {
        const eb_span *s = &c->trace[i];
        out[i] = (eb_trace_span){s->start_ns, s->end_ns, s->device, s->layer, s->token, s->kind, s->rows};
    }
    /* what did not fit is kept for the next read */
    memmove(c->trace, c->trace + n, (size_t)(c->trace_n - n) * sizeof *c->trace);
    c->trace_n -= n;
    *n_out = n;
    if (lost) {
        *lost = c->trace_lost;
        c->trace_lost = 0;
    }
    return EB_OK;
}
