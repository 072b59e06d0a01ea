/* Qwen3 and Qwen3-MoE (Qwen3ForCausalLM, Qwen3MoeForCausalLM): pre-norm decoder layers of grouped-query attention
 * (per-head RMSNorm of q and k, rotate-half RoPE) and a SwiGLU FFN, dense or routed (softmax top-k over the
 * experts, renormalised when norm_topk_prob; mlp_only_layers and decoder_sparse_step choose which layers route). */
#include "eb_forward.h"

static int forward(eb_step *s, int64_t first, int logits) {
    int st = eb_block_embed(s);
    for (int l = 0; l < s->m->cfg.num_layers && !st; l++) {
        st = eb_block_attention(s, l);
        if (!st) st = s->m->layers[l].is_moe ? eb_block_moe(s, l) : eb_block_dense_ffn(s, l);
    }
    if (!st && logits) st = eb_block_logits(s, first);
    return st;
}

const eb_family eb_family_qwen3 = {EB_ARCH_QWEN3_MOE, "qwen3", forward};
