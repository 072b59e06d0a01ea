"""Qwen3 (dense, Qwen3ForCausalLM: the demo's draft) and Qwen3-MoE (Qwen3MoeForCausalLM): grouped-query attention
with per-head q/k norms, plain RoPE, SwiGLU; the MoE layers route softmax top-k over num_experts experts. GGUF:
llama.cpp's qwen3 and qwen3moe."""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedError
from .base import LAYER_TENSORS, MOE_LAYER_TENSORS, ConfigKeys, Family, GGUFShape, Metadata, gguf_even_head


def _dense_config(keys: ConfigKeys, hidden: int, heads: int, layers: int) -> dict[str, Any]:
    return {}


def _moe_config(keys: ConfigKeys, hidden: int, heads: int, layers: int) -> dict[str, Any]:
    experts = keys.count("num_experts")
    only = keys.get("mlp_only_layers", list, [])
    for v in only:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < layers:
            keys.fail(f"'mlp_only_layers' contains {v!r}, expected layers 0..{layers - 1}")
    return {
        "num_experts": experts,
        "top_k": keys.get("num_experts_per_tok", int, ..., lambda v: 1 <= v <= experts, "1..num_experts"),
        "moe_intermediate_size": keys.count("moe_intermediate_size"),
        "norm_topk_prob": keys.get("norm_topk_prob", bool, False),
        "decoder_sparse_step": keys.count("decoder_sparse_step", 1),
        "mlp_only_layers": tuple(sorted(set(only))),
    }


def _plain_rope(m: Metadata, s: GGUFShape) -> None:
    """The head size RoPE rotates, and the keys that would make the model another computation than the one the
    engine runs (config.json's rope_scaling and use_sliding_window, in llama.cpp's terms)."""
    a, head_dim = s.prefix, s.head_dim
    gguf_even_head(m, s)

    def refuse(key: str, value: Any, expect: str) -> None:
        m.fail(f"'{key}' = {value!r} is not supported (expected {expect})", UnsupportedError)

    kind = m.get(a + "rope.scaling.type", "str", "none")
    if kind != "none":
        refuse(a + "rope.scaling.type", kind, "'none': the engine runs plain RoPE")
    for key in ("rope.scaling.factor", "rope.scale_linear"):
        factor = m.get(a + key, "float", 1.0)
        if factor not in (0.0, 1.0):  # 0: unset, as llama.cpp reads it
            refuse(a + key, factor, "1: no rope scaling")
    attn_factor = m.get(a + "rope.scaling.attn_factor", "float", 1.0)
    if attn_factor != 1.0:
        refuse(a + "rope.scaling.attn_factor", attn_factor, "1")
    rot = m.get(a + "rope.dimension_count", "int", head_dim)
    if rot != head_dim:
        refuse(a + "rope.dimension_count", rot, f"the head size {head_dim}: the engine rotates whole heads")
    if a + "rope.dimension_sections" in m.md:
        refuse(a + "rope.dimension_sections", m.md[a + "rope.dimension_sections"].value, "none: no multi-axis RoPE")
    window = m.get(a + "attention.sliding_window", "int", 0)
    if window:
        refuse(a + "attention.sliding_window", window, "0: the engine runs full attention")
    if a + "attention.sliding_window_pattern" in m.md:
        refuse(a + "attention.sliding_window_pattern", "...", "none: the engine runs full attention")
    if not m.get(a + "attention.causal", "bool", True):
        refuse(a + "attention.causal", False, "true")
    value_length = m.get(a + "attention.value_length", "int", head_dim)
    if value_length != head_dim:
        refuse(a + "attention.value_length", value_length, f"attention.key_length ({head_dim})")
    scale = m.get(a + "expert_weights_scale", "float", 0.0)
    if scale not in (0.0, 1.0):
        refuse(a + "expert_weights_scale", scale, "1: unscaled expert weights")
    gating = m.get(a + "expert_gating_func", "int", 1)
    if gating != 1:
        refuse(a + "expert_gating_func", gating, "1: softmax routing")


def _dense_gguf(m: Metadata, s: GGUFShape) -> dict[str, Any]:
    _plain_rope(m, s)
    if s.routed_layers:
        m.fail(f"a {s.prefix[:-1]} (dense) file holds expert routers (blk.{min(s.routed_layers)}.ffn_gate_inp.weight): "
               "expected qwen3moe as general.architecture", UnsupportedError)  # fmt: skip
    return {}


def _moe_gguf(m: Metadata, s: GGUFShape) -> dict[str, Any]:
    _plain_rope(m, s)
    a = s.prefix
    experts = m.count(a + "expert_count")
    top_k = m.count(a + "expert_used_count")
    if top_k > experts:
        m.fail(f"'{a}expert_used_count' = {top_k}, expected 1..{experts} ('{a}expert_count')")
    # llama.cpp's fallback when the key is absent; qwen3moe normalises the top-k weights unless told otherwise
    fallback = s.intermediate // top_k if s.intermediate else ...
    kw: dict[str, Any] = dict(moe_intermediate_size=m.count(a + "expert_feed_forward_length", fallback),
                              num_experts=experts, top_k=top_k,
                              norm_topk_prob=m.get(a + "expert_weights_norm", "bool", True))  # fmt: skip
    # a layer without a router is dense (the engine runs those; llama.cpp's qwen3moe has none)
    kw["mlp_only_layers"] = tuple(i for i in range(s.layers) if i not in s.routed_layers)
    if s.intermediate is None and not kw["mlp_only_layers"]:
        kw["intermediate_size"] = kw["moe_intermediate_size"]  # unused: every layer is routed
    return kw


def _moe_layer(config, layer: int) -> bool:
    if config.num_experts <= 0 or layer in config.mlp_only_layers:
        return False
    return (layer + 1) % config.decoder_sparse_step == 0


def _ktransformers(whole: list[int]) -> str | None:
    if not whole:
        return None  # its older YAML optimize rules place whole layers' experts, but not for this family on a GPU
    return (f"layers {', '.join(map(str, whole))} have every expert on the GPU: ktransformers' YAML optimize rules can "
            "place a whole layer's experts (KTransformersExperts with generate_op KExpertsMarlin, DeepSeek's rules), "
            "but its Qwen3-MoE rules (KTransformersExpertsV2) run experts with KExpertsCPU only; the flags above are "
            "the supported route")  # fmt: skip


QWEN3 = Family(
    architecture="qwen3",
    hf_classes=("Qwen3ForCausalLM",),
    gguf_arch="qwen3",
    native_code=1,
    config_keys=_dense_config,
    gguf_keys=_dense_gguf,
    gguf_layer_tensors=LAYER_TENSORS,
    moe_layer=lambda config, layer: False,
    routed=False,
)


QWEN3_MOE = Family(
    architecture="qwen3_moe",
    hf_classes=("Qwen3MoeForCausalLM",),
    gguf_arch="qwen3moe",
    native_code=2,
    config_keys=_moe_config,
    gguf_keys=_moe_gguf,
    gguf_layer_tensors=LAYER_TENSORS | MOE_LAYER_TENSORS,
    moe_layer=_moe_layer,
    ktransformers_note=_ktransformers,
)
