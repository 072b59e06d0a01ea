/* The loaded model: plain structs in the shape of the architecture. */
#ifndef EB_MODEL_H
#define EB_MODEL_H

#include "eb_internal.h"

typedef struct {
    const void *data; /* rows x cols, row-major, in dtype */
    int dtype;
    int64_t rows;
    int64_t cols;
} eb_weight;

typedef struct {
    eb_weight gate, up, down;
    int owner; /* engine device index */
} eb_expert;

typedef struct {
    float *input_norm, *post_norm;
    eb_weight q, k, v, o;
    float *q_norm, *k_norm;
    float *q_bias, *k_bias, *v_bias, *o_bias; /* only with attention_bias */
    int is_moe;
    eb_weight gate, up, down; /* dense MLP */
    eb_weight router;         /* num_experts x hidden */
    eb_expert *experts;
} eb_layer;

typedef struct {
    char *path;
    void *addr;
    uint64_t size;
} eb_mapped_file;

struct eb_model {
    eb_engine *engine;
    eb_model_config cfg;
    int32_t *mlp_only;
    int primary;
    eb_mapped_file *files;
    int n_files;
    eb_weight embed, lm_head;
    float *final_norm;
    eb_layer *layers;
    eb_model_info info;
};

#endif
