/* Loading a checkpoint: map or copy the files, validate every tensor descriptor, bind the weights of each layer. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eb_formats.h"
#include "eb_internal.h"
#include "eb_forward.h"

#define EB_MAX_DIM (1 << 20)

/* The families' codes and names, for the error of an unknown one: "1 Qwen3, 2 Qwen3-MoE, ... or 4 gpt-oss". */
static int unknown_arch(int32_t arch) {
    char known[256] = "";
    size_t used = 0;
    int n = 0, shown = 0; /* the models' families (a next-token module's arch is its model's) */
    for (int i = 0; i < eb_n_families; i++) n += !eb_families[i]->next_token;
    for (int i = 0; i < eb_n_families && used < sizeof known; i++) {
        if (eb_families[i]->next_token) continue;
        const char *sep = shown == 0 ? "" : shown + 1 < n ? ", " : " or ";
        shown++;
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%d %s", sep, eb_families[i]->arch,
                                 eb_families[i]->title);
    }
    return eb_fail(EB_ERR_UNSUPPORTED, "config: architecture code %d is not supported (expected %s)", arch, known);
}

static int check_config(const eb_model_config *c) {
    const eb_family *family = eb_family_of(c);
    int st;
    if (c->next_token_module != 0 && c->next_token_module != 1)
        return eb_fail(EB_ERR_FORMAT, "config: next_token_module = %d, expected 0 or 1", c->next_token_module);
    if (!family && c->next_token_module) {
        eb_model_config model = *c;
        model.next_token_module = 0;
        const eb_family *of = eb_family_of(&model);
        if (of)
            return eb_fail(EB_ERR_UNSUPPORTED, "config: next_token_module: the %s family has no multi-token-"
                                               "prediction module here (DeepSeek-V3's is)", of->title);
    }
    if (!family) return unknown_arch(c->arch);
#define POSITIVE(field)                                                                                          \
    if (c->field <= 0 || c->field > EB_MAX_DIM)                                                                  \
        return eb_fail(EB_ERR_FORMAT, "config: " #field " = %d, expected 1..%d", (int)c->field, EB_MAX_DIM);
    POSITIVE(vocab_size)
    POSITIVE(hidden_size)
    POSITIVE(num_layers)
    POSITIVE(num_heads)
    POSITIVE(num_kv_heads)
    POSITIVE(head_dim)
    POSITIVE(max_position_embeddings)
#undef POSITIVE
    if (c->head_dim % 2)
        return eb_fail(EB_ERR_FORMAT, "config: head_dim = %d, expected an even number (RoPE rotates pairs)", c->head_dim);
    if (c->num_heads % c->num_kv_heads)
        return eb_fail(EB_ERR_FORMAT, "config: num_attention_heads = %d is not a multiple of num_key_value_heads = %d",
                       c->num_heads, c->num_kv_heads);
    /* finite and in reach of the f32 arithmetic (a base below 1 or past 1e12 makes inf and NaN rotation tables, an
     * epsilon of 1 or more swamps the norm); the comparisons are false for NaN */
    if (!(c->rope_theta >= 1.0 && c->rope_theta <= 1e12))
        return eb_fail(EB_ERR_FORMAT, "config: rope_theta = %g, expected a number in 1..1e12", c->rope_theta);
    if (!(c->rms_norm_eps > 0.0 && c->rms_norm_eps < 1.0))
        return eb_fail(EB_ERR_FORMAT, "config: rms_norm_eps = %g, expected a number in (0, 1)", c->rms_norm_eps);
    int rope = c->rope_dim ? c->rope_dim : c->head_dim;
    if (rope <= 0 || rope % 2 || rope > c->head_dim || rope > 512)
        return eb_fail(EB_ERR_FORMAT, "config: rope_dim = %d, expected an even number in 2..head_dim (%d), at most 512",
                       rope, c->head_dim);
    if (c->rope_inv_freq)
        for (int i = 0; i < rope / 2; i++)
            if (!(c->rope_inv_freq[i] > 0.0f && c->rope_inv_freq[i] < 1e30f))
                return eb_fail(EB_ERR_FORMAT, "config: RoPE frequency %d = %g, expected a positive finite number", i,
                               (double)c->rope_inv_freq[i]);
    if (!(c->rope_attention_factor >= 0.0 && c->rope_attention_factor < 1e6) ||
        !(c->attention_scale >= 0.0 && c->attention_scale < 1e6))
        return eb_fail(EB_ERR_FORMAT, "config: RoPE attention factor %g or softmax scale %g, expected a positive "
                                      "finite number (0: the default)", c->rope_attention_factor, c->attention_scale);
    if (c->n_layer_window < 0 || (c->n_layer_window > 0 && !c->layer_window) ||
        (c->n_layer_window > 0 && c->n_layer_window != c->num_layers))
        return eb_fail(EB_ERR_FORMAT, "config: %d layer windows, expected none or one per layer (%d)",
                       c->n_layer_window, c->num_layers);
    for (int i = 0; i < c->n_layer_window; i++)
        if (c->layer_window[i] < 0 || c->layer_window[i] > c->max_position_embeddings)
            return eb_fail(EB_ERR_FORMAT, "config: layer %d's attention window is %d, expected 0 (full attention) or "
                                          "1..max_position_embeddings (%d)", i, c->layer_window[i],
                           c->max_position_embeddings);
    if (!(c->swiglu_limit >= 0.0 && c->swiglu_limit < 1e30) || !(c->swiglu_alpha >= 0.0 && c->swiglu_alpha < 1e30) ||
        (c->swiglu_limit > 0.0) != (family->clamped_swiglu != 0))
        return eb_fail(EB_ERR_FORMAT, "config: swiglu_limit = %g, swiglu_alpha = %g: expected a positive finite "
                                      "swiglu_limit for gpt-oss and DeepSeek-V4 (swiglu_alpha: gpt-oss's), 0 for the "
                                      "other families", c->swiglu_limit, c->swiglu_alpha);
    if (family->check_config && (st = family->check_config(c, rope))) return st;
    if (c->n_mlp_only_layers < 0 || (c->n_mlp_only_layers > 0 && !c->mlp_only_layers))
        return eb_fail(EB_ERR_ARGUMENT, "config: mlp_only_layers is inconsistent");
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] < 0 || c->mlp_only_layers[i] >= c->num_layers)
            return eb_fail(EB_ERR_FORMAT, "config: mlp_only_layers contains %d, expected layers 0..%d",
                           c->mlp_only_layers[i], c->num_layers - 1);
    int any_dense = 0, any_moe = 0;
    for (int l = 0; l < c->num_layers; l++) {
        if (family->is_moe_layer(c, l)) any_moe = 1;
        else any_dense = 1;
    }
    if (any_dense && (c->intermediate_size <= 0 || c->intermediate_size > EB_MAX_DIM))
        return eb_fail(EB_ERR_FORMAT, "config: intermediate_size = %d, expected 1..%d", c->intermediate_size,
                       EB_MAX_DIM);
    if (any_moe) {
        if (c->moe_intermediate_size <= 0 || c->moe_intermediate_size > EB_MAX_DIM)
            return eb_fail(EB_ERR_FORMAT, "config: moe_intermediate_size = %d, expected 1..%d",
                           c->moe_intermediate_size, EB_MAX_DIM);
        if (c->num_experts > 4096)
            return eb_fail(EB_ERR_FORMAT, "config: num_experts = %d, expected at most 4096", c->num_experts);
        if (c->top_k <= 0 || c->top_k > c->num_experts)
            return eb_fail(EB_ERR_FORMAT, "config: num_experts_per_tok = %d, expected 1..num_experts (%d)", c->top_k,
                           c->num_experts);
    }
    return EB_OK;
}

static int cmp_desc_name(const void *a, const void *b) {
    const eb_tensor_desc *x = *(const eb_tensor_desc *const *)a, *y = *(const eb_tensor_desc *const *)b;
    return strcmp(x->name, y->name);
}

static const eb_tensor_desc *find_tensor(const eb_binder *b, const char *name) {
    eb_tensor_desc key = {.name = name};
    const eb_tensor_desc *kp = &key;
    const eb_tensor_desc **hit = bsearch(&kp, b->sorted, (size_t)b->n, sizeof *b->sorted, cmp_desc_name);
    return hit ? *hit : NULL;
}

/* A weight's scale companion: the tensor '<name>_scale_inv' (the name DeepSeek's and transformers' FP8 checkpoints
 * give it), F32 of the grid its format's scale block makes of the weight. A weight of a scaled format is refused
 * without it (or as a vector, which no family stores so), and a companion beside a weight whose format takes none. */
static int bind_scale(const eb_binder *b, const eb_tensor_desc *t, eb_weight *w) {
    char name[320];
    snprintf(name, sizeof name, "%s_scale_inv", t->name);
    const eb_tensor_desc *s = find_tensor(b, name);
    const eb_format_traits *f = eb_format(w->dtype);
    const char *file = b->m->files[t->file_index].path;
    if (!f->scale_rows) {
        if (s)
            return eb_fail(EB_ERR_FORMAT, "tensor '%s' in '%s' is a scale companion of '%s', which is stored as %s and "
                                          "takes none (expected no '%s' beside a weight of a format without a scale "
                                          "block)", name, b->m->files[s->file_index].path, t->name, f->name, name);
        return EB_OK;
    }
    int64_t gr = eb_scale_grid_rows(w->dtype, w->rows), gc = eb_scale_grid_cols(w->dtype, w->cols);
    if (t->ndim != 2)
        return eb_fail(EB_ERR_FORMAT, "tensor '%s' in '%s' is a vector stored as %s, expected F32, F16 or BF16 (a "
                                      "scaled format is for matrices)", t->name, file, f->name);
    if (!s)
        return eb_fail(EB_ERR_FORMAT, "tensor '%s' in '%s' is stored as %s, which needs its scale companion '%s' (F32 "
                                      "of shape [%lld, %lld]: one scale per block of %d x %d values); the checkpoint "
                                      "has none", t->name, file, f->name, name, (long long)gr, (long long)gc,
                       f->scale_rows, f->scale_cols);
    int e8m0 = s->dtype == EB_DTYPE_U8; /* DeepSeek-V4's released '.scale': one E8M0 exponent byte a block */
    if ((s->dtype != EB_DTYPE_F32 && !e8m0) || s->ndim != 2 || s->shape[0] != gr || s->shape[1] != gc) {
        char got[96] = "";
        int off = 0;
        for (int i = 0; i < s->ndim && i < 4; i++)
            off += snprintf(got + off, sizeof got - (size_t)off, "%s%lld", i ? ", " : "", (long long)s->shape[i]);
        return eb_fail(EB_ERR_FORMAT, "tensor '%s' in '%s' (the scale companion of '%s', [%lld, %lld] in %s) is %s of "
                                      "shape [%s], expected F32 or E8M0 of shape [%lld, %lld] (one scale per block of "
                                      "%d x %d values)", name, b->m->files[s->file_index].path, t->name, (long long)w->rows,
                       (long long)w->cols, f->name, s->dtype == EB_DTYPE_U8 ? "E8M0" : eb_dtype_name(s->dtype), got,
                       (long long)gr, (long long)gc, f->scale_rows, f->scale_cols);
    }
    const unsigned char *at = (const unsigned char *)b->m->files[s->file_index].addr + s->offset;
    const float *grid = NULL;
    if (!e8m0 && (uintptr_t)at % _Alignof(float) == 0) {
        grid = (const float *)(const void *)at;
    } else { /* a file may hold it at any offset: the kernels read it as floats, so an aligned copy */
        eb_model *m = b->m;
        float **list = realloc(m->scale_copies, (size_t)(m->n_scale_copies + 1) * sizeof *list);
        float *copy = malloc((size_t)(gr * gc) * sizeof *copy);
        if (list) m->scale_copies = list;
        if (!list || !copy) {
            free(copy);
            return eb_fail(EB_ERR_MEMORY, "out of memory for tensor '%s'", name);
        }
        if (e8m0) /* 2^(e - 127), exactly; 255 is NaN (the weight's check then names the block) */
            for (int64_t i = 0; i < gr * gc; i++) copy[i] = eb_e8m0_to_f32(at[i]);
        else
            memcpy(copy, at, (size_t)s->nbytes);
        m->scale_copies[m->n_scale_copies++] = copy;
        grid = copy;
    }
    w->scale = (eb_rt_scale){grid, f->scale_rows, f->scale_cols};
    b->m->info.weight_bytes += s->nbytes;
    return EB_OK;
}

/* A bound weight into the load's list of weights to check (none when the load does not check). w: rows x cols as the
 * kernels read it; value (r, c) is element base + r * row_stride + c / col_div of tensor t. */
static int note_weight(const eb_binder *b, const eb_tensor_desc *t, const eb_weight *w, int64_t base,
                       int64_t row_stride, int64_t col_div) {
    if (!b->checks) return EB_OK;
    eb_checked_weight item = {(char *)t->name, t->file_index, *w, t->ndim, {0, 0, 0, 0}, base, row_stride, col_div};
    memcpy(item.shape, t->shape, sizeof item.shape);
    return eb_checks_add(b->checks, &item);
}

int eb_check_owned(const eb_binder *b, const char *tensor, const eb_weight *w, int64_t base, int64_t row_stride,
                   int64_t col_div) {
    const eb_tensor_desc *t = find_tensor(b, tensor);
    if (!t) return eb_fail(EB_ERR_FORMAT, "tensor '%s' is missing from the checkpoint", tensor);
    return note_weight(b, t, w, base, row_stride, col_div);
}

int eb_bind(const eb_binder *b, const char *name, int64_t d0, int64_t d1, eb_weight *out) {
    const eb_tensor_desc *t = find_tensor(b, name);
    if (!t) return eb_fail(EB_ERR_FORMAT, "tensor '%s' is missing from the checkpoint", name);
    int ndim = d1 > 0 ? 2 : 1;
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1)) {
        char got[96] = "";
        int off = 0;
        for (int i = 0; i < t->ndim && i < 4; i++)
            off += snprintf(got + off, sizeof got - (size_t)off, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        const char *file = b->m->files[t->file_index].path;
        if (ndim == 2)
            return eb_fail(EB_ERR_FORMAT, "tensor '%s' in '%s' has shape [%s], expected [%lld, %lld]", name, file, got,
                           (long long)d0, (long long)d1);
        return eb_fail(EB_ERR_FORMAT, "tensor '%s' in '%s' has shape [%s], expected [%lld]", name, file, got,
                       (long long)d0);
    }
    if (t->dtype == EB_DTYPE_U8)
        return eb_fail(EB_ERR_FORMAT, "tensor '%s' in '%s' holds raw bytes (U8), expected a weight format", name,
                       b->m->files[t->file_index].path);
    *out = (eb_weight){(const unsigned char *)b->m->files[t->file_index].addr + t->offset, t->dtype, d0,
                       ndim == 2 ? d1 : 1, {NULL, 0, 0}};
    int st = bind_scale(b, t, out);
    if (st) return st;
    eb_weight as_read = ndim == 2 ? *out : (eb_weight){out->data, t->dtype, 1, d0, {NULL, 0, 0}}; /* a vector: a row */
    if ((st = note_weight(b, t, &as_read, 0, as_read.cols, 1))) return st;
    b->m->info.weight_bytes += t->nbytes;
    return EB_OK;
}

int eb_has_tensor(const eb_binder *b, const char *name) { return find_tensor(b, name) != NULL; }

/* The owned copy of a layer's experts: bytes, advised for huge pages (it is read like the mapped files). */
static void *owned(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, (size_t)2 << 20, bytes ? bytes : 1)) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

/* Points each expert's weights into the owned copy: per expert gate (I rows of H), up, down (H rows of I). */
int eb_point_experts(eb_layer *L, int64_t E, int64_t H, int64_t I, int dtype, unsigned char **at) {
    L->experts = calloc((size_t)E, sizeof *L->experts);
    if (!L->experts) return eb_fail(EB_ERR_MEMORY, "out of memory");
    uint64_t gb = (uint64_t)I * eb_row_bytes(dtype, H), db = (uint64_t)H * eb_row_bytes(dtype, I);
    unsigned char *mem = owned((size_t)E * (2 * gb + db));
    if (!mem) return eb_fail(EB_ERR_MEMORY, "out of memory for the experts (%.1f MiB)", E * (2 * gb + db) / 1048576.0);
    L->experts_owned = mem;
    for (int64_t e = 0; e < E; e++) {
        unsigned char *p = mem + (size_t)e * (2 * gb + db);
        L->experts[e].gate = (eb_weight){p, dtype, I, H, {NULL, 0, 0}};
        L->experts[e].up = (eb_weight){p + gb, dtype, I, H, {NULL, 0, 0}};
        L->experts[e].down = (eb_weight){p + 2 * gb, dtype, H, I, {NULL, 0, 0}};
    }
    *at = mem;
    return EB_OK;
}

/* One MXFP4 row of n values from a Hugging Face row: per block of 32 its exponent (scales) and 16 bytes in which
 * byte j holds values 2j (low nibble) and 2j + 1 (high), into ggml's block: the exponent, then 16 bytes in which byte
 * j holds values j (low) and j + 16 (high). */
void eb_pack_mxfp4_row(const unsigned char *blocks, const unsigned char *scales, int64_t n, unsigned char *out) {
    for (int64_t k = 0; k < n / 32; k++, out += 17) {
        const unsigned char *in = blocks + k * 16;
        unsigned char v[32];
        for (int i = 0; i < 16; i++) v[2 * i] = in[i] & 0xF, v[2 * i + 1] = in[i] >> 4;
        out[0] = scales[k];
        for (int j = 0; j < 16; j++) out[1 + j] = (unsigned char)(v[j] | v[j + 16] << 4);
    }
}

int64_t eb_tensor_last_dim(const eb_binder *b, const char *name) {
    const eb_tensor_desc *t = find_tensor(b, name);
    return t && t->ndim > 0 ? t->shape[t->ndim - 1] : -1;
}

int eb_bind_tensor(const eb_binder *b, const char *name, int ndim, const int64_t *shape, int raw, const void **data,
                   int *dtype_out) {
    const eb_tensor_desc *t = find_tensor(b, name);
    if (!t) return eb_fail(EB_ERR_FORMAT, "tensor '%s' is missing from the checkpoint", name);
    const char *file = b->m->files[t->file_index].path;
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char got[96] = "", want[96] = "";
        int off = 0, woff = 0;
        for (int i = 0; i < t->ndim && i < 4; i++)
            off += snprintf(got + off, sizeof got - (size_t)off, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        for (int i = 0; i < ndim && i < 4; i++)
            woff += snprintf(want + woff, sizeof want - (size_t)woff, "%s%lld", i ? ", " : "", (long long)shape[i]);
        return eb_fail(EB_ERR_FORMAT, "tensor '%s' in '%s' has shape [%s], expected [%s]", name, file, got, want);
    }
    int is_float = t->dtype == EB_DTYPE_F32 || t->dtype == EB_DTYPE_F16 || t->dtype == EB_DTYPE_BF16;
    if (raw ? t->dtype != EB_DTYPE_U8 : !is_float)
        return eb_fail(EB_ERR_FORMAT, "tensor '%s' in '%s' is stored as %s, expected %s", name, file,
                       t->dtype == EB_DTYPE_U8 ? "U8" : eb_dtype_name(t->dtype), raw ? "U8" : "F32, F16 or BF16");
    *data = (const unsigned char *)b->m->files[t->file_index].addr + t->offset;
    *dtype_out = t->dtype;
    if (!raw) { /* (raw bytes are checked as the family packs them: eb_check_owned) */
        int64_t rows = 1;
        for (int i = 0; i + 1 < ndim; i++) rows *= shape[i];
        eb_weight w = {*data, t->dtype, rows, shape[ndim - 1], {NULL, 0, 0}};
        int st = note_weight(b, t, &w, 0, w.cols, 1);
        if (st) return st;
    }
    b->m->info.weight_bytes += t->nbytes;
    return EB_OK;
}

int eb_bind_attention(const eb_binder *b, int l) {
    const eb_model_config *c = &b->m->cfg;
    eb_layer *L = &b->m->layers[l];
    char name[256];
    int64_t H = c->hidden_size, qd = (int64_t)c->num_heads * c->head_dim, kvd = (int64_t)c->num_kv_heads * c->head_dim;
    int st;
#define NAME(fmt) (snprintf(name, sizeof name, "model.layers.%d." fmt, l), name)
#define TRY(x)                                                                                                   \
    if ((st = (x)) != EB_OK) return st;
    TRY(eb_bind_vector(b, NAME("input_layernorm.weight"), H, &L->input_norm))
    TRY(eb_bind_vector(b, NAME("post_attention_layernorm.weight"), H, &L->post_norm))
    TRY(eb_bind(b, NAME("self_attn.q_proj.weight"), qd, H, &L->q))
    TRY(eb_bind(b, NAME("self_attn.k_proj.weight"), kvd, H, &L->k))
    TRY(eb_bind(b, NAME("self_attn.v_proj.weight"), kvd, H, &L->v))
    TRY(eb_bind(b, NAME("self_attn.o_proj.weight"), H, qd, &L->o))
    if (c->attention_bias) {
        TRY(eb_bind_vector(b, NAME("self_attn.q_proj.bias"), qd, &L->q_bias))
        TRY(eb_bind_vector(b, NAME("self_attn.k_proj.bias"), kvd, &L->k_bias))
        TRY(eb_bind_vector(b, NAME("self_attn.v_proj.bias"), kvd, &L->v_bias))
        TRY(eb_bind_vector(b, NAME("self_attn.o_proj.bias"), H, &L->o_bias))
    }
    return EB_OK;
#undef NAME
#undef TRY
}

int eb_bind_embeddings(const eb_binder *b) {
    eb_model *m = b->m;
    const eb_model_config *c = &m->cfg;
    int st = eb_bind(b, "model.embed_tokens.weight", c->vocab_size, c->hidden_size, &m->embed);
    if (!st) st = eb_bind_vector(b, "model.norm.weight", c->hidden_size, &m->final_norm);
    if (st || c->tie_word_embeddings) {
        m->lm_head = m->embed;
        return st;
    }
    return eb_bind(b, "lm_head.weight", c->vocab_size, c->hidden_size, &m->lm_head);
}

int eb_bind_ffn(const eb_binder *b, int l, const char *prefix, int64_t inter, eb_weight *gate, eb_weight *up,
                eb_weight *down) {
    char name[256];
    int64_t H = b->m->cfg.hidden_size;
    const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
    eb_weight *w[3] = {gate, up, down};
    int st = EB_OK;
    for (int i = 0; i < 3 && !st; i++) {
        snprintf(name, sizeof name, "model.layers.%d.%s.%s.weight", l, prefix, proj[i]);
        st = eb_bind(b, name, i == 2 ? H : inter, i == 2 ? inter : H, w[i]);
    }
    return st;
}

int eb_bind_experts(const eb_binder *b, int l, int64_t inter) {
    eb_model *m = b->m;
    const eb_model_config *c = &m->cfg;
    eb_layer *L = &m->layers[l];
    char prefix[64];
    int st = EB_OK;
    L->experts = calloc((size_t)c->num_experts, sizeof *L->experts);
    if (!L->experts) return eb_fail(EB_ERR_MEMORY, "out of memory");
    for (int e = 0; e < c->num_experts && !st; e++) {
        eb_expert *x = &L->experts[e];
        snprintf(prefix, sizeof prefix, "mlp.experts.%d", e);
        st = eb_bind_ffn(b, l, prefix, inter, &x->gate, &x->up, &x->down);
    }
    return st;
}

int eb_split_columns(const eb_weight *w, const char *name, int64_t at, eb_weight *left, eb_weight *right,
                     void **owned) {
    const eb_format_traits *f = eb_format(w->dtype);
    int64_t sc = f ? f->scale_cols : 0;
    if (!f || at <= 0 || at >= w->cols || at % f->block || (sc && at % sc))
        return eb_fail(EB_ERR_UNSUPPORTED, "tensor '%s' (%s, %lld columns) cannot be split after column %lld: expected "
                                           "a split at a whole %s block (%d values%s)", name, eb_dtype_name(w->dtype),
                       (long long)w->cols, (long long)at, eb_dtype_name(w->dtype), f ? f->block : 0,
                       sc ? " and whole scale blocks" : "");
    uint64_t whole = eb_row_bytes(w->dtype, w->cols), lb = eb_row_bytes(w->dtype, at);
    uint64_t rb = eb_row_bytes(w->dtype, w->cols - at), rows = (uint64_t)w->rows;
    int64_t grid_rows = eb_scale_grid_rows(w->dtype, w->rows), grid_cols = eb_scale_grid_cols(w->dtype, w->cols);
    int64_t lcols = sc ? at / sc : 0;
    size_t scales = w->scale.data ? (size_t)(grid_rows * grid_cols) * sizeof(float) : 0;
    unsigned char *mem = malloc((size_t)(rows * (lb + rb)) + scales + 1);
    if (!mem) return eb_fail(EB_ERR_MEMORY, "out of memory splitting '%s'", name);
    unsigned char *l = mem, *r = mem + rows * lb;
    for (uint64_t i = 0; i < rows; i++) {
        const unsigned char *src = (const unsigned char *)w->data + i * whole;
        memcpy(l + i * lb, src, lb);
        memcpy(r + i * rb, src + lb, rb);
    }
    *left = (eb_weight){l, w->dtype, w->rows, at, {NULL, 0, 0}};
    *right = (eb_weight){r, w->dtype, w->rows, w->cols - at, {NULL, 0, 0}};
    if (scales) { /* each half's grid: the scale columns of its blocks */
        float *ls = (float *)(void *)(mem + rows * (lb + rb)), *rs = ls + grid_rows * lcols;
        for (int64_t i = 0; i < grid_rows; i++) {
            memcpy(ls + i * lcols, w->scale.data + i * grid_cols, (size_t)lcols * sizeof(float));
            memcpy(rs + i * (grid_cols - lcols), w->scale.data + i * grid_cols + lcols,
                   (size_t)(grid_cols - lcols) * sizeof(float));
        }
        left->scale = (eb_rt_scale){ls, w->scale.rows, w->scale.cols};
        right->scale = (eb_rt_scale){rs, w->scale.rows, w->scale.cols};
    }
    *owned = mem;
    return EB_OK;
}

/* A 1-D tensor converted to an owned f32 array (norm weights and biases are small and read often). */
int eb_bind_vector(const eb_binder *b, const char *name, int64_t d0, float **out) {
    eb_weight w;
    int st = eb_bind(b, name, d0, 0, &w);
    if (st) return st;
    float *v = malloc((size_t)d0 * sizeof *v);
    if (!v) return eb_fail(EB_ERR_MEMORY, "out of memory for tensor '%s'", name);
    eb_dequantize_row(w.data, w.dtype, d0, v);
    *out = v;
    return EB_OK;
}

static int check_descriptors(const eb_model *m, const eb_tensor_desc *tensors, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        const eb_tensor_desc *t = &tensors[i];
        if (!t->name) return eb_fail(EB_ERR_ARGUMENT, "tensor descriptor %d has no name", i);
        if (t->file_index < 0 || t->file_index >= m->n_files)
            return eb_fail(EB_ERR_ARGUMENT, "tensor '%s': file index %d out of range (%d files)", t->name,
                           t->file_index, m->n_files);
        const char *file = m->files[t->file_index].path;
        static const eb_format_traits raw = {.name = "U8", .dtype = EB_DTYPE_U8, .block = 1, .block_bytes = 1};
        const eb_format_traits *f = t->dtype == EB_DTYPE_U8 ? &raw : eb_format(t->dtype);
        if (!f) {
            char names[256];
            return eb_fail(EB_ERR_UNSUPPORTED, "tensor '%s' in '%s': dtype code %d is not supported (expected 0..%d: "
                                               "%s)",
                           t->name, file, t->dtype, EB_DTYPE_COUNT - 1,
                           eb_format_list((1u << EB_DTYPE_COUNT) - 1, names, sizeof names));
        }
        if (t->ndim < 1 || t->ndim > 4)
            return eb_fail(EB_ERR_FORMAT, "tensor '%s' in '%s': %d dimensions, expected 1 to 4", t->name, file, t->ndim);
        uint64_t rows = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] <= 0 || t->shape[d] > (int64_t)1 << 40)
                return eb_fail(EB_ERR_FORMAT, "tensor '%s' in '%s': dimension %d is %lld", t->name, file, d,
                               (long long)t->shape[d]);
            if (d == t->ndim - 1) continue;
            if (rows > UINT64_MAX / (uint64_t)t->shape[d])
                return eb_fail(EB_ERR_FORMAT, "tensor '%s' in '%s': shape overflows", t->name, file);
            rows *= (uint64_t)t->shape[d];
        }
        int64_t cols = t->shape[t->ndim - 1];
        uint64_t row = t->dtype == EB_DTYPE_U8 ? (uint64_t)cols : eb_row_bytes(t->dtype, cols);
        if (row == 0)
            return eb_fail(EB_ERR_FORMAT, "tensor '%s' in '%s': rows of %lld values are not a whole number of %s "
                                          "blocks (%d values each)", t->name, file, (long long)cols, f->name, f->block);
        if (rows > UINT64_MAX / row || rows * row != t->nbytes)
            return eb_fail(EB_ERR_FORMAT, "tensor '%s' in '%s': %llu bytes, expected %llu for %s with %llu rows of "
                                          "%lld values", t->name, file, (unsigned long long)t->nbytes,
                           (unsigned long long)(rows * row), f->name, (unsigned long long)rows, (long long)cols);
        uint64_t size = m->files[t->file_index].size;
        if (t->offset > size || t->nbytes > size - t->offset)
            return eb_fail(EB_ERR_FORMAT, "tensor '%s' in '%s': bytes %llu..%llu lie past the end of the file (%llu "
                                          "bytes)", t->name, file, (unsigned long long)t->offset,
                           (unsigned long long)(t->offset + t->nbytes), (unsigned long long)size);
    }
    return EB_OK;
}

/* Whether memory advised with MADV_HUGEPAGE may get transparent huge pages ("[always]" or "[madvise]"). */
static int huge_pages_enabled(void) {
    FILE *fp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!fp) return 0;
    char line[256] = "";
    int ok = fgets(line, sizeof line, fp) && (strstr(line, "[always]") || strstr(line, "[madvise]"));
    fclose(fp);
    return ok;
}

static int check_weights_mode(int requested) {
    if (requested == EB_WEIGHTS_AUTO || requested == EB_WEIGHTS_MAP || requested == EB_WEIGHTS_COPY) return EB_OK;
    return eb_fail(EB_ERR_ARGUMENT, "weights mode %d is not one of %d (auto), %d (map), %d (copy)", requested,
                   EB_WEIGHTS_AUTO, EB_WEIGHTS_MAP, EB_WEIGHTS_COPY);
}

int eb_weights_choose(int requested, uint64_t file_bytes, uint64_t available, int huge_pages, int *mode) {
    int st = check_weights_mode(requested);
    if (st) return st;
    if (requested == EB_WEIGHTS_MAP) {
        *mode = EB_WEIGHTS_MAP;
    } else if (requested == EB_WEIGHTS_AUTO) {
        *mode = huge_pages && available && file_bytes <= available / 2 ? EB_WEIGHTS_COPY : EB_WEIGHTS_MAP;
    } else {
        if (available && file_bytes > available)
            return eb_fail(EB_ERR_MEMORY, "weights: copying the files needs %.1f MiB, and %.1f MiB of memory is "
                                          "available; map them instead (EB_WEIGHTS_MAP, weights='map')",
                           file_bytes / 1048576.0, available / 1048576.0);
        *mode = EB_WEIGHTS_COPY;
    }
    return EB_OK;
}

/* A file is read into its copy by up to 16 threads (no more than the loading thread may run on), each taking at
 * least copy_min_part bytes of it in whole 2 MiB pages: the kernel clears each fresh page in the thread that first
 * writes it, so that work is shared too (on a host of several NUMA nodes the pages spread over the nodes the
 * threads ran on; the threads are not held to any). */
static uint64_t copy_min_part = (uint64_t)64 << 20;
static int copy_threads_used; /* by the last copy (tests) */

int eb_copy_threads_used(void) { return copy_threads_used; }

void eb_set_copy_min_part(uint64_t bytes) { copy_min_part = bytes ? bytes : (uint64_t)64 << 20; }

typedef struct {
    int fd;
    unsigned char *dst;
    uint64_t lo, hi; /* the file's bytes [lo, hi) into dst + lo */
    uint64_t at;     /* where reading stopped */
    int error;       /* errno of a failed read, or -1 where the file ended before hi */
} copy_part;

static void *read_part(void *arg) {
    copy_part *p = (copy_part *)arg;
    for (p->at = p->lo; p->at < p->hi;) {
        uint64_t left = p->hi - p->at;
        ssize_t got = pread(p->fd, p->dst + p->at, left > (1u << 30) ? (1u << 30) : (size_t)left, (off_t)p->at);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            p->error = got < 0 ? errno : -1;
            return NULL;
        }
        p->at += (uint64_t)got;
    }
    return NULL;
}

static int copy_threads(uint64_t size) {
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    uint64_t parts = (size + copy_min_part - 1) / copy_min_part;
    int n = cpus < 16 ? cpus : 16;
    if ((uint64_t)n > parts) n = (int)parts;
    return n < 1 ? 1 : n;
}

/* Read an open file into private memory on 2 MiB boundaries, advised for huge pages, then made read-only as a
 * mapping of the file would be. f->addr and f->map_bytes are set as soon as the memory exists, so a failure
 * part way is freed with the model. */
static int copy_file(eb_mapped_file *f, int fd) {
    const uint64_t huge = (uint64_t)2 << 20;
    uint64_t bytes = (f->size + huge - 1) / huge * huge;
    unsigned char *raw = mmap(NULL, bytes + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return eb_fail(EB_ERR_MEMORY, "cannot allocate %.1f MiB to copy '%s' into: %s", bytes / 1048576.0, f->path,
                       strerror(errno));
    uintptr_t start = ((uintptr_t)raw + huge - 1) & ~(uintptr_t)(huge - 1);
    size_t head = start - (uintptr_t)raw;
    if (head) munmap(raw, head);
    munmap((unsigned char *)start + bytes, huge - head);
    f->addr = (void *)start;
    f->map_bytes = bytes;
    madvise(f->addr, bytes, MADV_HUGEPAGE); /* a kernel without huge pages refuses: the copy is correct anyway */
    enum { MAX_COPY_THREADS = 16 };
    copy_part parts[MAX_COPY_THREADS];
    pthread_t threads[MAX_COPY_THREADS];
    int n = copy_threads(f->size), started = 1;
    uint64_t unit = copy_min_part < huge ? copy_min_part : huge; /* parts in whole units: 2 MiB pages but in tests */
    uint64_t units = (f->size + unit - 1) / unit;
    for (int i = 0; i < n; i++) {
        uint64_t lo = units * (uint64_t)i / (uint64_t)n * unit, hi = units * (uint64_t)(i + 1) / (uint64_t)n * unit;
        parts[i] = (copy_part){fd, f->addr, lo < f->size ? lo : f->size, hi < f->size ? hi : f->size, 0, 0};
    }
    for (int i = 1; i < n; i++, started++)
        if (pthread_create(&threads[i], NULL, read_part, &parts[i]) != 0) break;
    for (int i = started; i < n; i++) read_part(&parts[i]); /* the parts no thread took */
    read_part(&parts[0]);
    for (int i = 1; i < started; i++) pthread_join(threads[i], NULL);
    copy_threads_used = started;
    for (int i = 0; i < n; i++) { /* the first failure in the file's order */
        if (parts[i].error > 0)
            return eb_fail(EB_ERR_IO, "cannot read '%s' at byte %llu: %s", f->path, (unsigned long long)parts[i].at,
                           strerror(parts[i].error));
        if (parts[i].error < 0)
            return eb_fail(EB_ERR_IO, "'%s' ended at byte %llu of the %llu it had when opened (is it being "
                                      "rewritten?)", f->path, (unsigned long long)parts[i].at,
                           (unsigned long long)f->size);
    }
    if (mprotect(f->addr, bytes, PROT_READ) != 0)
        return eb_fail(EB_ERR_MEMORY, "cannot make the copy of '%s' read-only: %s", f->path, strerror(errno));
    return EB_OK;
}

/* Of the files' private copies, about how many bytes are backed by huge pages: AnonHugePages of /proc/self/smaps,
 * which the kernel reports per mapping. Adjacent copies (of this model or another) may share one mapping, so each
 * mapping's figure is counted in proportion to the part of it that holds this model's copies, at most file_bytes. */
static uint64_t copied_huge_bytes(const eb_model *m) {
    FILE *fp = fopen("/proc/self/smaps", "r");
    if (!fp) return 0;
    char line[512];
    double share = 0.0, total = 0.0;
    while (fgets(line, sizeof line, fp)) {
        unsigned long lo, hi;
        unsigned long long kib;
        char dash;
        if (sscanf(line, "%lx%c%lx ", &lo, &dash, &hi) == 3 && dash == '-' && hi > lo) {
            uint64_t mine = 0;
            for (int i = 0; i < m->n_files; i++) {
                uint64_t a = (uintptr_t)m->files[i].addr, b = a + m->files[i].map_bytes;
                if (a && a < hi && b > lo) mine += (b < hi ? b : hi) - (a > lo ? a : lo);
            }
            share = (double)mine / (double)(hi - lo);
        } else if (share > 0.0 && sscanf(line, "AnonHugePages: %llu kB", &kib) == 1) {
            total += share * (double)kib * 1024.0;
        }
    }
    fclose(fp);
    return total < (double)m->info.file_bytes ? (uint64_t)total : m->info.file_bytes;
}

/* The memory a copy may take: what the experts' home device (a CPU device, which reads the files) reports free;
 * 0 where it cannot say. */
static uint64_t memory_available(const eb_model *m) {
    const eb_engine *eng = m->engine;
    const eb_runtime *r = eb_device_runtime(eng, m->expert_home);
    eb_rt_device_info info;
    char err[256];
    return r->table->device_info(r->rt, eng->devices[m->expert_home].local, &info, err, sizeof err) == 0
               ? info.memory_free
               : 0;
}

/* Open every file, choose how to hold them (options->weights against the memory available), map or copy each. */
static int load_files(eb_model *m, const char *const *files, int32_t n_files, int requested) {
    m->files = calloc((size_t)n_files, sizeof *m->files);
    if (!m->files) return eb_fail(EB_ERR_MEMORY, "out of memory");
    uint64_t total = 0;
    for (int32_t i = 0; i < n_files; i++) {
        struct stat sb;
        if (!files[i]) return eb_fail(EB_ERR_ARGUMENT, "file %d has no path", i);
        if (stat(files[i], &sb) != 0) return eb_fail(EB_ERR_IO, "cannot open '%s': %s", files[i], strerror(errno));
        total += (uint64_t)sb.st_size;
    }
    int mode, st;
    if ((st = eb_weights_choose(requested, total, memory_available(m), huge_pages_enabled(), &mode))) return st;
    m->info.weights = mode;
    for (int32_t i = 0; i < n_files; i++) {
        eb_mapped_file *f = &m->files[i];
        f->fd = f->slot = -1;
        f->path = strdup(files[i]);
        m->n_files = i + 1;
        if (!f->path) return eb_fail(EB_ERR_MEMORY, "out of memory");
        int fd = open(files[i], O_RDONLY | O_CLOEXEC);
        if (fd < 0) return eb_fail(EB_ERR_IO, "cannot open '%s': %s", files[i], strerror(errno));
        struct stat sb;
        if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            close(fd);
            return eb_fail(EB_ERR_IO, "'%s' is not a regular file", files[i]);
        }
        f->size = (uint64_t)sb.st_size;
        m->info.file_bytes += f->size;
        if (f->size > 0 && mode == EB_WEIGHTS_COPY) {
            st = copy_file(f, fd);
        } else if (f->size > 0) {
            void *a = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
            if (a == MAP_FAILED) {
                st = eb_fail(EB_ERR_IO, "cannot map '%s': %s", files[i], strerror(errno));
            } else { /* kept open, its size and time noted, the mapping guarded: mapping.c */
                f->addr = a, f->map_bytes = f->size;
                f->fd = fd, f->mtime = sb.st_mtim;
                fd = -1;
                st = eb_mapping_register(m, i);
            }
        }
        if (fd >= 0) close(fd);
        if (st) return st;
    }
    if (mode == EB_WEIGHTS_COPY) m->info.huge_page_bytes = copied_huge_bytes(m);
    return EB_OK;
}

eb_dims eb_model_dims(const eb_model_config *c) {
    eb_dims d;
    int64_t shared = (int64_t)c->moe_intermediate_size * c->n_shared_experts;
    d.ffn = c->intermediate_size > c->moe_intermediate_size ? c->intermediate_size : c->moe_intermediate_size;
    if (shared > d.ffn) d.ffn = shared;
    d.hc = 0;
    d.q = d.att = (int64_t)c->num_heads * c->head_dim;
    d.k = d.v = d.cache_k = d.cache_v = (int64_t)c->num_kv_heads * c->head_dim;
    const eb_family *family = eb_family_of(c);
    if (family && family->dims) family->dims(c, &d);
    return d;
}

void eb_model_free(eb_model *m) {
    if (!m) return;
    if (m->n_contexts > 0 || m->n_borrowers > 0) { /* contexts or models still read its weights: the last one to go
                                                      * frees the model */
        m->free_requested = 1;
        return;
    }
    eb_model_release(m);
}

void eb_model_release(eb_model *m) {
    eb_placement_release(m);
    eb_primary_release(m);
    if (m->layers) {
        for (int l = 0; l < m->cfg.num_layers; l++) {
            eb_layer *L = &m->layers[l];
#define FREE_VECTOR(f, n) free(L->f);
            EB_LAYER_VECTORS(FREE_VECTOR, _)
#undef FREE_VECTOR
            free(L->k_b_owned);
            free(L->v_b_owned);
            free(L->o_a_owned);
            free(L->eh_owned);
            free(L->experts_owned);
            free(L->expert_bias);
            free(L->experts);
        }
        free(m->layers);
    }
    free(m->final_norm);
    for (int i = 0; i < 3; i++) free(m->hc_head[i]);
    free(m->compress_inv_freq);
    free(m->layer_kind);
    free(m->layer_hash);
    free(m->route_tokens);
    for (int i = 0; i < m->n_scale_copies; i++) free(m->scale_copies[i]);
    free(m->scale_copies);
    for (int i = 0; i < m->n_files; i++) {
        eb_mapping_unregister(&m->files[i]);
        if (m->files[i].addr) munmap(m->files[i].addr, m->files[i].map_bytes);
        if (m->files[i].fd >= 0) close(m->files[i].fd);
        free(m->files[i].path);
    }
    free(m->files);
    free(m->mlp_only);
    free(m->layer_window);
    free(m->rope_inv_freq);
    eb_engine *engine = m->engine;
    eb_model *lender = m->head_of;
    free(m);
    if (lender && --lender->n_borrowers == 0 && lender->free_requested && lender->n_contexts == 0)
        eb_model_release(lender);
    if (engine && --engine->n_models == 0 && engine->destroy_requested) eb_engine_release(engine);
}

/* Where a weight is, for an error: "what", "what of layer l" or "what of expert e of layer l". */
static void weight_where(char *out, size_t n, const char *what, int layer, int expert) {
    if (expert >= 0)
        snprintf(out, n, "%s of expert %d of layer %d", what, expert, layer);
    else if (layer >= 0)
        snprintf(out, n, "%s of layer %d", what, layer);
    else
        snprintf(out, n, "%s", what);
}

/* Whether device d's kernels read format dtype; otherwise an error naming the weight, the format and what they read. */
int eb_check_format(const eb_model *m, int d, int dtype, const char *what, int layer, int expert) {
    const eb_device *dev = &m->engine->devices[d];
    if (dev->formats & (1u << dtype)) return EB_OK;
    char where[96], list[128];
    weight_where(where, sizeof where, what, layer, expert);
    return eb_fail(EB_ERR_UNSUPPORTED, "%s is stored as %s, which %s's kernels do not read (they read %s)", where,
                   eb_dtype_name(dtype), dev->name, eb_format_list(dev->formats, list, sizeof list));
}

/* Whether device d runs format dtype in the q8 precision as the cpu module does; otherwise an error naming the
 * weight, the format and the device (whose kernels read it with f32 activations only: another result under q8's
 * name). */
static int check_q8_format(const eb_model *m, int d, int dtype, const char *what, int layer, int expert) {
    const eb_device *dev = &m->engine->devices[d];
    if (dev->q8_formats & (1u << dtype)) return EB_OK;
    char where[96], list[128];
    weight_where(where, sizeof where, what, layer, expert);
    return eb_fail(EB_ERR_UNSUPPORTED, "precision q8: %s is stored as %s, which %s reads with f32 activations only "
                                       "(its q8 kernels read %s); set precision f32, or %s", where,
                   eb_dtype_name(dtype), dev->name, eb_format_list(dev->q8_formats, list, sizeof list),
                   expert >= 0 ? "place that expert on another device" : "load the model on another primary");
}

typedef int (*weight_check)(const eb_model *m, int d, int dtype, const char *what, int layer, int expert);

/* check of every weight the primary's products read (the experts are checked where they are placed), the token
 * embedding too where embed. */
static int each_primary_weight(const eb_model *m, weight_check check, int embed) {
    int p = m->primary, st;
    if ((embed && (st = check(m, p, m->embed.dtype, "the token embedding", -1, -1))) ||
        (st = check(m, p, m->lm_head.dtype, "the output projection (lm_head)", -1, -1)))
        return st;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        const eb_layer *L = &m->layers[l];
        const eb_weight *w[] = {&L->q,   &L->k,    &L->v,       &L->o,       &L->router,  &L->gate,  &L->up,
                                &L->down, &L->q_a, &L->q_b,     &L->kv_a,    &L->k_b,     &L->v_b,   &L->sh_gate,
                                &L->sh_up, &L->sh_down, &L->kv, &L->o_a, &L->cmp_kv, &L->cmp_gate, &L->idx_kv,
                                &L->idx_gate, &L->idx_q, &L->idx_w};
        const char *names[] = {"q_proj",         "k_proj",        "v_proj",
                               "o_proj",         "the router",    "gate_proj",
                               "up_proj",        "down_proj",     "q_a_proj",
                               "q_b_proj",       "kv_a_proj_with_mqa", "kv_b_proj (keys)",
                               "kv_b_proj (values)", "shared_experts.gate_proj", "shared_experts.up_proj",
                               "shared_experts.down_proj", "attn.wkv", "attn.wo_a", "attn.compressor.wkv",
                               "attn.compressor.wgate", "attn.indexer.compressor.wkv", "attn.indexer.compressor.wgate",
                               "attn.indexer.wq_b", "attn.indexer.weights_proj"};
        for (int i = 0; i < (int)(sizeof w / sizeof *w); i++)
            if (w[i]->data && (st = check(m, p, w[i]->dtype, names[i], l, -1))) return st;
    }
    return EB_OK;
}

/* In the q8 precision, every weight a step reads in a format its device runs in q8 (the primary's, and each expert's
 * on its owner). */
static int check_q8_formats(const eb_model *m) {
    const eb_engine *eng = m->engine;
    int every = 1, st;
    for (int d = 0; d < eng->n_devices; d++) every &= (eng->devices[d].formats & ~eng->devices[d].q8_formats) == 0;
    if (every) return EB_OK; /* the common case: no device reads a format in f32 only */
    if ((st = each_primary_weight(m, check_q8_format, 0))) return st;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        const eb_layer *L = &m->layers[l];
        for (int e = 0; L->is_moe && L->experts && e < m->cfg.num_experts; e++) {
            const eb_expert *x = &L->experts[e];
            if ((st = check_q8_format(m, x->owner, x->gate.dtype, "gate_proj", l, e)) ||
                (st = check_q8_format(m, x->owner, x->up.dtype, "up_proj", l, e)) ||
                (st = check_q8_format(m, x->owner, x->down.dtype, "down_proj", l, e)))
                return st;
        }
    }
    return EB_OK;
}

/* Whether every device a step of this model uses runs the precision: a device that cannot is refused by name, never
 * left to read the activations in the precision it has instead (another result under the requested one's name). */
int eb_check_precision(const eb_model *m, int precision) {
    static const char *const names[] = {"f32", "q8"};
    const eb_engine *eng = m->engine;
    uint32_t bit = 1u << precision, every = bit;
    for (int d = 0; d < eng->n_devices; d++) every &= eng->devices[d].precisions;
    if (every) return precision == EB_PRECISION_Q8 ? check_q8_formats(m) : EB_OK; /* no device lacks it */
    int bad = eng->devices[m->primary].precisions & bit ? -1 : m->primary, layer = -1, expert = -1;
    for (int l = 0; bad < 0 && l < m->cfg.num_layers; l++) {
        const eb_layer *L = &m->layers[l];
        for (int e = 0; L->is_moe && L->experts && bad < 0 && e < m->cfg.num_experts; e++)
            if (!(eng->devices[L->experts[e].owner].precisions & bit)) bad = L->experts[e].owner, layer = l, expert = e;
    }
    if (bad < 0) return precision == EB_PRECISION_Q8 ? check_q8_formats(m) : EB_OK;
    char what[96], runs[32] = "";
    if (expert < 0) snprintf(what, sizeof what, "the primary");
    else snprintf(what, sizeof what, "the owner of expert %d of layer %d", expert, layer);
    for (int p = 0; p < (int)(sizeof names / sizeof *names); p++)
        if (eng->devices[bad].precisions & (1u << p))
            snprintf(runs + strlen(runs), sizeof runs - strlen(runs), "%s%s", *runs ? ", " : "", names[p]);
    return eb_fail(EB_ERR_UNSUPPORTED, "precision %s: %s, %s, does not run it (its kernels run %s); set another "
                                       "precision or %s", names[precision], eng->devices[bad].name, what,
                   *runs ? runs : "none",
                   expert < 0 ? "load the model on another primary" : "place those experts elsewhere");
}

/* Every weight the primary reads, in a format its kernels read (the experts are checked where they are placed). */
static int check_primary_formats(const eb_model *m) { return each_primary_weight(m, eb_check_format, 1); }

/* A weight's bytes with its scale companion's: what a product reads. */
static uint64_t read_bytes(const eb_weight *w) { return eb_weight_bytes(w) + eb_scale_bytes(w); }

static void compute_bytes_per_token(eb_model *m) {
    const eb_model_config *c = &m->cfg;
    uint64_t total = eb_row_bytes(m->embed.dtype, c->hidden_size) + read_bytes(&m->lm_head);
    eb_dims d = eb_model_dims(c);
    for (int l = 0; l < c->num_layers; l++) {
        const eb_layer *L = &m->layers[l];
        const eb_weight *attn[] = {&L->q,      &L->k,        &L->v,      &L->o,        &L->q_a,  &L->q_b,
                                   &L->kv_a,   &L->k_b,      &L->kv,     &L->o_a,      &L->cmp_kv, &L->cmp_gate,
                                   &L->idx_kv, &L->idx_gate, &L->idx_q,  &L->idx_w};
        for (size_t i = 0; i < sizeof attn / sizeof *attn; i++) total += read_bytes(attn[i]);
        if (L->v_b.data) /* each head's value rows (in kv_b_proj they alternate with the key rows) */
            total += (uint64_t)c->num_heads * (uint64_t)c->v_head_dim * eb_row_bytes(L->v_b.dtype, c->kv_lora_rank);
        if (L->is_moe) {
            uint64_t shared = read_bytes(&L->sh_gate) + read_bytes(&L->sh_up) + read_bytes(&L->sh_down);
            total += read_bytes(&L->router) + shared;
            m->info.shared_expert_bytes += shared;
            total += (uint64_t)c->top_k * eb_expert_bytes(&L->experts[0]);
        } else {
            total += read_bytes(&L->gate) + read_bytes(&L->up) + read_bytes(&L->down);
        }
    }
    m->info.bytes_per_token = total;
    uint64_t row = (uint64_t)(d.cache_k + d.cache_v) * sizeof(float);
    for (int l = 0; l < c->num_layers; l++) {
        int32_t w = c->layer_window ? c->layer_window[l] : 0;
        if (w) m->info.kv_window_bytes += (uint64_t)w * row;
        else m->info.kv_bytes_per_token += row;
    }
}

/* The embeddings and head of `of` read by m on their common primary: the same tables (formats, shapes) of the same
 * engine, or refused; a primary that reads them in place (a CPU device) holds no copy to share: nothing to do. */
static int borrow_head(eb_model *m, eb_model *of) {
    if (of->engine != m->engine)
        return eb_fail(EB_ERR_ARGUMENT, "head_of: a model of another engine");
    if (of->primary != m->primary || m->primary_host) return EB_OK;
    const eb_weight *w[2][2] = {{&m->embed, &m->lm_head}, {&of->embed, &of->lm_head}};
    for (int i = 0; i < 2; i++)
        if (w[0][i]->dtype != w[1][i]->dtype || w[0][i]->rows != w[1][i]->rows || w[0][i]->cols != w[1][i]->cols ||
            (m->embed.data == m->lm_head.data) != (of->embed.data == of->lm_head.data))
            return eb_fail(EB_ERR_ARGUMENT, "head_of: its %s (%s, %lld x %lld) is not this model's (%s, %lld x %lld)",
                           i ? "lm_head" : "embeddings", eb_dtype_name(w[1][i]->dtype), (long long)w[1][i]->rows,
                           (long long)w[1][i]->cols, eb_dtype_name(w[0][i]->dtype), (long long)w[0][i]->rows,
                           (long long)w[0][i]->cols);
    m->head_of = of;
    of->n_borrowers++;
    return EB_OK;
}

int eb_model_load(eb_engine *engine, const eb_model_config *config, const char *const *files, int32_t n_files,
                  const eb_tensor_desc *tensors, int32_t n_tensors, int32_t primary_device,
                  const eb_load_options *options, eb_model **out) {
    if (!engine || !config || !out || (n_files > 0 && !files) || (n_tensors > 0 && !tensors))
        return eb_fail(EB_ERR_ARGUMENT, "eb_model_load: NULL argument");
    *out = NULL;
    if (n_files <= 0 || n_files > 100000) return eb_fail(EB_ERR_ARGUMENT, "eb_model_load: %d files", n_files);
    if (n_tensors <= 0) return eb_fail(EB_ERR_FORMAT, "the checkpoint has no tensors");
    int weights = options ? options->weights : EB_WEIGHTS_AUTO, st = check_weights_mode(weights);
    if (st) return st;
    int check = options ? options->check_weights : EB_CHECK_WEIGHTS_ON;
    if (check != EB_CHECK_WEIGHTS_ON && check != EB_CHECK_WEIGHTS_OFF)
        return eb_fail(EB_ERR_ARGUMENT, "check_weights %d is not one of %d (check the weights at load) or %d (load "
                                        "them unchecked)", check, EB_CHECK_WEIGHTS_ON, EB_CHECK_WEIGHTS_OFF);
    check = check == EB_CHECK_WEIGHTS_ON;
    if (primary_device < 0 || primary_device >= engine->n_devices)
        return eb_fail(EB_ERR_RANGE, "primary device index %d out of range (%d devices loaded)", primary_device,
                       engine->n_devices);
    st = check_config(config);
    if (st) return st;
    const eb_device *dev = &engine->devices[primary_device];
    const eb_runtime *rt = &engine->runtimes[dev->runtime];
    eb_rt_device_info rinfo;
    char err[256] = "";
    if ((st = rt->table->device_info(rt->rt, dev->local, &rinfo, err, sizeof err)) != 0)
        return eb_fail(st, "device %s: %s", dev->name, err);
    int home = primary_device;
    const eb_family *family = eb_family_of(config);
    if (!rt->table->forward)
        return eb_fail(EB_ERR_UNSUPPORTED, "primary device %s: the '%s' runtime cannot run the forward pass "
                                           "(attention, router, norms); choose a CPU device or a GPU runtime",
                       dev->name, rt->name);
    eb_rt_model_shape shape = {config->hidden_size, config->head_dim, config->num_heads, config->num_kv_heads,
                               config->num_experts, config->top_k,
                               config->moe_intermediate_size > config->intermediate_size ? config->moe_intermediate_size
                                                                                          : config->intermediate_size,
                               config->max_position_embeddings};
    if ((st = rt->table->forward->check_model(rt->rt, dev->local, &shape, err, sizeof err)) != 0)
        return eb_fail(st, "primary device %s: %s", dev->name, err);
    for (const eb_rt_extension_id *need = family->extensions; need && need->name; need++)
        if (!eb_rt_find_extension(rt->table, *need))
            return eb_fail(EB_ERR_UNSUPPORTED, "primary device %s: the '%s' runtime lacks the extension '%s' version %u "
                                               "that %s's forward pass needs; choose a CPU device as the primary (its "
                                               "experts can still be placed on %s)",
                           dev->name, rt->name, need->name, (unsigned)need->version, family->title, dev->name);
    if (!rinfo.host_addressable) {
        /* experts start in host memory (the first CPU device); a placement moves them */
        for (home = 0; home < engine->n_devices && !engine->devices[home].host_addressable; home++) {
        }
        if (home == engine->n_devices)
            return eb_fail(EB_ERR_UNSUPPORTED, "primary device %s: experts start in host memory, but no CPU device is "
                                               "loaded; load the cpu runtime too", dev->name);
    }

    eb_model *m = calloc(1, sizeof *m);
    if (!m) return eb_fail(EB_ERR_MEMORY, "out of memory");
    m->engine = engine;
    engine->n_models++;
    m->cfg = *config;
    m->primary = primary_device;
    m->primary_host = rinfo.host_addressable;
    m->family = family;
    m->expert_home = home;
    if (config->n_mlp_only_layers > 0) {
        m->mlp_only = malloc((size_t)config->n_mlp_only_layers * sizeof *m->mlp_only);
        if (!m->mlp_only) {
            eb_model_free(m);
            return eb_fail(EB_ERR_MEMORY, "out of memory");
        }
        memcpy(m->mlp_only, config->mlp_only_layers, (size_t)config->n_mlp_only_layers * sizeof *m->mlp_only);
    }
    m->cfg.mlp_only_layers = m->mlp_only;
    if (config->n_layer_window > 0) {
        if (!(m->layer_window = malloc((size_t)config->n_layer_window * sizeof *m->layer_window))) {
            eb_model_free(m);
            return eb_fail(EB_ERR_MEMORY, "out of memory");
        }
        memcpy(m->layer_window, config->layer_window, (size_t)config->n_layer_window * sizeof *m->layer_window);
    }
    m->cfg.layer_window = m->layer_window;
    if (config->rope_inv_freq) {
        size_t half = (size_t)(config->rope_dim ? config->rope_dim : config->head_dim) / 2;
        if (!(m->rope_inv_freq = malloc(half * sizeof *m->rope_inv_freq))) {
            eb_model_free(m);
            return eb_fail(EB_ERR_MEMORY, "out of memory");
        }
        memcpy(m->rope_inv_freq, config->rope_inv_freq, half * sizeof *m->rope_inv_freq);
    }
    m->cfg.rope_inv_freq = m->rope_inv_freq;
    if (config->arch == EB_ARCH_DEEPSEEK_V4) { /* its per-layer kinds and its second RoPE (checked: the family's) */
        size_t L = (size_t)config->n_layer_kind, half = (size_t)(config->rope_dim ? config->rope_dim
                                                                                     : config->head_dim) / 2;
        m->layer_kind = malloc(L * sizeof *m->layer_kind);
        m->layer_hash = malloc(L * sizeof *m->layer_hash);
        m->compress_inv_freq = malloc(half * sizeof *m->compress_inv_freq);
        if (!m->layer_kind || !m->layer_hash || !m->compress_inv_freq) {
            eb_model_free(m);
            return eb_fail(EB_ERR_MEMORY, "out of memory");
        }
        memcpy(m->layer_kind, config->layer_kind, L * sizeof *m->layer_kind);
        memcpy(m->layer_hash, config->layer_hash, L * sizeof *m->layer_hash);
        memcpy(m->compress_inv_freq, config->compress_inv_freq, half * sizeof *m->compress_inv_freq);
    }
    m->cfg.layer_kind = m->layer_kind;
    m->cfg.layer_hash = m->layer_hash;
    m->cfg.compress_inv_freq = m->compress_inv_freq;
    eb_weight_checks checks = {NULL, 0, 0};
    eb_binder b = {NULL, n_tensors, m, check ? &checks : NULL};
    if ((st = load_files(m, files, n_files, weights)) || (st = check_descriptors(m, tensors, n_tensors))) {
        eb_model_free(m);
        return st;
    }
    b.sorted = malloc((size_t)n_tensors * sizeof *b.sorted);
    if (!b.sorted) {
        eb_model_free(m);
        return eb_fail(EB_ERR_MEMORY, "out of memory");
    }
    for (int32_t i = 0; i < n_tensors; i++) b.sorted[i] = &tensors[i];
    qsort(b.sorted, (size_t)n_tensors, sizeof *b.sorted, cmp_desc_name);
    for (int32_t i = 1; i < n_tensors; i++)
        if (strcmp(b.sorted[i - 1]->name, b.sorted[i]->name) == 0) {
            st = eb_fail(EB_ERR_FORMAT, "tensor '%s' appears twice in the checkpoint", b.sorted[i]->name);
            goto fail;
        }
    const eb_model_config *c = &m->cfg;
    if ((st = family->bind_model(&b))) goto fail;
    m->layers = calloc((size_t)c->num_layers, sizeof *m->layers);
    m->route_tokens = calloc((size_t)c->num_layers, sizeof(uint64_t));
    if (!m->layers || !m->route_tokens) {
        st = eb_fail(EB_ERR_MEMORY, "out of memory");
        goto fail;
    }
    for (int l = 0; l < c->num_layers; l++)
        if ((st = family->bind_layer(&b, l))) goto fail;
    for (int l = 0; l < c->num_layers; l++) {
        eb_layer *L = &m->layers[l];
        if (!L->is_moe) continue;
        for (int e = 0; e < c->num_experts; e++) { /* every expert starts at its home, read where it is */
            eb_expert *x = &L->experts[e];
            x->host_gate = x->gate.data;
            x->host_up = x->up.data;
            x->host_down = x->down.data;
            x->host_bias = x->bias;
            x->host_scale[0] = x->gate.scale.data;
            x->host_scale[1] = x->up.scale.data;
            x->host_scale[2] = x->down.scale.data;
            x->owner = m->expert_home;
            m->info.expert_bytes += eb_expert_bytes(x);
        }
        m->info.n_moe_layers++;
    }
    free(b.sorted);
    b.sorted = NULL;
    if ((st = eb_check_weights(m, &checks)) || (st = eb_model_file_faulted(m))) goto fail;
    eb_checks_free(&checks);
    if ((st = check_primary_formats(m))) goto fail;
    m->info.n_layers = c->num_layers;
    m->info.primary_device = primary_device;
    compute_bytes_per_token(m);
    m->counters.dev[home].weight_bytes += m->info.expert_bytes; /* every expert starts at its home */
    if (options && options->head_of && (st = borrow_head(m, (eb_model *)options->head_of))) goto fail;
    if ((st = eb_primary_init(m))) {
        eb_model_free(m);
        return st;
    }
    *out = m;
    return EB_OK;
fail:
    free(b.sorted);
    eb_checks_free(&checks);
    eb_model_free(m);
    return st;
}

int eb_model_get_info(const eb_model *m, eb_model_info *out) {
    if (!m || !out) return eb_fail(EB_ERR_ARGUMENT, "model info: NULL argument");
    *out = m->info;
    return EB_OK;
}

uint64_t eb_format_row_bytes(int32_t dtype, int64_t cols) { return eb_row_bytes(dtype, cols); }

int32_t eb_format_count(void) { return EB_DTYPE_COUNT; }

int eb_format_info(int32_t dtype, eb_format_desc *out) {
    if (!out) return eb_fail(EB_ERR_ARGUMENT, "format info: out is NULL");
    const eb_format_traits *f = eb_format(dtype);
    if (!f) return eb_fail(EB_ERR_RANGE, "format info: code %d is not one of 0..%d", dtype, EB_DTYPE_COUNT - 1);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", f->name);
    out->dtype = f->dtype;
    out->block = f->block;
    out->block_bytes = f->block_bytes;
    out->ggml_type = f->ggml_type;
    out->quantized = f->quantized;
    out->q8_block = f->q8_block;
    out->scale_rows = f->scale_rows;
    out->scale_cols = f->scale_cols;
    return EB_OK;
}

int eb_dequantize(int32_t dtype, const void *src, uint64_t src_bytes, int64_t n, float *out) {
    const eb_format_traits *f = eb_format(dtype);
    if (!f) return eb_fail(EB_ERR_UNSUPPORTED, "dequantize: format code %d is not one of 0..%d", dtype, EB_DTYPE_COUNT - 1);
    if ((n > 0 && (!src || !out)) || n < 0) return eb_fail(EB_ERR_ARGUMENT, "dequantize: NULL buffer or n = %lld", (long long)n);
    uint64_t need = eb_row_bytes(dtype, n);
    if (n > 0 && need == 0)
        return eb_fail(EB_ERR_ARGUMENT, "dequantize: %lld values are not a whole number of %s blocks (%d values each)",
                       (long long)n, f->name, f->block);
    if (src_bytes < need)
        return eb_fail(EB_ERR_RANGE, "dequantize: %lld %s values need %llu bytes, %llu given", (long long)n, f->name,
                       (unsigned long long)need, (unsigned long long)src_bytes);
    eb_dequantize_row(src, dtype, n, out);
    return EB_OK;
}
