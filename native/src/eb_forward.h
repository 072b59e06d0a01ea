/* The forward pass's building blocks and the step they run in: what a model family's file calls.
 *
 * A family's forward pass (models/<family>.c) reads top to bottom like the architecture and calls these blocks;
 * each block queues the primary's operations through its runtime's op table, whatever the primary is. A MoE layer
 * whose experts are all the primary's stays on it; a layer with experts elsewhere is a host round trip, and a
 * one-token step is recorded as graphs, one per part between those round trips, where the runtime can (the
 * blocks skip the operations of a part that is being replayed).
 */
#ifndef EB_FORWARD_H
#define EB_FORWARD_H

#include "eb_model.h"

typedef struct {
    eb_context *c;
    eb_model *m;
    const eb_runtime *r;
    const eb_rt_forward_ops *ops;
    const eb_rt_mla_ops *mla;      /* the primary's "mla" extension (NULL: it has none; the load checked) */
    const eb_rt_v4_ops *v4;        /* its "deepseek_v4" extension (NULL: it has none) */
    const eb_rt_graph_ops *graphs; /* NULL: this step is queued anew */
    void *rt;
    int dev;        /* the primary's index in its runtime */
    const char *name;
    int64_t n;      /* rows of this step */
    int part;       /* the part between host round trips being queued */
    int replaying;  /* the current part's recording was launched: its operations are skipped */
    int recording;
    int hidden_out; /* every row's state after the final norm is read back (eb_context_eval_hidden) */
    char err[512];
} eb_step;

/* Binding a checkpoint's tensors by name: the sorted descriptors, checked against the expected shape ([d0] when
 * d1 is 0) and pointed at in the mapped files; vectors (norms, biases) converted to owned f32 arrays. */
typedef struct {
    const eb_tensor_desc **sorted;
    int32_t n;
    eb_model *m;
    eb_weight_checks *checks; /* every weight bound is noted here for the load's check (NULL: unchecked) */
} eb_binder;
int eb_bind(const eb_binder *b, const char *name, int64_t d0, int64_t d1, eb_weight *out);
int eb_bind_vector(const eb_binder *b, const char *name, int64_t d0, float **out);
/* A tensor of any rank (ndim dimensions exactly shape) read as it is stored: a float format, or raw bytes where
 * dtype is EB_DTYPE_U8 (refused otherwise); *data its bytes, *dtype_out its format. */
int eb_bind_tensor(const eb_binder *b, const char *name, int ndim, const int64_t *shape, int raw, const void **data,
                   int *dtype_out);
/* A weight a family made at load from raw bytes (packed into a format its kernels read), noted for the load's check
 * under the tensor it comes from: its value (r, c) is element base + r * row_stride + c / col_div of that tensor. A
 * copy made from a bound float or format tensor needs none: its source is checked. */
int eb_check_owned(const eb_binder *b, const char *tensor, const eb_weight *w, int64_t base, int64_t row_stride,
                   int64_t col_div);
/* A weight's columns 0..at-1 and at.. as two weights of one owned copy (*owned, freed with the model), with their
 * scales: refused unless at is a whole number of the format's blocks (and of its scale blocks). name: for the error. */
int eb_split_columns(const eb_weight *w, const char *name, int64_t at, eb_weight *left, eb_weight *right,
                     void **owned);
/* Whether the checkpoint holds a tensor of this name. */
int eb_has_tensor(const eb_binder *b, const char *name);
/* The last dimension of a tensor as the checkpoint describes it (-1: no such tensor): the bytes of one value of a
 * raw integer table (8 for a folder's I64, 4 for a GGUF file's I32). */
int64_t eb_tensor_last_dim(const eb_binder *b, const char *name);
/* A layer's experts as one owned copy in `dtype` (advised for huge pages; freed with the model): each expert's gate and
 * up (I rows of H) and down (H rows of I) pointed into it; *at: its first byte. For layouts the kernels do not read,
 * packed at load (gpt-oss's transposed and MXFP4 tensors, DeepSeek-V4's released FP4 experts). */
int eb_point_experts(eb_layer *L, int64_t E, int64_t H, int64_t I, int dtype, unsigned char **at);
/* One MXFP4 row of n values from a Hugging Face / compressed-tensors row: per block of 32 its exponent (scales) and
 * 16 bytes in which byte j holds values 2j (low nibble) and 2j + 1 (high), into ggml's block. */
void eb_pack_mxfp4_row(const unsigned char *blocks, const unsigned char *scales, int64_t n, unsigned char *out);
/* What every family names alike: the embeddings, the final norm and lm_head (the embeddings when tied); a MoE
 * layer's routed experts, one tensor each (mlp.experts.E.{gate,up,down}_proj), into layer->experts. */
int eb_bind_embeddings(const eb_binder *b);
int eb_bind_experts(const eb_binder *b, int layer, int64_t inter);
/* Grouped-query attention's weights of layer l as Qwen3 and gpt-oss name them: the pre-attention and post-attention
 * norms, q/k/v/o, and their biases where the config has attention_bias. */
int eb_bind_attention(const eb_binder *b, int layer);
/* A SwiGLU FFN of layer l named model.layers.l.<prefix>.{gate,up,down}_proj.weight (inter x hidden, then
 * hidden x inter): a dense layer's MLP ("mlp"), shared experts, one routed expert. */
int eb_bind_ffn(const eb_binder *b, int layer, const char *prefix, int64_t inter, eb_weight *gate, eb_weight *up,
                eb_weight *down);

/* A model family, one file each (models/), registered once (eb_families in forward.c): the core's code for it, what it
 * checks of a config beyond what every family has, its activations' sizes, which of its layers route to experts and
 * how its router scores, its tensors by name (the model's, then each layer's: experts bound into layer->experts,
 * allocated by the family), the operations it needs of the primary's runtime beyond the common ones, and its
 * forward pass of one step (first: the first row whose logits are wanted; logits 0: none). */
typedef struct eb_family {
    const char *name;  /* "deepseek_v3" (engine/families/) */
    const char *title; /* "DeepSeek-V3", for messages */
    int32_t arch;      /* EB_ARCH_* */
    int routing;       /* EB_ROUTE_*: how its routers score */
    int clamped_swiglu; /* its experts' activation is clamped (swiglu_limit set: eb_model_act), else SiLU */
    int clamped_shared; /* its shared experts' too (the "deepseek_v4" extension's swiglu) */
    /* its MoE layers' routing where it is not the common route operation's (NULL: that one): writes c->dc's xn,
     * topk_id and topk_w from x (post: the norm) */
    int (*route)(eb_step *s, int layer, const eb_rt_norm *post);
    /* the runtime extensions its forward pass calls (ended by a NULL name; NULL: none): a primary whose module
     * lacks one is refused at load */
    const eb_rt_extension_id *extensions;
    /* its own keys (rope: the rotated dimensions); NULL: none beyond the common ones */
    int (*check_config)(const eb_model_config *c, int rope);
    /* its activations' sizes where they are not grouped-query attention's; NULL: they are */
    void (*dims)(const eb_model_config *c, eb_dims *d);
    int (*is_moe_layer)(const eb_model_config *c, int layer);
    int (*bind_model)(const eb_binder *b);
    int (*bind_layer)(const eb_binder *b, int layer);
    int (*forward)(eb_step *s, int64_t first, int logits);
    int next_token; /* a multi-token-prediction module of arch's checkpoints (eb_model_config.next_token_module) */
} eb_family;

extern const eb_family eb_family_qwen3;
extern const eb_family eb_family_qwen3_moe;
extern const eb_family eb_family_deepseek_v3;
extern const eb_family eb_family_gpt_oss;
extern const eb_family eb_family_deepseek_v4;
extern const eb_family eb_family_deepseek_v3_mtp;
extern const eb_family *const eb_families[];
extern const int eb_n_families;
/* The family of a config: its arch, the model or its next-token module (NULL: none such). */
const eb_family *eb_family_of(const eb_model_config *c);

int eb_block_embed(eb_step *s);
/* Pre-norm grouped-query attention with its residual: x += o(attention(rope(norm(q)), rope(norm(k)), v)). */
int eb_block_attention(eb_step *s, int layer);
/* Pre-norm multi-head latent attention (DeepSeek-V3) with its residual: q (through q_a, its norm and q_b, or q
 * alone), the latent and rope key from kv_a, attention in the absorbed form over the latent cache, x += o(out). */
int eb_block_mla_attention(eb_step *s, int layer);
/* Pre-norm SwiGLU FFN with its residual: x += down(silu(gate(xn)) * up(xn)). */
int eb_block_dense_ffn(eb_step *s, int layer);
/* Pre-norm routed experts with their residual: route on the primary; the other owners dispatched, the primary's
 * shared experts (x += them) and own experts meanwhile, join on the owners' events; x += the routed outputs
 * combined in canonical order. */
int eb_block_moe(eb_step *s, int layer);
/* DeepSeek-V4's (its "deepseek_v4" extension): the mHC streams (kind EB_HC_*; layer -1 with EXPAND and HEAD, ffn:
 * the layer's ffn_hc, else its attn_hc) between x and c->dc->hc; the attention of layer l from the collapsed rows in x
 * (its input norm, q through q_a, its norm and q_b, the key=value head, the compressors and the indexer, the grouped
 * output projection) into x; its routing (eb_family.route: sqrt-softplus scores, the choice by score + bias or by the
 * token id's row of tid2eid), which leaves x at 0 for the experts' sums. */
int eb_block_hc(eb_step *s, int kind, int layer, int ffn);
int eb_block_v4_attention(eb_step *s, int layer);
int eb_v4_route(eb_step *s, int layer, const eb_rt_norm *post);
/* A multi-token-prediction module's input: x = eh_proj [enorm(embedding of the token); hnorm(the target's hidden
 * state)], the projection as its two halves' products summed. */
int eb_block_next_token_input(eb_step *s);
/* Final norm and lm_head of rows first.. into the logits buffer (every row's norm where the step reads back the
 * hidden states). */
int eb_block_logits(eb_step *s, int64_t first);

#endif
