/* The cpu module's forward operations (what a cpu or hostsim primary runs), its extensions, and in the hostsim
 * build their recording as graphs. */
#define _GNU_SOURCE
#include "cpu_module.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

/* ---- the forward pass (the primary's operations) ------------------------------------------------------------
 *
 * Each operation waits for the device's queue to drain, then runs on the calling thread with the device's
 * workers. The cpu and hostsim builds share this code, so a hostsim primary gives a cpu primary's bits. */


static void drain(cpu_device *d) {
    pthread_mutex_lock(&d->qmu);
    while (d->count > 0) pthread_cond_wait(&d->q_idle, &d->qmu);
    pthread_mutex_unlock(&d->qmu);
}

static cpu_device *op_begin(void *rtp, int dev, uint64_t *t0, char *err, size_t errlen) {
    cpu_device *d = get_dev((cpu_runtime *)rtp, dev, err, errlen);
    if (!d) return NULL;
    drain(d);
    *t0 = now_ns();
    pthread_mutex_lock(&d->run_lock);
    return d;
}

static int op_end(cpu_device *d, uint64_t t0, int st) {
    pthread_mutex_unlock(&d->run_lock);
    atomic_fetch_add(&d->busy_ns, now_ns() - t0);
    return st;
}

/* The device's scratch of at least bytes (run_lock held); NULL when it cannot grow. */
static void *scratch(cpu_device *d, size_t bytes) { return grown(&d->scratch, &d->scratch_cap, bytes); }

static int op_check_model(void *rtp, int dev, const eb_rt_model_shape *shape, char *err, size_t errlen) {
    if (!get_dev((cpu_runtime *)rtp, dev, err, errlen)) return EB_ERR_RANGE;
    if (shape->head_dim % 2 != 0)
        return eb_rt_fail(err, errlen, EB_ERR_UNSUPPORTED, RUNTIME_NAME " runtime: head_dim %d: rotate-half RoPE needs "
                          "an even head_dim", shape->head_dim);
    return 0;
}

static int op_embed(void *rtp, int dev, const void *table, int dtype, const eb_rt_scale *scale, int64_t hidden,
                    const int32_t *ids, int64_t n, float *x, char *err, size_t errlen) {
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    const float *grid = scale ? scale->data : NULL;
    for (int64_t t = 0; t < n; t++) {
        const unsigned char *row = (const unsigned char *)table + (size_t)ids[t] * eb_row_bytes(dtype, hidden);
        ((cpu_runtime *)rtp)->kernels.format[dtype].dequantize(row, eb_scale_row(grid, dtype, ids[t], hidden), hidden,
                                                               x + t * hidden);
    }
    return op_end(d, t0, 0);
}

static void norm_rows(const eb_rt_norm *norm) {
    for (int64_t r = 0; r < norm->n; r++)
        eb_rmsnorm(norm->xn + r * norm->dim, norm->x + r * norm->dim, norm->w, norm->dim, norm->eps);
}

static int op_matmul(void *rtp, int dev, const eb_rt_norm *norm, const eb_rt_matmul *tasks, int n_tasks,
                     int accumulate, char *err, size_t errlen) {
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    cpu_runtime *rt = (cpu_runtime *)rtp;
    if (norm) norm_rows(norm);
    if (!accumulate) {
        if (run_multi(rt, d, tasks, n_tasks))
            return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
        return op_end(d, t0, 0);
    }
    /* y += w x: the product into scratch first, then one addition per element */
    for (int i = 0; i < n_tasks; i++) {
        const eb_rt_matmul *t = &tasks[i];
        size_t count = (size_t)t->n * (size_t)t->rows;
        float *tmp = scratch(d, count * sizeof *tmp);
        if (!tmp) return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
        eb_rt_matmul one = *t;
        one.y = tmp;
        if (run_multi(rt, d, &one, 1))
            return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
        for (size_t k = 0; k < count; k++) t->y[k] += tmp[k];
    }
    return op_end(d, t0, 0);
}

static int op_add(void *rtp, int dev, float *y, const float *b, int64_t n, int64_t dim, int broadcast, char *err,
                  size_t errlen) {
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < dim; i++) y[r * dim + i] += b[(broadcast ? 0 : r * dim) + i];
    return op_end(d, t0, 0);
}

static int op_silu_mul(void *rtp, int dev, float *g, const float *u, int64_t n, char *err, size_t errlen) {
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    for (int64_t i = 0; i < n; i++) g[i] = eb_silu(g[i]) * u[i];
    return op_end(d, t0, 0);
}

/* Attention's work items: `heads` query heads of one GQA group each (their key and value rows read once together),
 * every head with its own row of scores. */
typedef struct {
    const eb_rt_attention *a;
    int64_t pos, heads, stride; /* stride: a head's scores, the most positions a row attends to */
    float *scores;
    eb_f16_rows_fn f16_rows; /* an f16 cache's rows as f32 (NULL: eb_kv_row's own conversion) */
} attention_job;

#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline void attend_items(void *arg, int64_t i0, int64_t i1) {
    const attention_job *j = (const attention_job *)arg;
    const eb_rt_attention *a = j->a;
    int64_t hd = a->head_dim, group = a->n_heads / a->n_kv_heads, g = j->heads;
    int64_t qd = (int64_t)a->n_heads * hd, kvd = (int64_t)a->n_kv_heads * hd;
    for (int64_t i = i0; i < i1; i++) {
        int64_t h = i * g, kvh = h / group;
        for (int64_t t = 0; t < a->n; t++) {
            int64_t p = j->pos + t, lo = a->window && p >= a->window ? p - a->window + 1 : 0;
            size_t at = (size_t)(kvh * hd) * eb_kv_elem(a->kv_dtype);
            eb_attend_span(a->q + t * qd + h * hd, g, (const char *)a->k_cache + at, (const char *)a->v_cache + at,
                           a->kv_dtype, j->f16_rows, lo, p, a->n_cache, a->sinks ? a->sinks + h : NULL, kvd, hd,
                           j->scores + h * j->stride, j->stride, a->out + t * qd + h * hd);
        }
    }
}

static void attend_portable(void *arg, int64_t i0, int64_t i1) { attend_items(arg, i0, i1); }

/* The same built for AVX2 where the kernels are: eb_attend_group's sums are eight lanes with nothing reassociated
 * or contracted (-ffp-contract=off), so the wider build gives the same bits with half the instructions. Chosen at
 * init rather than through an ifunc, which the sanitizer runtimes do not survive. */
#if defined(__x86_64__) && defined(__GNUC__)
#define CPU_ATTENTION_AVX2 1
__attribute__((target("avx2"))) static void attend_avx2(void *arg, int64_t i0, int64_t i1) { attend_items(arg, i0, i1); }

/* An f16 cache's row as f32 by F16C's conversion, eight values an instruction (exact, as eb_f16_to_f32; where the
 * AVX2 kernels run, whose CPUs have F16C). */
__attribute__((target("avx2,f16c"))) static void f16_rows_f16c(const uint16_t *h, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++) out[i] = eb_f16_to_f32(h[i]);
}
#endif

static int op_attention(void *rtp, int dev, const eb_rt_attention *a, char *err, size_t errlen) {
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    cpu_runtime *rt = (cpu_runtime *)rtp;
    int64_t hd = a->head_dim, nh = a->n_heads, nkv = a->n_kv_heads;
    int64_t qd = nh * hd, kvd = nkv * hd, pos = *a->pos;
    int64_t stride = a->window && a->window < a->n_ctx ? a->window : a->n_ctx;
    float *scores = scratch(d, (size_t)nh * (size_t)stride * sizeof(float));
    if (!scores) return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
    for (int64_t t = 0; t < a->n; t++)
        eb_qk_rope_store(a->q + t * qd, a->k + t * kvd, a->v + t * kvd, a->q_norm, a->k_norm, a->rope_cos, a->rope_sin,
                         a->k_cache, a->v_cache, a->kv_dtype, pos + t, (pos + t) % a->n_cache, nh, nkv, hd, a->eps);
    /* a whole GQA group per work item where there are at least as many groups as threads, else one head (more
     * items than threads): the bits are the same either way */
    attention_job job = {a, pos, d->pool.n_threads <= nkv ? nh / nkv : 1, stride, scores, NULL};
    pool_fn attend = attend_portable;
#if defined(CPU_ATTENTION_AVX2) && defined(EB_CPU_HAVE_AVX2_BUILD)
    if (rt->avx2) attend = attend_avx2, job.f16_rows = f16_rows_f16c;
#endif
    trace_note(TRACE_PARALLEL_FOR, 0);
    pool_run(&d->pool, attend, &job, nh / job.heads, 1, 0);
    return op_end(d, t0, 0);
}

static int op_route(void *rtp, int dev, const eb_rt_route *r, char *err, size_t errlen) {
    if (r->scoring != EB_ROUTE_SOFTMAX_TOPK && r->scoring != EB_ROUTE_SIGMOID_GROUP &&
        r->scoring != EB_ROUTE_TOPK_SOFTMAX)
        return eb_rt_fail(err, errlen, EB_ERR_UNSUPPORTED, RUNTIME_NAME " runtime: router scoring %d: expected %d "
                          "(softmax top-k), %d (sigmoid, grouped) or %d (top-k, softmax)", r->scoring,
                          EB_ROUTE_SOFTMAX_TOPK, EB_ROUTE_SIGMOID_GROUP, EB_ROUTE_TOPK_SOFTMAX);
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    int64_t n = r->norm.n, E = r->n_experts, K = r->top_k;
    float *choice = NULL;
    if (r->scoring == EB_ROUTE_SIGMOID_GROUP && !(choice = scratch(d, (size_t)E * sizeof *choice)))
        return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
    norm_rows(&r->norm);
    /* the router in f32 whatever the precision: the choice of experts is what a precision must not move */
    eb_rt_matmul logits = {r->router, r->router_dtype, E,   r->norm.dim,    r->norm.xn,
                           n,         r->logits,       EB_PRECISION_F32, r->router_scale};
    (void)run_multi((cpu_runtime *)rtp, d, &logits, 1); /* f32 needs no quantized activations: it cannot fail */
    for (int64_t t = 0; t < n; t++) {
        if (choice)
            eb_route_sigmoid_group_row(r->logits + t * E, choice, r->bias, E, K, r->n_group, r->topk_group,
                                       r->norm_topk, r->scale, r->topk_id + t * K, r->topk_w + t * K);
        else if (r->scoring == EB_ROUTE_TOPK_SOFTMAX)
            eb_route_topk_softmax_row(r->logits + t * E, r->bias, E, K, r->topk_id + t * K, r->topk_w + t * K);
        else
            eb_route_row(r->logits + t * E, E, K, r->norm_topk, r->topk_id + t * K, r->topk_w + t * K);
        if (r->hits)
            for (int64_t k = 0; k < K; k++) r->hits[r->topk_id[t * K + k]]++;
    }
    return op_end(d, t0, 0);
}

/* MLA's work items: one head each, every row of the step, with its own scratch (the absorbed query, the rotated
 * rope query, the latent mix and a row of scores). */
typedef struct {
    const eb_rt_mla *a;
    const eb_cpu_kernel_set *k;
    int64_t pos;
    float *scratch;
} mla_job;

static void mla_heads(void *arg, int64_t h0, int64_t h1) {
    const mla_job *j = (const mla_job *)arg;
    const eb_rt_mla *a = j->a;
    int64_t R = a->rank, P = a->rope, N = a->nope, V = a->v_dim, C = R + P, qw = N + P;
    float scale = a->scale;
    size_t kb_head = (size_t)R * eb_row_bytes(a->k_b_dtype, N);
    size_t vb_head = (size_t)a->v_b_head_rows * eb_row_bytes(a->v_b_dtype, R);
    for (int64_t h = h0; h < h1; h++) {
        float *ql = j->scratch + h * (2 * R + P + a->n_ctx), *qp = ql + R, *ol = qp + P, *sc = ol + R;
        for (int64_t t = 0; t < a->n; t++) {
            int64_t p = j->pos + t;
            const float *q = a->q + (t * a->n_heads + h) * qw;
            memcpy(qp, q + N, (size_t)P * sizeof *qp);
            const float *cs = a->rope_cos + p * (P / 2), *sn = a->rope_sin + p * (P / 2);
            if (a->interleave) eb_rope_interleaved(qp, cs, sn, P);
            else eb_rope(qp, cs, sn, P);
            /* the query's nope part through the key half of kv_b: its dot with the latent is q_nope . k_nope */
            product(j->k, (const unsigned char *)a->k_b + (size_t)h * kb_head, a->k_b_dtype, NULL, 0, R, N, q, NULL, 1,
                    ql, R);
            float mx = -INFINITY, sum = 0.0f;
            for (int64_t s = 0; s <= p; s++) {
                const float *row = a->cache + s * C;
                float v = (eb_dot_qk(ql, row, R) + eb_dot_qk(qp, row + R, P)) * scale;
                sc[s] = v;
                if (v > mx) mx = v;
            }
            for (int64_t s = 0; s <= p; s++) {
                sc[s] = expf(sc[s] - mx);
                sum += sc[s];
            }
            float inv = 1.0f / sum;
            memset(ol, 0, (size_t)R * sizeof *ol);
            for (int64_t s = 0; s <= p; s++) {
                const float *restrict row = a->cache + s * C;
                float ps = sc[s] * inv;
                for (int64_t i = 0; i < R; i++) ol[i] += ps * row[i];
            }
            product(j->k, (const unsigned char *)a->v_b + (size_t)h * vb_head, a->v_b_dtype, NULL, 0, V, R, ol, NULL,
                    1, a->out + (t * a->n_heads + h) * V, V);
        }
    }
}

static int op_mla(void *rtp, int dev, const eb_rt_mla *a, char *err, size_t errlen) {
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    cpu_runtime *rt = (cpu_runtime *)rtp;
    int64_t R = a->rank, P = a->rope, C = R + P, pos = *a->pos;
    float *mem = scratch(d, (size_t)a->n_heads * (size_t)(2 * R + P + a->n_ctx) * sizeof(float));
    if (!mem) return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
    for (int64_t t = 0; t < a->n; t++) { /* the new rows' latent and rope key into the cache */
        float *row = a->cache + (pos + t) * C;
        const float *kv = a->kv + t * C, *cs = a->rope_cos + (pos + t) * (P / 2), *sn = a->rope_sin + (pos + t) * (P / 2);
        eb_rmsnorm(row, kv, a->kv_norm, R, a->eps);
        memcpy(row + R, kv + R, (size_t)P * sizeof *row);
        if (a->interleave) eb_rope_interleaved(row + R, cs, sn, P);
        else eb_rope(row + R, cs, sn, P);
    }
    mla_job job = {a, &rt->kernels, pos, mem};
    trace_note(TRACE_PARALLEL_FOR, 0);
    pool_run(&d->pool, mla_heads, &job, a->n_heads, 1, 0);
    return op_end(d, t0, 0);
}

/* The owned experts' pairs as one batch (experts ascending, each expert's pairs in ascending row order, as the
 * core's scheduler builds them for a peer), each pair's output then moved to its row of pair_out. */
static int moe_experts(cpu_runtime *rt, cpu_device *d, const eb_rt_moe *b, char *err, size_t errlen) {
    int64_t n = b->n, K = b->top_k, E = b->n_experts, H = b->hidden, I = b->inter, NK = n * K;
    size_t ex_bytes = (size_t)(E > NK ? NK : E) * sizeof(eb_rt_expert), idx_bytes = (size_t)NK * sizeof(int32_t);
    size_t y_bytes = (size_t)NK * (size_t)H * sizeof(float), work = eb_rt_expert_scratch_bytes(NK, H, I);
    size_t at[5] = {0}, bytes = 0, sizes[5] = {ex_bytes, idx_bytes + sizeof(int32_t), idx_bytes, idx_bytes, y_bytes};
    for (int i = 0; i < 5; i++) at[i] = bytes, bytes += (sizes[i] + 63) / 64 * 64;
    unsigned char *mem = scratch(d, bytes + work);
    if (!mem) return eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory");
    eb_rt_expert *experts = (eb_rt_expert *)(mem + at[0]);
    int32_t *start = (int32_t *)(mem + at[1]), *pair_token = (int32_t *)(mem + at[2]), *slot = (int32_t *)(mem + at[3]);
    float *y = (float *)(mem + at[4]);
    int32_t ne = 0, p = 0;
    for (int32_t e = 0; e < E; e++) {
        if (!b->experts[e].gate) continue;
        int32_t first = p;
        p = eb_group_pairs(b->topk_id, n, K, e, pair_token, slot, p);
        if (p == first) continue;
        experts[ne] = b->experts[e];
        start[ne++] = first;
    }
    start[ne] = p;
    eb_rt_expert_batch batch = {.n_experts = ne, .experts = experts, .pair_start = start, .n_pairs = p,
                                .n_tokens = (int32_t)n, .hidden = (int32_t)H, .inter = (int32_t)I,
                                .mode = EB_REDUCE_REFERENCE, .x = b->xn, .pair_token = pair_token, .y = y,
                                .scratch = mem + bytes, .scratch_bytes = work, .precision = b->precision,
                                .act = b->act};
    if (p > 0 && run_expert_batch(rt, d, &batch))
        return eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory");
    for (int32_t i = 0; i < p; i++) memcpy(b->pair_out + (int64_t)slot[i] * H, y + (int64_t)i * H, (size_t)H * sizeof(float));
    if (b->stats) b->stats[0] += (unsigned long long)ne, b->stats[1] += (unsigned long long)p;
    return 0;
}

static int op_moe(void *rtp, int dev, const eb_rt_moe *b, char *err, size_t errlen) {
    if (b->phase != EB_MOE_ALL && b->phase != EB_MOE_EXPERTS && b->phase != EB_MOE_COMBINE)
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT, RUNTIME_NAME " runtime: moe phase %d: expected %d, %d or %d",
                          b->phase, EB_MOE_ALL, EB_MOE_EXPERTS, EB_MOE_COMBINE);
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    int st = 0;
    if (b->phase != EB_MOE_COMBINE) st = moe_experts((cpu_runtime *)rtp, d, b, err, errlen);
    if (!st && b->phase != EB_MOE_EXPERTS)
        for (int64_t t = 0; t < b->n && !st; t++)
            if (!eb_moe_combine_row(b->x, t, b->top_k, b->hidden, b->topk_id, b->topk_w, b->experts,
                                    b->pair_out, b->foreign, b->mode == EB_REDUCE_OWNER_LOCAL))
                st = eb_rt_fail(err, errlen, EB_ERR_ARGUMENT, RUNTIME_NAME " runtime: a selected expert is not owned "
                                "and no foreign outputs were given");
    return op_end(d, t0, st);
}

/* ---- the "deepseek_v4" extension (DeepSeek-V4's operations, eb_runtime.h) -------------------------------------
 *
 * Each row's arithmetic depends on that row alone, in one order, whatever the step's rows: a batch gives its rows'
 * bits one by one, and so does a context truncated and evaluated again. */

static float v4_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* x / sqrt(mean(x^2) + eps), n values (transformers' RMSNorm without weight) */
static void v4_unit_norm(float *y, const float *x, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    float inv = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * inv;
}

/* RoPE of interleaved pairs on the last rd channels of a head of hd (sign -1: the inverse rotation), in place: the
 * pairs stay where they are, as transformers' V4 keeps them (its values are rotated too, so the layout matters). */
static void v4_rope(float *v, int64_t hd, int64_t rd, const float *inv_freq, int64_t p, float sign) {
    float *r = v + hd - rd;
    for (int64_t i = 0; i < rd / 2; i++) {
        float angle = (float)p * inv_freq[i], cs = cosf(angle), sn = sign * sinf(angle);
        float a = r[2 * i], b = r[2 * i + 1];
        r[2 * i] = a * cs - b * sn;
        r[2 * i + 1] = b * cs + a * sn;
    }
}

static float v4_dot(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* mHC's pre, post and comb of one row of streams (st: hc rows of H) into mix (post, comb; pre into pre) */
static void hc_mixes(const eb_rt_hc *a, const float *st, float *flat, float *pre, float *mix, int head) {
    int64_t hc = a->hc, HH = hc * (int64_t)a->hidden, M = head ? hc : (2 + hc) * hc;
    float f[64 * 66];
    v4_unit_norm(flat, st, HH, a->norm_eps);
    for (int64_t k = 0; k < M; k++) f[k] = v4_dot(a->fn + k * HH, flat, HH);
    for (int64_t j = 0; j < hc; j++) pre[j] = v4_sigmoid(f[j] * a->scale[0] + a->base[j]) + a->eps;
    if (head) return;
    float *post = mix, *comb = mix + hc;
    for (int64_t j = 0; j < hc; j++) post[j] = 2.0f * v4_sigmoid(f[hc + j] * a->scale[1] + a->base[hc + j]);
    for (int64_t j = 0; j < hc; j++) { /* each row's softmax, + eps */
        float *row = comb + j * hc, mx = -INFINITY, sum = 0.0f;
        for (int64_t k = 0; k < hc; k++) {
            row[k] = f[2 * hc + j * hc + k] * a->scale[2] + a->base[2 * hc + j * hc + k];
            mx = row[k] > mx ? row[k] : mx;
        }
        for (int64_t k = 0; k < hc; k++) sum += row[k] = expf(row[k] - mx);
        for (int64_t k = 0; k < hc; k++) row[k] = row[k] / sum + a->eps;
    }
    for (int it = 0; it < a->sinkhorn_iters; it++) { /* columns first; then rows, columns */
        for (int pass = it == 0 ? 1 : 0; pass < 2; pass++)
            for (int64_t i = 0; i < hc; i++) {
                float sum = 0.0f;
                for (int64_t k = 0; k < hc; k++) sum += pass ? comb[k * hc + i] : comb[i * hc + k];
                for (int64_t k = 0; k < hc; k++) {
                    float *v = pass ? &comb[k * hc + i] : &comb[i * hc + k];
                    *v = *v / (sum + a->eps);
                }
            }
    }
}

static int op_v4_hc(void *rtp, int dev, const eb_rt_hc *a, char *err, size_t errlen) {
    if (a->kind < EB_HC_EXPAND || a->kind > EB_HC_HEAD || a->hc < 1 || a->hc > 64)
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT, RUNTIME_NAME " runtime: mHC kind %d of %d streams: expected "
                          "kind %d..%d of 1..64 streams", a->kind, a->hc, EB_HC_EXPAND, EB_HC_HEAD);
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    int64_t hc = a->hc, H = a->hidden, HH = hc * H, M = (2 + hc) * hc;
    float *flat = scratch(d, (size_t)(HH + 64) * sizeof(float));
    if (!flat) return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
    for (int64_t t = 0; t < a->n; t++) {
        float *st = a->streams + t * HH, *x = a->x + t * H, *mix = a->mix + t * M, *pre = flat + HH;
        if (a->kind == EB_HC_EXPAND) {
            for (int64_t j = 0; j < hc; j++) memcpy(st + j * H, x, (size_t)H * sizeof *x);
        } else if (a->kind == EB_HC_POST) {
            const float *post = mix, *comb = mix + hc;
            memcpy(flat, st, (size_t)HH * sizeof *flat);
            for (int64_t k = 0; k < hc; k++)
                for (int64_t h = 0; h < H; h++) {
                    float sum = 0.0f;
                    for (int64_t j = 0; j < hc; j++) sum += comb[j * hc + k] * flat[j * H + h];
                    st[k * H + h] = post[k] * x[h] + sum;
                }
        } else {
            hc_mixes(a, st, flat, pre, mix, a->kind == EB_HC_HEAD);
            for (int64_t h = 0; h < H; h++) {
                float sum = 0.0f;
                for (int64_t j = 0; j < hc; j++) sum += pre[j] * st[j * H + h];
                x[h] = sum;
            }
        }
    }
    return op_end(d, t0, 0);
}

/* Where a V4 layer's state row keeps what (eb_v4_cache_row): the key=value row, the compressor's kv and gate
 * projections (up to 2 hd each), its entry, the indexer's kv and gate (2 idx each) and its entry. */
typedef struct {
    int64_t row, kv, ckv, cg, ce, ikv, ig, ie;
} v4_layout;

static v4_layout v4_layout_of(int64_t hd, int64_t ihd) {
    return (v4_layout){eb_v4_cache_row(hd, ihd), 0, hd, 3 * hd, 5 * hd, 6 * hd, 6 * hd + 2 * ihd, 6 * hd + 4 * ihd};
}

/* Compressed entry w of one compressor (dim channels; overlap: CSA's 2 rate slots, the first halves of window w - 1's
 * rows and the second halves of window w's) from the state rows: per channel the softmax over the slots of gate + ape
 * weighs kv, then the norm and the compress RoPE at w * rate. */
static void v4_compress(const eb_rt_v4_attention *a, const v4_layout *L, int64_t w, int64_t dim, int overlap,
                        int64_t kv_at, int64_t gate_at, const float *ape, const float *norm, float *entry, float *tmp) {
    int64_t rate = a->rate, width = overlap ? 2 * dim : dim, slots = 0;
    float *g = tmp, *v = tmp + 2 * rate, *pool = v + 2 * rate;
    for (int64_t c = 0; c < dim; c++) {
        slots = 0;
        if (overlap && w > 0)
            for (int64_t i = 0; i < rate; i++) {
                const float *row = a->cache + ((w - 1) * rate + i) * L->row;
                v[slots] = row[kv_at + c];
                g[slots++] = row[gate_at + c] + ape[i * width + c];
            }
        int64_t half = overlap ? dim : 0;
        for (int64_t i = 0; i < rate; i++) {
            const float *row = a->cache + (w * rate + i) * L->row;
            v[slots] = row[kv_at + half + c];
            g[slots++] = row[gate_at + half + c] + ape[i * width + half + c];
        }
        float mx = -INFINITY, sum = 0.0f, acc = 0.0f;
        for (int64_t i = 0; i < slots; i++) mx = g[i] > mx ? g[i] : mx;
        for (int64_t i = 0; i < slots; i++) sum += g[i] = expf(g[i] - mx);
        for (int64_t i = 0; i < slots; i++) acc += v[i] * (g[i] / sum);
        pool[c] = acc;
    }
    eb_rmsnorm(entry, pool, norm, dim, a->eps);
    v4_rope(entry, dim, a->rope_dim, a->compress_inv_freq, w * rate, 1.0f);
}

static int op_v4_attention(void *rtp, int dev, const eb_rt_v4_attention *a, char *err, size_t errlen) {
    if (a->kind != EB_V4_SLIDING && a->kind != EB_V4_CSA && a->kind != EB_V4_HCA)
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT, RUNTIME_NAME " runtime: V4 attention kind %d: expected %d, %d "
                          "or %d", a->kind, EB_V4_SLIDING, EB_V4_CSA, EB_V4_HCA);
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    int64_t hd = a->head_dim, ihd = a->idx_dim, nih = a->idx_heads, rd = a->rope_dim, pos = *a->pos;
    int64_t rate = a->rate, W = a->kind == EB_V4_CSA ? 2 * hd : hd, big = hd > ihd ? hd : ihd;
    v4_layout L = v4_layout_of(hd, ihd);
    int64_t n_scores = a->window + a->n_ctx + 1;
    size_t floats = (size_t)(2 * n_scores + 6 * rate + big + 64);
    float *mem = scratch(d, floats * sizeof(float) + (size_t)(a->n_ctx + 1) * sizeof(int32_t));
    if (!mem) return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
    float *sc = mem, *iscore = sc + n_scores, *tmp = iscore + n_scores;
    int32_t *sel = (int32_t *)(mem + floats);
    /* the new rows into the state: q normed and rotated, the key=value row, the compressors' projections */
    for (int64_t t = 0; t < a->n; t++) {
        int64_t p = pos + t;
        float *row = a->cache + p * L.row;
        for (int64_t h = 0; h < a->n_heads; h++) {
            float *q = a->q + (t * a->n_heads + h) * hd;
            v4_unit_norm(q, q, hd, a->eps);
            v4_rope(q, hd, rd, a->inv_freq, p, 1.0f);
        }
        eb_rmsnorm(row + L.kv, a->kv + t * hd, a->kv_norm, hd, a->eps);
        v4_rope(row + L.kv, hd, rd, a->inv_freq, p, 1.0f);
        if (a->kind != EB_V4_SLIDING) {
            memcpy(row + L.ckv, a->cmp_kv + t * W, (size_t)W * sizeof(float));
            memcpy(row + L.cg, a->cmp_gate + t * W, (size_t)W * sizeof(float));
        }
        if (a->kind == EB_V4_CSA) {
            memcpy(row + L.ikv, a->idx_kv + t * 2 * ihd, (size_t)(2 * ihd) * sizeof(float));
            memcpy(row + L.ig, a->idx_gate + t * 2 * ihd, (size_t)(2 * ihd) * sizeof(float));
        }
    }
    /* the entries whose windows these rows complete */
    for (int64_t t = 0; a->kind != EB_V4_SLIDING && t < a->n; t++) {
        int64_t p = pos + t, w = (p + 1) / rate - 1;
        if ((p + 1) % rate) continue;
        int csa = a->kind == EB_V4_CSA;
        v4_compress(a, &L, w, hd, csa, L.ckv, L.cg, a->cmp_ape, a->cmp_norm, a->cache + w * L.row + L.ce, tmp);
        if (csa)
            v4_compress(a, &L, w, ihd, 1, L.ikv, L.ig, a->idx_ape, a->idx_norm, a->cache + w * L.row + L.ie, tmp);
    }
    for (int64_t t = 0; t < a->n; t++) {
        int64_t p = pos + t, lo = p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        int64_t visible = a->kind == EB_V4_SLIDING ? 0 : (p + 1) / rate, n_sel = visible;
        if (a->kind == EB_V4_HCA)
            for (int64_t w = 0; w < visible; w++) sel[w] = (int32_t)w;
        if (a->kind == EB_V4_CSA && visible > 0) { /* the Lightning Indexer's choice */
            float qs = 1.0f / sqrtf((float)ihd), ws = 1.0f / sqrtf((float)nih);
            float *iq = a->idx_q + t * nih * ihd;
            for (int64_t h = 0; h < nih; h++) v4_rope(iq + h * ihd, ihd, rd, a->compress_inv_freq, p, 1.0f);
            for (int64_t w = 0; w < visible; w++) {
                const float *k = a->cache + w * L.row + L.ie;
                float score = 0.0f;
                for (int64_t h = 0; h < nih; h++) {
                    float dot = v4_dot(iq + h * ihd, k, ihd);
                    score += (dot > 0.0f ? dot : 0.0f) * qs * (a->idx_w[t * nih + h] * ws);
                }
                iscore[w] = score;
            }
            n_sel = visible < a->idx_topk ? visible : a->idx_topk;
            eb_topk(iscore, visible, n_sel, sel);
        }
        for (int64_t h = 0; h < a->n_heads; h++) {
            const float *q = a->q + (t * a->n_heads + h) * hd;
            float *out = a->out + (t * a->n_heads + h) * hd, mx = a->sinks[h], sum = 0.0f;
            int64_t ns = 0;
            for (int64_t s = lo; s <= p; s++) sc[ns++] = v4_dot(q, a->cache + s * L.row + L.kv, hd) * a->scale;
            for (int64_t i = 0; i < n_sel; i++)
                sc[ns++] = v4_dot(q, a->cache + (int64_t)sel[i] * L.row + L.ce, hd) * a->scale;
            for (int64_t i = 0; i < ns; i++) mx = sc[i] > mx ? sc[i] : mx;
            for (int64_t i = 0; i < ns; i++) sum += sc[i] = expf(sc[i] - mx);
            sum += expf(a->sinks[h] - mx);
            memset(out, 0, (size_t)hd * sizeof *out);
            for (int64_t i = 0; i < ns; i++) {
                int64_t at = i < p - lo + 1 ? (lo + i) * L.row + L.kv : (int64_t)sel[i - (p - lo + 1)] * L.row + L.ce;
                const float *v = a->cache + at;
                float pr = sc[i] / sum;
                for (int64_t c = 0; c < hd; c++) out[c] += pr * v[c];
            }
            v4_rope(out, hd, rd, a->inv_freq, p, -1.0f);
        }
    }
    return op_end(d, t0, 0);
}

static int op_v4_grouped(void *rtp, int dev, const eb_rt_grouped *a, char *err, size_t errlen) {
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    cpu_runtime *rt = (cpu_runtime *)rtp;
    int64_t in = a->in, G = a->groups, R = a->rank;
    float *x = scratch(d, (size_t)(a->n * in) * sizeof(float));
    if (!x) return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
    size_t group_bytes = (size_t)R * eb_row_bytes(a->dtype, in);
    for (int64_t g = 0; g < G; g++) {
        for (int64_t t = 0; t < a->n; t++)
            memcpy(x + t * in, a->x + (t * G + g) * in, (size_t)in * sizeof *x);
        product(&rt->kernels, (const unsigned char *)a->w + (size_t)g * group_bytes, a->dtype, NULL, 0, R, in, x, NULL,
                a->n, a->y + g * R, G * R);
    }
    return op_end(d, t0, 0);
}

static int op_v4_route(void *rtp, int dev, const eb_rt_v4_route *r, char *err, size_t errlen) {
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    int64_t n = r->norm.n, E = r->n_experts, K = r->top_k;
    float *choice = scratch(d, (size_t)E * sizeof *choice);
    if (!choice) return op_end(d, t0, eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory"));
    norm_rows(&r->norm);
    memset((float *)r->norm.x, 0, (size_t)(n * r->norm.dim) * sizeof(float)); /* where the experts' sums go */
    eb_rt_matmul logits = {r->router, r->router_dtype, E,   r->norm.dim,    r->norm.xn,
                           n,         r->logits,       EB_PRECISION_F32, r->router_scale};
    (void)run_multi((cpu_runtime *)rtp, d, &logits, 1); /* f32 needs no quantized activations: it cannot fail */
    for (int64_t t = 0; t < n; t++) {
        float *sc = r->logits + t * E, sum = 0.0f;
        int32_t *ids = r->topk_id + t * K;
        float *w = r->topk_w + t * K;
        for (int64_t e = 0; e < E; e++) sc[e] = sqrtf(sc[e] > 20.0f ? sc[e] : log1pf(expf(sc[e])));
        if (r->tid2eid) {
            for (int64_t k = 0; k < K; k++) ids[k] = (int32_t)r->tid2eid[(int64_t)r->ids[t] * r->hash_k + k];
        } else {
            for (int64_t e = 0; e < E; e++) choice[e] = sc[e] + r->bias[e];
            eb_topk(choice, E, K, ids);
        }
        for (int64_t k = 0; k < K; k++) sum += w[k] = sc[ids[k]];
        for (int64_t k = 0; k < K; k++) w[k] = w[k] / (sum + 1e-20f) * r->scale;
        if (r->hits)
            for (int64_t k = 0; k < K; k++) r->hits[ids[k]]++;
    }
    return op_end(d, t0, 0);
}

static int op_v4_swiglu(void *rtp, int dev, float *g, const float *u, int64_t n, float limit, char *err,
                        size_t errlen) {
    uint64_t t0;
    cpu_device *d = op_begin(rtp, dev, &t0, err, errlen);
    if (!d) return EB_ERR_RANGE;
    for (int64_t i = 0; i < n; i++) g[i] = eb_act(EB_ACT_SILU_CLAMP, 0.0f, limit, g[i], u[i]);
    return op_end(d, t0, 0);
}

#ifndef EB_CPU_HOSTSIM
const eb_rt_forward_ops eb_cpu_forward = {
    .check_model = op_check_model,
    .embed = op_embed,
    .matmul = op_matmul,
    .add = op_add,
    .silu_mul = op_silu_mul,
    .attention = op_attention,
    .route = op_route,
    .moe = op_moe,
};
static const eb_rt_mla_ops cpu_mla = {.mla = op_mla};
static const eb_rt_v4_ops cpu_v4 = {.hc = op_v4_hc, .attention = op_v4_attention, .grouped = op_v4_grouped,
                                    .route = op_v4_route, .swiglu = op_v4_swiglu};
const eb_rt_extension eb_cpu_extensions[] = {
    {{EB_EXT_MLA, EB_EXT_MLA_VERSION}, &cpu_mla},
    {{EB_EXT_DEEPSEEK_V4, EB_EXT_DEEPSEEK_V4_VERSION}, &cpu_v4},
    {{NULL, 0}, NULL},
};
#else
/* Graphs (hostsim only, so that the core's recording and replaying of steps runs without a GPU): between begin
 * and end the recording thread's operations are stored (their arguments copied) instead of run; launch runs them
 * again in order. Other threads' operations run as usual. */
enum { OP_EMBED, OP_MATMUL, OP_ADD, OP_SILU_MUL, OP_ATTENTION, OP_ROUTE, OP_MOE, OP_MLA, OP_V4_HC, OP_V4_ATTENTION,
       OP_V4_GROUPED, OP_V4_ROUTE, OP_V4_SWIGLU };
#define SIM_MAX_TASKS 8

typedef struct {
    int kind;
    const void *in0, *in1;
    void *out;
    int64_t n, dim;
    int flag; /* dtype (embed), accumulate (matmul), broadcast (add) */
    int has_norm, n_tasks;
    eb_rt_norm norm;
    eb_rt_matmul tasks[SIM_MAX_TASKS];
    eb_rt_attention attention;
    eb_rt_route route;
    eb_rt_moe moe;
    eb_rt_mla mla;
    eb_rt_scale scale; /* embed: the table's scale companion */
    eb_rt_hc hc;
    eb_rt_v4_attention v4_attention;
    eb_rt_grouped grouped;
    eb_rt_v4_route v4_route;
    float limit; /* the V4 swiglu's */
} sim_op;

typedef struct {
    sim_op *ops;
    int n, cap;
} sim_graph;

/* The graph this thread is recording (compared, never read through, when deciding whether to record: another
 * thread's graph may be freed at any time). */
static _Thread_local sim_graph *recording_here;

static int run_op(void *rtp, int dev, const sim_op *o, char *err, size_t errlen) {
    switch (o->kind) {
    case OP_EMBED:
        return op_embed(rtp, dev, o->in0, o->flag, &o->scale, o->dim, o->in1, o->n, o->out, err, errlen);
    case OP_MATMUL:
        return op_matmul(rtp, dev, o->has_norm ? &o->norm : NULL, o->tasks, o->n_tasks, o->flag, err, errlen);
    case OP_ADD:
        return op_add(rtp, dev, o->out, o->in0, o->n, o->dim, o->flag, err, errlen);
    case OP_SILU_MUL:
        return op_silu_mul(rtp, dev, o->out, o->in0, o->n, err, errlen);
    case OP_ATTENTION:
        return op_attention(rtp, dev, &o->attention, err, errlen);
    case OP_ROUTE:
        return op_route(rtp, dev, &o->route, err, errlen);
    case OP_MLA:
        return op_mla(rtp, dev, &o->mla, err, errlen);
    case OP_V4_HC:
        return op_v4_hc(rtp, dev, &o->hc, err, errlen);
    case OP_V4_ATTENTION:
        return op_v4_attention(rtp, dev, &o->v4_attention, err, errlen);
    case OP_V4_GROUPED:
        return op_v4_grouped(rtp, dev, &o->grouped, err, errlen);
    case OP_V4_ROUTE:
        return op_v4_route(rtp, dev, &o->v4_route, err, errlen);
    case OP_V4_SWIGLU:
        return op_v4_swiglu(rtp, dev, o->out, o->in0, o->n, o->limit, err, errlen);
    default:
        return op_moe(rtp, dev, &o->moe, err, errlen);
    }
}

/* Record o when this thread is recording on dev (*recorded = 1), else leave it to the caller to run. */
static int record(void *rtp, int dev, const sim_op *o, int *recorded, char *err, size_t errlen) {
    *recorded = 0;
    cpu_device *d = get_dev((cpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    sim_graph *g = atomic_load(&d->recording);
    if (!g || g != recording_here) return 0;
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        sim_op *ops = realloc(g->ops, (size_t)cap * sizeof *ops);
        if (!ops) return eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory");
        g->ops = ops;
        g->cap = cap;
    }
    g->ops[g->n++] = *o;
    *recorded = 1;
    return 0;
}

static int submit(void *rtp, int dev, const sim_op *o, char *err, size_t errlen) {
    int recorded, st = record(rtp, dev, o, &recorded, err, errlen);
    return st || recorded ? st : run_op(rtp, dev, o, err, errlen);
}

static int sim_embed(void *rtp, int dev, const void *table, int dtype, const eb_rt_scale *scale, int64_t hidden,
                     const int32_t *ids, int64_t n, float *x, char *err, size_t errlen) {
    sim_op o = {.kind = OP_EMBED, .in0 = table, .in1 = ids, .out = x, .n = n, .dim = hidden, .flag = dtype};
    if (scale) o.scale = *scale;
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_matmul(void *rtp, int dev, const eb_rt_norm *norm, const eb_rt_matmul *tasks, int n_tasks,
                      int accumulate, char *err, size_t errlen) {
    if (n_tasks > SIM_MAX_TASKS) /* the core's steps pass at most three */
        return eb_rt_fail(err, errlen, EB_ERR_ARGUMENT, RUNTIME_NAME " runtime: %d products in one call, at most %d",
                          n_tasks, SIM_MAX_TASKS);
    sim_op o = {.kind = OP_MATMUL, .has_norm = norm != NULL, .n_tasks = n_tasks, .flag = accumulate};
    if (norm) o.norm = *norm;
    if (n_tasks) memcpy(o.tasks, tasks, (size_t)n_tasks * sizeof *tasks); /* (none: the norm alone, tasks NULL) */
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_add(void *rtp, int dev, float *y, const float *b, int64_t n, int64_t dim, int broadcast, char *err,
                   size_t errlen) {
    sim_op o = {.kind = OP_ADD, .in0 = b, .out = y, .n = n, .dim = dim, .flag = broadcast};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_silu_mul(void *rtp, int dev, float *g, const float *u, int64_t n, char *err, size_t errlen) {
    sim_op o = {.kind = OP_SILU_MUL, .in0 = u, .out = g, .n = n};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_attention(void *rtp, int dev, const eb_rt_attention *a, char *err, size_t errlen) {
    sim_op o = {.kind = OP_ATTENTION, .attention = *a};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_route(void *rtp, int dev, const eb_rt_route *r, char *err, size_t errlen) {
    sim_op o = {.kind = OP_ROUTE, .route = *r};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_moe(void *rtp, int dev, const eb_rt_moe *b, char *err, size_t errlen) {
    sim_op o = {.kind = OP_MOE, .moe = *b};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_mla(void *rtp, int dev, const eb_rt_mla *a, char *err, size_t errlen) {
    sim_op o = {.kind = OP_MLA, .mla = *a};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_v4_hc(void *rtp, int dev, const eb_rt_hc *a, char *err, size_t errlen) {
    sim_op o = {.kind = OP_V4_HC, .hc = *a};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_v4_attention(void *rtp, int dev, const eb_rt_v4_attention *a, char *err, size_t errlen) {
    sim_op o = {.kind = OP_V4_ATTENTION, .v4_attention = *a};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_v4_grouped(void *rtp, int dev, const eb_rt_grouped *a, char *err, size_t errlen) {
    sim_op o = {.kind = OP_V4_GROUPED, .grouped = *a};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_v4_route(void *rtp, int dev, const eb_rt_v4_route *r, char *err, size_t errlen) {
    sim_op o = {.kind = OP_V4_ROUTE, .v4_route = *r};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_v4_swiglu(void *rtp, int dev, float *g, const float *u, int64_t n, float limit, char *err,
                         size_t errlen) {
    sim_op o = {.kind = OP_V4_SWIGLU, .in0 = u, .out = g, .n = n, .limit = limit};
    return submit(rtp, dev, &o, err, errlen);
}

static int sim_graph_begin(void *rtp, int dev, char *err, size_t errlen) {
    cpu_device *d = get_dev((cpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    sim_graph *g = calloc(1, sizeof *g);
    if (!g) return eb_rt_fail(err, errlen, EB_ERR_MEMORY, RUNTIME_NAME " runtime: out of memory");
    void *none = NULL;
    if (!atomic_compare_exchange_strong(&d->recording, &none, g)) {
        free(g);
        return eb_rt_fail(err, errlen, EB_ERR_STATE, RUNTIME_NAME ":%d is already recording", dev);
    }
    recording_here = g;
    return 0;
}

static void sim_graph_free(void *rtp, int dev, void *graph) {
    (void)rtp, (void)dev;
    sim_graph *g = graph;
    if (g) free(g->ops);
    free(g);
}

static int sim_graph_end(void *rtp, int dev, void **graph, char *err, size_t errlen) {
    cpu_device *d = get_dev((cpu_runtime *)rtp, dev, err, errlen);
    if (!d) return EB_ERR_RANGE;
    sim_graph *g = atomic_exchange(&d->recording, NULL);
    if (!g) return eb_rt_fail(err, errlen, EB_ERR_STATE, RUNTIME_NAME ":%d is not recording", dev);
    if (g == recording_here) recording_here = NULL;
    if (graph) *graph = g;
    else sim_graph_free(rtp, dev, g);
    return 0;
}

static int sim_graph_launch(void *rtp, int dev, void *graph, char *err, size_t errlen) {
    const sim_graph *g = graph;
    for (int i = 0; i < g->n; i++) {
        int st = run_op(rtp, dev, &g->ops[i], err, errlen);
        if (st) return st;
    }
    return 0;
}

const eb_rt_forward_ops eb_cpu_forward = {
    .check_model = op_check_model,
    .embed = sim_embed,
    .matmul = sim_matmul,
    .add = sim_add,
    .silu_mul = sim_silu_mul,
    .attention = sim_attention,
    .route = sim_route,
    .moe = sim_moe,
};
static const eb_rt_mla_ops sim_mla_ops = {.mla = sim_mla};
static const eb_rt_v4_ops sim_v4_ops = {.hc = sim_v4_hc, .attention = sim_v4_attention, .grouped = sim_v4_grouped,
                                        .route = sim_v4_route, .swiglu = sim_v4_swiglu};
const eb_rt_extension eb_cpu_extensions[] = {
    {{EB_EXT_MLA, EB_EXT_MLA_VERSION}, &sim_mla_ops},
    {{EB_EXT_DEEPSEEK_V4, EB_EXT_DEEPSEEK_V4_VERSION}, &sim_v4_ops},
    {{NULL, 0}, NULL},
};

const eb_rt_graph_ops eb_cpu_graphs = {
    .begin = sim_graph_begin,
    .end = sim_graph_end,
    .launch = sim_graph_launch,
    .free = sim_graph_free,
};
#endif
