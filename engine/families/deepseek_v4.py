"""DeepSeek-V4 (DeepseekV4ForCausalLM): one shared key=value head with a sliding window in every layer, compressed
key/value entries beside it (CSA: compressed sparse attention with the Lightning Indexer; HCA: heavily compressed
attention), mHC residual streams, sqrt-softplus routing with a correction bias or, in the first layers, a token-id
hash table, one shared expert, a clamped SwiGLU. GGUF: llama.cpp's deepseek4.

The engine reads and checks a V4 config.json here (read_config: every key transformers 5.25.0's DeepseekV4Config
reads, with the released checkpoints' older names folded in as transformers folds them) and hands it to the core
(config_keys: the shared fields, and the V4 fields of eb_model_config as native_fields), whose forward pass is
native/src/models/deepseek_v4.c over the cpu module's "deepseek_v4" extension. Its GGUF files (llama.cpp's deepseek4,
which its converter writes from the released FP8/FP4 checkpoints: the FP8 matrices dequantized then Q8_0, the FP4
experts repacked to MXFP4, tid2eid I32) are read: gguf_keys hands their keys to read_config under the released
config.json's names (the file's YaRN keys scale the compress RoPE alone, as transformers folds the released
rope_scaling), GGUF_*_TENSORS name their tensors. The released folders themselves are read too (folder_tensors: their
names without the model. prefix, attn.kv_norm, each FP8 matrix's E8M0 '.scale' as the core's scale companion, the
FP4 experts' I8 codes and E8M0 '.scale', which the core packs into MXFP4 rows at load; the MTP module left out).

What transformers computes (models/deepseek_v4/modeling_deepseek_v4.py), all of it in float32 on float32 weights:

* The residual is hc_mult streams of hidden_size: the token's embedding copied into each. Around each of the two
  sublayers of a layer, an mHC block (attn_hc, ffn_hc) takes the streams x [hc, hidden]: f = fn @ rms(flatten(x))
  (an RMSNorm without weight, rms_norm_eps, over hc * hidden values), split into pre [hc], post [hc], comb [hc, hc];
  pre = sigmoid(scale[0] * f_pre + base_pre) + hc_eps, post = 2 sigmoid(scale[1] * f_post + base_post),
  comb = softmax over its last axis of (scale[2] * f_comb + base_comb) + hc_eps, then Sinkhorn: columns normalised
  (each divided by its sum + hc_eps), then hc_sinkhorn_iters - 1 times rows then columns. The sublayer's input is
  sum_j pre_j x_j (then input_layernorm / post_attention_layernorm); its output y gives the new streams
  x'_k = post_k y + sum_j comb[j, k] x_j (comb transposed). After the last layer hc_head collapses the streams (pre
  only: sigmoid(hc_scale * hc_fn @ rms(flatten(x)) + hc_base) + hc_eps), then the final norm and the head.
* Attention (every layer): q_residual = q_a_norm(q_a_proj(x)) [q_lora_rank]; q = q_b_proj(q_residual) per head,
  then an RMSNorm without weight over each head's head_dim; kv = kv_norm(kv_proj(x)) [head_dim], one head that is
  both key and value. RoPE (interleaved pairs) on the last rope_dim channels of q and kv at the token's position.
  Scores q . k * head_dim**-0.5 over the keys of the window (positions t - sliding_window < s <= t) plus, in a CSA
  or HCA layer, the compressed entries the query may see; a learned sink per head joins the softmax and is dropped.
  The output's last rope_dim channels are rotated back (the inverse rotation at the query's position), then the
  grouped output projection: the heads' num_heads * head_dim values split into o_groups groups, each projected by
  its block of o_a_proj to o_lora_rank, the o_groups * o_lora_rank values projected to hidden by o_b_proj.
* Two RoPEs: 'main' (rope_theta, no scaling) for the sliding-window-only layers; 'compress' (compress_rope_theta,
  with the config's YaRN and an attention factor of 1.0 unless named) for every CSA and HCA layer: its queries and
  keys, its compressed entries and its indexer.
* HCA compressor (rate m, 128 in V4-Flash): kv = kv_proj(x), gate = gate_proj(x) + position_bias[i % m]
  ([m, head_dim]); each complete window of m tokens gives one entry: per channel the softmax over the window's m
  tokens of gate weighs kv, the sum goes through the compressor's kv_norm, then the compress RoPE at the window's
  first position. Entry w is seen by query t once its window is complete: w < (t + 1) // m.
* CSA compressor (rate 4): kv_proj and gate_proj give 2 * head_dim channels, the first half feeding the next
  window's entry and the second half this window's: entry w pools, per channel, over 2m slots (window w - 1's first
  halves, window w's second halves; for w = 0 the first slots weigh nothing), same norm and RoPE. The Lightning
  Indexer has the same compressor at index_head_dim; its query q_b_proj(q_residual) [index_n_heads, index_head_dim]
  with the compress RoPE at t; score(t, w) = sum_h w_h relu(q_h . k_w) index_head_dim**-0.5 with
  w_h = weights_proj(x)_h * index_n_heads**-0.5 (x: the attention's input); each query keeps the index_topk best
  entries among those it may see and attends to those alone (with the window's keys).
* MoE (every layer): scores = sqrt(softplus(gate(x))) over n_routed_experts; a 'moe' layer picks the top
  num_experts_per_tok of scores + e_score_correction_bias, a 'hash_moe' layer the experts tid2eid[token id]; the
  chosen scores, divided by their sum (+ 1e-20), times routed_scaling_factor weigh the experts. An expert (and the
  one shared expert, of moe_intermediate_size): down(silu(min(gate, limit)) * clamp(up, -limit, limit)).

A context keeps, per layer: the last sliding_window - 1 keys; per CSA / HCA layer the compressed entries so far
and the partial window's projected kv and gate rows (fewer than m); per CSA layer, for the compressor and the
indexer each, also the first halves of the last complete window (the next entry's overlap) and the indexer's
entries. transformers' own cache of these cannot be cropped (no speculative rollback there); its cached runs, in
any split of the sequence, give its one forward's logits to within 1e-6 (recipes/deepseek_v4.py checks it). The
engine's context keeps instead, per layer and position, the key=value row and the compressors' projected rows, and
per window its entry (computed when the window's last position arrives, from those rows alone): any split of the
sequence, and a truncation, give the same bits.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from ..core.errors import CheckpointError, EngineError, UnsupportedError
from .base import ConfigKeys, Family, GGUFShape, Metadata, gguf_yarn, yarn_rope

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
ATTENTION_TYPES = (SLIDING, CSA, HCA)
# compress_ratios, the released configs' per-layer key: each value names a layer's kind (transformers maps it so;
# the rate of each kind is compress_rates')
RELEASED_RATIOS = {0: SLIDING, 4: CSA, 128: HCA}
HASH, ROUTED = "hash_moe", "moe"
MLP_TYPES = (HASH, ROUTED)
SCORING = "sqrtsoftplus"

# DeepseekV4Config's defaults (transformers 5.25.0), for the keys a config.json may leave out
DEFAULTS: dict[str, Any] = {
    "head_dim": 512,
    "q_lora_rank": 1024,
    "num_experts_per_tok": 6,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "moe_intermediate_size": 2048,
    "routed_scaling_factor": 1.5,
    "max_position_embeddings": 1048576,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "compress_rates": {CSA: 4, HCA: 128},
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1.0e-6,
    "num_hash_layers": 3,
    "swiglu_limit": 10.0,
    "sliding_window": 128,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "num_nextn_predict_layers": 1,
    "partial_rotary_factor": 64 / 512,
}


@dataclass(frozen=True)
class Rope:
    """One of V4's two rotary embeddings ('main', 'compress'): interleaved pairs on the last `dim` channels of a head,
    the dim / 2 frequencies (YaRN's where the config scales it) and the factor on cos and sin."""

    theta: float
    dim: int
    inv_freq: tuple[float, ...]
    attention_factor: float
    yarn: bool


@dataclass(frozen=True)
class V4Config:
    """What DeepSeek-V4's forward pass reads from config.json beyond the shared ModelConfig fields, checked
    (read_config). Per layer: its attention kind (layer_types) and its router kind (mlp_layer_types)."""

    layer_types: tuple[str, ...]
    mlp_layer_types: tuple[str, ...]
    csa_rate: int  # tokens per compressed entry of a CSA layer
    hca_rate: int  # of an HCA layer
    head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    sliding_window: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    routed_scaling_factor: float
    swiglu_limit: float
    main_rope: Rope
    compress_rope: Rope
    next_token_layers: int  # num_nextn_predict_layers: the released folders' mtp.* module, which nothing here loads

    def compress_rate(self, layer: int) -> int:
        """Tokens per compressed entry of the layer; 0 for a sliding-window-only layer."""
        kind = self.layer_types[layer]
        return 0 if kind == SLIDING else self.csa_rate if kind == CSA else self.hca_rate

    @property
    def hash_layers(self) -> tuple[int, ...]:
        return tuple(i for i, kind in enumerate(self.mlp_layer_types) if kind == HASH)


def read_config(keys: ConfigKeys, hidden: int, heads: int, layers: int) -> V4Config:
    """DeepseekV4Config's keys as transformers 5.25.0 reads them, its defaults where a key is left out, the released
    configs' older names (compress_ratios, compress_rate_csa / compress_rate_hca, num_hash_layers, qk_rope_head_dim,
    rope_scaling) folded in as transformers folds them. Each inconsistency is named by its key; a model transformers
    would run but the engine is not to (another scoring function, shared-expert biases) is an UnsupportedError. Keys
    transformers does not read for V4 are not read here either: num_key_value_heads (one key=value head whatever it
    says), n_shared_experts (one shared expert), norm_topk_prob (always renormalised), attention_bias, and
    DeepSeek-V3's n_group, topk_group, first_k_dense_replace and topk_method."""
    get = keys.get

    def count(key: str, below: int = 2**16, low: int = 1) -> int:
        return get(key, int, DEFAULTS.get(key, ...), lambda v: low <= v < below, f"an integer in {low}..{below - 1}")

    def number(key: str, check, expect: str) -> float:
        return get(key, float, DEFAULTS.get(key, ...), check, expect)

    scoring = get("scoring_func", str, SCORING)
    if scoring != SCORING:
        keys.fail(f"scoring_func {scoring!r:.40} is not supported (expected {SCORING!r}, DeepSeek-V4's router)",
                  UnsupportedError)  # fmt: skip
    if get("mlp_bias", bool, False):
        keys.fail("mlp_bias = true is not supported for deepseek_v4 (expected false: the shared expert without "
                  "biases)", UnsupportedError)  # fmt: skip
    # fields transformers declares, and type-checks, but does not read for V4: one key=value head, one shared expert,
    # the chosen weights always renormalised, no attention biases
    for key, kind in (("num_key_value_heads", int), ("n_shared_experts", int), ("norm_topk_prob", bool),
                      ("attention_bias", bool)):  # fmt: skip
        get(key, kind, None)

    head_dim = count("head_dim")
    experts = count("n_routed_experts")
    o_groups = count("o_groups")
    if heads * head_dim % o_groups:
        keys.fail(f"'o_groups' = {o_groups} does not divide num_attention_heads * head_dim = {heads * head_dim} (the "
                  "grouped output projection splits the heads' outputs into o_groups equal groups)")  # fmt: skip
    layer_types = _layer_types(keys, layers)
    mlp_layer_types = _mlp_layer_types(keys, layers)
    rates = _compress_rates(keys, layer_types)
    index_head_dim = count("index_head_dim")
    top_k = f"1..n_routed_experts ({experts})"
    main, compress = _ropes(keys, head_dim, layers)
    if CSA in layer_types and compress.dim > index_head_dim:
        keys.fail(f"'index_head_dim' = {index_head_dim} is smaller than the compress RoPE's {compress.dim} rotated "
                  "channels (the indexer rotates the last channels of its heads)")  # fmt: skip
    return V4Config(
        layer_types=layer_types,
        mlp_layer_types=mlp_layer_types,
        csa_rate=rates[CSA],
        hca_rate=rates[HCA],
        head_dim=head_dim,
        q_lora_rank=count("q_lora_rank"),
        o_groups=o_groups,
        o_lora_rank=count("o_lora_rank"),
        sliding_window=count("sliding_window", below=2**31),
        index_n_heads=count("index_n_heads"),
        index_head_dim=index_head_dim,
        index_topk=count("index_topk", below=2**31),
        hc_mult=count("hc_mult", below=65),
        hc_sinkhorn_iters=count("hc_sinkhorn_iters", below=10_001),
        hc_eps=number("hc_eps", lambda v: 0 <= v < 1, "a number in [0, 1)"),
        num_experts=experts,
        top_k=get("num_experts_per_tok", int, DEFAULTS["num_experts_per_tok"], lambda v: 1 <= v <= experts, top_k),
        moe_intermediate_size=count("moe_intermediate_size"),
        routed_scaling_factor=number("routed_scaling_factor", lambda v: 0 < v < 1e6, "a positive number"),
        swiglu_limit=number("swiglu_limit", lambda v: 0 < v < math.inf, "a positive number"),
        main_rope=main,
        compress_rope=compress,
        next_token_layers=count("num_nextn_predict_layers", below=65, low=0),
    )


def _type_list(keys: ConfigKeys, key: str, layers: int, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A list of one kind per layer, at least num_hidden_layers long (transformers keeps the first num_hidden_layers;
    the entries past them are the next-token-prediction layers')."""
    value = keys.raw[key]
    if not isinstance(value, list) or len(value) < layers:
        found = f"{len(value)} entries" if isinstance(value, list) else repr(value)
        keys.fail(f"'{key}' = {found}, expected a list of one entry per layer (num_hidden_layers = {layers})")
    for i, kind in enumerate(value):
        if kind not in allowed:
            keys.fail(f"'{key}'[{i}] = {kind!r:.60}, expected one of {', '.join(map(repr, allowed))}")
    return tuple(value[:layers])


def _layer_types(keys: ConfigKeys, layers: int) -> tuple[str, ...]:
    """layer_types, else the released compress_ratios (0, 4 or 128 per layer: sliding-window only, CSA, HCA), else
    transformers' default (two HCA layers, then CSA and HCA alternating from HCA)."""
    raw = keys.raw
    ratios = raw.get("compress_ratios")
    from_ratios = None
    if ratios is not None:
        if not isinstance(ratios, list) or len(ratios) < layers:
            found = f"{len(ratios)} entries" if isinstance(ratios, list) else repr(ratios)
            keys.fail(f"'compress_ratios' = {found}, expected at least one per layer (num_hidden_layers = {layers}; "
                      "entries past them are the next-token-prediction layers')")  # fmt: skip
        for i, r in enumerate(ratios):
            if isinstance(r, bool) or r not in RELEASED_RATIOS:
                keys.fail(f"'compress_ratios'[{i}] = {r!r:.60}, expected 0 (sliding window only), 4 (compressed "
                          "sparse attention) or 128 (heavily compressed attention)")  # fmt: skip
        from_ratios = tuple(RELEASED_RATIOS[r] for r in ratios[:layers])
    if raw.get("layer_types") is not None:
        types = _type_list(keys, "layer_types", layers, ATTENTION_TYPES)
        if from_ratios is not None and from_ratios != types:
            layer = next(i for i, (a, b) in enumerate(zip(types, from_ratios, strict=True)) if a != b)
            keys.fail(f"'layer_types'[{layer}] = {types[layer]!r} but 'compress_ratios'[{layer}] = "
                      f"{ratios[layer]!r} ({from_ratios[layer]}): expected both to name the same layers")  # fmt: skip
        return types
    if from_ratios is not None:
        return from_ratios
    rest = [CSA if i % 2 else HCA for i in range(max(layers - 2, 0))]
    return tuple([HCA] * min(layers, 2) + rest)


def _mlp_layer_types(keys: ConfigKeys, layers: int) -> tuple[str, ...]:
    """mlp_layer_types, else the released num_hash_layers (that many hash-routed layers first; 3 where neither is
    given, as transformers has it)."""
    raw = keys.raw
    n_hash = raw.get("num_hash_layers")
    if n_hash is not None:
        expect = f"0..num_hidden_layers ({layers}): the first num_hash_layers layers route by token id"
        n_hash = keys.get("num_hash_layers", int, ..., lambda v: 0 <= v <= layers, expect)
    if raw.get("mlp_layer_types") is not None:
        types = _type_list(keys, "mlp_layer_types", layers, MLP_TYPES)
        if n_hash is not None and types != (HASH,) * n_hash + (ROUTED,) * (layers - n_hash):
            keys.fail(f"'mlp_layer_types' ({', '.join(types)}) is not 'num_hash_layers' = {n_hash} hash-routed layers "
                      "followed by routed ones: expected both to name the same layers")  # fmt: skip
        return types
    if n_hash is None:
        n_hash = min(layers, DEFAULTS["num_hash_layers"])
    return (HASH,) * n_hash + (ROUTED,) * (layers - n_hash)


def _compress_rates(keys: ConfigKeys, layer_types: tuple[str, ...]) -> dict[str, int]:
    """compress_rates ({kind: tokens per entry}, transformers' default where absent) with the released
    compress_rate_csa / compress_rate_hca over it; a kind some layer has must have a rate. Where no layer has a kind
    its rate is 0."""
    raw = keys.raw
    rates = raw.get("compress_rates")
    if rates is None:
        rates = dict(DEFAULTS["compress_rates"])
    elif not isinstance(rates, dict):
        keys.fail(f"'compress_rates' = {rates!r:.80}, expected an object {{kind: tokens per compressed entry}}")
    rates = dict(rates)
    for kind, key in ((CSA, "compress_rate_csa"), (HCA, "compress_rate_hca")):
        if raw.get(key) is not None:
            rates[kind] = keys.get(key, int, ..., lambda v: 0 < v < 2**16, "a positive integer below 65536")
    for kind, rate in rates.items():
        if kind not in (CSA, HCA):
            keys.fail(f"'compress_rates' names {kind!r:.60}, expected {CSA!r} or {HCA!r}")
        if isinstance(rate, bool) or not isinstance(rate, int) or not 0 < rate < 2**16:
            keys.fail(f"'compress_rates'[{kind!r}] = {rate!r:.60}, expected a positive integer below 65536 (tokens per "
                      "compressed entry)")  # fmt: skip
    for kind in (CSA, HCA):
        if kind in layer_types and kind not in rates:
            keys.fail(f"'compress_rates' has no rate for {kind!r}, which layer {layer_types.index(kind)} is")
    return {kind: rates.get(kind, 0) if kind in layer_types else 0 for kind in (CSA, HCA)}


def _rope_dim(keys: ConfigKeys, head_dim: int) -> int:
    """The rotated channels of a head: head_dim * partial_rotary_factor, else the released qk_rope_head_dim, else
    transformers' default (64 of 512); both given, they must agree."""
    raw = keys.raw
    legacy = raw.get("qk_rope_head_dim")
    if legacy is not None:
        legacy = keys.get("qk_rope_head_dim", int, ..., lambda v: 0 < v <= head_dim, f"1..head_dim ({head_dim})")
    if raw.get("partial_rotary_factor") is not None:
        factor = keys.get("partial_rotary_factor", float, ..., lambda v: 0 < v <= 1, "a number in (0, 1]")
        dim, key = int(head_dim * factor), "partial_rotary_factor"
        if legacy is not None and legacy != dim:
            keys.fail(f"'qk_rope_head_dim' = {legacy} but 'partial_rotary_factor' = {factor!r} of head_dim {head_dim} "
                      f"rotates {dim} channels: expected them to agree")  # fmt: skip
    elif legacy is not None:
        dim, key = legacy, "qk_rope_head_dim"
    else:
        dim, key = int(head_dim * DEFAULTS["partial_rotary_factor"]), "head_dim"
    _even_rope(keys, key, dim, head_dim)
    return dim


def _even_rope(keys: ConfigKeys, key: str, dim: int, head_dim: int) -> None:
    if dim < 2 or dim % 2:
        keys.fail(f"'{key}' makes the RoPE rotate {dim} channels of head_dim {head_dim}, expected an even number >= 2 "
                  "(RoPE rotates pairs)")  # fmt: skip


def _ropes(keys: ConfigKeys, head_dim: int, layers: int) -> tuple[Rope, Rope]:
    """The main and compress RoPEs. rope_parameters nested by rope kind ({'main': {...}, 'compress': {...}}, as
    transformers saves them) is read as it stands; else rope_parameters or the released rope_scaling (one flat YaRN
    object, or none) scales the compress RoPE alone, with rope_theta for the main RoPE and compress_rope_theta for
    the other, as transformers folds them."""
    raw = keys.raw
    max_pos = keys.get("max_position_embeddings", int, DEFAULTS["max_position_embeddings"], lambda v: 0 < v < 2**31,
                       "a positive integer")  # fmt: skip
    params = raw.get("rope_parameters")
    key = "rope_parameters"
    if params is None:
        params, key = raw.get("rope_scaling"), "rope_scaling"
    if params is not None and not isinstance(params, dict):
        keys.fail(f"'{key}' = {params!r:.80}, expected an object")
    params = params or {}
    dim = _rope_dim(keys, head_dim)  # checked in either form: transformers keeps it as the config's qk_rope_head_dim
    if isinstance(params.get("main"), dict) and isinstance(params.get("compress"), dict):
        # transformers reads each as it stands: a partial_rotary_factor left out there rotates the whole head
        return tuple(_nested_rope(keys, f"{key}.{kind}", params[kind], head_dim, max_pos)
                     for kind in ("main", "compress"))  # fmt: skip
    theta = keys.get("rope_theta", float, DEFAULTS["rope_theta"], lambda v: 1 <= v <= 1e12, "a number in 1..1e12")
    compress_theta = keys.get("compress_rope_theta", float, DEFAULTS["compress_rope_theta"],
                              lambda v: 1 <= v <= 1e12, "a number in 1..1e12")  # fmt: skip
    scaling = {k: v for k, v in params.items() if k not in ("main", "compress")}
    if _rope_type(keys, key, scaling) == "yarn":
        scaling.setdefault("attention_factor", 1.0)  # V4's: YaRN's mscale is not applied to cos and sin
    names = {k: f"{key}.{k}" for k in YARN_KEYS} | {"rope_theta": "compress_rope_theta"}
    main = _rope({"rope_type": "default"}, dim, theta, max_pos, keys, names)
    return main, _rope(scaling, dim, compress_theta, max_pos, keys, names)


YARN_KEYS = ("factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "original_max_position_embeddings",
             "attention_factor", "truncate")  # fmt: skip


def _rope_type(keys: ConfigKeys, where: str, params: dict) -> str:
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "yarn"):
        keys.fail(f"'{where}' rope_type {kind!r:.40} is not supported (expected 'default' or 'yarn')", UnsupportedError)
    return kind


def _nested_rope(keys: ConfigKeys, where: str, params: Any, head_dim: int, max_pos: int) -> Rope:
    """One RoPE of a nested rope_parameters: its own rope_theta (required) and partial_rotary_factor (1.0 where
    absent, as transformers reads it)."""
    if not isinstance(params, dict):
        keys.fail(f"'{where}' = {params!r:.80}, expected an object")
    theta = params.get("rope_theta")
    if isinstance(theta, bool) or not isinstance(theta, int | float) or not 1 <= theta <= 1e12:
        keys.fail(f"'{where}.rope_theta' = {theta!r:.40}, expected a number in 1..1e12")
    factor = params.get("partial_rotary_factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
        keys.fail(f"'{where}.partial_rotary_factor' = {factor!r:.40}, expected a number in (0, 1]")
    dim = int(head_dim * factor)
    _even_rope(keys, f"{where}.partial_rotary_factor", dim, head_dim)
    _rope_type(keys, where, params)
    names = {k: f"{where}.{k}" for k in (*YARN_KEYS, "rope_theta")}
    return _rope(params, dim, float(theta), max_pos, keys, names)


def _rope(params: dict, dim: int, theta: float, max_pos: int, keys: ConfigKeys, names: dict[str, str]) -> Rope:
    """The frequencies of one RoPE over dim channels: YaRN's (base.yarn_rope, which names a bad value by `names`)
    or theta's."""
    if params.get("rope_type", params.get("type", "default")) == "yarn":
        freq, factor, _ = yarn_rope(params, dim, theta, max_pos, keys.path, names)
        return Rope(theta, dim, freq, factor, True)
    f32 = np.float32
    freq = f32(1.0) / (f32(theta) ** (np.arange(0, dim, 2, dtype=f32) / f32(dim)))
    return Rope(theta, dim, tuple(float(v) for v in freq), 1.0, False)


def config_keys(keys: ConfigKeys, hidden: int, heads: int, layers: int) -> dict[str, Any]:
    """The shared ModelConfig fields V4 has the meaning of (read_config checks every V4 key): one key=value head of
    head_dim, the experts (each layer routes; one shared expert, whose width is also intermediate_size), the
    chosen weights renormalised, the main RoPE's rotated channels (interleaved) and frequencies, the softmax scale,
    the clamped SwiGLU's limit; the rest (native_fields) goes to the core's DeepSeek-V4 fields as it stands."""
    v4 = read_config(keys, hidden, heads, layers)
    if v4.main_rope.dim != v4.compress_rope.dim:
        keys.fail(f"rope_parameters: the main RoPE rotates {v4.main_rope.dim} channels and the compress RoPE "
                  f"{v4.compress_rope.dim}: expected the same number (the engine's V4 rotates one slice of a head)",
                  UnsupportedError)  # fmt: skip
    for rope, kind in ((v4.main_rope, "main"), (v4.compress_rope, "compress")):
        if rope.attention_factor != 1.0:
            keys.fail(f"rope_parameters: the {kind} RoPE's attention factor is {rope.attention_factor}, expected 1.0 "
                      "(V4 does not scale cos and sin)", UnsupportedError)  # fmt: skip
    kinds = {SLIDING: 0, CSA: 1, HCA: 2}
    native = {
        "hc_mult": v4.hc_mult,
        "hc_sinkhorn_iters": v4.hc_sinkhorn_iters,
        "hc_eps": v4.hc_eps,
        "o_groups": v4.o_groups,
        "o_lora_rank": v4.o_lora_rank,
        "sliding_window": v4.sliding_window,
        "layer_kind": tuple(kinds[k] for k in v4.layer_types),
        "layer_hash": tuple(int(k == HASH) for k in v4.mlp_layer_types),
        "n_layer_kind": layers,
        "csa_rate": v4.csa_rate,
        "hca_rate": v4.hca_rate,
        "compress_inv_freq": tuple(float(f) for f in v4.compress_rope.inv_freq),
        "index_n_heads": v4.index_n_heads,
        "index_head_dim": v4.index_head_dim,
        "index_topk": v4.index_topk,
    }
    return {
        "num_kv_heads": 1,
        "head_dim": v4.head_dim,
        "intermediate_size": v4.moe_intermediate_size,
        "num_experts": v4.num_experts,
        "top_k": v4.top_k,
        "moe_intermediate_size": v4.moe_intermediate_size,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": v4.routed_scaling_factor,
        "q_lora_rank": v4.q_lora_rank,
        "rope_dim": v4.main_rope.dim,
        "rope_interleave": True,
        "rope_inv_freq": tuple(float(f) for f in v4.main_rope.inv_freq),
        "attention_scale": v4.head_dim**-0.5,
        "swiglu_limit": v4.swiglu_limit,
        "native_fields": tuple(native.items()),
    }


# config.json's key -> the deepseek4 file's key (after 'deepseek4.'), as llama.cpp's converter writes them
GGUF_KEYS = {
    "max_position_embeddings": "context_length",
    "head_dim": "attention.key_length",
    "qk_rope_head_dim": "rope.dimension_count",
    "q_lora_rank": "attention.q_lora_rank",
    "sliding_window": "attention.sliding_window",
    "moe_intermediate_size": "expert_feed_forward_length",
    "routed_scaling_factor": "expert_weights_scale",
    "index_n_heads": "attention.indexer.head_count",
    "index_head_dim": "attention.indexer.key_length",
    "index_topk": "attention.indexer.top_k",
    "o_groups": "attention.output_group_count",
    "o_lora_rank": "attention.output_lora_rank",
    "compress_ratios": "attention.compress_ratios",
    "compress_rope_theta": "attention.compress_rope_freq_base",
    "hc_mult": "hyper_connection.count",
    "hc_sinkhorn_iters": "hyper_connection.sinkhorn_iterations",
    "hc_eps": "hyper_connection.epsilon",
    "num_hash_layers": "hash_layer_count",
    "n_routed_experts": "expert_count",
    "num_experts_per_tok": "expert_used_count",
    "rope_theta": "rope.freq_base",
    "num_nextn_predict_layers": "nextn_predict_layers",
    "swiglu_limit": "swiglu_clamp_exp",
}
GGUF_OPTIONAL = ("num_nextn_predict_layers", "compress_rope_theta", "rope_theta")
GATING_SQRTSOFTPLUS = 4  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SQRTSOFTPLUS


class _GGUFKeys(ConfigKeys):
    """A deepseek4 file's metadata under config.json's keys (the released configs' spelling), so that read_config
    checks a file as it checks a folder; each error names the file's key."""

    def __init__(self, raw: dict, path: Path, names: dict[str, str]):
        super().__init__(raw, path)
        self.names = names

    def fail(self, message: str, cls: type[EngineError] = CheckpointError) -> NoReturn:
        for key, gguf_key in self.names.items():
            message = message.replace(f"'{key}'", f"'{gguf_key}'")
        super().fail(message, cls)


def gguf_keys(m: Metadata, s: GGUFShape) -> dict[str, Any]:
    """A deepseek4 file's keys (llama.cpp's converter writes them from the released config.json: its
    compress_ratios, num_hash_layers, qk_rope_head_dim, one flat YaRN rope_scaling) as the config.json they were
    written from, read by read_config as a folder's. What llama.cpp can state but transformers' V4 does not run is
    refused by its key: a router other than sqrt-softplus, a shared-expert count other than one, weights not
    renormalised, a SwiGLU limit per layer or apart for the shared expert, key/value heads other than one."""
    a = s.prefix
    names = {k: a + v for k, v in GGUF_KEYS.items()} | {"rope_scaling": a + "rope.scaling.*"}
    raw: dict[str, Any] = {}
    for key, gkey in names.items():
        value = m.md.get(gkey)
        if value is None:
            if key not in GGUF_OPTIONAL and key != "rope_scaling":
                m.fail(f"metadata key '{gkey}' is missing")
            continue
        raw[key] = value.value
    raw.setdefault("num_nextn_predict_layers", 0)  # llama.cpp writes it only for a file that holds the MTP layers
    limits = raw.pop("swiglu_limit", None)
    shared = m.md.get(a + "swiglu_clamp_shexp")
    for key, value in ((a + "swiglu_clamp_exp", limits), (a + "swiglu_clamp_shexp", shared and shared.value)):
        if not isinstance(value, list) or len(value) != s.layers or len(set(value)) != 1:
            m.fail(f"'{key}' = {value!r:.80}, expected one SwiGLU limit per layer, the same for every layer (the "
                   "engine's V4 clamps every layer's experts at one limit)", UnsupportedError)  # fmt: skip
    if limits[0] != shared.value[0]:
        m.fail(
            f"'{a}swiglu_clamp_exp' ({limits[0]}) and '{a}swiglu_clamp_shexp' ({shared.value[0]}) differ: expected "
            "the routed and shared experts clamped at one limit, as DeepSeek-V4's swiglu_limit",
            UnsupportedError,
        )
    raw["swiglu_limit"] = float(limits[0])
    gating = m.get(a + "expert_gating_func", "int")
    if gating != GATING_SQRTSOFTPLUS:
        m.fail(f"'{a}expert_gating_func' = {gating}, expected {GATING_SQRTSOFTPLUS} (sqrt-softplus, DeepSeek-V4's "
               "router)", UnsupportedError)  # fmt: skip
    if m.count(a + "expert_shared_count") != 1:
        m.fail(f"'{a}expert_shared_count' = {m.count(a + 'expert_shared_count')}, expected 1 (DeepSeek-V4's one "
               "shared expert)", UnsupportedError)  # fmt: skip
    if not m.get(a + "expert_weights_norm", "bool"):
        m.fail(f"'{a}expert_weights_norm' is false, expected true (DeepSeek-V4 renormalises the chosen experts' "
               "weights)", UnsupportedError)  # fmt: skip
    if m.count(a + "attention.head_count_kv", 1) != 1:
        m.fail(f"'{a}attention.head_count_kv' = {m.count(a + 'attention.head_count_kv')}, expected 1 (one key=value "
               "head)")  # fmt: skip
    if m.get(a + "rope.scaling.type", "str", "none") == "yarn":
        raw["rope_scaling"] = gguf_yarn(m, a, m.count(a + "context_length"))
    elif m.get(a + "rope.scaling.type", "str", "none") != "none":
        m.fail(f"'{a}rope.scaling.type' = {m.get(a + 'rope.scaling.type', 'str')!r}, expected 'yarn' or none",
               UnsupportedError)  # fmt: skip
    out_width = m.get(a + "embedding_length_out", "int", s.hidden * raw.get("hc_mult", 1))
    keys = _GGUFKeys(raw, m.path, names)
    kw = config_keys(keys, s.hidden, s.heads, s.layers)
    hc = dict(kw["native_fields"])["hc_mult"]
    if out_width != s.hidden * hc:
        m.fail(f"'{a}embedding_length_out' = {out_width}, expected embedding_length x hyper_connection.count = "
               f"{s.hidden * hc} (the residual streams)")  # fmt: skip
    return kw


# ---- tensors -----------------------------------------------------------------------------------------------------

# A transformers folder's tensors, by the name save_pretrained gives them: transformers 5.25.0's conversion mapping
# writes the released checkpoints' names (layers.N.attn.wq_a.weight, ffn.experts.M.w1.weight, hc_attn_fn, ...) under
# model.layers.N., the embeddings, final norm and hc_head under their module names, the head as head.weight.
GLOBAL_TENSORS = ("model.embed_tokens.weight", "model.norm.weight", "head.weight", "model.hc_head.hc_fn",
                  "model.hc_head.hc_base", "model.hc_head.hc_scale")  # fmt: skip

# llama.cpp's deepseek4 tensor names (blk.N.<name>, as its converter writes the released checkpoints) -> the names
# above without model.layers.N.; its merged experts (ffn_*_exps) are ffn.experts.M.w1 / w3 / w2 (GGUF_EXPERT_TENSORS),
# its head and mHC head GGUF_GLOBAL_TENSORS. Checked against a file of llama.cpp's converter
# (tests/fixtures/deepseek-v4-gguf).
GGUF_LAYER_TENSORS = {
    "attn_norm.weight": "attn_norm.weight",
    "attn_q_a.weight": "attn.wq_a.weight",
    "attn_q_a_norm.weight": "attn.q_norm.weight",
    "attn_q_b.weight": "attn.wq_b.weight",
    "attn_kv.weight": "attn.wkv.weight",
    "attn_kv_a_norm.weight": "attn.norm.weight",
    "attn_sinks.weight": "attn.attn_sink",
    "attn_output_a.weight": "attn.wo_a.weight",
    "attn_output_b.weight": "attn.wo_b.weight",
    "attn_compressor_kv.weight": "attn.compressor.wkv.weight",
    "attn_compressor_gate.weight": "attn.compressor.wgate.weight",
    "attn_compressor_ape.weight": "attn.compressor.ape",
    "attn_compressor_norm.weight": "attn.compressor.norm.weight",
    "indexer.attn_q_b.weight": "attn.indexer.wq_b.weight",
    "indexer.proj.weight": "attn.indexer.weights_proj.weight",
    "indexer_compressor_kv.weight": "attn.indexer.compressor.wkv.weight",
    "indexer_compressor_gate.weight": "attn.indexer.compressor.wgate.weight",
    "indexer_compressor_ape.weight": "attn.indexer.compressor.ape",
    "indexer_compressor_norm.weight": "attn.indexer.compressor.norm.weight",
    "hc_attn_fn.weight": "hc_attn_fn",
    "hc_attn_base.weight": "hc_attn_base",
    "hc_attn_scale.weight": "hc_attn_scale",
    "hc_ffn_fn.weight": "hc_ffn_fn",
    "hc_ffn_base.weight": "hc_ffn_base",
    "hc_ffn_scale.weight": "hc_ffn_scale",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn_gate_inp.weight": "ffn.gate.weight",
    "exp_probs_b.bias": "ffn.gate.bias",
    "ffn_gate_tid2eid.weight": "ffn.gate.tid2eid",
    "ffn_gate_shexp.weight": "ffn.shared_experts.w1.weight",
    "ffn_up_shexp.weight": "ffn.shared_experts.w3.weight",
    "ffn_down_shexp.weight": "ffn.shared_experts.w2.weight",
}


# The released checkpoints' names (deepseek-ai/DeepSeek-V4-*: no 'model.' prefix, the attention's key/value norm
# attn.kv_norm, each FP8 matrix's E8M0 scales '<name>.scale', the MTP module under mtp.*) -> transformers' saved names
# above, the FP8 scales as the core's scale companions ('<name>.weight_scale_inv'); the FP4 experts' '.scale' stays
# beside its codes (the core packs the two into MXFP4 rows).
RELEASED_GLOBAL_TENSORS = {
    "embed.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "head.weight": "head.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
}


def _released_name(name: str) -> str:
    """A released tensor name as the family binds it (the names of transformers' saved folders)."""
    new = RELEASED_GLOBAL_TENSORS.get(name)
    if new is not None:
        return new
    return "model." + name.replace(".attn.kv_norm.", ".attn.norm.") if name.startswith("layers.") else name


def folder_tensors(tensors: dict) -> dict:
    """A folder in the released layout under transformers' names (see RELEASED_GLOBAL_TENSORS); a transformers folder
    (its names begin with model.) as it is. The MTP module (mtp.*) is left out: nothing here loads it yet. A weight's
    '.scale' becomes its scale companion, '<its bound name>_scale_inv', whatever the weight's format (the core refuses
    a companion beside a format that takes none), except the FP4 experts' (I8 codes), which the core packs with it."""
    if "embed.weight" not in tensors and not any(n.startswith("layers.") for n in tensors):
        return tensors
    out = {}
    for name, t in tensors.items():
        if name.startswith("mtp."):
            continue
        new = _released_name(name)
        weight = tensors.get(name.removesuffix(".scale") + ".weight")
        if name.endswith(".scale") and weight is not None and weight.dtype != "I8":
            new = _released_name(name.removesuffix(".scale") + ".weight") + "_scale_inv"
        out[new] = dataclasses.replace(t, name=new, stored_as=name if new != name else "")
    return out


GGUF_GLOBAL_TENSORS = {
    "output.weight": "head.weight",
    "output_hc_fn.weight": "model.hc_head.hc_fn",
    "output_hc_base.weight": "model.hc_head.hc_base",
    "output_hc_scale.weight": "model.hc_head.hc_scale",
}
GGUF_EXPERT_TENSORS = {
    "ffn_gate_exps.weight": "ffn.experts.{e}.w1.weight",
    "ffn_up_exps.weight": "ffn.experts.{e}.w3.weight",
    "ffn_down_exps.weight": "ffn.experts.{e}.w2.weight",
}


def expected_tensors(v4: V4Config, hidden: int, heads: int, vocab: int, tied: bool) -> dict[str, tuple[int, ...]]:
    """Every tensor of a transformers folder of this configuration: name (as saved, see GLOBAL_TENSORS) -> shape.
    tid2eid is int64 [vocab, top_k]; the rest are floating point."""
    hc, hd, mix = v4.hc_mult, v4.head_dim, (2 + v4.hc_mult) * v4.hc_mult
    inter, q, ihd = v4.moe_intermediate_size, v4.q_lora_rank, v4.index_head_dim
    out = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "model.hc_head.hc_fn": (hc, hc * hidden),
        "model.hc_head.hc_base": (hc,),
        "model.hc_head.hc_scale": (1,),
    }
    if not tied:
        out["head.weight"] = (vocab, hidden)
    for layer, kind in enumerate(v4.layer_types):
        p = f"model.layers.{layer}."
        shapes = {
            "attn_norm.weight": (hidden,),
            "ffn_norm.weight": (hidden,),
            "attn.attn_sink": (heads,),
            "attn.wq_a.weight": (q, hidden),
            "attn.q_norm.weight": (q,),
            "attn.wq_b.weight": (heads * hd, q),
            "attn.wkv.weight": (hd, hidden),
            "attn.norm.weight": (hd,),
            "attn.wo_a.weight": (v4.o_groups * v4.o_lora_rank, heads * hd // v4.o_groups),
            "attn.wo_b.weight": (hidden, v4.o_groups * v4.o_lora_rank),
            "ffn.gate.weight": (v4.num_experts, hidden),
            "ffn.shared_experts.w1.weight": (inter, hidden),
            "ffn.shared_experts.w3.weight": (inter, hidden),
            "ffn.shared_experts.w2.weight": (hidden, inter),
        }
        for part in ("attn", "ffn"):
            shapes |= {f"hc_{part}_fn": (mix, hc * hidden), f"hc_{part}_base": (mix,), f"hc_{part}_scale": (3,)}
        if kind != SLIDING:
            width = (2 if kind == CSA else 1) * hd
            c = "attn.compressor."
            shapes |= {c + "wkv.weight": (width, hidden), c + "wgate.weight": (width, hidden),
                       c + "ape": (v4.compress_rate(layer), width), c + "norm.weight": (hd,)}  # fmt: skip
        if kind == CSA:
            c = "attn.indexer.compressor."
            shapes |= {c + "wkv.weight": (2 * ihd, hidden), c + "wgate.weight": (2 * ihd, hidden),
                       c + "ape": (v4.csa_rate, 2 * ihd), c + "norm.weight": (ihd,),
                       "attn.indexer.wq_b.weight": (v4.index_n_heads * ihd, q),
                       "attn.indexer.weights_proj.weight": (v4.index_n_heads, hidden)}  # fmt: skip
        if v4.mlp_layer_types[layer] == HASH:
            shapes["ffn.gate.tid2eid"] = (vocab, v4.top_k)
        else:
            shapes["ffn.gate.bias"] = (v4.num_experts,)
        for e in range(v4.num_experts):
            shapes |= {f"ffn.experts.{e}.w1.weight": (inter, hidden), f"ffn.experts.{e}.w3.weight": (inter, hidden),
                       f"ffn.experts.{e}.w2.weight": (hidden, inter)}  # fmt: skip
        out |= {p + name: shape for name, shape in shapes.items()}
    return out


def kv_row_bytes(config) -> int:
    """One position of one layer's state as the core keeps it (eb_v4_cache_row, f32): the key=value row, the
    compressors' and the indexer's per-position projections and a compressed entry's slot, 6 head_dim + 5
    index_head_dim floats, in every layer (none is a ring)."""
    return 4 * (6 * config.head_dim + 5 * dict(config.native_fields)["index_head_dim"])


def kv_read_bytes(config, context: float) -> float:
    """The state one decode step reads at a context of this many positions, as the core's V4 attention reads it
    (f32): in every layer its window's key=value rows (min(sliding_window, context)); in an HCA layer every compressed
    entry (one per hca_rate positions); in a CSA layer the indexer's key of every entry (one per csa_rate positions,
    index_head_dim floats) and the index_topk entries it keeps. (A compressor reads its window's projections once per
    entry it closes: under a row per step, left out.)"""
    f = dict(config.native_fields)
    hd, ihd, topk = config.head_dim, f["index_head_dim"], f["index_topk"]
    context = max(float(context), 0.0)
    floats = 0.0
    for kind in f["layer_kind"]:
        floats += hd * min(float(f["sliding_window"]), context)
        if kind == 1:  # CSA
            entries = math.floor(context / f["csa_rate"])
            floats += ihd * entries + hd * min(topk, entries)
        elif kind == 2:  # HCA
            floats += hd * math.floor(context / f["hca_rate"])
    return 4 * floats


DEEPSEEK_V4 = Family(
    architecture="deepseek_v4",
    title="DeepSeek-V4",
    hf_classes=("DeepseekV4ForCausalLM",),
    gguf_arch="deepseek4",
    native_code=5,  # EB_ARCH_DEEPSEEK_V4
    config_keys=config_keys,
    gguf_keys=gguf_keys,
    gguf_layer_tensors=GGUF_LAYER_TENSORS,
    moe_layer=lambda config, layer: True,
    rope_scaling=True,
    gguf_global_tensors=GGUF_GLOBAL_TENSORS,
    gguf_expert_tensors=GGUF_EXPERT_TENSORS,
    int_tables=(".ffn.gate.tid2eid",),
    folder_tensors=folder_tensors,
    kv_row_bytes=kv_row_bytes,
    kv_read_bytes=kv_read_bytes,
)
