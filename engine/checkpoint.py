"""Reading a Hugging Face model folder: config.json, safetensors (single or sharded), tokenizer.json (a GGUF file
opens here too: engine/gguf_file.py reads it into the same Checkpoint).

Everything is validated here before the core sees it; the core then memory-maps the files and checks every
descriptor again. Nothing is copied: a tensor is a (file, offset, dtype, shape) descriptor.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from . import gguf_file
from .errors import CheckpointError, UnsupportedError
from .model_config import ModelConfig, TensorInfo, yarn_rope

ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
}
GPT_OSS_SWIGLU_ALPHA = 1.702  # transformers' GptOssExperts.alpha (not a config key)
# Every dtype the safetensors format defines, with its element size, to check byte counts of any tensor.
ALL_DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass
class Checkpoint:
    folder: Path  # where the model was opened from: its folder, or its .gguf file (a split's first part)
    config: ModelConfig
    tensors: dict[str, TensorInfo]
    files: list[Path]
    tokenizer: Any = None  # tokenizers.Tokenizer, or None when the folder has no tokenizer.json
    raw_config: dict = field(default_factory=dict)

    @cached_property
    def vocabulary(self) -> dict[str, int] | None:
        """Token text -> id (added tokens included), read from the tokenizer once; None without a tokenizer."""
        return None if self.tokenizer is None else self.tokenizer.get_vocab(with_added_tokens=True)

    @cached_property
    def vocabulary_digest(self) -> str | None:
        """sha256 of the vocabulary: two checkpoints with equal digests give every id the same meaning."""
        if self.vocabulary is None:
            return None
        text = json.dumps(sorted(self.vocabulary.items()), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @classmethod
    def open(cls, folder: str | Path) -> Checkpoint:
        """A Hugging Face model folder, or a GGUF file (any part of a split one)."""
        folder = Path(folder)
        if folder.is_file():
            return cls(*gguf_file.read_checkpoint(folder))
        if not folder.is_dir():
            raise CheckpointError(f"model folder or GGUF file '{folder}' does not exist")
        raw = read_config_json(folder / "config.json")
        config = parse_config(raw, folder / "config.json")
        tensors, files = read_weights(folder)
        tensors = drop_next_token_layers(config, raw, tensors, folder / "config.json")
        check_layer_count(config, tensors, folder / "config.json")
        tokenizer = read_tokenizer(folder / "tokenizer.json", config)
        return cls(folder, config, tensors, files, tokenizer, raw)


def parse_json(text: str | bytes, path: Path, what: str = "") -> Any:
    """JSON text of a file, or a CheckpointError naming the file: bad UTF-8 or syntax, nesting deeper than Python's
    recursion allows, an integer longer than Python converts (both would escape as RecursionError / ValueError)."""
    where = f"'{path}'" + (f": {what}" if what else "")
    try:
        return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{where} is not UTF-8 text: {exc}") from None
    except RecursionError:
        raise CheckpointError(f"{where} is not valid JSON here: nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{where} is not valid JSON: {exc}") from None
    except ValueError:  # an integer past sys.get_int_max_str_digits()
        raise CheckpointError(
            f"{where} is not valid JSON here: it holds an integer of more than {sys.get_int_max_str_digits()} digits"
        ) from None


def read_config_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"'{path}' is missing: a model folder needs a config.json")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"'{path}' is not valid JSON: {exc}") from None
    except OSError as exc:
        raise CheckpointError(f"'{path}': cannot read: {exc.strerror or exc}") from None
    raw = parse_json(text, path)
    if not isinstance(raw, dict):
        raise CheckpointError(f"'{path}': expected a JSON object, got {type(raw).__name__}")
    return raw


def read_config(path: str | Path) -> ModelConfig:
    """The ModelConfig of a model folder (its config.json) or of a GGUF file (its header), nothing else read."""
    path = Path(path)
    if path.is_file():
        return gguf_file.read_config(path)
    if not path.is_dir():
        raise CheckpointError(f"model folder or GGUF file '{path}' does not exist")
    return parse_config(read_config_json(path / "config.json"), path / "config.json")


def _get(raw: dict, key: str, kind: type, path: Path, default: Any = ..., check=None, expect: str = "") -> Any:
    if key not in raw or raw[key] is None:
        if default is ...:
            raise CheckpointError(f"'{path}': '{key}' is missing")
        return default
    value = raw[key]
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise CheckpointError(f"'{path}': '{key}' = {value!r}, expected {kind.__name__}")
    if check is not None and not check(value):
        raise CheckpointError(f"'{path}': '{key}' = {value!r}, expected {expect}")
    return value


def parse_config(raw: dict, path: Path) -> ModelConfig:
    archs = raw.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise CheckpointError(f"'{path}': 'architectures' is missing or not a list of names")
    known = [a for a in archs if a in ARCHITECTURES]
    if not known:
        raise UnsupportedError(
            f"'{path}': architecture {', '.join(archs)} is not supported (expected one of {', '.join(ARCHITECTURES)})"
        )
    arch = ARCHITECTURES[known[0]]
    positive = (lambda v: 0 < v < 2**31, "a positive integer below 2**31")

    def pos_int(key: str, default: Any = ...) -> int:
        return _get(raw, key, int, path, default, *positive)

    if arch not in ("deepseek_v3", "gpt_oss") and raw.get("rope_scaling") not in (None, {}):
        raise UnsupportedError(f"'{path}': rope_scaling {raw['rope_scaling']!r} is not supported (expected null)")
    if raw.get("use_sliding_window"):
        raise UnsupportedError(f"'{path}': use_sliding_window = true is not supported (expected false)")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedError(f"'{path}': hidden_act {act!r} is not supported (expected 'silu')")
    hidden = pos_int("hidden_size")
    heads = pos_int("num_attention_heads")
    layers = pos_int("num_hidden_layers")
    kw: dict[str, Any] = {}
    if arch == "qwen3_moe":
        kw["num_experts"] = pos_int("num_experts")
        kw["top_k"] = _get(
            raw, "num_experts_per_tok", int, path, ..., lambda v: 1 <= v <= kw["num_experts"], "1..num_experts"
        )
        kw["moe_intermediate_size"] = pos_int("moe_intermediate_size")
        kw["norm_topk_prob"] = _get(raw, "norm_topk_prob", bool, path, False)
        kw["decoder_sparse_step"] = pos_int("decoder_sparse_step", 1)
        only = _get(raw, "mlp_only_layers", list, path, [])
        for v in only:
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < layers:
                raise CheckpointError(f"'{path}': 'mlp_only_layers' contains {v!r}, expected layers 0..{layers - 1}")
        kw["mlp_only_layers"] = tuple(sorted(set(only)))
    elif arch == "deepseek_v3":
        kw.update(_deepseek_config(raw, path, heads, layers))
    elif arch == "gpt_oss":
        kw.update(_gpt_oss_config(raw, path, hidden, heads, layers))
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
    bos = raw.get("bos_token_id")
    config = ModelConfig(
        architecture=arch,
        vocab_size=pos_int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=pos_int("intermediate_size"),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kw.pop("num_kv_heads", None) or pos_int("num_key_value_heads", heads),
        head_dim=kw.pop("head_dim", None) or pos_int("head_dim", hidden // heads if hidden % heads == 0 else ...),
        max_position_embeddings=pos_int("max_position_embeddings"),
        # a RoPE base below 1 or past f32's reach turns the rotation tables into inf and NaN; an epsilon of 1 or more
        # swamps the norm it guards: no real model has either
        rope_theta=_get(raw, "rope_theta", float, path, 10000.0, lambda v: 1.0 <= v <= 1e12, "a number in 1..1e12"),
        rms_norm_eps=_get(raw, "rms_norm_eps", float, path, 1e-6, lambda v: 0 < v < 1, "a number in (0, 1)"),
        tie_word_embeddings=_get(raw, "tie_word_embeddings", bool, path, False),
        attention_bias=kw.pop("attention_bias", None) or _get(raw, "attention_bias", bool, path, False),
        bos_token_id=bos if isinstance(bos, int) else None,
        eos_token_id=eos_ids,
        synthetic=bool(raw.get("expertbench_synthetic", False)),
        **kw,
    )
    if config.num_heads % config.num_kv_heads:
        raise CheckpointError(
            f"'{path}': num_attention_heads = {heads} is not a multiple of num_key_value_heads = {config.num_kv_heads}"
        )
    return config


def _deepseek_config(raw: dict, path: Path, heads: int, layers: int) -> dict[str, Any]:
    """DeepseekV3Config's keys as transformers reads them: MLA ranks and head widths, grouped routing, shared experts,
    YaRN. Each inconsistency is named by its key."""
    positive = (lambda v: 0 < v < 2**16, "a positive integer below 65536")

    def pos_int(key: str, default: Any = ...) -> int:
        return _get(raw, key, int, path, default, *positive)

    for key, allowed in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc"), ("hidden_act", "silu")):
        if raw.get(key, allowed) != allowed:
            raise UnsupportedError(f"'{path}': {key} {raw[key]!r} is not supported (expected {allowed!r})")
    if _get(raw, "attention_bias", bool, path, False):
        raise UnsupportedError(f"'{path}': attention_bias = true is not supported for deepseek_v3 (expected false)")
    kw: dict[str, Any] = {
        "q_lora_rank": _get(raw, "q_lora_rank", int, path, 0, *positive),
        "kv_lora_rank": pos_int("kv_lora_rank"),
        "qk_nope_head_dim": pos_int("qk_nope_head_dim"),
        "qk_rope_head_dim": _get(raw, "qk_rope_head_dim", int, path, ..., lambda v: 0 < v <= 512 and v % 2 == 0,
                                 "an even number in 2..512"),
        "v_head_dim": pos_int("v_head_dim"),
        "num_experts": pos_int("n_routed_experts"),
        "moe_intermediate_size": pos_int("moe_intermediate_size"),
        "n_shared_experts": _get(raw, "n_shared_experts", int, path, 0, lambda v: 0 <= v <= 64, "0..64"),
        "first_k_dense_replace": _get(raw, "first_k_dense_replace", int, path, 0, lambda v: 0 <= v <= layers,
                                      f"0..num_hidden_layers ({layers})"),
        "norm_topk_prob": _get(raw, "norm_topk_prob", bool, path, False),
        "routed_scaling_factor": _get(raw, "routed_scaling_factor", float, path, 1.0, lambda v: 0 < v < 1e6,
                                      "a positive number"),
        "rope_interleave": _get(raw, "rope_interleave", bool, path, True),
    }  # fmt: skip
    if _get(raw, "moe_layer_freq", int, path, 1) != 1:
        raise UnsupportedError(f"'{path}': moe_layer_freq = {raw['moe_layer_freq']} is not supported (expected 1)")
    E = kw["num_experts"]
    kw["n_group"] = n_group = _get(raw, "n_group", int, path, 1, lambda v: 1 <= v <= 256, "1..256")
    if E % n_group:
        raise CheckpointError(f"'{path}': 'n_routed_experts' = {E} is not divisible by 'n_group' = {n_group}")
    if n_group > 1 and E // n_group < 2:
        raise CheckpointError(f"'{path}': 'n_group' = {n_group} leaves {E // n_group} expert per group, expected at "
                              "least 2 (a group scores by its two best experts)")  # fmt: skip
    kw["topk_group"] = topk_group = _get(raw, "topk_group", int, path, 1, lambda v: v >= 1, "a positive integer")
    if topk_group > n_group:
        raise CheckpointError(f"'{path}': 'topk_group' = {topk_group} is larger than 'n_group' = {n_group}")
    kept = topk_group * (E // n_group)
    kw["top_k"] = _get(raw, "num_experts_per_tok", int, path, ..., lambda v: 1 <= v <= kept,
                       f"1..{kept} (the experts of the topk_group groups kept)")  # fmt: skip
    rope = kw["qk_rope_head_dim"]
    kw["head_dim"] = rope  # as DeepseekV3Config sets it: the rotated part
    kw["rope_dim"] = rope
    kw["num_kv_heads"] = heads
    qk = kw["qk_nope_head_dim"] + rope
    scaling = raw.get("rope_scaling")
    theta = _get(raw, "rope_theta", float, path, 10000.0, lambda v: 1.0 <= v <= 1e12, "a number in 1..1e12")
    max_pos = _get(raw, "max_position_embeddings", int, path, ..., lambda v: 0 < v < 2**31, "a positive integer")
    kw["attention_scale"] = qk**-0.5
    if scaling not in (None, {}):
        freq, factor, scale = yarn_rope(scaling, rope, theta, max_pos, path)
        kw["rope_inv_freq"], kw["rope_attention_factor"] = freq, factor
        kw["attention_scale"] = qk**-0.5 * scale
    return kw


def _gpt_oss_config(raw: dict, path: Path, hidden: int, heads: int, layers: int) -> dict[str, Any]:
    """GptOssConfig's keys as transformers reads them: experts (num_local_experts of intermediate_size each), the
    layers' attention kinds and window, the clamped SwiGLU's limit, YaRN, the MXFP4 quantization of the released
    checkpoints. Each inconsistency is named by its key."""
    positive = (lambda v: 0 < v < 2**31, "a positive integer below 2**31")

    def pos_int(key: str, default: Any = ...) -> int:
        return _get(raw, key, int, path, default, *positive)

    experts = pos_int("num_local_experts")
    inter = pos_int("intermediate_size")
    kw: dict[str, Any] = {
        "num_experts": experts,
        "top_k": _get(raw, "num_experts_per_tok", int, path, ..., lambda v: 1 <= v <= experts,
                      f"1..num_local_experts ({experts})"),
        "moe_intermediate_size": inter,
        "norm_topk_prob": True,  # the softmax over the chosen k sums to 1
        "attention_bias": _get(raw, "attention_bias", bool, path, True),
        "swiglu_limit": _get(raw, "swiglu_limit", float, path, 7.0, lambda v: 0 < v < 1e30, "a positive number"),
        "swiglu_alpha": GPT_OSS_SWIGLU_ALPHA,
    }  # fmt: skip
    quant = raw.get("quantization_config")
    if quant is not None and (not isinstance(quant, dict) or quant.get("quant_method") != "mxfp4"):
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        raise UnsupportedError(f"'{path}': quantization_config quant_method {method!r} is not supported (expected "
                               "'mxfp4', as the released gpt-oss checkpoints have, or none)")  # fmt: skip
    kinds = raw.get("layer_types")
    if kinds is None:  # GptOssConfig's default: sliding, full, sliding, ...
        kinds = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers:
        got = f"{len(kinds)} entries" if isinstance(kinds, list) else repr(kinds)
        raise CheckpointError(f"'{path}': 'layer_types' has {got}, expected one per layer (num_hidden_layers = "
                              f"{layers})")  # fmt: skip
    for i, kind in enumerate(kinds):
        if kind not in ("sliding_attention", "full_attention"):
            raise CheckpointError(f"'{path}': 'layer_types'[{i}] = {kind!r}, expected 'sliding_attention' or "
                                  "'full_attention'")  # fmt: skip
    max_pos = _get(raw, "max_position_embeddings", int, path, ..., *positive)
    window = 0
    if "sliding_attention" in kinds:
        window = pos_int("sliding_window")
        if window > max_pos:
            raise CheckpointError(f"'{path}': 'sliding_window' = {window} is larger than the context "
                                  f"('max_position_embeddings' = {max_pos}), expected at most {max_pos}")  # fmt: skip
    kw["layer_windows"] = tuple(window if kind == "sliding_attention" else 0 for kind in kinds)
    head_dim = pos_int("head_dim", hidden // heads if hidden % heads == 0 else ...)
    if head_dim % 2:
        raise CheckpointError(f"'{path}': 'head_dim' = {head_dim}, expected an even number (RoPE rotates pairs)")
    kw["head_dim"] = head_dim
    scaling = raw.get("rope_scaling")
    if scaling not in (None, {}):
        theta = _get(raw, "rope_theta", float, path, 10000.0, lambda v: 1.0 <= v <= 1e12, "a number in 1..1e12")
        freq, factor, _ = yarn_rope(scaling, head_dim, theta, max_pos, path)
        kw["rope_inv_freq"], kw["rope_attention_factor"] = freq, factor
    return kw


MAX_DIM = 1 << 40  # a dimension past this (a shape like [0, 2**63]) fits no memory and no int64 product

LAYER_TENSOR = re.compile(r"model\.layers\.(\d+)\.")


def drop_next_token_layers(config: ModelConfig, raw: dict, tensors: dict[str, TensorInfo],
                           path: Path) -> dict[str, TensorInfo]:  # fmt: skip
    """DeepSeek-V3's released folders hold its multi-token-prediction module as layers num_hidden_layers ..
    num_hidden_layers + num_nextn_predict_layers - 1 (model.layers.61.* in V3): transformers does not load them and
    neither does this engine (nor llama.cpp's converter), so they are left out here."""
    if config.architecture != "deepseek_v3":
        return tensors
    extra = _get(raw, "num_nextn_predict_layers", int, path, 0, lambda v: 0 <= v <= 64, "0..64")
    if not extra:
        return tensors
    mtp = range(config.num_layers, config.num_layers + extra)
    return {n: t for n, t in tensors.items() if not ((m := LAYER_TENSOR.match(n)) and int(m.group(1)) in mtp)}


def check_layer_count(config: ModelConfig, tensors: dict[str, TensorInfo], path: Path) -> None:
    """The layers the checkpoint holds must be the layers the config says: a smaller num_hidden_layers would drop
    the rest silently (a larger one is refused by the core, which finds the tensors missing)."""
    held = [int(m.group(1)) for m in map(LAYER_TENSOR.match, tensors) if m]
    if held and max(held) >= config.num_layers:
        top = max(held)
        raise CheckpointError(
            f"'{path}': num_hidden_layers = {config.num_layers}, but the checkpoint holds tensors of layer {top} "
            f"(model.layers.{top}.*): expected num_hidden_layers = {top + 1}"
        )


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and validate one safetensors file's header; returns its tensors with absolute offsets."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(
                    f"'{path}': {size} bytes, too short for a safetensors file (needs an 8-byte header length)"
                )
            (hlen,) = struct.unpack("<Q", head)
            if hlen > size - 8 or hlen > MAX_HEADER_BYTES:
                raise CheckpointError(
                    f"'{path}': header length {hlen} is larger than the file allows ({size - 8} bytes after the length)"
                )
            header_bytes = f.read(hlen)
    except OSError as exc:
        raise CheckpointError(f"'{path}': cannot read: {exc.strerror or exc}") from None
    header = parse_json(header_bytes, path, "the safetensors header")
    if not isinstance(header, dict):
        raise CheckpointError(f"'{path}': the safetensors header is not a JSON object")
    data_start = 8 + hlen
    data_size = size - data_start
    tensors: dict[str, TensorInfo] = {}
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        where = f"'{path}': tensor '{name}'"
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
            raise CheckpointError(f"{where}: expected an object with dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in ALL_DTYPE_SIZES:
            raise CheckpointError(f"{where}: unknown dtype {dtype!r} (expected one of {', '.join(ALL_DTYPE_SIZES)})")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < MAX_DIM for d in shape
        ):
            raise CheckpointError(f"{where}: shape {shape!r:.200} is not a list of integers in 0..{MAX_DIM - 1}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise CheckpointError(f"{where}: data_offsets {offsets!r} is not [begin, end] with 0 <= begin <= end")
        begin, end = offsets
        if end > data_size:
            raise CheckpointError(
                f"{where}: data_offsets [{begin}, {end}] lie past the end of the data ({data_size} bytes)"
            )
        expected = math.prod(shape) * ALL_DTYPE_SIZES[dtype]
        if end - begin != expected:
            raise CheckpointError(
                f"{where}: {end - begin} bytes for {dtype} of shape {shape}, expected {expected} bytes"
            )
        spans.append((begin, end, name))
        tensors[name] = TensorInfo(name, path, dtype, tuple(shape), data_start + begin, end - begin)
    # as upstream safetensors requires: the tensors cover the data exactly, in order, from its first byte to the end
    # of the file (a header length cut short into its own padding would otherwise shift every tensor)
    spans.sort()
    reach, holder = 0, ""
    for begin, end, name in spans:
        if begin < reach:
            raise CheckpointError(f"'{path}': tensors '{holder}' and '{name}' overlap (from byte {begin} of the data)")
        if begin > reach:
            after = f"after tensor '{holder}'" if holder else "before the first tensor"
            raise CheckpointError(
                f"'{path}': bytes {reach}..{begin} of the data {after} belong to no tensor (expected the tensors "
                f"to cover the data exactly; is the header length ({hlen}) right?)"
            )
        reach, holder = end, name
    if reach != data_size:
        raise CheckpointError(
            f"'{path}': the tensors end at byte {reach} of the data but the file holds {data_size} bytes after the "
            f"header (expected the tensors to cover the data exactly; a truncated or appended file?)"
        )
    return tensors


def read_weights(folder: Path) -> tuple[dict[str, TensorInfo], list[Path]]:
    index = folder / "model.safetensors.index.json"
    single = folder / "model.safetensors"
    if index.is_file():
        try:
            text = index.read_bytes()
        except OSError as exc:
            raise CheckpointError(f"'{index}': cannot read: {exc.strerror or exc}") from None
        data = parse_json(text, index)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"'{index}': 'weight_map' is missing or empty")
        for name, shard in weight_map.items():
            if not isinstance(shard, str):
                raise CheckpointError(
                    f"'{index}': weight_map['{name}'] = {shard!r:.80}, expected the name of a shard file (a string)"
                )
        shard_names = sorted(set(weight_map.values()), key=str)
        for shard in shard_names:
            if not isinstance(shard, str) or "/" in shard or "\\" in shard or shard in ("", ".", ".."):
                raise CheckpointError(f"'{index}': shard name {shard!r} is not a file name in the model folder")
            if not (folder / shard).is_file():
                raise CheckpointError(f"'{index}' names shard '{shard}', which does not exist in '{folder}'")
        files = [folder / s for s in shard_names]
        tensors: dict[str, TensorInfo] = {}
        by_file = {f.name: read_safetensors_header(f) for f in files}
        for name, shard in weight_map.items():
            found = by_file[shard].get(name)
            if found is None:
                raise CheckpointError(f"'{index}' puts tensor '{name}' in '{shard}', which does not hold it")
            tensors[name] = found
        return tensors, files
    if single.is_file():
        return read_safetensors_header(single), [single]
    raise CheckpointError(f"'{folder}' has neither model.safetensors nor model.safetensors.index.json")


def read_tokenizer(path: Path, config: ModelConfig):
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the tokenizers library raises plain Exception subclasses
        raise CheckpointError(f"'{path}' could not be read as a tokenizer: {exc}") from None
    if tok.get_vocab_size(with_added_tokens=True) > config.vocab_size:
        raise CheckpointError(
            f"'{path}' has {tok.get_vocab_size(with_added_tokens=True)} tokens, more than the model's vocab_size "
            f"({config.vocab_size})"
        )
    return tok
