"""DeepSeek-V3 (DeepseekV3ForCausalLM): multi-head latent attention (MLA), sigmoid routing with a correction bias
over groups of experts, shared experts, leading dense layers, YaRN. GGUF: llama.cpp's deepseek2 (its name for
DeepSeek-V2/V3)."""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedError
from .base import ConfigKeys, Family, GGUFShape, Metadata, gguf_theta, gguf_yarn, gguf_yarn_keys, yarn_rope

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


def _ktransformers(whole: list[int]) -> str | None:
    if not whole:
        return None
    return (f"layers {', '.join(map(str, whole))} have every expert on the GPU: ktransformers' DeepSeek-V3 YAML "
            "optimize rules can also place them whole (a rule matching those layers' mlp.experts with "
            "KTransformersExperts, generate_op KExpertsMarlin)")  # fmt: skip


DEEPSEEK_V3 = Family(
    architecture="deepseek_v3",
    hf_classes=("DeepseekV3ForCausalLM",),
    gguf_arch="deepseek2",
    native_code=3,
    config_keys=config_keys,
    gguf_keys=gguf_keys,
    gguf_layer_tensors=GGUF_LAYER_TENSORS,
    moe_layer=lambda config, layer: config.num_experts > 0 and layer >= config.first_k_dense_replace,
    rope_scaling=True,
    extra_layers=next_token_layers,
    ktransformers_note=_ktransformers,
)
