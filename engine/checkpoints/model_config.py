"""What a checkpoint is made of, whatever its file format: the model's hyper-parameters (ModelConfig) and its
tensors as descriptors (TensorInfo). The readers of a Hugging Face folder (engine/checkpoints/checkpoint.py) and of a
GGUF file (engine/checkpoints/gguf_file.py) both produce them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..families import family


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int
    stored_as: str = ""  # its name in the file, where the family reads it under another (Family.folder_tensors)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # the family's name (engine/families/)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    attention_bias: bool
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    synthetic: bool = False
    # RoPE as the core computes it: rotated dims per head (0: head_dim), interleaved pairs, the frequencies of a
    # scaled RoPE (YaRN; empty: rope_theta's), a factor on cos and sin and the softmax scale (0.0: the defaults)
    rope_dim: int = 0
    rope_interleave: bool = False
    rope_inv_freq: tuple[float, ...] = ()
    rope_attention_factor: float = 0.0
    attention_scale: float = 0.0
    # DeepSeek-V3: MLA attention, grouped sigmoid routing, shared experts, leading dense layers
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    n_shared_experts: int = 0
    first_k_dense_replace: int = 0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    # gpt-oss: per layer its attention window (0: full attention; empty: every layer full), attention sinks, experts
    # with biases and the clamped SwiGLU (swiglu_limit 0: plain SwiGLU)
    layer_windows: tuple[int, ...] = ()
    swiglu_limit: float = 0.0
    swiglu_alpha: float = 0.0
    # a family's own fields of the core's config (eb_model_config), by name: numbers, or tuples of them (arrays)
    native_fields: tuple[tuple[str, Any], ...] = ()
    # block-scaled FP8 weights (quantization_config's quant_method 'fp8'): the scale block (rows, cols); empty: none
    weight_block: tuple[int, ...] = ()
    # the checkpoint's multi-token-prediction module as a model of its own (Checkpoint.next_token_module): one layer
    # that reads a token and the target's hidden state beside it
    next_token_module: bool = False

    def is_moe_layer(self, layer: int) -> bool:
        """Whether the layer routes to experts, as its family says (engine/families/)."""
        fam = family(self.architecture)
        return fam.routed and self.num_experts > 0 and fam.moe_layer(self, layer)

    @property
    def shared_expert_intermediate(self) -> int:
        """Width of the shared experts' FFN (all of them as one), 0 without any."""
        return self.moe_intermediate_size * self.n_shared_experts

    @property
    def moe_layers(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.is_moe_layer(i)]
