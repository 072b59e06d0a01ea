"""What every family module (engine/families/<family>.py) fills in, and the readers it is given.

A family says, as data and small functions, all that differs between the model families the engine runs: the
Hugging Face class names and the config.json keys it reads, the GGUF architecture with its metadata keys and tensor
names, which layers route, the code the core knows it by, the demo pair it is built as and what an export to another
engine must say of it. Everything else (reading files, binding tensors, placement, runs) is shared and iterates the
registry (engine/families/__init__.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from ..core.errors import CheckpointError, EngineError, UnsupportedError

if TYPE_CHECKING:
    from .synthetic import DemoRecipe

# llama.cpp's per-layer tensor names -> the Hugging Face names (engine/model.py binds those), as the llama-shaped
# families (Qwen3, and gpt-oss's attention) name them
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
MOE_LAYER_TENSORS = {"ffn_gate_inp.weight": "mlp.gate.weight"}
ATTENTION_BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias")


class ConfigKeys:
    """Typed reads of a config.json's keys; each error names the file and the key."""

    def __init__(self, raw: dict, path: Path):
        self.raw, self.path = raw, path

    def fail(self, message: str, cls: type[EngineError] = CheckpointError) -> NoReturn:
        raise cls(f"'{self.path}': {message}")

    def get(self, key: str, kind: type, default: Any = ..., check=None, expect: str = "") -> Any:
        """raw[key] as kind (an int passes for a float; a bool for neither), default when missing or null (... :
        required), held to check (expect says what it wants)."""
        raw = self.raw
        if key not in raw or raw[key] is None:
            if default is ...:
                self.fail(f"'{key}' is missing")
            return default
        value = raw[key]
        ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            self.fail(f"'{key}' = {value!r}, expected {kind.__name__}")
        if check is not None and not check(value):
            self.fail(f"'{key}' = {value!r}, expected {expect}")
        return value

    def count(self, key: str, default: Any = ..., below: int = 2**31) -> int:
        """A positive integer below `below`."""
        return self.get(key, int, default, lambda v: 0 < v < below, f"a positive integer below {_power(below)}")

    def rope_theta(self) -> float:
        return self.get("rope_theta", float, 10000.0, lambda v: 1.0 <= v <= 1e12, "a number in 1..1e12")

    def fp8_block(self) -> tuple[int, int]:
        """The scale block (rows, cols) of a quantization_config of block-scaled FP8 weights, as transformers'
        finegrained FP8 and DeepSeek's released checkpoints write it: quant_method 'fp8', fmt 'e4m3',
        weight_block_size [rows, cols] (128 x 128 where absent), activation_scheme 'dynamic' (the engine runs the
        activations in its own precision: a static scheme's input scales would be left unread)."""
        quant = self.raw["quantization_config"]
        where = "quantization_config"
        fmt = quant.get("fmt", "e4m3")
        if fmt != "e4m3":
            self.fail(f"{where} fmt {fmt!r} is not supported (expected 'e4m3')", UnsupportedError)
        scheme = quant.get("activation_scheme", "dynamic")
        if scheme != "dynamic":
            self.fail(f"{where} activation_scheme {scheme!r} is not supported (expected 'dynamic')", UnsupportedError)
        block = quant.get("weight_block_size", [128, 128])
        if not (isinstance(block, list) and len(block) == 2 and all(type(v) is int and 0 < v <= 65536 for v in block)):
            self.fail(f"{where} weight_block_size = {block!r:.80}, expected two integers [rows, cols] in 1..65536")
        return block[0], block[1]


def _power(n: int) -> str:
    return f"2**{n.bit_length() - 1}" if n > 65536 and n & (n - 1) == 0 else str(n)


class Metadata(Protocol):
    """Typed reads of a GGUF file's metadata (engine/checkpoints/gguf_file.py's reader); errors name file and key."""

    path: Path
    md: Mapping[str, Any]

    def fail(self, message: str, cls: type[EngineError] = CheckpointError) -> NoReturn: ...
    def get(self, key: str, kind: str, default: Any = ...) -> Any: ...
    def count(self, key: str, default: Any = ..., lo: int = 1) -> int: ...
    def number(self, key: str, default: Any, check, expect: str) -> float: ...
    def layer_pattern(self, key: str, layers: int, period: int) -> list[bool]: ...


@dataclass(frozen=True)
class GGUFShape:
    """What the shared GGUF reader found before a family reads its own keys: the `<arch>.` prefix, the counts
    every family has, the layers that hold an expert router (blk.N.ffn_gate_inp.weight), the feed-forward width
    (None: no key) and the tensor names."""

    prefix: str
    layers: int
    hidden: int
    heads: int
    head_dim: int
    intermediate: int | None
    routed_layers: frozenset[int]
    tensor_names: frozenset[str]


@dataclass(frozen=True)
class Family:
    """One architecture the engine runs (ModelConfig.architecture), as data and small functions.

    config_keys(keys, hidden, heads, layers) -> the family's ModelConfig fields from config.json (it may set
        num_kv_heads, head_dim, attention_bias where the family fixes them).
    gguf_keys(meta, shape) -> the same from a GGUF file's `<arch>.*` keys (it may set num_kv_heads, head_dim and
        intermediate_size).
    moe_layer(config, layer) -> whether the layer routes to experts.
    extra_layers(keys) -> layers a released folder holds past num_hidden_layers that neither transformers nor the
        engine load (DeepSeek-V3's next-token-prediction module), left out when the folder is read.
    ktransformers_note(whole_layers) -> what an export to ktransformers must say of this family (None: the
        general note).
    kv_row_bytes(config) -> the bytes one position adds to one layer's state where the family keeps more than its
        KV heads' keys and values or MLA's latent (None: those, as the cost model counts them).
    kv_read_bytes(config, context) -> the state's bytes one decode step reads at a context of this many positions,
        every layer together, where a step reads other than every row (full attention) or its window's (None: those).
    awaiting: what the core lacks to run the family (empty: it runs it). A family awaiting its forward pass
        (engine.families.AWAITING) has its config.json or GGUF keys read and checked, then is refused with this.
    gguf_awaiting: why its GGUF files are refused where the core runs it from a folder (empty: they are read).
    gguf_global_tensors: the family's names for llama.cpp's tensors outside the layers, over the shared ones
        (token_embd, output_norm, output).
    gguf_expert_tensors: llama.cpp's merged expert tensors -> the name of expert {e}'s slice under
        model.layers.N. (empty: mlp.experts.{e}.gate_proj.weight and so on).
    int_tables: the ends of the names of tensors of integers the family binds (their bytes handed over as they are);
        an integer tensor by any other name is refused as a dtype the engine does not run.
    folder_tensors(tensors) -> a folder's tensors under the names the family binds, where a layout names them
        otherwise (DeepSeek-V4's released checkpoints); as they are by default.
    next_token_names: the multi-token-prediction layer's own tensors (extra_layers), by their names after
        model.layers.<L>., and what its module binds them as (None: the model's own is read instead); empty: the
        core runs no module of this family (Checkpoint.next_token_module).
    """

    architecture: str
    title: str  # in words, for people ("DeepSeek-V3")
    hf_classes: tuple[str, ...]
    gguf_arch: str
    native_code: int  # eb_model_config.arch: the core's code (native/include/expertbench.h EB_ARCH_*)
    config_keys: Callable[[ConfigKeys, int, int, int], dict[str, Any]]
    gguf_keys: Callable[[Metadata, GGUFShape], dict[str, Any]]
    gguf_layer_tensors: Mapping[str, str]
    moe_layer: Callable[[Any, int], bool]  # (a ModelConfig, a layer index)
    routed: bool = True
    rope_scaling: bool = False  # reads config.json's rope_scaling (YaRN); else a rope_scaling is refused
    gguf_expert_biases: Mapping[str, str] = field(default_factory=dict)
    extra_layers: Callable[[ConfigKeys], int] = lambda keys: 0
    ktransformers_note: Callable[[list[int]], str | None] = lambda whole: None
    kv_row_bytes: Callable[[Any], int] | None = None  # (a ModelConfig)
    kv_read_bytes: Callable[[Any, float], float] | None = None  # (a ModelConfig, a context)
    demo: DemoRecipe | None = None  # its built-in synthetic pair (engine/checkpoints/demo.py), when it has one
    awaiting: str = ""
    gguf_awaiting: str = ""  # what keeps its GGUF files from being read, where the core runs it from folders
    gguf_global_tensors: Mapping[str, str] = field(default_factory=dict)
    gguf_expert_tensors: Mapping[str, str] = field(default_factory=dict)
    int_tables: tuple[str, ...] = ()  # ends of the names of its integer tables (I64 / I32), handed over as raw bytes
    folder_tensors: Callable[[dict], dict] = lambda tensors: tensors  # {name: TensorInfo}, under the names it binds
    next_token_names: tuple[tuple[str, str | None], ...] = ()

    def refuse_gguf(self, where: str) -> None:
        """Raise the UnsupportedError of a GGUF file of a family whose files are not read (awaiting, or
        gguf_awaiting); nothing for one whose files are."""
        self.refuse_awaiting(where)
        if self.gguf_awaiting:
            raise UnsupportedError(f"{where}: {self.title}: {self.gguf_awaiting}")

    def refuse_awaiting(self, where: str) -> None:
        """Raise the one UnsupportedError of a family the core cannot run yet (awaiting), naming it and what it
        lacks; nothing for a family it runs. where: the file, as the readers' errors name it."""
        if self.awaiting:
            raise UnsupportedError(f"{where}: {self.title} ({', '.join(self.hf_classes)}; GGUF '{self.gguf_arch}') is "
                                   f"not run by the engine yet: {self.awaiting}")  # fmt: skip


def gguf_yarn_keys(a: str) -> dict[str, str]:
    """The metadata keys llama.cpp writes YaRN's config.json values to, so that yarn_rope's errors name the key."""
    s = a + "rope.scaling."
    return {
        "rope_theta": a + "rope.freq_base",
        "factor": s + "factor",
        "beta_fast": s + "yarn_beta_fast",
        "beta_slow": s + "yarn_beta_slow",
        "original_max_position_embeddings": s + "original_context_length",
        "attention_factor": s + "yarn_attn_factor",
        "mscale": s + "yarn_log_multiplier",
        "mscale_all_dim": s + "yarn_log_multiplier",
    }


def gguf_yarn(m: Metadata, a: str, max_pos: int) -> dict[str, Any]:
    """A file's YaRN keys (llama.cpp's names) as the config.json rope_scaling they were written from."""
    return {
        "type": "yarn",
        "factor": m.number(a + "rope.scaling.factor", ..., lambda v: 1 <= v < 1e6, "a number >= 1"),
        "original_max_position_embeddings": m.count(a + "rope.scaling.original_context_length", max_pos),
        "beta_fast": m.number(a + "rope.scaling.yarn_beta_fast", 32.0, lambda v: v > 0, "a positive number"),
        "beta_slow": m.number(a + "rope.scaling.yarn_beta_slow", 1.0, lambda v: v > 0, "a positive number"),
    }


def gguf_even_head(m: Metadata, s: GGUFShape) -> None:
    """RoPE rotates pairs: a head size (attention.key_length) must be even."""
    if s.head_dim % 2:
        given = "" if s.prefix + "attention.key_length" in m.md else " (absent: embedding_length / head_count)"
        m.fail(f"'{s.prefix}attention.key_length' = {s.head_dim}{given}, expected an even number (RoPE rotates pairs)")


def gguf_theta(m: Metadata, a: str) -> float:
    return m.number(a + "rope.freq_base", 10000.0, lambda v: 1.0 <= v <= 1e12, "a number in 1..1e12")


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
