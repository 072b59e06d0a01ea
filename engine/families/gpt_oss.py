"""gpt-oss (GptOssForCausalLM): attention with biases and sinks, every other layer windowed, softmax top-k over the
chosen experts, experts with biases and a clamped SwiGLU, MXFP4 experts in the released checkpoints, YaRN. GGUF:
llama.cpp's gpt-oss."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import UnsupportedError
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
from .synthetic import (
    FORMAT_VERSION,
    INIT_STD,
    DemoRecipe,
    RawTensor,
    Tensor,
    matrix,
    norm_weight,
    normal,
    vector,
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


# ---- the demo pair (engine/checkpoints/demo.py): gpt-oss target and draft in the released MXFP4 layout ---------------


@dataclass(frozen=True)
class GptOssDemoSize:
    """A size of the gpt-oss-shaped pair (family 'gpt-oss'): config.json as GptOssConfig writes it, the experts in the
    released MXFP4 layout. Layers alternate sliding_attention (even) and full_attention (odd); the draft carries
    draft_layers // 2 evenly spaced pairs of them. Every matrix width is a multiple of 32 (MXFP4 blocks)."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int  # even: a sliding and a full attention layer per pair
    draft_layers: int  # even: the draft carries this many of the target's layers, in pairs
    num_experts: int  # num_local_experts
    top_k: int  # num_experts_per_tok
    intermediate_size: int  # each expert's width (gpt-oss's intermediate_size)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int
    max_position_embeddings: int = 4096
    rope_theta: float = 150000.0
    yarn_factor: float = 32.0  # rope_scaling: YaRN as gpt-oss has it (factor 32 over its original context)
    yarn_original_max_position_embeddings: int = 128
    swiglu_limit: float = 7.0
    bias_std: float = 0.1  # of every bias (attention, router, experts)
    sink_std: float = 1.0  # of the attention sinks (one logit per head)
    # std of each expert's deviation from the base MLP, relative to INIT_STD: far smaller than the other families'
    # (a deviation that moves a value past the midpoint between two 4-bit codes moves it a whole step)
    expert_deviation: float = 0.0005
    skipped_layer_scale: float = 0.01  # output scale (o_proj, the experts' down_proj, their biases) of skipped layers
    shard_bytes: int = 1 << 30
    family: str = "gpt-oss"  # in the recipe, so that no manifest of one family passes for another


DEMO_SIZES = {
    # About 110 M parameters in 77 MB of files (the experts MXFP4); acceptance at q=2: 77 %.
    "default": GptOssDemoSize("default", vocab_size=4096, hidden_size=512, num_layers=8, draft_layers=4,
                              num_experts=16, top_k=4, intermediate_size=512, num_heads=12, num_kv_heads=2,
                              head_dim=64, sliding_window=32),
    # gpt-oss-20b's shape scaled down (hidden = intermediate_size, 32 experts, top-4, head_dim 64, window 128):
    # about 0.9 B parameters in 600 MB of files, for speed measurements; acceptance at q=2: 79 %.
    "bench": GptOssDemoSize("bench", vocab_size=32000, hidden_size=1024, num_layers=8, draft_layers=4,
                            num_experts=32, top_k=4, intermediate_size=1024, num_heads=16, num_kv_heads=2,
                            head_dim=64, sliding_window=128, expert_deviation=0.0001, skipped_layer_scale=0.006,
                            shard_bytes=512 << 20),
}  # fmt: skip


def demo_layers(spec: GptOssDemoSize) -> list[int]:
    """Target layer carried by each draft layer: evenly spaced pairs of a sliding and a full attention layer, so that
    the draft's layers alternate as the target's do."""
    pairs, carried = spec.num_layers // 2, spec.draft_layers // 2
    starts = [0] if carried == 1 else [round(j * (pairs - 1) / (carried - 1)) for j in range(carried)]
    return [layer for i in starts for layer in (2 * i, 2 * i + 1)]


# quantization_config of the released gpt-oss checkpoints (openai/gpt-oss-20b's and -120b's config.json)
RELEASED_QUANTIZATION = {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                               "lm_head"],
    "quant_method": "mxfp4",
}  # fmt: skip


def demo_config(spec: GptOssDemoSize, role: str, eos_id: int) -> dict:
    """config.json of the gpt-oss pair: GptOssConfig's keys as transformers saves them, with the released
    checkpoints' swiglu_limit and quantization_config. The draft is the same model with fewer layers and one expert
    (top-1); its layer_types alternate as the target's."""
    layers = spec.num_layers if role == "target" else spec.draft_layers
    return {
        "architectures": ["GptOssForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "bos_token_id": eos_id,
        "dtype": "bfloat16",
        "eos_token_id": eos_id,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "initializer_range": INIT_STD,
        "intermediate_size": spec.intermediate_size,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        "max_position_embeddings": spec.max_position_embeddings,
        "model_type": "gpt_oss",
        "num_attention_heads": spec.num_heads,
        "num_experts_per_tok": spec.top_k if role == "target" else 1,
        "num_hidden_layers": layers,
        "num_key_value_heads": spec.num_kv_heads,
        "num_local_experts": spec.num_experts if role == "target" else 1,
        "output_router_logits": False,
        "quantization_config": RELEASED_QUANTIZATION,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": spec.yarn_factor,
            "original_max_position_embeddings": spec.yarn_original_max_position_embeddings,
            "rope_type": "yarn",
            "truncate": False,
        },
        "rope_theta": spec.rope_theta,
        "router_aux_loss_coef": 0.9,
        "sliding_window": spec.sliding_window,
        "swiglu_limit": spec.swiglu_limit,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": spec.vocab_size,
        "expertbench_synthetic": True,
        "expertbench_demo": {"family": spec.family, "size": spec.name, "role": role, "format": FORMAT_VERSION},
    }


def demo_tensors(spec: GptOssDemoSize, role: str) -> Iterator[Tensor]:
    """The gpt-oss pair's tensors under transformers' GptOssForCausalLM names, the experts in the released MXFP4
    layout (RawTensor: *_blocks and *_scales as uint8), in file order. Target expert e of a layer is its base MLP
    plus a deviation (weights and biases), quantized on its own; a draft layer holds its target layer's attention
    (biases and sinks too) and norms as they are, a router of one expert, and as that expert the MXFP4 of the base
    MLP. The layers the draft skips write small updates: their o_proj and experts' down_proj (with biases) scaled."""
    H, inter, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    yield "model.embed_tokens.weight", (spec.vocab_size, H), lambda: normal("go.embed", (spec.vocab_size, H))
    carried = demo_layers(spec)
    layers = range(spec.num_layers) if role == "target" else carried
    E = spec.num_experts if role == "target" else 1
    dev = spec.expert_deviation if role == "target" else 0.0
    for out_index, t in enumerate(layers):
        p, k = f"model.layers.{t if role == 'target' else out_index}.", f"go.{t}"
        scale = spec.skipped_layer_scale if role == "target" and t not in carried else 1.0
        yield p + "input_layernorm.weight", (H,), norm_weight(f"{k}.input_layernorm", H)
        q_rows, kv_rows = spec.num_heads * hd, spec.num_kv_heads * hd
        for proj, shape, s in (("q_proj", (q_rows, H), 1.0), ("k_proj", (kv_rows, H), 1.0),
                               ("v_proj", (kv_rows, H), 1.0), ("o_proj", (H, q_rows), scale)):  # fmt: skip
            yield p + f"self_attn.{proj}.weight", shape, matrix(f"{k}.{proj}", shape, s)
            yield p + f"self_attn.{proj}.bias", shape[:1], vector(f"{k}.{proj}.bias", shape[0], spec.bias_std * s)
        yield p + "self_attn.sinks", (spec.num_heads,), vector(f"{k}.sinks", spec.num_heads, spec.sink_std)
        yield p + "post_attention_layernorm.weight", (H,), norm_weight(f"{k}.post_attention_layernorm", H)
        yield p + "mlp.router.weight", (E, H), matrix(f"{k}.router", (E, H))
        yield p + "mlp.router.bias", (E,), vector(f"{k}.router.bias", E, spec.bias_std)
        for proj, rows, cols, s in (("gate_up_proj", 2 * inter, H, 1.0), ("down_proj", H, inter, scale)):
            blocks, scales = _mxfp4_experts(k, proj, E, rows, cols, dev, s)
            yield p + f"mlp.experts.{proj}_blocks", (E, rows, cols // 32, 16), blocks
            yield p + f"mlp.experts.{proj}_scales", (E, rows, cols // 32), scales
            yield p + f"mlp.experts.{proj}_bias", (E, rows), _expert_biases(k, proj, E, rows, dev, spec.bias_std * s)
    yield "model.norm.weight", (H,), norm_weight("go.final_norm", H)
    yield "lm_head.weight", (spec.vocab_size, H), lambda: normal("go.lm_head", (spec.vocab_size, H))


def _expert_rows(k: str, proj: str, e: int | None, rows: int, cols: int, deviation: float) -> np.ndarray:
    """One expert's matrix of a gpt-oss layer, one row per output ([rows, cols]): gate_up_proj's rows interleave the
    gate (even rows) and up (odd rows) projections, as the released layout does. e None: the base MLP's."""
    parts = ("gate", "up") if proj == "gate_up_proj" else ("down",)
    out = np.empty((rows, cols), dtype=np.float32)
    for i, part in enumerate(parts):
        w = normal(f"{k}.base.{part}", (rows // len(parts), cols))
        if e is not None and deviation:
            w += normal(f"{k}.expert.{e}.{part}", w.shape, INIT_STD * deviation)
        out[i :: len(parts)] = w
    return out


def _expert_biases(k: str, proj: str, E: int, rows: int, deviation: float, std: float) -> Callable[[], np.ndarray]:
    """[E, rows]: each expert's bias is the base bias plus a deviation (gate and up interleaved as the rows are)."""
    parts = ("gate", "up") if proj == "gate_up_proj" else ("down",)

    def make() -> np.ndarray:
        out = np.empty((E, rows), dtype=np.float32)
        for i, part in enumerate(parts):
            base = normal(f"{k}.base.{part}.bias", (rows // len(parts),), std)
            for e in range(E):
                b = base.copy()
                if deviation:
                    b += normal(f"{k}.expert.{e}.{part}.bias", b.shape, std * deviation)
                out[e, i :: len(parts)] = b
        return out

    return make


def _mxfp4_experts(k: str, proj: str, E: int, rows: int, cols: int, deviation: float,
                   scale: float) -> tuple[RawTensor, RawTensor]:  # fmt: skip
    """The makers of one layer's *_blocks [E, rows, cols/32, 16] and *_scales [E, rows, cols/32]: every expert's
    matrix (times scale) quantized once for both (the writer asks for the blocks, then the scales)."""
    made: dict[str, np.ndarray] = {}

    def quantized() -> dict[str, np.ndarray]:
        if not made:
            blocks = np.empty((E, rows, cols // 32, 16), dtype=np.uint8)
            scales = np.empty((E, rows, cols // 32), dtype=np.uint8)
            for e in range(E):
                w = _expert_rows(k, proj, e, rows, cols, deviation)
                if scale != 1.0:
                    w *= np.float32(scale)
                blocks[e], scales[e] = mxfp4_quantize(w)
            made.update(blocks=blocks, scales=scales)
        return made

    def scales() -> np.ndarray:
        out = quantized()["scales"]
        made.clear()
        return out

    return RawTensor(lambda: quantized()["blocks"]), RawTensor(scales)


# FP4 E2M1: the magnitudes of codes 0..7 (bit 3 is the sign) and the midpoints between neighbours
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
_E2M1_MIDPOINTS = (E2M1[1:] + E2M1[:-1]) / 2


def mxfp4_quantize(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [..., n] (n a multiple of 32) -> (blocks uint8 [..., n/32, 16], scales uint8 [..., n/32]): the OCP MX
    rule as the gpt-oss fixtures' quantizer has it. Per block of 32 values the exponent e = floor(log2(max |x|)) - 2
    (E2M1's largest exponent is 2), stored as e + 127; each x / 2^e rounded to the nearest E2M1 magnitude, ties to
    the even code, past 6 to 6; a value that rounds to zero is +0. Element i of a block is in byte i // 2, the low
    nibble for even i. Dequantized: E2M1[code & 7] * (-1 if code & 8) * 2^(scale - 127) (transformers'
    convert_moe_packed_tensors)."""
    x = np.asarray(rows, dtype=np.float32).reshape(*rows.shape[:-1], -1, 32)
    _, exp = np.frexp(np.abs(x).max(axis=-1))  # max = m * 2^exp, m in [0.5, 1): floor(log2(max)) = exp - 1
    e = np.clip(exp - 3, -127, 127)
    scaled = np.abs(x) * np.exp2(-e).astype(np.float32)[..., None]  # exact: a power of two
    code = np.searchsorted(_E2M1_MIDPOINTS, scaled, side="left")  # on a midpoint: the smaller code
    tie = (code % 2 == 1) & (scaled == _E2M1_MIDPOINTS[np.minimum(code, len(_E2M1_MIDPOINTS) - 1)])
    code = (code + tie).astype(np.uint8)
    code |= np.where((x < 0) & (code > 0), np.uint8(8), np.uint8(0))
    return code[..., 0::2] | (code[..., 1::2] << 4), (e + 127).astype(np.uint8)


def mxfp4_dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The inverse of mxfp4_quantize: (blocks [..., G, 16], scales [..., G]) -> float32 [..., G * 32]."""
    code = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    values = np.where(code & 8, -1.0, 1.0).astype(np.float32) * E2M1[code & 7]
    values *= np.exp2(scales.astype(np.int32) - 127).astype(np.float32)[..., None]
    return values.reshape(*blocks.shape[:-2], -1)


DEMO = DemoRecipe(
    "gpt-oss",
    "gpt-oss",
    "one-expert gpt-oss",
    ("safetensors",),
    DEMO_SIZES,
    demo_config,
    demo_tensors,
    demo_layers,
    folder_weights="MXFP4 experts, BF16 elsewhere",
    tokenizer_config=True,
)


GPT_OSS = Family(
    architecture="gpt_oss",
    title="gpt-oss",
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
    demo=DEMO,
)
