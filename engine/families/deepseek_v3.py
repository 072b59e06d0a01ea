"""DeepSeek-V3 (DeepseekV3ForCausalLM): multi-head latent attention (MLA), sigmoid routing with a correction bias
over groups of experts, shared experts, leading dense layers, YaRN. GGUF: llama.cpp's deepseek2 (its name for
DeepSeek-V2/V3)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import UnsupportedError
from .base import ConfigKeys, Family, GGUFShape, Metadata, gguf_theta, gguf_yarn, gguf_yarn_keys, yarn_rope
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
    vector,
)

# The converter splits kv_b_proj into attn_k_b ([heads, kv_lora_rank, nope]: the key half transposed) and attn_v_b
# ([heads, v, kv_lora_rank]); older files hold attn_kv_b whole. Their 3-D tensors are bound as 2-D (heads stacked).
GGUF_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
    "attn_k_b.weight": "self_attn.k_b_proj.weight",
    "attn_v_b.weight": "self_attn.v_b_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
}
GATING_SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID


def config_keys(keys: ConfigKeys, hidden: int, heads: int, layers: int) -> dict[str, Any]:
    """DeepseekV3Config's keys as transformers reads them: MLA ranks and head widths, grouped routing, shared experts,
    YaRN. Each inconsistency is named by its key."""
    raw, get = keys.raw, keys.get

    def pos_int(key: str, default: Any = ...) -> int:
        return keys.count(key, default, below=2**16)

    for key, allowed in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc"), ("hidden_act", "silu")):
        if raw.get(key, allowed) != allowed:
            keys.fail(f"{key} {raw[key]!r} is not supported (expected {allowed!r})", UnsupportedError)
    if get("attention_bias", bool, False):
        keys.fail("attention_bias = true is not supported for deepseek_v3 (expected false)", UnsupportedError)
    kw: dict[str, Any] = {
        "q_lora_rank": get("q_lora_rank", int, 0, lambda v: 0 < v < 2**16, "a positive integer below 65536"),
        "kv_lora_rank": pos_int("kv_lora_rank"),
        "qk_nope_head_dim": pos_int("qk_nope_head_dim"),
        "qk_rope_head_dim": get("qk_rope_head_dim", int, ..., lambda v: 0 < v <= 512 and v % 2 == 0,
                                "an even number in 2..512"),
        "v_head_dim": pos_int("v_head_dim"),
        "num_experts": pos_int("n_routed_experts"),
        "moe_intermediate_size": pos_int("moe_intermediate_size"),
        "n_shared_experts": get("n_shared_experts", int, 0, lambda v: 0 <= v <= 64, "0..64"),
        "first_k_dense_replace": get("first_k_dense_replace", int, 0, lambda v: 0 <= v <= layers,
                                     f"0..num_hidden_layers ({layers})"),
        "norm_topk_prob": get("norm_topk_prob", bool, False),
        "routed_scaling_factor": get("routed_scaling_factor", float, 1.0, lambda v: 0 < v < 1e6, "a positive number"),
        "rope_interleave": get("rope_interleave", bool, True),
    }  # fmt: skip
    if get("moe_layer_freq", int, 1) != 1:
        keys.fail(f"moe_layer_freq = {raw['moe_layer_freq']} is not supported (expected 1)", UnsupportedError)
    E = kw["num_experts"]
    kw["n_group"] = n_group = get("n_group", int, 1, lambda v: 1 <= v <= 256, "1..256")
    if E % n_group:
        keys.fail(f"'n_routed_experts' = {E} is not divisible by 'n_group' = {n_group}")
    if n_group > 1 and E // n_group < 2:
        keys.fail(f"'n_group' = {n_group} leaves {E // n_group} expert per group, expected at least 2 (a group "
                  "scores by its two best experts)")  # fmt: skip
    kw["topk_group"] = topk_group = get("topk_group", int, 1, lambda v: v >= 1, "a positive integer")
    if topk_group > n_group:
        keys.fail(f"'topk_group' = {topk_group} is larger than 'n_group' = {n_group}")
    kept = topk_group * (E // n_group)
    kw["top_k"] = get("num_experts_per_tok", int, ..., lambda v: 1 <= v <= kept,
                      f"1..{kept} (the experts of the topk_group groups kept)")  # fmt: skip
    rope = kw["qk_rope_head_dim"]
    kw["head_dim"] = rope  # as DeepseekV3Config sets it: the rotated part
    kw["rope_dim"] = rope
    kw["num_kv_heads"] = heads
    qk = kw["qk_nope_head_dim"] + rope
    scaling = raw.get("rope_scaling")
    theta = keys.rope_theta()
    max_pos = get("max_position_embeddings", int, ..., lambda v: 0 < v < 2**31, "a positive integer")
    kw["attention_scale"] = qk**-0.5
    if scaling not in (None, {}):
        freq, factor, scale = yarn_rope(scaling, rope, theta, max_pos, keys.path)
        kw["rope_inv_freq"], kw["rope_attention_factor"] = freq, factor
        kw["attention_scale"] = qk**-0.5 * scale
    return kw


def gguf_keys(m: Metadata, s: GGUFShape) -> dict[str, Any]:
    """A deepseek2 file's MLA, routing and RoPE keys as DeepseekV3Config's fields (llama.cpp writes them from the
    config.json: conversion of DeepseekV2Model), each checked by its key. One latent is shared by every head:
    head_count_kv is 1, the lengths are MLA's."""
    a, layers = s.prefix, s.layers
    kw: dict[str, Any] = {"num_kv_heads": s.heads}
    gating = m.get(a + "expert_gating_func", "int", None)
    # The converter writes the key only when config.json names scoring_func, which transformers' DeepseekV3Config does
    # not save; llama.cpp then reads softmax (DeepSeek-V2). A router correction bias (exp_probs_b) is V3's sigmoid
    # routing whatever the key says, so a file holding it without the key is read as transformers runs its source.
    biased = any(name.endswith(".exp_probs_b.bias") for name in s.tensor_names)
    if gating != GATING_SIGMOID and not (gating is None and biased):
        found = "missing" if gating is None else f"{gating}"
        m.fail(f"'{a}expert_gating_func' is {found}, expected {GATING_SIGMOID} (sigmoid, DeepSeek-V3): a file with "
               "neither it nor a router correction bias (blk.N.exp_probs_b.bias) is DeepSeek-V2's softmax routing, "
               "which the engine does not run", UnsupportedError)  # fmt: skip
    q_lora = m.get(a + "attention.q_lora_rank", "int", None)
    kw["q_lora_rank"] = 0 if q_lora is None else m.count(a + "attention.q_lora_rank")
    kw["kv_lora_rank"] = m.count(a + "attention.kv_lora_rank")
    rope = m.count(a + "rope.dimension_count")
    if rope % 2 or rope > 512:
        m.fail(f"'{a}rope.dimension_count' = {rope}, expected an even number up to 512")
    qk = m.count(a + "attention.key_length_mla")
    if qk <= rope:
        m.fail(f"'{a}attention.key_length_mla' = {qk}, expected more than '{a}rope.dimension_count' = {rope} "
               "(the nope and rope parts of a query head)")  # fmt: skip
    kw.update(qk_rope_head_dim=rope, qk_nope_head_dim=qk - rope, head_dim=rope, rope_dim=rope, rope_interleave=True)
    kw["v_head_dim"] = m.count(a + "attention.value_length_mla")
    experts = m.count(a + "expert_count")
    n_group = m.count(a + "expert_group_count", 1)
    topk_group = m.count(a + "expert_group_used_count", 1)
    if experts % n_group:
        m.fail(f"'{a}expert_count' = {experts} is not divisible by '{a}expert_group_count' = {n_group}")
    if topk_group > n_group:
        m.fail(f"'{a}expert_group_used_count' = {topk_group} is larger than '{a}expert_group_count' = {n_group}")
    if n_group > 1 and experts // n_group < 2:
        m.fail(f"'{a}expert_group_count' = {n_group} leaves {experts // n_group} expert per group, expected at least 2")
    top_k = m.count(a + "expert_used_count")
    if top_k > topk_group * (experts // n_group):
        m.fail(f"'{a}expert_used_count' = {top_k}, expected at most {topk_group * (experts // n_group)} (the experts "
               "of the groups kept)")  # fmt: skip
    scale = m.number(a + "expert_weights_scale", 0.0, lambda v: 0 <= v < 1e6, "a number in 0..1e6")
    kw.update(num_experts=experts, top_k=top_k, n_group=n_group, topk_group=topk_group,
              routed_scaling_factor=scale or 1.0,  # llama.cpp: 0 (unset) scales nothing
              norm_topk_prob=m.get(a + "expert_weights_norm", "bool", False),
              moe_intermediate_size=m.count(a + "expert_feed_forward_length"),
              n_shared_experts=m.count(a + "expert_shared_count", 0, lo=0),
              first_k_dense_replace=m.count(a + "leading_dense_block_count", 0, lo=0))  # fmt: skip
    lead = kw["first_k_dense_replace"]
    if lead > layers:
        m.fail(f"'{a}leading_dense_block_count' = {lead}, expected 0..{layers}")
    max_pos = m.count(a + "context_length")
    theta = gguf_theta(m, a)
    kw["attention_scale"] = qk**-0.5
    kind = m.get(a + "rope.scaling.type", "str", "none")
    if kind == "yarn":  # as transformers reads the config.json it came from (mscale = mscale_all_dim, as in DeepSeek's)
        mscale = m.number(a + "rope.scaling.yarn_log_multiplier", 0.0, lambda v: 0 <= v < 100, "a number in 0..100")
        scaling = gguf_yarn(m, a, max_pos)
        if mscale:
            scaling["mscale"] = scaling["mscale_all_dim"] = mscale / 0.1
        freq, factor, softmax = yarn_rope(scaling, rope, theta, max_pos, m.path, gguf_yarn_keys(a))
        kw.update(rope_inv_freq=freq, rope_attention_factor=factor, attention_scale=qk**-0.5 * softmax)
    elif kind != "none":
        m.fail(f"'{a}rope.scaling.type' = {kind!r} is not supported (expected 'yarn' or none)", UnsupportedError)
    if s.routed_layers != set(range(lead, layers)):
        m.fail(f"the layers with an expert router ({sorted(s.routed_layers)[:8]}...) are not layers {lead}.."
               f"{layers - 1}: expected every layer from '{a}leading_dense_block_count' = {lead} on")  # fmt: skip
    if s.intermediate is None and lead == 0:
        kw["intermediate_size"] = kw["moe_intermediate_size"]  # unused: every layer is routed
    return kw


def next_token_layers(keys: ConfigKeys) -> int:
    """The released folders hold the multi-token-prediction module as layers num_hidden_layers ..
    num_hidden_layers + num_nextn_predict_layers - 1 (model.layers.61.* in V3)."""
    return keys.get("num_nextn_predict_layers", int, 0, lambda v: 0 <= v <= 64, "0..64")


# The MTP layer's own tensors beside its decoder layer: its input norms and projection, its shared head's norm (the
# module's final norm), and its copies of the embeddings and the head (the model's are read: the same values)
NEXT_TOKEN_NAMES = (
    ("enorm.", "model.mtp.enorm."),
    ("hnorm.", "model.mtp.hnorm."),
    ("eh_proj.", "model.mtp.eh_proj."),
    ("shared_head.norm.", "model.norm."),
    ("shared_head.head.", None),
    ("embed_tokens.", None),
)


def _ktransformers(whole: list[int]) -> str | None:
    if not whole:
        return None
    return (f"layers {', '.join(map(str, whole))} have every expert on the GPU: ktransformers' DeepSeek-V3 YAML "
            "optimize rules can also place them whole (a rule matching those layers' mlp.experts with "
            "KTransformersExperts, generate_op KExpertsMarlin)")  # fmt: skip


# ---- the demo pair (engine/checkpoints/demo.py): a DeepSeek-V3 target and a draft of dense DeepSeek-V3 layers --------


@dataclass(frozen=True)
class DeepSeekDemoSize:
    """A size of the DeepSeek-V3-shaped pair (family 'deepseek'). The first first_k_dense_replace layers are dense,
    with intermediate_size = moe_intermediate_size * (n_shared_experts + 1): the width of a draft layer, which holds
    the shared expert and the base MLP side by side."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    draft_layers: int  # the draft carries this many of the target's layers, evenly spaced
    num_experts: int  # n_routed_experts
    top_k: int  # num_experts_per_tok
    n_group: int
    topk_group: int
    moe_intermediate_size: int
    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_shared_experts: int = 1
    first_k_dense_replace: int = 1
    routed_scaling_factor: float = 2.5
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    yarn_factor: float = 4.0  # rope_scaling: YaRN as DeepSeek-V3 has it, over original_max_position_embeddings
    yarn_original_max_position_embeddings: int = 1024
    router_bias_std: float = 0.1  # e_score_correction_bias: N(0, router_bias_std) (it only changes the choice)
    expert_deviation: float = 0.033  # std of each expert's deviation from the base MLP, relative to INIT_STD
    skipped_layer_scale: float = 0.018  # output scale (o_proj, the experts' down_proj) of the layers the draft skips
    shard_bytes: int = 1 << 30
    family: str = "deepseek"  # in the recipe, so that no manifest of one family passes for the other

    @property
    def intermediate_size(self) -> int:
        return self.moe_intermediate_size * (self.n_shared_experts + 1)


DEMO_SIZES = {
    # About 60 M parameters, like the Qwen3-MoE default.
    "default": DeepSeekDemoSize("default", vocab_size=4096, hidden_size=512, num_layers=8, draft_layers=4,
                                num_experts=16, top_k=4, n_group=4, topk_group=2, moe_intermediate_size=256,
                                num_heads=8, q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=64,
                                qk_rope_head_dim=32, v_head_dim=64),
    # About one billion parameters, the bytes of the Qwen3-MoE bench size, for benchmarks.
    "bench": DeepSeekDemoSize("bench", vocab_size=32000, hidden_size=1024, num_layers=16, draft_layers=4,
                              num_experts=32, top_k=4, n_group=8, topk_group=4, moe_intermediate_size=512,
                              num_heads=16, q_lora_rank=512, kv_lora_rank=256, qk_nope_head_dim=64,
                              qk_rope_head_dim=32, v_head_dim=64, expert_deviation=0.019,
                              skipped_layer_scale=0.009, shard_bytes=512 << 20),
}  # fmt: skip


def demo_layers(spec: DeepSeekDemoSize) -> list[int]:
    return evenly_spaced(spec.num_layers, spec.draft_layers)


def demo_config(spec: DeepSeekDemoSize, role: str, eos_id: int) -> dict:
    """config.json of the DeepSeek pair: DeepseekV3Config's keys as transformers saves them, with DeepSeek's own
    scoring_func and topk_method beside them (as DeepSeek-V3's config.json has them). The draft is the same model
    with fewer layers, every one of them dense (first_k_dense_replace = num_hidden_layers)."""
    layers = spec.num_layers if role == "target" else spec.draft_layers
    qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "first_k_dense_replace": spec.first_k_dense_replace if role == "target" else layers,
        "head_dim": spec.qk_rope_head_dim,
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "initializer_range": INIT_STD,
        "intermediate_size": spec.intermediate_size,
        "kv_lora_rank": spec.kv_lora_rank,
        "max_position_embeddings": spec.max_position_embeddings,
        "moe_intermediate_size": spec.moe_intermediate_size,
        "n_group": spec.n_group,
        "n_routed_experts": spec.num_experts,
        "n_shared_experts": spec.n_shared_experts,
        "norm_topk_prob": True,
        "num_attention_heads": spec.num_heads,
        "num_experts_per_tok": spec.top_k,
        "num_hidden_layers": layers,
        "num_key_value_heads": spec.num_heads,
        "q_lora_rank": spec.q_lora_rank,
        "qk_head_dim": qk,
        "qk_nope_head_dim": spec.qk_nope_head_dim,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
        "rms_norm_eps": 1e-06,
        "rope_interleave": True,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": spec.yarn_factor,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": spec.yarn_original_max_position_embeddings,
            "rope_type": "yarn",
            "type": "yarn",
        },
        "rope_theta": spec.rope_theta,
        "routed_scaling_factor": spec.routed_scaling_factor,
        "scoring_func": "sigmoid",
        "tie_word_embeddings": False,
        "topk_group": spec.topk_group,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "v_head_dim": spec.v_head_dim,
        "vocab_size": spec.vocab_size,
        "expertbench_synthetic": True,
        "expertbench_demo": {"family": spec.family, "size": spec.name, "role": role, "format": FORMAT_VERSION},
    }


def demo_tensors(spec: DeepSeekDemoSize, role: str) -> Iterator[Tensor]:
    """The DeepSeek pair's tensors under transformers' DeepseekV3ForCausalLM names, in file order. Every routed
    expert is the layer's base MLP plus a small deviation; a draft layer holds its target layer's attention and norms
    as they are and, as its dense FFN, the target's dense FFN or [shared expert | base MLP] (gate and up rows stacked,
    down columns side by side, the base's down_proj times routed_scaling_factor)."""
    H, inter, heads = spec.hidden_size, spec.moe_intermediate_size, spec.num_heads
    qk, rope = spec.qk_nope_head_dim + spec.qk_rope_head_dim, spec.qk_rope_head_dim
    shared = inter * spec.n_shared_experts
    yield "model.embed_tokens.weight", (spec.vocab_size, H), lambda: normal("ds.embed", (spec.vocab_size, H))
    carried = demo_layers(spec)
    layers = range(spec.num_layers) if role == "target" else carried
    for out_index, t in enumerate(layers):
        p, k = f"model.layers.{t if role == 'target' else out_index}.", f"ds.{t}"
        scale = spec.skipped_layer_scale if role == "target" and t not in carried else 1.0
        for norm, n in (("input_layernorm", H), ("post_attention_layernorm", H),
                        ("self_attn.q_a_layernorm", spec.q_lora_rank),
                        ("self_attn.kv_a_layernorm", spec.kv_lora_rank)):  # fmt: skip
            yield p + norm + ".weight", (n,), norm_weight(f"{k}.{norm}", n)
        attention = {
            "q_a_proj": ((spec.q_lora_rank, H), 1.0),
            "q_b_proj": ((heads * qk, spec.q_lora_rank), 1.0),
            "kv_a_proj_with_mqa": ((spec.kv_lora_rank + rope, H), 1.0),
            "kv_b_proj": ((heads * (spec.qk_nope_head_dim + spec.v_head_dim), spec.kv_lora_rank), 1.0),
            "o_proj": ((H, heads * spec.v_head_dim), scale),
        }
        for proj, (shape, s) in attention.items():
            yield p + f"self_attn.{proj}.weight", shape, matrix(f"{k}.{proj}", shape, s)
        dense = t < spec.first_k_dense_replace
        if dense or role == "draft":
            I = spec.intermediate_size  # noqa: E741
            for proj, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                if dense:
                    make = matrix(f"{k}.dense.{proj}", shape, scale if proj == "down_proj" else 1.0)
                else:
                    make = _shared_and_base(k, proj, shared, inter, H, spec.routed_scaling_factor)
                yield p + f"mlp.{proj}.weight", shape, make
            continue
        E = spec.num_experts
        yield p + "mlp.gate.weight", (E, H), matrix(f"{k}.router", (E, H))
        yield p + "mlp.gate.e_score_correction_bias", (E,), vector(f"{k}.router_bias", E, spec.router_bias_std)
        shapes = {"gate_proj": (inter, H), "up_proj": (inter, H), "down_proj": (H, inter)}
        for e in range(E):
            for proj, shape in shapes.items():
                out_scale = scale if proj == "down_proj" else 1.0
                yield p + f"mlp.experts.{e}.{proj}.weight", shape, expert(k, e, proj, shape, spec.expert_deviation,
                                                                           out_scale)  # fmt: skip
        for proj in shapes:
            shape, s = ((shared, H), 1.0) if proj != "down_proj" else ((H, shared), scale)
            yield p + f"mlp.shared_experts.{proj}.weight", shape, matrix(f"{k}.shared.{proj}", shape, s)
    yield "model.norm.weight", (H,), norm_weight("ds.final_norm", H)
    yield "lm_head.weight", (spec.vocab_size, H), lambda: normal("ds.lm_head", (spec.vocab_size, H))


def _shared_and_base(k: str, proj: str, shared: int, inter: int, H: int, routed_scale: float):
    """A draft FFN matrix standing for a target MoE layer: the shared expert's and the base MLP's side by side."""

    def make() -> np.ndarray:
        if proj == "down_proj":
            base = normal(f"{k}.base.{proj}", (H, inter))
            base *= np.float32(routed_scale)
            return np.concatenate([normal(f"{k}.shared.{proj}", (H, shared)), base], axis=1)
        return np.concatenate([normal(f"{k}.shared.{proj}", (shared, H)), normal(f"{k}.base.{proj}", (inter, H))])

    return make


DEMO = DemoRecipe(
    "deepseek",
    "DeepSeek-V3",
    "dense DeepSeek-V3",
    ("safetensors",),
    DEMO_SIZES,
    demo_config,
    demo_tensors,
    demo_layers,
    tokenizer_config=True,
)


DEEPSEEK_V3 = Family(
    architecture="deepseek_v3",
    title="DeepSeek-V3",
    hf_classes=("DeepseekV3ForCausalLM",),
    gguf_arch="deepseek2",
    native_code=3,
    config_keys=config_keys,
    gguf_keys=gguf_keys,
    gguf_layer_tensors=GGUF_LAYER_TENSORS,
    moe_layer=lambda config, layer: config.num_experts > 0 and layer >= config.first_k_dense_replace,
    rope_scaling=True,
    extra_layers=next_token_layers,
    next_token_names=NEXT_TOKEN_NAMES,
    ktransformers_note=_ktransformers,
    demo=DEMO,
)
