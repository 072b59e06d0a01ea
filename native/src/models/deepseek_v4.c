/* DeepSeek-V4 (DeepseekV4ForCausalLM): hc_mult residual streams mixed by mHC around each sublayer; attention of one
 * shared key=value head over a sliding window, with compressed entries beside it in CSA layers (overlapping windows
 * of csa_rate positions, the Lightning Indexer choosing index_topk of them per query) and HCA layers (windows of
 * hca_rate, every entry), a learned sink per head, the output rotated back and projected through o_groups low-rank
 * groups; every layer routed (sqrt-softplus scores, the choice by score + correction bias, or in the hash layers by
 * the token id's row of tid2eid), one shared expert, a clamped SwiGLU. Tensors by the names transformers saves
 * (the released checkpoints' names under model.layers.N., engine/families/deepseek_v4.py). Its operations beyond the
 * common ones are the "deepseek_v4" extension's; the layers' compressor state lives in the context's cache rows, one
 * row per position (eb_v4_cache_row), so truncating a context rolls it back exactly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eb_forward.h"

static int is_moe_layer(const eb_model_config *c, int layer) {
    (void)layer;
    return c->num_experts > 0;
}

static int check_config(const eb_model_config *c, int rope) {
#define RANGE(field, lo, hi)                                                                                     \
    if (c->field < (lo) || c->field > (hi))                                                                      \
        return eb_fail(EB_ERR_FORMAT, "config: " #field " = %d, expected %d..%d", (int)c->field, (int)(lo), (int)(hi));
    RANGE(hc_mult, 1, 64)
    RANGE(hc_sinkhorn_iters, 1, 10000)
    RANGE(o_groups, 1, 65536)
    RANGE(o_lora_rank, 1, 65536)
    RANGE(q_lora_rank, 1, 65536)
    RANGE(sliding_window, 1, 1 << 30)
    RANGE(num_kv_heads, 1, 1)
    RANGE(num_experts, 1, 65536)
    RANGE(n_shared_experts, 1, 1)
#undef RANGE
    if (!(c->hc_eps >= 0.0 && c->hc_eps < 1.0))
        return eb_fail(EB_ERR_FORMAT, "config: hc_eps = %g, expected a number in [0, 1)", c->hc_eps);
    if ((int64_t)c->num_heads * c->head_dim % c->o_groups)
        return eb_fail(EB_ERR_FORMAT, "config: o_groups = %d does not divide num_attention_heads * head_dim = %lld",
                       c->o_groups, (long long)c->num_heads * c->head_dim);
    if (!c->rope_interleave || !c->rope_dim || !c->rope_inv_freq || !c->compress_inv_freq)
        return eb_fail(EB_ERR_FORMAT, "config: DeepSeek-V4 needs its two RoPEs' frequencies (rope_inv_freq and "
                                      "compress_inv_freq) of rope_dim interleaved channels");
    for (int i = 0; i < rope / 2; i++)
        if (!(c->compress_inv_freq[i] > 0.0f && c->compress_inv_freq[i] < 1e30f))
            return eb_fail(EB_ERR_FORMAT, "config: compress RoPE frequency %d = %g, expected a positive finite number",
                           i, (double)c->compress_inv_freq[i]);
    if (c->n_layer_kind != c->num_layers || !c->layer_kind || !c->layer_hash)
        return eb_fail(EB_ERR_FORMAT, "config: %d layer kinds, expected one per layer (%d) with layer_kind and "
                                      "layer_hash", c->n_layer_kind, c->num_layers);
    int csa = 0;
    for (int l = 0; l < c->num_layers; l++) {
        int k = c->layer_kind[l];
        if (k != EB_V4_SLIDING && k != EB_V4_CSA && k != EB_V4_HCA)
            return eb_fail(EB_ERR_FORMAT, "config: layer %d's kind is %d, expected %d (sliding window), %d (CSA) or %d "
                                          "(HCA)", l, k, EB_V4_SLIDING, EB_V4_CSA, EB_V4_HCA);
        if (c->layer_hash[l] != 0 && c->layer_hash[l] != 1)
            return eb_fail(EB_ERR_FORMAT, "config: layer %d's hash routing flag is %d, expected 0 or 1", l,
                           c->layer_hash[l]);
        int rate = k == EB_V4_CSA ? c->csa_rate : k == EB_V4_HCA ? c->hca_rate : 1;
        if (rate < 1 || rate > 65535)
            return eb_fail(EB_ERR_FORMAT, "config: layer %d is %s with a compress rate of %d, expected 1..65535", l,
                           k == EB_V4_CSA ? "compressed sparse attention" : "heavily compressed attention", rate);
        csa |= k == EB_V4_CSA;
    }
    if (csa) {
        if (c->index_n_heads < 1 || c->index_n_heads > 65536 || c->index_head_dim < rope ||
            c->index_head_dim > 65536 || c->index_topk < 1)
            return eb_fail(EB_ERR_FORMAT, "config: the indexer's index_n_heads = %d, index_head_dim = %d, index_topk = "
                                          "%d: expected 1..65536 heads of rope_dim (%d)..65536 channels keeping at "
                                          "least one entry", c->index_n_heads, c->index_head_dim, c->index_topk, rope);
    }
    if (!(c->routed_scaling_factor > 0.0 && c->routed_scaling_factor < 1e6))
        return eb_fail(EB_ERR_FORMAT, "config: routed_scaling_factor = %g, expected a positive finite number",
                       c->routed_scaling_factor);
    return EB_OK;
}

/* The activations: q_b's output; in k the key=value head's, the compressors' and the indexer's products; in v q_a's
 * output, its norm and the grouped projection's output; per position the layer's state (eb_v4_cache_row); the mHC
 * streams and their mixes. */
static void dims(const eb_model_config *c, eb_dims *d) {
    int64_t hd = c->head_dim, ihd = c->index_head_dim, nih = c->index_n_heads;
    d->q = d->att = (int64_t)c->num_heads * hd;
    d->k = 5 * hd + 4 * ihd + nih * ihd + nih;
    d->v = 2 * (int64_t)c->q_lora_rank + (int64_t)c->o_groups * c->o_lora_rank;
    d->cache_k = eb_v4_cache_row(hd, ihd);
    d->cache_v = 0;
    d->hc = (int64_t)c->hc_mult * c->hidden_size + eb_v4_hc_mix(c);
}

/* A float tensor of shape [d0] (d1 0) or [d0, d1] as an owned f32 array of at least len values (zeros past it). */
static int bind_f32(const eb_binder *b, const char *name, int64_t d0, int64_t d1, int64_t len, float **out) {
    eb_weight w;
    int st = eb_bind(b, name, d0, d1, &w);
    if (st) return st;
    int64_t rows = d1 > 0 ? d0 : 1, cols = d1 > 0 ? d1 : d0, n = rows * cols > len ? rows * cols : len;
    float *v = calloc((size_t)n, sizeof *v);
    if (!v) return eb_fail(EB_ERR_MEMORY, "out of memory for tensor '%s'", name);
    if (d1 > 0)
        for (int64_t r = 0; r < rows; r++) eb_weight_row_f32(&w, r, v + r * cols);
    else
        eb_dequantize_row(w.data, w.dtype, cols, v);
    *out = v;
    return EB_OK;
}

static int bind_model(const eb_binder *b) {
    eb_model *m = b->m;
    const eb_model_config *c = &m->cfg;
    int64_t H = c->hidden_size, hc = c->hc_mult;
    int st = eb_bind(b, "model.embed_tokens.weight", c->vocab_size, H, &m->embed);
    if (!st) st = eb_bind_vector(b, "model.norm.weight", H, &m->final_norm);
    if (!st) st = bind_f32(b, "model.hc_head.hc_fn", hc, hc * H, 0, &m->hc_head[0]);
    if (!st) st = bind_f32(b, "model.hc_head.hc_base", hc, 0, 0, &m->hc_head[1]);
    if (!st) st = bind_f32(b, "model.hc_head.hc_scale", 1, 0, 0, &m->hc_head[2]);
    if (st || c->tie_word_embeddings) {
        m->lm_head = m->embed;
        return st;
    }
    return eb_bind(b, "head.weight", c->vocab_size, H, &m->lm_head);
}

/* tid2eid ([vocab, top_k] token id -> experts: a folder's int64, a GGUF file's int32, handed over as raw bytes
 * [vocab, top_k, 8 or 4]) as floats, each id checked. */
static int bind_tid2eid(const eb_binder *b, const char *name, eb_layer *L) {
    const eb_model_config *c = &b->m->cfg;
    int64_t width = eb_tensor_last_dim(b, name) == 4 ? 4 : 8;
    int64_t V = c->vocab_size, K = c->top_k, shape[3] = {V, K, width};
    const void *data;
    int dt, st;
    if ((st = eb_bind_tensor(b, name, 3, shape, 1, &data, &dt))) return st;
    float *ids = malloc((size_t)(V * K) * sizeof *ids);
    if (!ids) return eb_fail(EB_ERR_MEMORY, "out of memory for tensor '%s'", name);
    L->tid2eid = ids;
    for (int64_t i = 0; i < V * K; i++) {
        int64_t e;
        if (width == 4) {
            int32_t e32;
            memcpy(&e32, (const unsigned char *)data + (size_t)i * 4, 4);
            e = e32;
        } else {
            memcpy(&e, (const unsigned char *)data + (size_t)i * 8, 8);
        }
        if (e < 0 || e >= c->num_experts)
            return eb_fail(EB_ERR_FORMAT, "tensor '%s': token id %lld's expert %lld (entry %lld) is out of range, "
                                          "expected 0..%d (n_routed_experts - 1)", name, (long long)(i / K),
                           (long long)e, (long long)(i % K), c->num_experts - 1);
        for (int64_t k = 0; k < i % K; k++)
            if ((int64_t)ids[i - 1 - k] == e)
                return eb_fail(EB_ERR_FORMAT, "tensor '%s': token id %lld chooses expert %lld twice, expected %lld "
                                              "distinct experts", name, (long long)(i / K), (long long)e, (long long)K);
        ids[i] = (float)e;
    }
    return EB_OK;
}

/* o_a in a scaled format (the released FP8): an owned copy, since the grouped output projection reads each group's
 * rows at offsets where a scale block's rows do not begin. BF16 where every value is one exactly (E4M3 times a power
 * of two, as the released E8M0 scales make it: half f32's bytes), else f32; the weight bytes count the copy. */
static int dequantize_o_a(const eb_binder *b, eb_layer *L) {
    int64_t rows = L->o_a.rows, cols = L->o_a.cols, n = rows * cols;
    float *f = malloc((size_t)n * sizeof *f);
    if (!f) return eb_fail(EB_ERR_MEMORY, "out of memory for o_a's values");
    for (int64_t r = 0; r < rows; r++) eb_weight_row_f32(&L->o_a, r, f + r * cols);
    int exact = 1;
    for (int64_t i = 0; i < n && exact; i++) exact = eb_bf16_to_f32(eb_f32_to_bf16(f[i])) == f[i] || f[i] != f[i];
    uint64_t before = eb_row_bytes(L->o_a.dtype, cols) * (uint64_t)rows;
    if (exact) {
        uint16_t *h = malloc((size_t)n * sizeof *h);
        if (!h) {
            free(f);
            return eb_fail(EB_ERR_MEMORY, "out of memory for o_a's values");
        }
        for (int64_t i = 0; i < n; i++) h[i] = eb_f32_to_bf16(f[i]);
        free(f);
        L->o_a_owned = h;
        L->o_a = (eb_weight){h, EB_DTYPE_BF16, rows, cols, {NULL, 0, 0}};
    } else {
        L->o_a_owned = f;
        L->o_a = (eb_weight){f, EB_DTYPE_F32, rows, cols, {NULL, 0, 0}};
    }
    b->m->info.weight_bytes += eb_row_bytes(L->o_a.dtype, cols) * (uint64_t)rows - before;
    return EB_OK;
}

/* The released layout's routed experts: FP4 E2M1 codes packed two a byte ('.weight', I8 [rows, cols / 2], element 2i
 * in the low nibble) with one E8M0 exponent per 32 values ('.scale', [rows, cols / 32]), packed once at load into
 * MXFP4 rows (the same codes and exponents: no value changes). */
static int bind_fp4_experts(const eb_binder *b, int l, int64_t E, int64_t H, int64_t I) {
    eb_layer *L = &b->m->layers[l];
    static const char *const proj[3] = {"w1", "w3", "w2"}; /* gate, up, down */
    unsigned char *mem;
    char name[256];
    int st = eb_point_experts(L, E, H, I, EB_DTYPE_MXFP4, &mem);
    if (st) return st;
    if (I % 32) return eb_fail(EB_ERR_FORMAT, "layer %d: the FP4 experts' down projection has rows of %lld values, "
                                              "expected a multiple of 32 (one E8M0 scale per 32)", l, (long long)I);
    for (int64_t e = 0; e < E; e++)
        for (int p = 0; p < 3; p++) {
            eb_weight *w = p == 0 ? &L->experts[e].gate : p == 1 ? &L->experts[e].up : &L->experts[e].down;
            int64_t rows = w->rows, cols = w->cols, ws[2] = {rows, cols / 2}, ss[2] = {rows, cols / 32};
            const void *codes, *scales;
            int dt;
            snprintf(name, sizeof name, "model.layers.%d.ffn.experts.%lld.%s.weight", l, (long long)e, proj[p]);
            if ((st = eb_bind_tensor(b, name, 2, ws, 1, &codes, &dt))) return st;
            snprintf(name, sizeof name, "model.layers.%d.ffn.experts.%lld.%s.scale", l, (long long)e, proj[p]);
            if ((st = eb_bind_tensor(b, name, 2, ss, 1, &scales, &dt))) return st;
            for (int64_t i = 0; i < rows * (cols / 32); i++) /* E8M0's NaN: MXFP4 would read it as 2^127 */
                if (((const unsigned char *)scales)[i] == 255)
                    return eb_fail(EB_ERR_FORMAT, "tensor '%s': scale [%lld, %lld] is E8M0's NaN (255), expected an "
                                                  "exponent 0..254", name, (long long)(i / (cols / 32)),
                                   (long long)(i % (cols / 32)));
            uint64_t row = eb_row_bytes(EB_DTYPE_MXFP4, cols);
            for (int64_t r = 0; r < rows; r++)
                eb_pack_mxfp4_row((const unsigned char *)codes + (size_t)(r * (cols / 2)),
                                  (const unsigned char *)scales + (size_t)(r * (cols / 32)), cols,
                                  (unsigned char *)w->data + (size_t)r * row);
            /* a bad value's exponent is an element of the scale tensor */
            if ((st = eb_check_owned(b, name, w, 0, cols / 32, 32))) return st;
        }
    return EB_OK;
}

static int bind_layer(const eb_binder *b, int l) {
    eb_model *m = b->m;
    const eb_model_config *c = &m->cfg;
    eb_layer *L = &m->layers[l];
    char name[256];
    int64_t H = c->hidden_size, heads = c->num_heads, hd = c->head_dim, qlr = c->q_lora_rank, hc = c->hc_mult;
    int64_t ihd = c->index_head_dim, nih = c->index_n_heads, E = c->num_experts, I = c->moe_intermediate_size;
    int64_t og = c->o_groups, olr = c->o_lora_rank, mix = eb_v4_hc_mix(c);
    int kind = c->layer_kind[l];
    int st;
#define NAME(fmt, ...) (snprintf(name, sizeof name, "model.layers.%d." fmt, l, ##__VA_ARGS__), name)
#define TRY(x)                                                                                                   \
    if ((st = (x)) != EB_OK) return st;
    TRY(eb_bind_vector(b, NAME("attn_norm.weight"), H, &L->input_norm))
    TRY(eb_bind_vector(b, NAME("ffn_norm.weight"), H, &L->post_norm))
    TRY(eb_bind_vector(b, NAME("attn.attn_sink"), heads, &L->sinks))
    TRY(eb_bind(b, NAME("attn.wq_a.weight"), qlr, H, &L->q_a))
    TRY(eb_bind_vector(b, NAME("attn.q_norm.weight"), qlr, &L->q_a_norm))
    TRY(eb_bind(b, NAME("attn.wq_b.weight"), heads * hd, qlr, &L->q_b))
    TRY(eb_bind(b, NAME("attn.wkv.weight"), hd, H, &L->kv))
    TRY(eb_bind_vector(b, NAME("attn.norm.weight"), hd, &L->kv_norm))
    TRY(eb_bind(b, NAME("attn.wo_a.weight"), og * olr, heads * hd / og, &L->o_a))
    if (eb_dtype_scaled(L->o_a.dtype)) TRY(dequantize_o_a(b, L))
    TRY(eb_bind(b, NAME("attn.wo_b.weight"), H, og * olr, &L->o))
    TRY(bind_f32(b, NAME("hc_attn_fn"), mix, hc * H, 0, &L->hc_attn_fn))
    TRY(bind_f32(b, NAME("hc_attn_base"), mix, 0, 0, &L->hc_attn_base))
    TRY(bind_f32(b, NAME("hc_attn_scale"), 3, 0, 0, &L->hc_attn_scale))
    TRY(bind_f32(b, NAME("hc_ffn_fn"), mix, hc * H, 0, &L->hc_ffn_fn))
    TRY(bind_f32(b, NAME("hc_ffn_base"), mix, 0, 0, &L->hc_ffn_base))
    TRY(bind_f32(b, NAME("hc_ffn_scale"), 3, 0, 0, &L->hc_ffn_scale))
    if (kind != EB_V4_SLIDING) {
        int64_t width = (kind == EB_V4_CSA ? 2 : 1) * hd, rate = kind == EB_V4_CSA ? c->csa_rate : c->hca_rate;
        TRY(eb_bind(b, NAME("attn.compressor.wkv.weight"), width, H, &L->cmp_kv))
        TRY(eb_bind(b, NAME("attn.compressor.wgate.weight"), width, H, &L->cmp_gate))
        TRY(bind_f32(b, NAME("attn.compressor.ape"), rate, width, eb_v4_ape(c, hd), &L->cmp_ape))
        TRY(eb_bind_vector(b, NAME("attn.compressor.norm.weight"), hd, &L->cmp_norm))
    }
    if (kind == EB_V4_CSA) {
        TRY(eb_bind(b, NAME("attn.indexer.compressor.wkv.weight"), 2 * ihd, H, &L->idx_kv))
        TRY(eb_bind(b, NAME("attn.indexer.compressor.wgate.weight"), 2 * ihd, H, &L->idx_gate))
        TRY(bind_f32(b, NAME("attn.indexer.compressor.ape"), c->csa_rate, 2 * ihd, eb_v4_ape(c, ihd), &L->idx_ape))
        TRY(eb_bind_vector(b, NAME("attn.indexer.compressor.norm.weight"), ihd, &L->idx_norm))
        TRY(eb_bind(b, NAME("attn.indexer.wq_b.weight"), nih * ihd, qlr, &L->idx_q))
        TRY(eb_bind(b, NAME("attn.indexer.weights_proj.weight"), nih, H, &L->idx_w))
    }
    L->is_moe = 1;
    TRY(eb_bind(b, NAME("ffn.gate.weight"), E, H, &L->router))
    if (c->layer_hash[l]) {
        TRY(bind_tid2eid(b, NAME("ffn.gate.tid2eid"), L))
    } else {
        TRY(eb_bind_vector(b, NAME("ffn.gate.bias"), E, &L->router_bias))
    }
    TRY(eb_bind(b, NAME("ffn.shared_experts.w1.weight"), I, H, &L->sh_gate))
    TRY(eb_bind(b, NAME("ffn.shared_experts.w3.weight"), I, H, &L->sh_up))
    TRY(eb_bind(b, NAME("ffn.shared_experts.w2.weight"), H, I, &L->sh_down))
    if (eb_tensor_last_dim(b, NAME("ffn.experts.0.w1.weight")) == H / 2 && H % 32 == 0)
        return bind_fp4_experts(b, l, E, H, I);
    if (!(L->experts = calloc((size_t)E, sizeof *L->experts))) return eb_fail(EB_ERR_MEMORY, "out of memory");
    for (int64_t e = 0; e < E; e++) {
        eb_expert *x = &L->experts[e];
        TRY(eb_bind(b, NAME("ffn.experts.%lld.w1.weight", (long long)e), I, H, &x->gate))
        TRY(eb_bind(b, NAME("ffn.experts.%lld.w3.weight", (long long)e), I, H, &x->up))
        TRY(eb_bind(b, NAME("ffn.experts.%lld.w2.weight", (long long)e), H, I, &x->down))
    }
    return EB_OK;
#undef NAME
#undef TRY
}

/* The forward pass of one step: the embeddings into every stream; per layer each sublayer between its mHC's
 * collapse (into x) and its mix (back into the streams); the head's collapse, the final norm and the logits. */
static int forward(eb_step *s, int64_t first, int logits) {
    int st = eb_block_embed(s);
    if (!st) st = eb_block_hc(s, EB_HC_EXPAND, -1, 0);
    for (int l = 0; l < s->m->cfg.num_layers && !st; l++) {
        st = eb_block_hc(s, EB_HC_PRE, l, 0);
        if (!st) st = eb_block_v4_attention(s, l);
        if (!st) st = eb_block_hc(s, EB_HC_POST, l, 0);
        if (!st) st = eb_block_hc(s, EB_HC_PRE, l, 1);
        if (!st) st = eb_block_moe(s, l);
        if (!st) st = eb_block_hc(s, EB_HC_POST, l, 1);
    }
    if (!st) st = eb_block_hc(s, EB_HC_HEAD, -1, 0);
    if (!st && logits) st = eb_block_logits(s, first);
    return st;
}

const eb_family eb_family_deepseek_v4 = {
    .name = "deepseek_v4",
    .title = "DeepSeek-V4",
    .arch = EB_ARCH_DEEPSEEK_V4,
    .routing = EB_ROUTE_SIGMOID_GROUP, /* unused: its route below */
    .clamped_swiglu = 1,
    .clamped_shared = 1,
    .route = eb_v4_route,
    .extensions = (const eb_rt_extension_id[]){{EB_EXT_DEEPSEEK_V4, EB_EXT_DEEPSEEK_V4_VERSION}, {NULL, 0}},
    .check_config = check_config,
    .dims = dims,
    .is_moe_layer = is_moe_layer,
    .bind_model = bind_model,
    .bind_layer = bind_layer,
    .forward = forward,
};
