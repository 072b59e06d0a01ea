"""Qwen3 (dense, Qwen3ForCausalLM: the demo's draft) and Qwen3-MoE (Qwen3MoeForCausalLM): grouped-query attention
with per-head q/k norms, plain RoPE, SwiGLU; the MoE layers route softmax top-k over num_experts experts. GGUF:
llama.cpp's qwen3 and qwen3moe."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..core.errors import UnsupportedError
from .base import LAYER_TENSORS, MOE_LAYER_TENSORS, ConfigKeys, Family, GGUFShape, Metadata, gguf_even_head
from .synthetic import (
    FORMAT_VERSION,
    INIT_STD,
    DemoRecipe,
    Tensor,
    evenly_spaced,
    expert,
    matrix,
    norm_weight,
    normal,
)


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


# ---- the demo pair (engine/checkpoints/demo.py): a Qwen3-MoE target and a dense Qwen3 draft built from it ------------


@dataclass(frozen=True)
class DemoSize:
    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    draft_layers: int  # the draft carries this many of the target's layers, evenly spaced
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int = 4096
    rope_theta: float = 1000000.0
    expert_deviation: float = 0.033  # std of each expert's deviation from the base MLP, relative to INIT_STD
    skipped_layer_scale: float = 0.018  # output scale (o_proj, down_proj) of the target layers the draft skips
    shard_bytes: int = 1 << 30  # safetensors shards of at most this size (one file when the model fits)


SIZES = {
    # About 60 M parameters (17 M active per token): decodes far above 10 tokens/s on a 2-core laptop CPU.
    "default": DemoSize("default", vocab_size=4096, hidden_size=512, num_layers=8, draft_layers=4, num_experts=16,
                        top_k=4, moe_intermediate_size=256, num_heads=8, num_kv_heads=2, head_dim=64),
    # About one billion parameters, for benchmarks.
    "bench": DemoSize("bench", vocab_size=32000, hidden_size=1024, num_layers=16, draft_layers=4, num_experts=32,
                      top_k=4, moe_intermediate_size=512, num_heads=16, num_kv_heads=4, head_dim=64,
                      expert_deviation=0.024, skipped_layer_scale=0.011, shard_bytes=512 << 20),
    # Qwen3-30B-A3B's layer shape (hidden 2048, 32 heads of 128 with 4 KV heads, 128 experts top-8 of width 768) in
    # 8 layers: 5.1 G parameters (10 GB in bf16), 0.33 G active per token. For the GPU benchmarks (bench/gpu/), where
    # the bench size is launch-bound; its draft's acceptance was not tuned.
    "wide": DemoSize("wide", vocab_size=32000, hidden_size=2048, num_layers=8, draft_layers=4, num_experts=128,
                     top_k=8, moe_intermediate_size=768, num_heads=32, num_kv_heads=4, head_dim=128,
                     expert_deviation=0.024, skipped_layer_scale=0.011),
}  # fmt: skip


def demo_layers(spec: DemoSize) -> list[int]:
    return evenly_spaced(spec.num_layers, spec.draft_layers)


def demo_config(spec: DemoSize, role: str, eos_id: int) -> dict:
    """config.json as transformers writes it for Qwen3MoeForCausalLM (target) / Qwen3ForCausalLM (draft)."""
    common = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "initializer_range": INIT_STD,
        "max_position_embeddings": spec.max_position_embeddings,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": spec.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": spec.vocab_size,
        "expertbench_synthetic": True,
        "expertbench_demo": {"size": spec.name, "role": role, "format": FORMAT_VERSION},
    }
    if role == "draft":
        return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                "intermediate_size": spec.moe_intermediate_size, "num_hidden_layers": spec.draft_layers,
                "max_window_layers": spec.draft_layers, **common}  # fmt: skip
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "decoder_sparse_step": 1,
            "intermediate_size": spec.moe_intermediate_size * spec.top_k, "mlp_only_layers": [],
            "moe_intermediate_size": spec.moe_intermediate_size, "norm_topk_prob": True,
            "num_experts": spec.num_experts, "num_experts_per_tok": spec.top_k, "num_hidden_layers": spec.num_layers,
            "output_router_logits": False, "router_aux_loss_coef": 0.001, **common}  # fmt: skip


def demo_tensors(spec: DemoSize, role: str) -> Iterator[Tensor]:
    """The tensors of the target or the draft, in file order: every expert the layer's base MLP plus a small
    deviation; the draft's layers carry the target layers' attention and base MLPs."""
    H, inter, hd = spec.hidden_size, spec.moe_intermediate_size, spec.head_dim
    yield "model.embed_tokens.weight", (spec.vocab_size, H), lambda: normal("embed", (spec.vocab_size, H))
    carried = demo_layers(spec)
    layers = range(spec.num_layers) if role == "target" else carried
    for out_index, t in enumerate(layers):
        p = f"model.layers.{t if role == 'target' else out_index}."
        skipped = role == "target" and t not in carried
        scale = spec.skipped_layer_scale if skipped else 1.0
        for norm, n in (("input_layernorm", H), ("post_attention_layernorm", H),
                        ("self_attn.q_norm", hd), ("self_attn.k_norm", hd)):  # fmt: skip
            yield p + norm + ".weight", (n,), norm_weight(f"{t}.{norm}", n)
        q_rows, kv_rows = spec.num_heads * hd, spec.num_kv_heads * hd
        yield p + "self_attn.q_proj.weight", (q_rows, H), matrix(f"{t}.q", (q_rows, H))
        yield p + "self_attn.k_proj.weight", (kv_rows, H), matrix(f"{t}.k", (kv_rows, H))
        yield p + "self_attn.v_proj.weight", (kv_rows, H), matrix(f"{t}.v", (kv_rows, H))
        yield p + "self_attn.o_proj.weight", (H, q_rows), matrix(f"{t}.o", (H, q_rows), scale)
        shapes = {"gate_proj": (inter, H), "up_proj": (inter, H), "down_proj": (H, inter)}
        if role == "draft":
            for proj, shape in shapes.items():
                yield p + f"mlp.{proj}.weight", shape, matrix(f"{t}.base.{proj}", shape)
            continue
        dev = spec.expert_deviation
        yield p + "mlp.gate.weight", (spec.num_experts, H), matrix(f"{t}.router", (spec.num_experts, H))
        for e in range(spec.num_experts):
            for proj, shape in shapes.items():
                out_scale = scale if proj == "down_proj" else 1.0
                yield p + f"mlp.experts.{e}.{proj}.weight", shape, expert(t, e, proj, shape, dev, out_scale)
    yield "model.norm.weight", (H,), norm_weight("final_norm", H)
    yield "lm_head.weight", (spec.vocab_size, H), lambda: normal("lm_head", (spec.vocab_size, H))


DEMO = DemoRecipe(
    "qwen3", "Qwen3-MoE", "dense Qwen3", ("safetensors", "gguf"), SIZES, demo_config, demo_tensors, demo_layers
)


QWEN3 = Family(
    architecture="qwen3",
    title="Qwen3",
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
    title="Qwen3-MoE",
    hf_classes=("Qwen3MoeForCausalLM",),
    gguf_arch="qwen3moe",
    native_code=2,
    config_keys=_moe_config,
    gguf_keys=_moe_gguf,
    gguf_layer_tensors=LAYER_TENSORS | MOE_LAYER_TENSORS,
    moe_layer=_moe_layer,
    ktransformers_note=_ktransformers,
    demo=DEMO,
)
