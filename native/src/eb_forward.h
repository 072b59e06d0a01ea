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
    const eb_rt_graph_ops *graphs; /* NULL: this step is queued anew */
    void *rt;
    int dev;        /* the primary's index in its runtime */
    const char *name;
    int64_t n;      /* rows of this step */
    int part;       /* the part between host round trips being queued */
    int replaying;  /* the current part's recording was launched: its operations are skipped */
    int recording;
    char err[512];
} eb_step;

/* A model family: its forward pass of one step (first: the first row whose logits are wanted; logits 0: none). */
typedef struct eb_family {
    int32_t arch;
    const char *name;
    int (*forward)(eb_step *s, int64_t first, int logits);
} eb_family;

extern const eb_family eb_family_qwen3;
const eb_family *eb_family_for(int32_t arch);

int eb_block_embed(eb_step *s);
/* Pre-norm grouped-query attention with its residual: x += o(attention(rope(norm(q)), rope(norm(k)), v)). */
int eb_block_attention(eb_step *s, int layer);
/* Pre-norm SwiGLU FFN with its residual: x += down(silu(gate(xn)) * up(xn)). */
int eb_block_dense_ffn(eb_step *s, int layer);
/* Pre-norm routed experts with their residual: route on the primary; the other owners dispatched, the primary's
 * own experts meanwhile, join on the owners' events; x += the outputs combined in canonical order. */
int eb_block_moe(eb_step *s, int layer);
/* Final norm and lm_head of rows first.. into the logits buffer. */
int eb_block_logits(eb_step *s, int64_t first);

#endif
