"""What a checkpoint is made of, whatever its file format: the model's hyper-parameters (ModelConfig) and its
tensors as descriptors (TensorInfo). The readers of a Hugging Face folder (engine/checkpoint.py) and of a GGUF file
(engine/gguf_file.py) both produce them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from .errors import CheckpointError, UnsupportedError

MOE_ARCHITECTURES = ("qwen3_moe", "deepseek_v3", "gpt_oss")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # "qwen3" or "qwen3_moe"
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

    def is_moe_layer(self, layer: int) -> bool:
        if self.architecture not in MOE_ARCHITECTURES or self.num_experts <= 0:
            return False
        if self.architecture == "deepseek_v3":
            return layer >= self.first_k_dense_replace
        if self.architecture == "gpt_oss":
            return True
        if layer in self.mlp_only_layers:
            return False
        return (layer + 1) % self.decoder_sparse_step == 0

    @property
    def shared_expert_intermediate(self) -> int:
        """Width of the shared experts' FFN (all of them as one), 0 without any."""
        return self.moe_intermediate_size * self.n_shared_experts

    @property
    def moe_layers(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.is_moe_layer(i)]


def yarn_rope(scaling: Any, dim: int, theta: float, max_pos: int, path: Path,
              keys: dict[str, str] | None = None) -> tuple[tuple[float, ...], float, float]:  # fmt: skip
    """YaRN as transformers computes it (modeling_rope_utils._compute_yarn_parameters, in f32): the frequencies of
    the dim rotated dimensions, the factor on cos and sin, and DeepSeek's softmax factor mscale(factor,
    mscale_all_dim)^2. keys: the file's own names of the values (a GGUF file's metadata keys, by config.json's
    name; rope_theta included), for the errors.

    Each value is held to the domain of the formulas below, so that no file gets a math error or NaN frequencies:
    a dimension's correction is dim * log(original / (2π·beta)) / (2 log(theta)), so theta > 1 and beta > 0 with
    that ratio a finite non-zero float; the ramp runs from beta_fast's dimension up to beta_slow's, so beta_fast >=
    beta_slow; mscale(factor, m) = 0.1·m·ln(factor) + 1 divides, so m >= 0."""
    import numpy as np

    def name(key: str) -> str:
        if keys and key in keys:
            return f"'{keys[key]}'"
        return "'rope_theta'" if key == "rope_theta" else f"rope_scaling: '{key}'"

    def bad(key: str, value: Any, expected: str) -> NoReturn:
        raise CheckpointError(f"'{path}': {name(key)} = {value!r}, expected {expected}")

    if not isinstance(scaling, dict):
        raise CheckpointError(f"'{path}': rope_scaling = {scaling!r}, expected an object")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "yarn":
        raise UnsupportedError(f"'{path}': rope_scaling type {kind!r} is not supported (expected 'yarn' or null)")
    if dim % 2:
        raise CheckpointError(f"'{path}': YaRN over {dim} rotated dimensions, expected an even number (RoPE rotates "
                              "pairs)")  # fmt: skip

    def number(key: str, default: Any) -> float:
        value = scaling.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            bad(key, value, "a number")
        return float(value)

    factor = number("factor", ...)
    if factor is ... or not 1.0 <= factor <= 1e6:  # the GGUF reader's bound; past f32's range a frequency is 0
        bad("factor", scaling.get("factor"), "a number in 1..1e6")
    mscale, mscale_all_dim = number("mscale", 0.0), number("mscale_all_dim", 0.0)
    for key, m in (("mscale", mscale), ("mscale_all_dim", mscale_all_dim)):
        if m < 0:
            bad(key, m, "a number >= 0 (mscale = 0.1·m·ln(factor) + 1 divides, and must stay positive)")
    beta_fast, beta_slow = number("beta_fast", 0.0) or 32.0, number("beta_slow", 0.0) or 1.0
    for key, beta in (("beta_fast", beta_fast), ("beta_slow", beta_slow)):
        if beta < 0:
            bad(key, beta, "a positive number of rotations (its correction dimension takes log(original context / "
                           f"(2π·{key})))")  # fmt: skip
    if beta_fast < beta_slow:
        ramp = "the ramp from extrapolated to interpolated frequencies runs from beta_fast's dimension to beta_slow's"
        bad("beta_fast", beta_fast, f"at least {name('beta_slow')} = {beta_slow!r} ({ramp})")
    original = scaling.get("original_max_position_embeddings") or max_pos
    if isinstance(original, bool) or not isinstance(original, int) or not 0 < original < 2**31:
        bad("original_max_position_embeddings", original, "a positive integer below 2**31")
    if not theta > 1.0:
        bad("rope_theta", theta, "a number > 1 with YaRN scaling (its correction dimensions divide by its logarithm)")
    truncate = scaling.get("truncate", True)
    if not isinstance(truncate, bool):
        bad("truncate", truncate, "true or false")
    attention_factor = number("attention_factor", None)
    if attention_factor is not None and attention_factor < 0:
        bad("attention_factor", attention_factor, "a number >= 0")

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)

    def correction_dim(key: str, rotations: float) -> float:
        ratio = original / (rotations * 2 * math.pi)
        if not 0 < ratio < math.inf:  # a beta near 0 or past 1e307: the ratio overflows or underflows
            bad(key, rotations, f"a number of rotations for which original context / (2π·{key}) is a finite "
                                f"non-zero float ({original} / (2π·{rotations!r}) = {ratio})")  # fmt: skip
        return (dim * math.log(ratio)) / (2 * math.log(theta))

    low, high = correction_dim("beta_fast", beta_fast), correction_dim("beta_slow", beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    f32 = np.float32
    pos_freqs = f32(theta) ** (np.arange(0, dim, 2, dtype=f32) / f32(dim))
    extrapolation, interpolation = f32(1.0) / pos_freqs, f32(1.0) / (f32(factor) * pos_freqs)
    ramp = np.clip((np.arange(dim // 2, dtype=f32) - f32(low)) / f32(high - low), 0, 1).astype(f32)
    keep = f32(1.0) - ramp
    inv_freq = interpolation * (f32(1.0) - keep) + extrapolation * keep
    softmax = get_mscale(factor, mscale_all_dim) ** 2 if mscale_all_dim else 1.0
    return tuple(float(v) for v in inv_freq.astype(f32)), float(attention_factor), float(softmax)
