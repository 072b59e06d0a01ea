/* expertbench native core: the one public header.
 *
 * Opaque handles; every call returns an eb_status (EB_OK == 0). When a call fails, the text of the error
 * is readable with eb_last_error() on the same thread until the next failing call. Nothing in the library
 * aborts, exits or prints on bad input.
 *
 * This header is parsed by cffi (engine/_build_native.py): keep it free of preprocessor logic that cffi
 * cannot read between the EB_CDEF_BEGIN / EB_CDEF_END markers.
 */
#ifndef EXPERTBENCH_H
#define EXPERTBENCH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Weight formats: the one list of them. The core's table of sizes (eb_formats.h), the eb_dtype codes below, the GPU
 * kernels' row sizes and, through eb_format_info, the Python engine's formats are all made from it.
 *
 * Columns: the name (as the gguf package and safetensors name it; the code is EB_DTYPE_<name>); the code (the ABI's
 * numbering: a format keeps its code, a new one takes the next; listed in code order); values per block (1: a float
 * format); bytes per block; the GGUF file's type code (ggml_type); quantized; and the q8 precision's activation block
 * against it (the values quantized to int8 under one scale for its integer products: a scale per weight block of 32,
 * one per 256-value block of the K formats, whose eight sub-blocks then sum in integers as llama.cpp's Q8_K does; 0:
 * no integer product, read with f32 activations in either precision).
 *
 * The quantized formats are ggml's blocks, as GGUF files store them (a row is a whole number of blocks): Q8_0 (f16
 * scale, 32 int8), Q4_K / Q5_K (f16 scale and minimum, eight 6-bit sub-block scales and minima, 4-bit quants, Q5_K a
 * fifth bit), Q6_K (6-bit quants, sixteen int8 scales, f16 scale), MXFP4 (an E8M0 exponent, 32 E2M1 quants), Q5_0 /
 * Q5_1 (f16 scale (Q5_1: and minimum), 32 fifth bits, 4-bit quants; what llama.cpp's quantizer writes for a K-quant's
 * rows that are not whole 256-value blocks, such as DeepSeek's attn_k_b in a Q4_K_M file, and in some files for an
 * expert's gate or up beside a Q8_0 or MXFP4 one; rare and small, they have no integer product), Q4_0 (f16 scale,
 * 4-bit quants less 8; older tooling's files) and Q4_1 (f16 scale and minimum, 4-bit quants), whose q8 activations
 * are blocks of 32 as llama.cpp's Q8_0 / Q8_1 beside them, IQ4_NL (f16 scale, 4-bit codes into a non-linear grid
 * of 16 values, eb_iq4nl_values), q8 blocks of 32 too, and IQ4_XS (256 values: f16 scale, eight signed 6-bit
 * sub-block scales, IQ4_NL's codes), q8 blocks of 256 as llama.cpp's Q8_K beside it, and Q2_K (256 values: sixteen
 * 4-bit sub-block scales and minima, 2-bit quants, f16 scale and minimum; the down projections of llama.cpp's 2-bit
 * files), and Q3_K (256 values: 2-bit quants and a third bit, sixteen signed 6-bit sub-block scales, f16 scale;
 * llama.cpp's Q3_K presets), q8 blocks of 256 too. The i-quants look groups of 8 (or 4) values up in codebooks
 * (eb_iq_tables.h, from the gguf package's) with signs from a 7-bit index: IQ2_XXS (256 values: f16 scale, per 32 a
 * 4-bit scale, four 8-bit grid indices and four sign indices; the gate and up of DeepSeek V4's 2-bit files) and
 * IQ3_XXS (256 values: f16 scale, 8-bit indices into a grid of 4 values, per 32 four sign indices and a 4-bit
 * scale) and IQ2_XS (256 values: f16 scale, per 8 a 9-bit index into a grid of 8 values and a sign index, per 16 a
 * 4-bit scale), IQ3_S (256 values: f16 scale, 9-bit indices into a grid of 4 values, a sign bit a value, per 32 a
 * 4-bit scale), and the 1-bit IQ1_S (256 values: f16 scale, per 8 an 11-bit index into a grid of -1, 0, +1, per 32 a
 * 3-bit scale and the sign of a shift of 1/8) and IQ1_M (IQ1_S's grid, per 8 the shift's sign, per 16 a 3-bit
 * scale, the f16 scale in the scales' top bits), and IQ2_S (256 values: f16 scale, per 8 a 10-bit index into a grid
 * of 8 values and 8 sign bits, per 16 a 4-bit scale; the IQ2_M presets and unsloth's UD-IQ2 mixes), q8 blocks of 256
 * as llama.cpp's Q8_K beside them.
 *
 * The last two columns, the scale block (rows x cols; 0 x 0: none), mark a format whose values are multiplied by a
 * scale companion: a separate f32 tensor of one scale per block of the weight, ceil(rows / scale_rows) x
 * ceil(cols / scale_cols) of them, which the core binds beside the weight (eb_weight, eb_rt_scale) and every kernel
 * reads with it. F8_E4M3_B128 is DeepSeek-V3's and V4's released FP8 (transformers' finegrained FP8): one byte per
 * value in OCP FP8 E4M3FN (sign, 4-bit exponent of bias 7, 3-bit mantissa, subnormals, 0x7F and 0xFF NaN, no
 * infinities), the value at (r, c) that E4M3 value times scale[r / 128][c / 128], the safetensors file's F8_E4M3
 * tensor beside its F32 '<name>_scale_inv'. No GGUF type (-1); no integer product. */
/*           name   code block bytes ggml quantized q8_block scale_rows scale_cols */
#define EB_FORMATS(X)                               \
    X(F32,          0,   1,   4,   0, 0,   0,   0,   0) \
    X(F16,          1,   1,   2,   1, 0,   0,   0,   0) \
    X(BF16,         2,   1,   2,  30, 0,   0,   0,   0) \
    X(Q8_0,         3,  32,  34,   8, 1,  32,   0,   0) \
    X(Q4_K,         4, 256, 144,  12, 1, 256,   0,   0) \
    X(Q5_K,         5, 256, 176,  13, 1, 256,   0,   0) \
    X(Q6_K,         6, 256, 210,  14, 1, 256,   0,   0) \
    X(MXFP4,        7,  32,  17,  39, 1,  32,   0,   0) \
    X(Q5_0,         8,  32,  22,   6, 1,   0,   0,   0) \
    X(Q5_1,         9,  32,  24,   7, 1,   0,   0,   0) \
    X(F8_E4M3_B128, 10,  1,   1,  -1, 0,   0, 128, 128) \
    X(Q4_0,         11, 32,  18,   2, 1,  32,   0,   0) \
    X(Q4_1,         12, 32,  20,   3, 1,  32,   0,   0) \
    X(IQ4_NL,       13, 32,  18,  20, 1,  32,   0,   0) \
    X(IQ4_XS,       14, 256, 136, 23, 1, 256,   0,   0) \
    X(Q2_K,         15, 256,  84, 10, 1, 256,   0,   0) \
    X(Q3_K,         16, 256, 110, 11, 1, 256,   0,   0) \
    X(IQ2_XXS,      17, 256,  66, 16, 1, 256,   0,   0) \
    X(IQ3_XXS,      18, 256,  98, 18, 1, 256,   0,   0) \
    X(IQ2_XS,       19, 256,  74, 17, 1, 256,   0,   0) \
    X(IQ3_S,        20, 256, 110, 21, 1, 256,   0,   0) \
    X(IQ1_S,        21, 256,  50, 19, 1, 256,   0,   0) \
    X(IQ1_M,        22, 256,  56, 29, 1, 256,   0,   0) \
    X(IQ2_S,        23, 256,  82, 22, 1, 256,   0,   0)

/* Outside the cdef, which expands no macros: Python reads the codes through eb_format_info. */
typedef enum {
#define EB_FORMAT_CODE(name, code, block, block_bytes, ggml_type, quantized, q8_block, scale_rows, scale_cols) \
    EB_DTYPE_##name = code,
    EB_FORMATS(EB_FORMAT_CODE)
#undef EB_FORMAT_CODE
#define EB_FORMAT_ONE(name, code, block, block_bytes, ggml_type, quantized, q8_block, scale_rows, scale_cols) +1
    EB_DTYPE_COUNT = 0 EB_FORMATS(EB_FORMAT_ONE),
#undef EB_FORMAT_ONE
    EB_DTYPE_U8 = 63 /* not a weight format: bytes of a format's parts stored apart (a Hugging Face MXFP4 checkpoint's
                        *_blocks and *_scales), which the loader reads and packs into MXFP4 rows; engine/model.py
                        names it too (RAW_U8); well above the formats' codes, which stay below it */
} eb_dtype;

/* EB_CDEF_BEGIN */
enum {
    EB_API_VERSION = 1,
    EB_MAX_NAME = 64,
    EB_MAX_TEXT = 256,
    EB_MAX_PATH = 1024,
};

typedef enum {
    EB_OK = 0,
    EB_ERR_ARGUMENT = 1,    /* a bad value passed by the caller */
    EB_ERR_IO = 2,          /* a file could not be opened, read or mapped */
    EB_ERR_FORMAT = 3,      /* a file or tensor is damaged or of the wrong shape */
    EB_ERR_UNSUPPORTED = 4, /* valid, but not something this engine runs */
    EB_ERR_RANGE = 5,       /* an index, token id or length out of range */
    EB_ERR_MODULE = 6,      /* a runtime module failed to load or has the wrong ABI */
    EB_ERR_MEMORY = 7,      /* an allocation failed */
    EB_ERR_DEVICE = 8,      /* a device reported an error */
    EB_ERR_STATE = 9,       /* the call is not valid in the object's current state */
    EB_ERR_NUMERIC = 10     /* a step's numbers are not finite (NaN or inf logits): never a token chosen from them */
} eb_status;

typedef enum {
    EB_ARCH_QWEN3 = 1,    /* Qwen3ForCausalLM (dense) */
    EB_ARCH_QWEN3_MOE = 2, /* Qwen3MoeForCausalLM */
    EB_ARCH_DEEPSEEK_V3 = 3, /* DeepseekV3ForCausalLM: MLA attention, grouped sigmoid routing, shared experts */
    EB_ARCH_GPT_OSS = 4,     /* GptOssForCausalLM: attention sinks, sliding-window layers, biased experts with a
                                clamped SwiGLU, top-k routing with the softmax over the chosen */
    EB_ARCH_DEEPSEEK_V4 = 5  /* DeepseekV4ForCausalLM: one shared key=value head with a sliding window, compressed
                                entries (CSA with the Lightning Indexer, HCA), mHC residual streams, sqrt-softplus or
                                token-id hash routing, a grouped low-rank output projection */
} eb_arch;

typedef struct eb_engine eb_engine;
typedef struct eb_model eb_model;
typedef struct eb_context eb_context;

/* Which CPU kernels a cpu runtime may use: the best the CPU runs, or at most AVX2, or the portable C ones. The q8
 * precision's AVX-512 VNNI kernels give the AVX2 kernels' bits, so the cap changes speed only; the portable kernels
 * sum in another order (other bits, the same within rounding). */
typedef enum {
    EB_CPU_KERNELS_BEST = 0,
    EB_CPU_KERNELS_PORTABLE = 1,
    EB_CPU_KERNELS_AVX2 = 2,
    EB_CPU_KERNELS_COUNT
} eb_cpu_kernels;

typedef struct {
    int32_t n_devices;          /* CPU runtime: number of devices (worker groups); 0 = one per NUMA node */
    int32_t threads_per_device; /* CPU runtime: worker threads per device; 0 = all cores / devices */
    int32_t kernels;            /* CPU runtime: an eb_cpu_kernels, the most the kernels may use of the CPU */
    uint64_t memory_limit;      /* bytes a device may allocate; 0 = what the hardware has */
} eb_runtime_options;

typedef struct {
    char name[EB_MAX_NAME];         /* "cpu" */
    char path[EB_MAX_PATH];         /* the file it was loaded from */
    char kernel_variant[EB_MAX_NAME]; /* e.g. "avx2+fma+f16c", "avx2+fma+f16c+avx512vnni" or "portable" */
    uint32_t abi_version;
    int32_t n_devices;
    char extensions[EB_MAX_NAME];   /* the family operations its devices run as the primary, "name/version" each,
                                       comma-separated ("mla/1"); "" when none */
} eb_runtime_info;

typedef struct {
    char name[EB_MAX_NAME];         /* "cpu:0" */
    char kind[EB_MAX_NAME];         /* "cpu", "gpu" */
    char description[EB_MAX_TEXT];  /* human readable */
    uint64_t memory_total;
    uint64_t memory_free;
    int32_t runtime_index;
    int32_t local_index;
    int32_t threads;
    uint32_t formats;               /* the weight formats its kernels read: bit (1 << eb_dtype) each */
    uint32_t precisions;            /* the activation precisions its kernels run: bit (1 << eb_precision) each */
    uint32_t kv_caches;             /* the KV cache formats a context may keep there as the primary: bit (1 << eb_dtype)
                                       each, f32 always */
    int32_t queued_ops;             /* 1: its forward operations return before they have run (a GPU's stream) */
} eb_device_info;

typedef struct {
    int32_t arch;                 /* eb_arch */
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t intermediate_size;     /* dense MLP layers */
    int32_t moe_intermediate_size; /* each expert (MoE only) */
    int32_t num_layers;
    int32_t num_heads;
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t num_experts;           /* 0 for dense models */
    int32_t top_k;
    int32_t norm_topk_prob;
    int32_t decoder_sparse_step;
    int32_t tie_word_embeddings;
    int32_t attention_bias;
    int32_t max_position_embeddings;
    double rope_theta;
    double rms_norm_eps;
    const int32_t *mlp_only_layers;
    int32_t n_mlp_only_layers;
    /* RoPE: the dimensions rotated per head (0: head_dim), in interleaved pairs (x[2i], x[2i+1]) or halves (x[i],
     * x[i + d/2]); its frequencies (rope_dim / 2 of them, NULL: 1 / rope_theta^(2i / rope_dim)) as a scaled RoPE
     * such as YaRN makes them, with a factor on cos and sin (0: 1); the softmax scale (0: 1 / sqrt(the q.k width)) */
    int32_t rope_dim;
    int32_t rope_interleave;
    const float *rope_inv_freq;
    double rope_attention_factor;
    double attention_scale;
    /* DeepSeek-V3 (0 elsewhere): MLA attention with q through a rank-q_lora_rank bottleneck (0: a plain q_proj) and
     * keys and values from a cached latent of kv_lora_rank plus one shared rope key of qk_rope_head_dim; routing by
     * sigmoid scores in n_group groups of which topk_group are kept, the weights times routed_scaling_factor; the
     * first first_k_dense_replace layers dense; n_shared_experts always-on experts on the primary */
    int32_t q_lora_rank;
    int32_t kv_lora_rank;
    int32_t qk_nope_head_dim;
    int32_t qk_rope_head_dim;
    int32_t v_head_dim;
    int32_t n_shared_experts;
    int32_t first_k_dense_replace;
    int32_t n_group;
    int32_t topk_group;
    double routed_scaling_factor;
    /* gpt-oss (NULL / 0 elsewhere): per layer its attention window (layer_window: num_layers entries, 0 = full
     * attention; a window w attends to the w most recent positions, its own included, and its KV cache holds only
     * those the steps can reach); attention sinks (one learned logit per head in every layer's softmax); experts
     * with biases and the clamped SwiGLU: swiglu_limit > 0 clamps gate above at the limit and up to +-limit, then
     * (up + 1) * gate * sigmoid(swiglu_alpha * gate) */
    const int32_t *layer_window;
    int32_t n_layer_window;
    double swiglu_limit;
    double swiglu_alpha;
    /* DeepSeek-V4 (0 / NULL elsewhere; swiglu_limit then clamps gate above and up to +-limit before silu(gate) * up,
     * q_lora_rank is q's bottleneck, rope_inv_freq the main RoPE's): hc_mult residual streams mixed by mHC with
     * hc_sinkhorn_iters Sinkhorn iterations and hc_eps; the grouped output projection (o_groups groups of
     * o_lora_rank); a window of sliding_window positions in every layer; per layer its kind (layer_kind:
     * num_layers entries of EB_V4_*) and whether it routes by token id (layer_hash: num_layers entries of 0 or 1);
     * the compressed entries of csa_rate (CSA) or hca_rate (HCA) positions each, rotated by the compress RoPE
     * (compress_inv_freq: rope_dim / 2 frequencies; CSA and HCA layers' queries and keys too); the Lightning Indexer
     * of index_n_heads heads of index_head_dim keeping index_topk entries per query */
    int32_t hc_mult;
    int32_t hc_sinkhorn_iters;
    double hc_eps;
    int32_t o_groups;
    int32_t o_lora_rank;
    int32_t sliding_window;
    const int32_t *layer_kind;
    const int32_t *layer_hash;
    int32_t n_layer_kind; /* entries of layer_kind and of layer_hash */
    int32_t csa_rate;
    int32_t hca_rate;
    const float *compress_inv_freq;
    int32_t index_n_heads;
    int32_t index_head_dim;
    int32_t index_topk;
    /* 1: the checkpoint's multi-token-prediction module (DeepSeek-V3's model.layers.<num_hidden_layers>.*, a
     * draft that ships inside the target) as a model of its own, of the family of arch: num_layers 1, its decoder
     * layer named model.layers.0.*, its input norms and projection model.mtp.{enorm,hnorm,eh_proj}.weight, its
     * shared head's norm and head as model.norm and lm_head. Each position reads a token and the target's hidden
     * state beside it (eb_context_eval_hidden) and predicts the token after that token. 0: the model itself. */
    int32_t next_token_module;
} eb_model_config;

/* A DeepSeek-V4 layer's attention (eb_model_config.layer_kind). */
enum { EB_V4_SLIDING = 0, EB_V4_CSA = 1, EB_V4_HCA = 2 };

/* One tensor of a checkpoint: where its bytes are in which file. */
typedef struct {
    const char *name;     /* Hugging Face tensor name */
    int32_t file_index;   /* index into the files array of eb_model_load */
    int32_t dtype;        /* eb_dtype */
    int32_t ndim;
    int64_t shape[4];
    uint64_t offset;      /* absolute byte offset of the data in the file */
    uint64_t nbytes;
} eb_tensor_desc;

/* The activations' precision against quantized weights (float formats are always read in f32). */
typedef enum {
    EB_PRECISION_F32 = 0, /* activations and sums in f32 against the exactly dequantized weights: the reference mode's,
                             placement-invariant, equal to the float model of the dequantized weights */
    EB_PRECISION_Q8 = 1   /* activations quantized to int8 per block (32 values against Q8_0 and MXFP4, 256 against
                             the K formats), integer products (as llama.cpp's CPU kernels):
                             faster, deterministic and placement-invariant across CPU and GPU devices (the GPU
                             modules compute the cpu module's x86 kernels' bits), another result */
} eb_precision;

typedef enum {
    EB_MODE_REFERENCE = 0,  /* expert outputs summed on the primary in ascending expert id: placement-invariant */
    EB_MODE_OWNER_LOCAL = 1 /* each owner pre-sums its experts: fewer bytes back, another float association */
} eb_reduction_mode;

/* Per-device counters of a model, since load or the last reset (busy_ns: since the runtime started). */
typedef struct {
    uint64_t experts_run;       /* expert invocations: an expert with at least one row in a layer step */
    uint64_t rows;              /* (token, expert) pairs computed */
    uint64_t bytes_to_device;   /* staged from the primary to this device (inputs and routing plan) */
    uint64_t bytes_from_device; /* copied back to the primary */
    uint64_t waits;             /* times the primary waited for this device to finish a layer's branch */
    uint64_t busy_ns;           /* time the device spent running kernels (monotonic, all models) */
    uint64_t weight_bytes;      /* expert weights this device owns under the current placement */
    uint64_t allocated_bytes;   /* device memory this model holds there: weight copies and staging arenas */
} eb_device_counters;

typedef struct {
    uint64_t joins;             /* MoE layer steps whose experts ran on more than one device */
    uint64_t layer_steps;       /* MoE layer steps */
    uint64_t arena_allocations; /* staging arena (re)allocations: zero on the hot path once warmed up */
    uint64_t uploads;           /* experts copied to a device by placement changes */
    uint64_t host_round_trips;  /* a device primary's MoE layer steps that read routing back to the host */
    uint64_t graph_captures;    /* parts of one-token steps recorded into graphs (a device primary; a step is one
                                   part while every expert is on the primary, else one per host round trip + 1) */
    uint64_t graph_launches;    /* recorded parts launched */
} eb_model_counters;

/* How a model's files are held in host memory, where the CPU devices read them. */
typedef enum {
    EB_WEIGHTS_AUTO = 0, /* COPY where transparent huge pages are enabled and the files take at most half of the
                            memory the CPU device that holds the experts reports free (MemAvailable, less where a
                            cgroup limit or the runtime's memory_limit leaves less); MAP otherwise */
    EB_WEIGHTS_MAP = 1,  /* memory-map the files: pages shared with the page cache, 4 KiB each, read on first use */
    EB_WEIGHTS_COPY = 2  /* read the files into private memory advised for transparent huge pages: each 2 MiB page
                            takes one TLB entry where 4 KiB pages take 512, which streams weights faster */
} eb_weights_mode;

/* Whether a load checks the weights: every value of every weight the model reads, dequantized as its kernels read it,
 * must be a number (no NaN, no inf, no magnitude past 2^64, as a NaN or inf block scale or scale companion, an MXFP4
 * exponent of 255 or an FP8 NaN byte make): otherwise the load is refused naming the file, the tensor and the first bad
 * value's index. It reads every byte of the weights once, by a thread per CPU. */
typedef enum {
    EB_CHECK_WEIGHTS_ON = 0, /* the default */
    EB_CHECK_WEIGHTS_OFF = 1 /* load them unchecked: a bad value then makes NaN logits, which greedy decoding refuses */
} eb_check_weights_mode;

typedef struct {
    int32_t weights;       /* eb_weights_mode */
    int32_t check_weights; /* eb_check_weights_mode */
    /* NULL, or a model of the same engine whose embeddings and head this one reads where both have the same primary
     * and the same tables (a multi-token-prediction module beside its model: a GPU holds them once). The model freed
     * first waits for the other. */
    const struct eb_model *head_of;
} eb_load_options;

/* One weight format of the core's table (EB_FORMATS in this header): what engine/formats.py is made from. */
typedef struct {
    char name[16];       /* "Q4_K" */
    int32_t dtype;       /* eb_dtype: the code */
    int32_t block;       /* values per block (1: a float format) */
    int32_t block_bytes; /* bytes per block */
    int32_t ggml_type;   /* the GGUF file's type code; -1: none */
    int32_t quantized;
    int32_t q8_block;    /* the q8 precision's activation block against it; 0: read with f32 activations */
    int32_t scale_rows;  /* the block of one scale of its scale companion (rows x cols); 0 x 0: it takes none */
    int32_t scale_cols;
} eb_format_desc;

typedef struct {
    int32_t n_layers;
    int32_t n_moe_layers;
    uint64_t weight_bytes;        /* all weights as stored */
    uint64_t expert_bytes;        /* weights of routed experts */
    uint64_t bytes_per_token;     /* weights read per decoded token (top-k experts, no lm_head sharing) */
    int32_t primary_device;
    int32_t weights;              /* how the files are held: EB_WEIGHTS_MAP or EB_WEIGHTS_COPY (never AUTO) */
    uint64_t file_bytes;          /* the checkpoint's files, all of them */
    uint64_t huge_page_bytes;     /* of a copy, the bytes the kernel backs with huge pages at load (0 when mapped) */
    uint64_t kv_bytes_per_token;  /* KV cache per position, all layers (MLA: the latent and the rope key; the
                                     full-attention layers only where some layers have a window) */
    uint64_t kv_window_bytes;     /* the KV cache of the sliding-window layers at their windows, whatever the
                                     context's length (a context of batches of b rows holds b - 1 rows more each) */
    uint64_t shared_expert_bytes; /* weights of the shared experts, read on the primary every token */
} eb_model_info;

const char *eb_last_error(void);
/* Bytes of a row of cols values in a weight format (eb_dtype), 0 where cols is not a whole number of its blocks. */
uint64_t eb_format_row_bytes(int32_t dtype, int64_t cols);
/* The formats: codes 0 .. eb_format_count() - 1, each described by eb_format_info (EB_ERR_RANGE past the last). */
int32_t eb_format_count(void);
int eb_format_info(int32_t dtype, eb_format_desc *out);
/* n values (a whole number of blocks) of a row in a weight format, as f32: the values every kernel computes with (of a
 * format with a scale companion, the values before their scales: each is then multiplied by its block's scale). */
int eb_dequantize(int32_t dtype, const void *src, uint64_t src_bytes, int64_t n, float *out);
const char *eb_status_name(int status);
uint32_t eb_runtime_abi_version(void); /* the runtime-module ABI this core loads */

/* Objects may be freed in any order: an engine outlives its models and a model its contexts (a destroy or free
 * called earlier takes effect when the last dependent object is freed). */
int eb_engine_create(eb_engine **out);
void eb_engine_destroy(eb_engine *engine);
/* Load the runtime module `name` (e.g. "cpu"). path NULL: the file expertbench_rt_<name>.so in the folder of
 * the core library itself. A given path is authoritative: if it cannot be loaded, that is the error. */
int eb_engine_load_runtime(eb_engine *engine, const char *name, const char *path,
                           const eb_runtime_options *options);
int eb_engine_runtime_count(const eb_engine *engine);
int eb_engine_runtime_info(const eb_engine *engine, int index, eb_runtime_info *out);
int eb_engine_device_count(const eb_engine *engine);
int eb_engine_device_info(const eb_engine *engine, int index, eb_device_info *out);
/* Index of a device by its name ("cpu:0"), or -1 with an error. */
int eb_engine_find_device(const eb_engine *engine, const char *name, int32_t *index);
/* The folder the core library was loaded from (where runtime modules are looked for). */
int eb_core_location(char *buf, size_t len);

/* Map or copy the files (options NULL: EB_WEIGHTS_AUTO) and bind the tensors: validates every offset, size, dtype
 * and shape first. */
int eb_model_load(eb_engine *engine, const eb_model_config *config, const char *const *files, int32_t n_files,
                  const eb_tensor_desc *tensors, int32_t n_tensors, int32_t primary_device,
                  const eb_load_options *options, eb_model **out);
void eb_model_free(eb_model *model);
int eb_model_get_info(const eb_model *model, eb_model_info *out);

/* Expert placement. owners has num_layers * num_experts entries (row-major by layer): the engine device index
 * owning each expert; -1 for every entry of a layer that is not an MoE layer. Every new placement is checked
 * first (devices, ranges, memory on each device); if anything fails, the previous placement stays intact.
 * Moving experts uploads only what moved and frees the old copies. No context may be evaluating meanwhile. */
int eb_model_set_placement(eb_model *model, const int32_t *owners, int64_t n);
int eb_model_get_placement(const eb_model *model, int32_t *owners, int64_t n);
/* Expert weight bytes each device would own under owners (out has one entry per engine device). */
int eb_model_placement_bytes(const eb_model *model, const int32_t *owners, int64_t n, uint64_t *out,
                             int32_t n_devices);
int eb_model_device_counters(const eb_model *model, int32_t device, eb_device_counters *out);
int eb_model_get_counters(const eb_model *model, eb_model_counters *out);
void eb_model_reset_counters(eb_model *model);
/* Routing statistics since load or the last reset: hits has num_layers * num_experts entries (row-major by
 * layer), the number of tokens routed to each expert; tokens has num_layers entries, the tokens each layer
 * routed (0 for dense layers). Either may be NULL. */
int eb_model_routing_counts(const eb_model *model, uint64_t *hits, int64_t n_hits, uint64_t *tokens, int32_t n_layers);
void eb_model_reset_routing(eb_model *model);
/* Whether evaluation counts into the routing statistics (1, the default); 0 for decodes that only measure (a
 * calibration): their routing is not the workload's. */
int eb_model_set_routing_counting(eb_model *model, int32_t enabled);

/* A decoding context: a KV cache of n_ctx positions and scratch for batches of up to n_batch positions.
 * Everything it needs is allocated here; eval allocates nothing. */
int eb_context_create(eb_model *model, int32_t n_ctx, int32_t n_batch, eb_context **out);
/* The same with the KV cache kept in kv_dtype: EB_DTYPE_F32 (eb_context_create's, the reference), EB_DTYPE_F16 or
 * EB_DTYPE_BF16 (half the bytes: each key and value rounded to the nearest when stored, read back exactly; a fast
 * mode, not the reference's output). Refused (EB_ERR_UNSUPPORTED, naming why) for a family whose cache is other state
 * (DeepSeek-V3's latent, DeepSeek-V4's), heads wider than 512, and a primary device whose module keeps f32 only. */
int eb_context_create_kv(eb_model *model, int32_t n_ctx, int32_t n_batch, int32_t kv_dtype, eb_context **out);
void eb_context_free(eb_context *ctx);
/* Append n positions. logits: NULL, or room for n rows of vocab_size floats (all_rows = 1) or one row (the
 * last position, all_rows = 0). On error nothing is appended. */
int eb_context_eval(eb_context *ctx, const int32_t *ids, int32_t n, float *logits, int32_t all_rows);
/* eb_context_eval with the hidden states a multi-token-prediction module reads. hidden_in: n rows of hidden_size
 * floats, required for a next_token_module model (row t: the target's hidden state at the position before ids[t]'s),
 * NULL for any other. hidden_out: NULL, or room for n rows of hidden_size: each position's last hidden state after
 * the final norm, what the model's head reads (a target's: the next token module's hidden_in; a module's own:
 * the hidden_in of its next chained step). */
int eb_context_eval_hidden(eb_context *ctx, const int32_t *ids, int32_t n, float *logits, int32_t all_rows,
                           const float *hidden_in, float *hidden_out);
/* Greedy decoding: out[0] = first (chosen by the caller, from the logits of the positions so far); then, until n
 * tokens are chosen or the last one chosen is one of stop_ids, append the last one chosen and choose the argmax of
 * its logits (the first of equal values; numpy's argmax). Every chosen token but the last is appended. *n_out: the
 * tokens chosen (out has room for n), also on an error, which keeps the positions appended before it. Logits that
 * hold NaN or inf are EB_ERR_NUMERIC naming the step (the index in out of the token they would choose), the position
 * and the first bad token id. */
int eb_context_greedy(eb_context *ctx, int32_t first, int32_t n, const int32_t *stop_ids, int32_t n_stop,
                      int32_t *out, int32_t *n_out);
/* Forget every position from pos on (0 <= pos <= current position). */
int eb_context_truncate(eb_context *ctx, int32_t pos);
int32_t eb_context_position(const eb_context *ctx);
int eb_context_set_mode(eb_context *ctx, int32_t mode); /* eb_reduction_mode; reference by default */
int eb_context_set_precision(eb_context *ctx, int32_t precision); /* eb_precision; f32 by default */
int32_t eb_context_capacity(const eb_context *ctx);
/* A device primary records a one-token step into graphs (one per part between host round trips) and replays them
 * (enabled = 1, the default); 0 queues each step's work anew. Results are the same either way. */
int eb_context_set_graphs(eb_context *ctx, int32_t enabled);
/* Experts per token of this context's steps: 1..the count the model was loaded with (its buffers are sized for that;
 * the default), and with grouped routing at most the kept groups' experts. A speed choice with a quality cost; the
 * routing statistics count the experts chosen. A GPU primary's recorded steps are recorded anew. The getter: the
 * context's count (0 for a model without experts, -1 for NULL). */
int eb_context_set_top_k(eb_context *ctx, int32_t top_k);
int32_t eb_context_top_k(const eb_context *ctx);
/* The per-token trace. Spans are kept per context while enabled (capacity > 0: room for that many; 0 turns it off
 * and frees it); read moves the oldest up to `room` of them out, and *lost says how many did not fit since the
 * last read. Times are the host's CLOCK_MONOTONIC in nanoseconds. On a primary whose operations are queued (a GPU),
 * its spans time the queuing and the waits; its peers' expert spans come from their completion events. */
typedef enum {
    EB_SPAN_EMBED = 0,
    EB_SPAN_ATTENTION = 1, /* norm, q/k/v, attention and the output projection of one layer */
    EB_SPAN_ROUTE = 2,     /* norm and router of a MoE layer */
    EB_SPAN_EXPERTS = 3,   /* one owner's routed experts of one layer */
    EB_SPAN_STAGE = 4,     /* on the primary: routing and rows read back; on a staged peer: its rows' upload, and
                            * its outputs' download, each its own span (the experts' span between them) */
    EB_SPAN_JOIN = 5,      /* the primary waiting for the peers' completion events */
    EB_SPAN_COMBINE = 6,   /* the other owners' outputs sent to the primary and the sum in canonical order */
    EB_SPAN_DENSE = 7,     /* a dense FFN */
    EB_SPAN_LOGITS = 8,    /* final norm and lm_head */
    EB_SPAN_GRAPH = 9,     /* a recorded part of a step, replayed */
    EB_SPAN_SHARED = 10    /* the shared experts of a MoE layer on the primary (while the peers run theirs) */
} eb_span_kind;

typedef struct {
    uint64_t start_ns, end_ns;
    int32_t device; /* engine device index */
    int32_t layer;  /* -1 outside the layers */
    int32_t token;  /* the position of the step's first row */
    int32_t kind;   /* eb_span_kind */
    int32_t rows;   /* rows (positions, or pairs for experts) */
} eb_trace_span;

int eb_context_set_trace(eb_context *ctx, int64_t capacity);
int eb_context_read_trace(eb_context *ctx, eb_trace_span *out, int64_t room, int64_t *n_out, int64_t *lost);
/* EB_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif
