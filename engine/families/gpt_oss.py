"""gpt-oss (GptOssForCausalLM): attention with biases and sinks, every other layer windowed, softmax top-k over the
chosen experts, experts with biases and a clamped SwiGLU, MXFP4 experts in the released checkpoints, YaRN. GGUF:
llama.cpp's gpt-oss."""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedError
from .base import (
    LAYER_TENSORS,
    ConfigKeys,
    Family,
    GGUFShape,
    Metadata,
    gguf_even_head,
    gguf_theta,
    gguf_yarn,
    gguf_yarn_keys,
    yarn_rope,
)

SWIGLU_ALPHA = 1.702  # transformers' GptOssExperts.alpha (not a config key)
# llama.cpp runs gpt-oss's clamped SwiGLU with these constants (no GGUF key holds them), as transformers does
GGUF_SWIGLU = (7.0, SWIGLU_ALPHA)
# attention biases and sinks, the router's bias, post_attention_norm
GGUF_LAYER_TENSORS = {
    **{
        k: v for k, v in LAYER_TENSORS.items() if k.startswith(("attn_norm", "attn_q.", "attn_k.", "attn_v.", "attn_o"))
    },
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_sinks.weight": "self_attn.sinks",
    "ffn_gate_inp.weight": "mlp.router.weight",
    "ffn_gate_inp.bias": "mlp.router.bias",
}
# the experts' biases are merged like their weights ([inter or hidden, experts] in GGUF order) and become one vector
# per expert
GGUF_EXPERT_BIASES = {
    "ffn_gate_exps.bias": "gate_proj.bias",
    "ffn_up_exps.bias": "up_proj.bias",
    "ffn_down_exps.bias": "down_proj.bias",
}


def config_keys(keys: ConfigKeys, hidden: int, heads: int, layers: int) -> dict[str, Any]:
    """GptOssConfig's keys as transformers reads them: experts (num_local_experts of intermediate_size each), the
    layers' attention kinds and window, the clamped SwiGLU's limit, YaRN, the MXFP4 quantization of the released
    checkpoints. Each inconsistency is named by its key."""
    raw, get, pos_int = keys.raw, keys.get, keys.count
    experts = pos_int("num_local_experts")
    kw: dict[str, Any] = {
        "num_experts": experts,
        "top_k": get("num_experts_per_tok", int, ..., lambda v: 1 <= v <= experts,
                     f"1..num_local_experts ({experts})"),
        "moe_intermediate_size": pos_int("intermediate_size"),
        "norm_topk_prob": True,  # the softmax over the chosen k sums to 1
        "attention_bias": get("attention_bias", bool, True),
        "swiglu_limit": get("swiglu_limit", float, 7.0, lambda v: 0 < v < 1e30, "a positive number"),
        "swiglu_alpha": SWIGLU_ALPHA,
    }  # fmt: skip
    quant = raw.get("quantization_config")
    if quant is not None and (not isinstance(quant, dict) or quant.get("quant_method") != "mxfp4"):
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        keys.fail(f"quantization_config quant_method {method!r} is not supported (expected 'mxfp4', as the released "
                  "gpt-oss checkpoints have, or none)", UnsupportedError)  # fmt: skip
    kinds = raw.get("layer_types")
    if kinds is None:  # GptOssConfig's default: sliding, full, sliding, ...
        kinds = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers:
        got = f"{len(kinds)} entries" if isinstance(kinds, list) else repr(kinds)
        keys.fail(f"'layer_types' has {got}, expected one per layer (num_hidden_layers = {layers})")
    for i, kind in enumerate(kinds):
        if kind not in ("sliding_attention", "full_attention"):
            keys.fail(f"'layer_types'[{i}] = {kind!r}, expected 'sliding_attention' or 'full_attention'")
    max_pos = pos_int("max_position_embeddings")
    window = 0
    if "sliding_attention" in kinds:
        window = pos_int("sliding_window")
        if window > max_pos:
            keys.fail(f"'sliding_window' = {window} is larger than the context ('max_position_embeddings' = "
                      f"{max_pos}), expected at most {max_pos}")  # fmt: skip
    kw["layer_windows"] = tuple(window if kind == "sliding_attention" else 0 for kind in kinds)
    head_dim = pos_int("head_dim", hidden // heads if hidden % heads == 0 else ...)
    if head_dim % 2:
        keys.fail(f"'head_dim' = {head_dim}, expected an even number (RoPE rotates pairs)")
    kw["head_dim"] = head_dim
    scaling = raw.get("rope_scaling")
    if scaling not in (None, {}):
        freq, factor, _ = yarn_rope(scaling, head_dim, keys.rope_theta(), max_pos, keys.path)
        kw["rope_inv_freq"], kw["rope_attention_factor"] = freq, factor
    return kw


def gguf_keys(m: Metadata, s: GGUFShape) -> dict[str, Any]:
    """A gpt-oss file's expert, window and RoPE keys as GptOssConfig's fields (llama.cpp writes them from the
    config.json: conversion/gpt_oss.py), each checked by its key. The windowed layers: the pattern llama.cpp reads
    (attention.sliding_window_pattern, a period or one flag per layer; by default every other layer from the first,
    as transformers' layer_types default)."""
    a, layers, head_dim = s.prefix, s.layers, s.head_dim
    gguf_even_head(m, s)
    experts = m.count(a + "expert_count")
    top_k = m.count(a + "expert_used_count")
    if top_k > experts:
        m.fail(f"'{a}expert_used_count' = {top_k}, expected 1..{experts} ('{a}expert_count')")
    max_pos = m.count(a + "context_length")
    window = m.count(a + "attention.sliding_window")
    if window > max_pos:
        m.fail(f"'{a}attention.sliding_window' = {window} is larger than the context ('{a}context_length' = "
               f"{max_pos}), expected at most {max_pos}")  # fmt: skip
    sliding = m.layer_pattern(a + "attention.sliding_window_pattern", layers, 2)
    rot = m.get(a + "rope.dimension_count", "int", head_dim)
    if rot != head_dim:
        m.fail(f"'{a}rope.dimension_count' = {rot} is not supported (expected the head size {head_dim})",
               UnsupportedError)  # fmt: skip
    kw: dict[str, Any] = dict(
        num_experts=experts, top_k=top_k, norm_topk_prob=True,
        moe_intermediate_size=m.count(a + "expert_feed_forward_length"),
        layer_windows=tuple(window if s else 0 for s in sliding),
        swiglu_limit=GGUF_SWIGLU[0], swiglu_alpha=GGUF_SWIGLU[1],
    )  # fmt: skip
    kind = m.get(a + "rope.scaling.type", "str", "none")
    if kind == "yarn":  # as transformers reads gpt-oss's config.json (truncate: false, which no GGUF key holds)
        scaling = gguf_yarn(m, a, max_pos) | {"truncate": False}
        if a + "rope.scaling.yarn_attn_factor" in m.md:
            scaling["attention_factor"] = m.number(a + "rope.scaling.yarn_attn_factor", ..., lambda v: 0 < v < 1e6,
                                                   "a positive number")  # fmt: skip
        freq, factor, _ = yarn_rope(scaling, head_dim, gguf_theta(m, a), max_pos, m.path, gguf_yarn_keys(a))
        kw.update(rope_inv_freq=freq, rope_attention_factor=factor)
    elif kind != "none":
        m.fail(f"'{a}rope.scaling.type' = {kind!r} is not supported (expected 'yarn' or none)", UnsupportedError)
    if s.routed_layers != set(range(layers)):
        missing = min(set(range(layers)) - s.routed_layers)
        m.fail(f"layer {missing} has no expert router (blk.{missing}.ffn_gate_inp.weight): every gpt-oss layer "
               "routes")  # fmt: skip
    if s.intermediate is None:
        kw["intermediate_size"] = kw["moe_intermediate_size"]
    return kw


def _ktransformers(whole: list[int]) -> str:
    return ("ktransformers' YAML optimize rules have no gpt-oss file (its optimize_rules hold DeepSeek, "
            "Qwen2/Qwen3-MoE, Mixtral, GLM-4-MoE and other families' rules), so only the flags above can say "
            "this placement; they were not checked against a gpt-oss launch of ktransformers (its CPU "
            "experts must run gpt-oss's MXFP4 experts with their biases and the clamped SwiGLU)")  # fmt: skip


GPT_OSS = Family(
    architecture="gpt_oss",
    hf_classes=("GptOssForCausalLM",),
    gguf_arch="gpt-oss",
    native_code=4,
    config_keys=config_keys,
    gguf_keys=gguf_keys,
    gguf_layer_tensors=GGUF_LAYER_TENSORS,
    gguf_expert_biases=GGUF_EXPERT_BIASES,
    moe_layer=lambda config, layer: config.num_experts > 0,
    rope_scaling=True,
    ktransformers_note=_ktransformers,
)
