/* DeepSeek-V3 (DeepseekV3ForCausalLM, and R1 and V2-Lite-shaped checkpoints of it): pre-norm decoder layers of
 * multi-head latent attention (q through a low-rank bottleneck, or a plain q_proj when q_lora_rank is null; keys and
 * values from a cached latent of kv_lora_rank plus one rope key shared by the heads; interleaved RoPE, YaRN scaled)
 * and an FFN: dense for the first first_k_dense_replace layers, then routed experts chosen by sigmoid scores in
 * groups (a correction bias for the choice only, the weights scaled) beside always-on shared experts. Tensors by
 * their Hugging Face names, one tensor per expert; kv_b_proj may come split as a GGUF file holds it (k_b_proj: its
 * key half transposed per head, v_b_proj: its value half). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eb_forward.h"

static int is_moe_layer(const eb_model_config *c, int layer) {
    return c->num_experts > 0 && layer >= c->first_k_dense_replace;
}

/* MLA's ranks and head widths, the dense lead, the shared experts and the grouped routing. */
static int check_config(const eb_model_config *c, int rope) {
#define MLA_DIM(field)                                                                                           \
    if (c->field <= 0 || c->field > 65536)                                                                       \
        return eb_fail(EB_ERR_FORMAT, "config: " #field " = %d, expected 1..65536", (int)c->field);
    MLA_DIM(kv_lora_rank)
    MLA_DIM(qk_nope_head_dim)
    MLA_DIM(qk_rope_head_dim)
    MLA_DIM(v_head_dim)
#undef MLA_DIM
    if (c->q_lora_rank < 0 || c->q_lora_rank > 65536)
        return eb_fail(EB_ERR_FORMAT, "config: q_lora_rank = %d, expected 0 (none) or 1..65536", c->q_lora_rank);
    if (rope != c->qk_rope_head_dim)
        return eb_fail(EB_ERR_FORMAT, "config: the rotated dimensions (%d) must be qk_rope_head_dim (%d)", rope,
                       c->qk_rope_head_dim);
    if (c->first_k_dense_replace < 0 || c->first_k_dense_replace > c->num_layers)
        return eb_fail(EB_ERR_FORMAT, "config: first_k_dense_replace = %d, expected 0..num_hidden_layers (%d)",
                       c->first_k_dense_replace, c->num_layers);
    if (c->n_shared_experts < 0 || c->n_shared_experts > 64)
        return eb_fail(EB_ERR_FORMAT, "config: n_shared_experts = %d, expected 0..64", c->n_shared_experts);
    if (c->num_experts <= 0) return EB_OK;
    if (c->n_group <= 0 || c->n_group > 256 || c->num_experts % c->n_group)
        return eb_fail(EB_ERR_FORMAT, "config: n_group = %d, expected 1..256 dividing n_routed_experts (%d)", c->n_group,
                       c->num_experts);
    if (c->n_group > 1 && c->num_experts / c->n_group < 2)
        return eb_fail(EB_ERR_FORMAT, "config: n_group = %d leaves %d expert per group, expected at least 2 (a group's "
                                      "score is the sum of its two best)", c->n_group, c->num_experts / c->n_group);
    if (c->topk_group <= 0 || c->topk_group > c->n_group)
        return eb_fail(EB_ERR_FORMAT, "config: topk_group = %d, expected 1..n_group (%d)", c->topk_group, c->n_group);
    if (c->top_k > c->topk_group * (c->num_experts / c->n_group))
        return eb_fail(EB_ERR_FORMAT, "config: num_experts_per_tok = %d, expected at most the experts of the topk_group "
                                      "kept groups (%d)", c->top_k, c->topk_group * (c->num_experts / c->n_group));
    if (!(c->routed_scaling_factor > 0.0 && c->routed_scaling_factor < 1e6))
        return eb_fail(EB_ERR_FORMAT, "config: routed_scaling_factor = %g, expected a positive finite number",
                       c->routed_scaling_factor);
    return EB_OK;
}

/* MLA's activations: the query heads' nope and rope parts, the cached latent with the rope key (no value cache), q_a's
 * output and its norm, the heads' values. */
static void dims(const eb_model_config *c, eb_dims *d) {
    d->q = (int64_t)c->num_heads * (c->qk_nope_head_dim + c->qk_rope_head_dim);
    d->k = d->cache_k = (int64_t)c->kv_lora_rank + c->qk_rope_head_dim;
    d->v = 2 * (int64_t)c->q_lora_rank;
    d->att = (int64_t)c->num_heads * c->v_head_dim;
    d->cache_v = 0;
}

/* k_b from kv_b_proj (heads blocks of nope key rows then v value rows, rank values each): per head its key rows
 * transposed into rank rows of nope, an owned copy in kv_b's format (f32 where that is a block format or a scaled
 * one: its values with their scales). */
static int transpose_k_b(eb_layer *L, const eb_weight *kv_b, int64_t heads, int64_t nope, int64_t v, int64_t rank) {
    int dt = kv_b->dtype;
    size_t es = dt == EB_DTYPE_F32 ? 4 : dt == EB_DTYPE_F16 || dt == EB_DTYPE_BF16 ? 2 : 0;
    size_t out_es = es ? es : sizeof(float), row_bytes = eb_row_bytes(dt, rank);
    unsigned char *out = malloc((size_t)(heads * rank * nope) * out_es);
    float *row = es ? NULL : malloc((size_t)rank * sizeof *row);
    if (!out || (!es && !row)) {
        free(out);
        free(row);
        return eb_fail(EB_ERR_MEMORY, "out of memory for kv_b_proj's keys");
    }
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < nope; i++) {
            const unsigned char *src = (const unsigned char *)kv_b->data + (size_t)(h * (nope + v) + i) * row_bytes;
            if (!es) eb_weight_row_f32(kv_b, h * (nope + v) + i, row);
            for (int64_t j = 0; j < rank; j++) {
                unsigned char *dst = out + (size_t)((h * rank + j) * nope + i) * out_es;
                memcpy(dst, es ? src + (size_t)j * es : (const unsigned char *)(row + j), out_es);
            }
        }
    free(row);
    L->k_b_owned = out;
    L->k_b = (eb_weight){out, es ? dt : EB_DTYPE_F32, heads * rank, nope, {NULL, 0, 0}};
    return EB_OK;
}

/* v_b from a kv_b_proj in a scaled format: its value rows with their scales, an owned f32 copy (the attention reads a
 * head's rows at any row of kv_b, where a scale block's rows do not begin). */
static int dequantize_v_b(eb_layer *L, const eb_weight *kv_b, int64_t heads, int64_t nope, int64_t v, int64_t rank) {
    float *out = malloc((size_t)(heads * v * rank) * sizeof *out);
    if (!out) return eb_fail(EB_ERR_MEMORY, "out of memory for kv_b_proj's values");
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < v; i++) eb_weight_row_f32(kv_b, h * (nope + v) + nope + i, out + (h * v + i) * rank);
    L->v_b_owned = out;
    L->v_b = (eb_weight){out, EB_DTYPE_F32, heads * v, rank, {NULL, 0, 0}};
    L->v_b_head_rows = v;
    return EB_OK;
}

static int bind_layer(const eb_binder *b, int l) {
    eb_model *m = b->m;
    const eb_model_config *c = &m->cfg;
    eb_layer *L = &m->layers[l];
    char name[256];
    int64_t H = c->hidden_size, heads = c->num_heads, nope = c->qk_nope_head_dim, rope = c->qk_rope_head_dim;
    int64_t v = c->v_head_dim, rank = c->kv_lora_rank, qlr = c->q_lora_rank;
    int st;
#define NAME(fmt, ...) (snprintf(name, sizeof name, "model.layers.%d." fmt, l, ##__VA_ARGS__), name)
#define TRY(x)                                                                                                   \
    if ((st = (x)) != EB_OK) return st;
    TRY(eb_bind_vector(b, NAME("input_layernorm.weight"), H, &L->input_norm))
    TRY(eb_bind_vector(b, NAME("post_attention_layernorm.weight"), H, &L->post_norm))
    if (qlr) {
        TRY(eb_bind(b, NAME("self_attn.q_a_proj.weight"), qlr, H, &L->q_a))
        TRY(eb_bind_vector(b, NAME("self_attn.q_a_layernorm.weight"), qlr, &L->q_a_norm))
        TRY(eb_bind(b, NAME("self_attn.q_b_proj.weight"), heads * (nope + rope), qlr, &L->q_b))
    } else {
        TRY(eb_bind(b, NAME("self_attn.q_proj.weight"), heads * (nope + rope), H, &L->q))
    }
    TRY(eb_bind(b, NAME("self_attn.kv_a_proj_with_mqa.weight"), rank + rope, H, &L->kv_a))
    TRY(eb_bind_vector(b, NAME("self_attn.kv_a_layernorm.weight"), rank, &L->kv_a_norm))
    TRY(eb_bind(b, NAME("self_attn.o_proj.weight"), H, heads * v, &L->o))
    if (eb_has_tensor(b, NAME("self_attn.k_b_proj.weight"))) { /* split as a GGUF file holds it */
        TRY(eb_bind(b, name, heads * rank, nope, &L->k_b))
        TRY(eb_bind(b, NAME("self_attn.v_b_proj.weight"), heads * v, rank, &L->v_b))
        L->v_b_head_rows = v;
        if (eb_dtype_scaled(L->k_b.dtype) || eb_dtype_scaled(L->v_b.dtype))
            return eb_fail(EB_ERR_UNSUPPORTED, "tensors 'model.layers.%d.self_attn.k_b_proj.weight' and 'v_b_proj' are "
                                               "stored as %s and %s, expected formats without a scale companion (a "
                                               "scaled kv_b_proj is read whole)", l, eb_dtype_name(L->k_b.dtype),
                           eb_dtype_name(L->v_b.dtype));
    } else {
        eb_weight kv_b;
        TRY(eb_bind(b, NAME("self_attn.kv_b_proj.weight"), heads * (nope + v), rank, &kv_b))
        TRY(transpose_k_b(L, &kv_b, heads, nope, v, rank))
        if (eb_dtype_scaled(kv_b.dtype)) {
            TRY(dequantize_v_b(L, &kv_b, heads, nope, v, rank))
        } else { /* the value rows read in place: head h's v rows follow its nope key rows */
            L->v_b = (eb_weight){(const unsigned char *)kv_b.data + (size_t)nope * eb_row_bytes(kv_b.dtype, rank),
                                 kv_b.dtype, heads * (nope + v) - nope, rank, {NULL, 0, 0}};
            L->v_b_head_rows = nope + v;
        }
    }
    L->is_moe = is_moe_layer(c, l);
    if (!L->is_moe) {
        return eb_bind_ffn(b, l, "mlp", c->intermediate_size, &L->gate, &L->up, &L->down);
    }
    int64_t I = c->moe_intermediate_size, S = I * c->n_shared_experts;
    TRY(eb_bind(b, NAME("mlp.gate.weight"), c->num_experts, H, &L->router))
    TRY(eb_bind_vector(b, NAME("mlp.gate.e_score_correction_bias"), c->num_experts, &L->router_bias))
    if (S) TRY(eb_bind_ffn(b, l, "mlp.shared_experts", S, &L->sh_gate, &L->sh_up, &L->sh_down))
    TRY(eb_bind_experts(b, l, I))
    return EB_OK;
#undef NAME
#undef TRY
}

/* The forward pass of one step. */
static int forward(eb_step *s, int64_t first, int logits) {
    int st = eb_block_embed(s);
    for (int l = 0; l < s->m->cfg.num_layers && !st; l++) {
        st = eb_block_mla_attention(s, l);
        if (!st) st = s->m->layers[l].is_moe ? eb_block_moe(s, l) : eb_block_dense_ffn(s, l);
    }
    if (!st && logits) st = eb_block_logits(s, first);
    return st;
}

/* ---- the multi-token-prediction module ------------------------------------------------------------------ */

/* DeepSeek-V3's MTP module as a model of its own (a draft inside the target's checkpoint): one decoder layer of the
 * model's kind (model.layers.0.*, its mtp.* projection beside it), the shared head's norm and head as the model's. */
static int mtp_check_config(const eb_model_config *c, int rope) {
    if (c->num_layers != 1)
        return eb_fail(EB_ERR_FORMAT, "config: a multi-token-prediction module is one layer, got num_layers = %d",
                       c->num_layers);
    return check_config(c, rope);
}

static int mtp_bind_layer(const eb_binder *b, int l) {
    eb_layer *L = &b->m->layers[l];
    int64_t H = b->m->cfg.hidden_size;
    eb_weight eh;
    int st = bind_layer(b, l);
    if (!st) st = eb_bind_vector(b, "model.mtp.enorm.weight", H, &L->enorm);
    if (!st) st = eb_bind_vector(b, "model.mtp.hnorm.weight", H, &L->hnorm);
    if (!st) st = eb_bind(b, "model.mtp.eh_proj.weight", H, 2 * H, &eh);
    if (!st) st = eb_split_columns(&eh, "model.mtp.eh_proj.weight", H, &L->eh_embed, &L->eh_hidden, &L->eh_owned);
    return st;
}

/* A position's input: its token's embedding and the target's hidden state beside it, each normed, projected
 * together (eh_proj over the two side by side); then the layer and the shared head. */
static int mtp_forward(eb_step *s, int64_t first, int logits) {
    int st = eb_block_next_token_input(s);
    if (!st) st = eb_block_mla_attention(s, 0);
    if (!st) st = s->m->layers[0].is_moe ? eb_block_moe(s, 0) : eb_block_dense_ffn(s, 0);
    if (!st && logits) st = eb_block_logits(s, first);
    return st;
}

const eb_family eb_family_deepseek_v3_mtp = {
    .name = "deepseek_v3",
    .title = "DeepSeek-V3 MTP module",
    .arch = EB_ARCH_DEEPSEEK_V3,
    .routing = EB_ROUTE_SIGMOID_GROUP,
    .extensions = (const eb_rt_extension_id[]){{EB_EXT_MLA, EB_EXT_MLA_VERSION}, {NULL, 0}},
    .check_config = mtp_check_config,
    .dims = dims,
    .is_moe_layer = is_moe_layer,
    .bind_model = eb_bind_embeddings,
    .bind_layer = mtp_bind_layer,
    .forward = mtp_forward,
    .next_token = 1,
};

const eb_family eb_family_deepseek_v3 = {
    .name = "deepseek_v3",
    .title = "DeepSeek-V3",
    .arch = EB_ARCH_DEEPSEEK_V3,
    .routing = EB_ROUTE_SIGMOID_GROUP,
    .extensions = (const eb_rt_extension_id[]){{EB_EXT_MLA, EB_EXT_MLA_VERSION}, {NULL, 0}},
    .check_config = check_config,
    .dims = dims,
    .is_moe_layer = is_moe_layer,
    .bind_model = eb_bind_embeddings,
    .bind_layer = bind_layer,
    .forward = forward,
};
