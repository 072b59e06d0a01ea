/* Qwen3 and Qwen3-MoE (Qwen3ForCausalLM, Qwen3MoeForCausalLM): pre-norm decoder layers of grouped-query attention
 * (per-head RMSNorm of q and k, rotate-half RoPE, optional q/k/v/o biases) and a SwiGLU FFN, dense or routed
 * (softmax top-k over the experts, renormalised when norm_topk_prob; mlp_only_layers and decoder_sparse_step say
 * which layers route). Tensors by their Hugging Face names, one tensor per expert. */
#include <stdio.h>

#include "eb_forward.h"

static int is_moe_layer(const eb_model_config *c, int layer) {
    if (c->num_experts <= 0) return 0;
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] == layer) return 0;
    return (layer + 1) % c->decoder_sparse_step == 0;
}

static int is_dense_layer(const eb_model_config *c, int layer) {
    (void)c, (void)layer;
    return 0;
}

static int check_moe_config(const eb_model_config *c, int rope) {
    (void)rope;
    if (c->decoder_sparse_step <= 0)
        return eb_fail(EB_ERR_FORMAT, "config: decoder_sparse_step = %d, expected >= 1", c->decoder_sparse_step);
    return EB_OK;
}

static int bind_layer(const eb_binder *b, int l) {
    eb_model *m = b->m;
    const eb_model_config *c = &m->cfg;
    eb_layer *L = &m->layers[l];
    char name[256];
    int64_t H = c->hidden_size;
    int st;
#define NAME(fmt, ...) (snprintf(name, sizeof name, "model.layers.%d." fmt, l, ##__VA_ARGS__), name)
#define TRY(x)                                                                                                   \
    if ((st = (x)) != EB_OK) return st;
    TRY(eb_bind_attention(b, l))
    TRY(eb_bind_vector(b, NAME("self_attn.q_norm.weight"), c->head_dim, &L->q_norm))
    TRY(eb_bind_vector(b, NAME("self_attn.k_norm.weight"), c->head_dim, &L->k_norm))
    L->is_moe = m->family->is_moe_layer(c, l);
    if (!L->is_moe) {
        return eb_bind_ffn(b, l, "mlp", c->intermediate_size, &L->gate, &L->up, &L->down);
    }
    int64_t I = c->moe_intermediate_size;
    TRY(eb_bind(b, NAME("mlp.gate.weight"), c->num_experts, H, &L->router))
    TRY(eb_bind_experts(b, l, I))
    return EB_OK;
#undef NAME
#undef TRY
}

/* The forward pass of one step. */
static int forward(eb_step *s, int64_t first, int logits) {
    int st = eb_block_embed(s);
    for (int l = 0; l < s->m->cfg.num_layers && !st; l++) {
        st = eb_block_attention(s, l);
        if (!st) st = s->m->layers[l].is_moe ? eb_block_moe(s, l) : eb_block_dense_ffn(s, l);
    }
    if (!st && logits) st = eb_block_logits(s, first);
    return st;
}

const eb_family eb_family_qwen3 = {
    .name = "qwen3",
    .title = "Qwen3",
    .arch = EB_ARCH_QWEN3,
    .routing = EB_ROUTE_SOFTMAX_TOPK,
    .is_moe_layer = is_dense_layer,
    .bind_model = eb_bind_embeddings,
    .bind_layer = bind_layer,
    .forward = forward,
};

const eb_family eb_family_qwen3_moe = {
    .name = "qwen3_moe",
    .title = "Qwen3-MoE",
    .arch = EB_ARCH_QWEN3_MOE,
    .routing = EB_ROUTE_SOFTMAX_TOPK,
    .check_config = check_moe_config,
    .is_moe_layer = is_moe_layer,
    .bind_model = eb_bind_embeddings,
    .bind_layer = bind_layer,
    .forward = forward,
};
