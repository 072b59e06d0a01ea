/* The arithmetic of the forward pass that must be the same wherever it runs on a CPU: the cpu and hostsim
 * modules' forward operations and the core's scheduler use these, so that a step gives the same bits on either.
 * Plain C, static inline, no state. */
#ifndef EB_OPS_H
#define EB_OPS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "eb_convert.h"
#include "eb_runtime.h"

/* out = w * x / rms(x), accumulated in double; out may be x. */
static inline void eb_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    float inv = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

/* Rotate-half RoPE on one head vector (as transformers' apply_rotary_pos_emb). */
static inline void eb_rope(float *v, const float *cs, const float *sn, int64_t hd) {
    int64_t half = hd / 2;
    for (int64_t i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
    }
}

static inline float eb_silu(float x) { return x / (1.0f + expf(-x)); }

/* q . k with eight partial sums (a shape the compiler turns into SIMD without reassociating anything). Always
 * inlined, like eb_attend, so that it runs in its caller's instruction set. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline float eb_dot_qk(const float *q, const float *k, int64_t hd) {
    float part[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= hd; i += 8)
        for (int l = 0; l < 8; l++) part[l] += q[i + l] * k[i + l];
    float s = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    for (; i < hd; i++) s += q[i] * k[i];
    return s;
}

/* Request the hd floats at row into the caches (a hint; every 64-byte line of it). */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline void eb_prefetch_row(const void *row, int64_t bytes) {
    for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch((const char *)row + i, 0, 3);
}

/* The KV cache's formats (eb_rt_attention.kv_dtype): f32 (the reference), or f16 / bf16, half the bytes: each key and
 * value rounded to the nearest when stored, read back exactly as f32, so the arithmetic after is the f32 cache's.
 * EB_KV_MAX_HEAD_DIM bounds a head's row in a half cache (the core refuses wider heads there). */
enum { EB_KV_MAX_HEAD_DIM = 512 };
/* A value's bytes in the cache, from the format table. */
static inline size_t eb_kv_elem(int32_t kv_dtype) { return (size_t)eb_row_bytes(kv_dtype, 1); }

/* n f16 values as f32, eb_f16_to_f32's bits: a module's faster conversion of a half cache's rows (its F16C one), or
 * NULL for eb_kv_row's own. */
typedef void (*eb_f16_rows_fn)(const uint16_t *h, float *out, int64_t n);

/* hd values of a cache row at element `at` as f32: the row itself in an f32 cache, else converted into buf (an f16
 * row by f16_rows where given). Always inlined, so that the conversion is built for the attention's instruction set
 * (eb_attend_span). */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline const float *eb_kv_row(const void *cache, int32_t kv_dtype, int64_t at, int64_t hd, float *buf,
                                     eb_f16_rows_fn f16_rows) {
    if (kv_dtype == EB_DTYPE_F32) return (const float *)cache + at;
    const uint16_t *h = (const uint16_t *)cache + at;
    if (kv_dtype == EB_DTYPE_F16 && f16_rows) {
        f16_rows(h, buf, hd);
        return buf;
    }
    int64_t i = 0; /* blocks of eight independent lanes: a shape the compiler makes SIMD */
    if (kv_dtype == EB_DTYPE_BF16) {
        for (; i + 8 <= hd; i += 8)
            for (int l = 0; l < 8; l++) buf[i + l] = eb_bf16_to_f32(h[i + l]);
        for (; i < hd; i++) buf[i] = eb_bf16_to_f32(h[i]);
    } else {
        for (; i + 8 <= hd; i += 8)
            for (int l = 0; l < 8; l++) buf[i + l] = eb_f16_to_f32_lanes(h[i + l]);
        for (; i < hd; i++) buf[i] = eb_f16_to_f32_lanes(h[i]);
    }
    return buf;
}

/* n values into a cache row at element `at`, rounded to the cache's format. */
static inline void eb_kv_store(void *cache, int32_t kv_dtype, int64_t at, const float *x, int64_t n) {
    if (kv_dtype == EB_DTYPE_F32) {
        memcpy((float *)cache + at, x, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *h = (uint16_t *)cache + at;
    for (int64_t i = 0; i < n; i++) h[i] = kv_dtype == EB_DTYPE_BF16 ? eb_f32_to_bf16(x[i]) : eb_f32_to_f16(x[i]);
}

/* g query heads of one row (at q, hd floats apart; outputs at o likewise) attending to cache positions lo..p of the
 * key/value head they share (a GQA group): kc, vc point at that head's first cache row (rows stride kvd apart;
 * position s at row s % ring: a window's ring cache, or ring > p), and each key and value row is read once per block
 * of up to EB_ATTEND_HEADS of the group's heads, requested a few rows ahead (the cache is in memory, not in the
 * caches, after a step's weights have streamed through). sinks (NULL: none): one more logit per head in the softmax,
 * with no value. scores has room for g rows of sstride >= p - lo + 1 floats. Each head's arithmetic is that of the
 * head alone (g = 1), in the same order, so the bits do not depend on g. Always inlined, so that a caller built for a
 * wider instruction set (the core's attention) runs it in that set. */
enum { EB_ATTEND_HEADS = 8, EB_ATTEND_AHEAD = 16 };
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline void eb_attend_span(const float *q, int64_t g, const void *kc, const void *vc, int32_t kv_dtype,
                                  eb_f16_rows_fn f16_rows, int64_t lo, int64_t p, int64_t ring, const float *sinks,
                                  int64_t kvd, int64_t hd, float *scores, int64_t sstride, float *restrict o) {
    float scale = 1.0f / sqrtf((float)hd);
    int64_t span = p - lo, first = lo % ring; /* scores[s] is position lo + s, at cache row (lo + s) % ring */
    size_t es = eb_kv_elem(kv_dtype);
    const char *kb = (const char *)kc, *vb = (const char *)vc;
    float kbuf[EB_KV_MAX_HEAD_DIM], vbuf[EB_KV_MAX_HEAD_DIM]; /* a half cache's row as f32 */
#define EB_NEXT(r) ((r) + 1 == ring ? 0 : (r) + 1)
    for (int64_t j0 = 0; j0 < g; j0 += EB_ATTEND_HEADS) {
        int64_t gb = g - j0 < EB_ATTEND_HEADS ? g - j0 : EB_ATTEND_HEADS;
        const float *qb = q + j0 * hd;
        float *sb = scores + j0 * sstride, *restrict ob = o + j0 * hd;
        float mx[EB_ATTEND_HEADS], inv[EB_ATTEND_HEADS];
        for (int64_t j = 0; j < gb; j++) mx[j] = sinks ? sinks[j0 + j] : -INFINITY;
        int64_t row = first, ahead = first;
        for (int64_t s = 0; s < EB_ATTEND_AHEAD && s <= span; s++, ahead = EB_NEXT(ahead)) {
            eb_prefetch_row(kb + (size_t)(ahead * kvd) * es, hd * (int64_t)es);
            eb_prefetch_row(vb + (size_t)(ahead * kvd) * es, hd * (int64_t)es);
        }
        for (int64_t s = 0; s <= span; s++, row = EB_NEXT(row)) {
            if (s + EB_ATTEND_AHEAD <= span) {
                eb_prefetch_row(kb + (size_t)(ahead * kvd) * es, hd * (int64_t)es);
                eb_prefetch_row(vb + (size_t)(ahead * kvd) * es, hd * (int64_t)es);
                ahead = EB_NEXT(ahead);
            }
            const float *kr = eb_kv_row(kc, kv_dtype, row * kvd, hd, kbuf, f16_rows);
            for (int64_t j = 0; j < gb; j++) {
                float v = eb_dot_qk(qb + j * hd, kr, hd) * scale;
                sb[j * sstride + s] = v;
                if (v > mx[j]) mx[j] = v;
            }
        }
        for (int64_t j = 0; j < gb; j++) {
            float *sc = sb + j * sstride, sum = 0.0f;
            for (int64_t s = 0; s <= span; s++) {
                sc[s] = expf(sc[s] - mx[j]);
                sum += sc[s];
            }
            if (sinks) sum += expf(sinks[j0 + j] - mx[j]); /* the sink's share of the softmax goes nowhere */
            inv[j] = 1.0f / sum;
        }
        memset(ob, 0, (size_t)(gb * hd) * sizeof *ob);
        row = first;
        for (int64_t s = 0; s <= span; s++, row = EB_NEXT(row)) {
            const float *restrict v = eb_kv_row(vc, kv_dtype, row * kvd, hd, vbuf, f16_rows);
            for (int64_t j = 0; j < gb; j++) {
                float ps = sb[j * sstride + s] * inv[j], *restrict oj = ob + j * hd;
                int64_t i = 0;
                for (; i + 8 <= hd; i += 8) /* blocks of eight independent lanes: a shape the compiler makes SIMD */
                    for (int l = 0; l < 8; l++) oj[i + l] += ps * v[i + l];
                for (; i < hd; i++) oj[i] += ps * v[i];
            }
        }
    }
#undef EB_NEXT
}

/* g heads of one row attending to cache positions 0..p, row s at s (eb_attend_span without a window or sinks). */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline void eb_attend_group(const float *q, int64_t g, const float *kc, const float *restrict vc, int64_t p,
                                   int64_t kvd, int64_t hd, float *scores, int64_t sstride, float *restrict o) {
    eb_attend_span(q, g, kc, vc, EB_DTYPE_F32, NULL, 0, p, p + 1, NULL, kvd, hd, scores, sstride, o);
}

/* One head of one row attending to cache positions 0..p (eb_attend_group of one head). */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline void eb_attend(const float *q, const float *kc, const float *restrict vc, int64_t p, int64_t kvd,
                             int64_t hd, float *scores, float *restrict o) {
    eb_attend_group(q, 1, kc, vc, p, kvd, hd, scores, p + 1, o);
}

/* One row at position p before attention: the per-head RMSNorm (Qwen3's; none when q_norm and k_norm are NULL) and
 * rotation of its nh query heads (q) and nkv key heads (k) in place, then its key and value rows into the caches
 * (rows of kvd = nkv * hd values of kv_dtype: eb_kv_store). */
static inline void eb_qk_rope_store(float *q, float *k, const float *v, const float *q_norm, const float *k_norm,
                                    const float *rope_cos, const float *rope_sin, void *k_cache, void *v_cache,
                                    int32_t kv_dtype, int64_t p, int64_t row, int64_t nh, int64_t nkv, int64_t hd,
                                    float eps) {
    const float *cs = rope_cos + p * (hd / 2), *sn = rope_sin + p * (hd / 2);
    for (int64_t h = 0; h < nh; h++) {
        if (q_norm) eb_rmsnorm(q + h * hd, q + h * hd, q_norm, hd, eps);
        eb_rope(q + h * hd, cs, sn, hd);
    }
    for (int64_t h = 0; h < nkv; h++) {
        if (k_norm) eb_rmsnorm(k + h * hd, k + h * hd, k_norm, hd, eps);
        eb_rope(k + h * hd, cs, sn, hd);
    }
    eb_kv_store(k_cache, kv_dtype, row * nkv * hd, k, nkv * hd);
    eb_kv_store(v_cache, kv_dtype, row * nkv * hd, v, nkv * hd);
}

/* The K largest of E values, largest first (ties to the lower index), into ids: every router's choice. */
static inline void eb_topk(const float *v, int64_t E, int64_t K, int32_t *ids) {
    for (int64_t k = 0; k < K; k++) {
        int32_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            int taken = 0;
            for (int64_t j = 0; j < k; j++) taken |= ids[j] == e;
            if (!taken && (best < 0 || v[e] > v[best])) best = (int32_t)e;
        }
        ids[k] = best;
    }
}

/* Softmax of one row of E router logits in place (f32), then the top K (ties to the lower id) and their
 * weights, renormalised when norm. */
static inline void eb_route_row(float *p, int64_t E, int64_t K, int norm, int32_t *ids, float *w) {
    float mx = p[0];
    for (int64_t e = 1; e < E; e++)
        if (p[e] > mx) mx = p[e];
    float sum = 0.0f;
    for (int64_t e = 0; e < E; e++) {
        p[e] = expf(p[e] - mx);
        sum += p[e];
    }
    for (int64_t e = 0; e < E; e++) p[e] /= sum;
    eb_topk(p, E, K, ids);
    for (int64_t k = 0; k < K; k++) w[k] = p[ids[k]];
    if (norm) {
        float s = 0.0f;
        for (int64_t k = 0; k < K; k++) s += w[k];
        for (int64_t k = 0; k < K; k++) w[k] /= s;
    }
}

/* gpt-oss's choice (EB_ROUTE_TOPK_SOFTMAX) for one row of E router logits, in place: the bias (NULL: none) added, the
 * top K logits (ties to the lower id), their weights the softmax over those K. */
static inline void eb_route_topk_softmax_row(float *p, const float *bias, int64_t E, int64_t K, int32_t *ids,
                                             float *w) {
    if (bias)
        for (int64_t e = 0; e < E; e++) p[e] += bias[e];
    eb_topk(p, E, K, ids);
    float mx = p[ids[0]], sum = 0.0f; /* the first chosen is the largest */
    for (int64_t k = 0; k < K; k++) sum += w[k] = expf(p[ids[k]] - mx);
    for (int64_t k = 0; k < K; k++) w[k] /= sum;
}

/* The experts' activation of one gate and up value (eb_rt_act). */
static inline float eb_act(int kind, float alpha, float limit, float g, float u) {
    if (kind == EB_ACT_SILU) return eb_silu(g) * u;
    g = g < limit ? g : limit;
    u = u < -limit ? -limit : u > limit ? limit : u;
    if (kind == EB_ACT_SILU_CLAMP) return eb_silu(g) * u;
    return (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
}

/* RoPE of interleaved pairs (x[2i], x[2i+1]) rotated by frequency i, written de-interleaved as transformers'
 * apply_rotary_pos_emb_interleave does (the pairs' first values, then their second: every vector that meets this one
 * in a dot product is rotated alike, so the order is the reference's); hd at most 512. */
static inline void eb_rope_interleaved(float *v, const float *cs, const float *sn, int64_t hd) {
    float t[512];
    int64_t half = hd / 2;
    for (int64_t i = 0; i < half; i++) {
        float a = v[2 * i], b = v[2 * i + 1];
        t[i] = a * cs[i] - b * sn[i];
        t[i + half] = b * cs[i] + a * sn[i];
    }
    memcpy(v, t, (size_t)hd * sizeof *v);
}

/* DeepSeek-V3's choice (EB_ROUTE_SIGMOID_GROUP) for one row of E router logits, in place: p becomes the sigmoid
 * scores; c (E floats of scratch) the scores plus bias with the experts of the groups not kept at 0, as transformers
 * masks them. Groups (E / n_group experts each) rank by the sum of their two best biased scores; ties go to the lower
 * index, as everywhere. */
static inline void eb_route_sigmoid_group_row(float *p, float *c, const float *bias, int64_t E, int64_t K, int64_t G,
                                              int64_t KG, int norm, float scale, int32_t *ids, float *w) {
    int64_t per = E / G;
    for (int64_t e = 0; e < E; e++) {
        p[e] = 1.0f / (1.0f + expf(-p[e]));
        c[e] = p[e] + bias[e];
    }
    if (KG < G) {
        float gs[256];
        unsigned char keep[256] = {0};
        for (int64_t g = 0; g < G; g++) {
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int64_t e = g * per; e < (g + 1) * per; e++) {
                if (c[e] > b1) b2 = b1, b1 = c[e];
                else if (c[e] > b2) b2 = c[e];
            }
            gs[g] = b1 + b2;
        }
        for (int64_t k = 0; k < KG; k++) {
            int64_t best = 0;
            while (keep[best]) best++; /* KG < G: a group is left */
            for (int64_t g = best + 1; g < G; g++)
                if (!keep[g] && gs[g] > gs[best]) best = g;
            keep[best] = 1;
        }
        for (int64_t g = 0; g < G; g++)
            if (!keep[g])
                for (int64_t e = g * per; e < (g + 1) * per; e++) c[e] = 0.0f;
    }
    eb_topk(c, E, K, ids);
    for (int64_t k = 0; k < K; k++) w[k] = p[ids[k]];
    float s = 0.0f;
    if (norm)
        for (int64_t k = 0; k < K; k++) s += w[k];
    for (int64_t k = 0; k < K; k++) w[k] = (norm ? w[k] / (s + 1e-20f) : w[k]) * scale;
}

/* The next of a row's K selections in ascending expert id after id `done` (-1 to begin): its index k. */
static inline int64_t eb_next_ascending(const int32_t *ids, int64_t K, int32_t done) {
    int64_t k = -1;
    for (int64_t i = 0; i < K; i++)
        if (ids[i] > done && (k < 0 || ids[i] < ids[k])) k = i;
    return k;
}

/* Append the pairs that chose expert e to a plan, in ascending row order: for each, the row it reads
 * (pair_token[p]) and its index t * K + k in the routing (slot[p]). Returns the plan's new length. The one way
 * pairs are grouped by expert, on the primary (its own experts) and for each peer (the scheduler). */
static inline int32_t eb_group_pairs(const int32_t *topk_id, int64_t n, int64_t K, int32_t e, int32_t *pair_token,
                                     int32_t *slot, int32_t p) {
    for (int64_t i = 0; i < n * K; i++)
        if (topk_id[i] == e) {
            pair_token[p] = (int32_t)(i / K);
            slot[p++] = (int32_t)i;
        }
    return p;
}

/* The combination of row t's expert outputs (the one reduction of a MoE layer on a CPU primary): x += the sum, begun
 * at 0, over its K selections in ascending expert id of weight * output, an owned expert's output (experts[id].gate
 * set) read from pair_out row t * K + k and another's from foreign (same row; reference mode). owner_local: the sum
 * over the owned ones only, plus foreign row t (the other owners' weighted sums; NULL: none). Returns 0 when a
 * selected expert is not owned and no foreign rows were given (reference mode). */
static inline int eb_moe_combine_row(float *x, int64_t t, int64_t K, int64_t H, const int32_t *topk_id,
                                     const float *topk_w, const eb_rt_expert *experts, const float *pair_out,
                                     const float *foreign, int owner_local) {
    const int32_t *ids = topk_id + t * K;
    float s[H > 0 ? H : 1];
    memset(s, 0, (size_t)H * sizeof(float));
    int32_t done = -1;
    for (int64_t j = 0; j < K; j++) {
        int64_t k = eb_next_ascending(ids, K, done);
        done = ids[k];
        int owned = experts[ids[k]].gate != NULL;
        if (!owned && owner_local) continue;
        if (!owned && !foreign) return 0;
        const float *row = (owned ? pair_out : foreign) + (t * K + k) * H;
        float w = topk_w[t * K + k];
        for (int64_t h = 0; h < H; h++) s[h] += row[h] * w;
    }
    if (owner_local && foreign)
        for (int64_t h = 0; h < H; h++) s[h] += foreign[t * H + h];
    for (int64_t h = 0; h < H; h++) x[t * H + h] += s[h];
    return 1;
}

#endif
