/* gpt-oss (GptOssForCausalLM): pre-norm decoder layers of grouped-query attention with q/k/v/o biases, one learned
 * sink logit per head, and in the layers layer_types names sliding_attention a window of sliding_window positions;
 * rotate-half RoPE (YaRN scaled); every layer routed: the router's logits plus its bias, their top-k, the softmax over
 * the chosen; experts with biases and the clamped SwiGLU.
 *
 * The experts come in three layouts: one tensor per expert and projection (mlp.experts.E.{gate,up,down}_proj.weight
 * and .bias, as a GGUF file's merged tensors are described), read in place; the unquantized layout transformers saves
 * (mlp.experts.gate_up_proj [experts, hidden, 2 inter] with gate and up interleaved on the last dimension, down_proj
 * [experts, inter, hidden], their biases), transposed once at load into an owned copy in the same format; and the
 * MXFP4 layout the released checkpoints ship (gate_up_proj_blocks [experts, 2 inter, hidden / 32, 16] and
 * gate_up_proj_scales [experts, 2 inter, hidden / 32], the same for down_proj), packed once at load into MXFP4 rows
 * (a block's exponent byte, then its 16 bytes of nibbles) without dequantizing: the same values, bit for bit. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "eb_forward.h"

static int is_moe_layer(const eb_model_config *c, int layer) {
    (void)layer;
    return c->num_experts > 0;
}

static int check_config(const eb_model_config *c, int rope) {
    (void)rope;
    if (c->num_experts <= 0)
        return eb_fail(EB_ERR_FORMAT, "config: num_local_experts = %d, expected at least 1 (gpt-oss routes every layer)",
                       c->num_experts);
    return EB_OK;
}

/* A projection's MXFP4 blocks and scales ([E, rows, cols / 32, 16] and [E, rows, cols / 32]) into the experts' rows:
 * interleave 2 splits the rows between gate (even) and up (odd), else they are down's. */
static int pack_mxfp4(const eb_binder *b, int l, const char *proj, int64_t E, int64_t rows, int64_t cols,
                      eb_layer *L, int interleave) {
    char name[256];
    int64_t bs[4] = {E, rows, cols / 32, 16}, ss[3] = {E, rows, cols / 32};
    const void *blocks, *scales;
    int dt, st;
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s_blocks", l, proj);
    if ((st = eb_bind_tensor(b, name, 4, bs, 1, &blocks, &dt))) return st;
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s_scales", l, proj);
    if ((st = eb_bind_tensor(b, name, 3, ss, 1, &scales, &dt))) return st;
    uint64_t row = eb_row_bytes(EB_DTYPE_MXFP4, cols);
    for (int64_t e = 0; e < E; e++)
        for (int64_t r = 0; r < rows; r++) {
            const eb_weight *w = interleave ? (r % 2 ? &L->experts[e].up : &L->experts[e].gate) : &L->experts[e].down;
            int64_t to = interleave ? r / 2 : r;
            eb_pack_mxfp4_row((const unsigned char *)blocks + (size_t)((e * rows + r) * (cols / 32) * 16),
                           (const unsigned char *)scales + (size_t)((e * rows + r) * (cols / 32)), cols,
                           (unsigned char *)w->data + (size_t)to * row);
        }
    /* the packed rows are what the kernels read; a bad value's exponent is an element of the scales tensor */
    for (int64_t e = 0; e < E; e++)
        for (int k = 0; k < (interleave ? 2 : 1); k++) {
            const eb_weight *w = interleave ? (k ? &L->experts[e].up : &L->experts[e].gate) : &L->experts[e].down;
            if ((st = eb_check_owned(b, name, w, (e * rows + k) * (cols / 32), (interleave ? 2 : 1) * (cols / 32), 32)))
                return st;
        }
    return EB_OK;
}

/* A projection stored transposed ([E, cols, rows] of es-byte values: x @ w) into the experts' rows; interleave as in
 * pack_mxfp4 (the rows are gate_up_proj's last dimension). */
static void transpose_float(const unsigned char *src, size_t es, int64_t E, int64_t cols, int64_t rows, eb_layer *L,
                            int interleave) {
    for (int64_t e = 0; e < E; e++)
        for (int64_t c = 0; c < cols; c++) {
            const unsigned char *in = src + (size_t)((e * cols + c) * rows) * es;
            for (int64_t r = 0; r < rows; r++) {
                const eb_weight *w = interleave ? (r % 2 ? &L->experts[e].up : &L->experts[e].gate)
                                                : &L->experts[e].down;
                int64_t to = interleave ? r / 2 : r;
                memcpy((unsigned char *)w->data + (size_t)(to * cols + c) * es, in + (size_t)r * es, es);
            }
        }
}

/* The experts' biases as one owned f32 array, (2 I + H) per expert (eb_rt_expert.bias): per-expert vectors, or the
 * Hugging Face layout's gate_up_proj_bias [E, 2 I] (interleaved) and down_proj_bias [E, H]. */
static int bind_biases(const eb_binder *b, int l, eb_layer *L, int64_t E, int64_t H, int64_t I, int per_expert) {
    char name[256];
    int64_t w = 2 * I + H;
    float *all = malloc((size_t)(E * w) * sizeof *all);
    if (!all) return eb_fail(EB_ERR_MEMORY, "out of memory");
    L->expert_bias = all;
    int st = EB_OK;
    if (per_expert) {
        const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
        int64_t at[3] = {0, I, 2 * I}, len[3] = {I, I, H};
        for (int64_t e = 0; e < E && !st; e++)
            for (int k = 0; k < 3 && !st; k++) {
                float *v = NULL;
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%lld.%s.bias", l, (long long)e, proj[k]);
                if (!(st = eb_bind_vector(b, name, len[k], &v))) memcpy(all + e * w + at[k], v, (size_t)len[k] * sizeof *v);
                free(v);
            }
    } else {
        const void *gu, *dn;
        int gdt, ddt;
        int64_t gs[2] = {E, 2 * I}, ds[2] = {E, H};
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
        if ((st = eb_bind_tensor(b, name, 2, gs, 0, &gu, &gdt))) return st;
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj_bias", l);
        if ((st = eb_bind_tensor(b, name, 2, ds, 0, &dn, &ddt))) return st;
        float *row = malloc((size_t)(2 * I > H ? 2 * I : H) * sizeof *row);
        if (!row) return eb_fail(EB_ERR_MEMORY, "out of memory");
        for (int64_t e = 0; e < E; e++) {
            eb_dequantize_row((const unsigned char *)gu + (size_t)e * eb_row_bytes(gdt, 2 * I), gdt, 2 * I, row);
            for (int64_t i = 0; i < I; i++) all[e * w + i] = row[2 * i], all[e * w + I + i] = row[2 * i + 1];
            eb_dequantize_row((const unsigned char *)dn + (size_t)e * eb_row_bytes(ddt, H), ddt, H, all + e * w + 2 * I);
        }
        free(row);
    }
    for (int64_t e = 0; e < E && !st; e++) L->experts[e].bias = all + e * w;
    return st;
}

static int bind_experts(const eb_binder *b, int l, eb_layer *L) {
    const eb_model_config *c = &b->m->cfg;
    int64_t E = c->num_experts, H = c->hidden_size, I = c->moe_intermediate_size;
    char name[256];
    unsigned char *mem;
    int st;
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.0.gate_proj.weight", l);
    if (eb_has_tensor(b, name)) { /* one tensor per expert: read in place */
        if ((st = eb_bind_experts(b, l, I))) return st;
        return bind_biases(b, l, L, E, H, I, 1);
    }
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj_blocks", l);
    if (eb_has_tensor(b, name)) { /* MXFP4 */
        if (H % 32 || I % 32)
            return eb_fail(EB_ERR_FORMAT, "layer %d: MXFP4 experts need hidden_size (%lld) and intermediate_size "
                                          "(%lld) to be multiples of 32", l, (long long)H, (long long)I);
        if ((st = eb_point_experts(L, E, H, I, EB_DTYPE_MXFP4, &mem)) || (st = pack_mxfp4(b, l, "gate_up_proj", E, 2 * I, H,
                                                                                        L, 1)) ||
            (st = pack_mxfp4(b, l, "down_proj", E, H, I, L, 0)))
            return st;
        return bind_biases(b, l, L, E, H, I, 0);
    }
    const void *gu, *dn; /* the unquantized layout */
    int gdt, ddt;
    int64_t gs[3] = {E, H, 2 * I}, ds[3] = {E, I, H};
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", l);
    if ((st = eb_bind_tensor(b, name, 3, gs, 0, &gu, &gdt))) return st;
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", l);
    if ((st = eb_bind_tensor(b, name, 3, ds, 0, &dn, &ddt))) return st;
    if (gdt != ddt)
        return eb_fail(EB_ERR_FORMAT, "layer %d: gate_up_proj is %s and down_proj %s, expected one format", l,
                       eb_dtype_name(gdt), eb_dtype_name(ddt));
    if ((st = eb_point_experts(L, E, H, I, gdt, &mem))) return st;
    size_t es = eb_row_bytes(gdt, 1);
    transpose_float(gu, es, E, H, 2 * I, L, 1);
    transpose_float(dn, es, E, I, H, L, 0);
    return bind_biases(b, l, L, E, H, I, 0);
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
    TRY(eb_bind_vector(b, NAME("self_attn.sinks"), c->num_heads, &L->sinks))
    L->window = c->layer_window ? c->layer_window[l] : 0;
    L->is_moe = is_moe_layer(c, l);
    TRY(eb_bind(b, NAME("mlp.router.weight"), c->num_experts, H, &L->router))
    TRY(eb_bind_vector(b, NAME("mlp.router.bias"), c->num_experts, &L->router_bias))
    return bind_experts(b, l, L);
#undef NAME
#undef TRY
}

/* The forward pass of one step. */
static int forward(eb_step *s, int64_t first, int logits) {
    int st = eb_block_embed(s);
    for (int l = 0; l < s->m->cfg.num_layers && !st; l++) {
        st = eb_block_attention(s, l);
        if (!st) st = eb_block_moe(s, l);
    }
    if (!st && logits) st = eb_block_logits(s, first);
    return st;
}

const eb_family eb_family_gpt_oss = {
    .name = "gpt_oss",
    .title = "gpt-oss",
    .arch = EB_ARCH_GPT_OSS,
    .routing = EB_ROUTE_TOPK_SOFTMAX,
    .clamped_swiglu = 1,
    .check_config = check_config,
    .is_moe_layer = is_moe_layer,
    .bind_model = eb_bind_embeddings,
    .bind_layer = bind_layer,
    .forward = forward,
};
