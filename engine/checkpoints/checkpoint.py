"""Reading a Hugging Face model folder: config.json, safetensors (single or sharded), tokenizer.json (a GGUF file
opens here too: engine/checkpoints/gguf_file.py reads it into the same Checkpoint).

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
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from ..core.errors import CheckpointError, UnsupportedError
from ..families import BY_HF_CLASS, family, hf_family
from ..families.base import ConfigKeys
from . import gguf_file
from .model_config import ModelConfig, TensorInfo

# Every dtype the safetensors format defines, with its element size, to check byte counts of any tensor.
ALL_DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
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
    # the multi-token-prediction module's tensors (DeepSeek-V3's model.layers.<num_hidden_layers>.*), which the model
    # itself does not read: next_token_module() makes a draft of them
    next_token_tensors: dict[str, TensorInfo] = field(default_factory=dict)
    module_layer: int | None = None  # a next-token module's checkpoint: the file's layer its layer 0 is

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
        tensors = family(config.architecture).folder_tensors(tensors)
        tensors, mtp = split_next_token_layers(config, raw, tensors, folder / "config.json")
        check_layer_count(config, tensors, folder / "config.json")
        tokenizer = read_tokenizer(folder / "tokenizer.json", config)
        return cls(folder, config, tensors, files, tokenizer, raw, mtp)

    @property
    def has_next_token_module(self) -> bool:
        return bool(self.next_token_tensors)

    def next_token_module(self) -> Checkpoint:
        """The checkpoint's multi-token-prediction module as a checkpoint of its own, a draft for speculative decoding
        that ships inside the target (DeepSeek-V3's one MTP layer): its decoder layer as layer 0 of a one-layer model
        of the family, its input norms and projection as model.mtp.{enorm,hnorm,eh_proj}, its shared head's norm as
        the final norm; the embeddings and the head are the model's own (the module's copies of them are the same
        values, as every reader of these folders takes them). Each tensor keeps its name in the file (stored_as)."""
        return next_token_checkpoint(self)


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


def parse_config(raw: dict, path: Path) -> ModelConfig:
    archs = raw.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        raise CheckpointError(f"'{path}': 'architectures' is missing or not a list of names")
    known = [a for a in archs if hf_family(a) is not None]
    if not known:
        raise UnsupportedError(
            f"'{path}': architecture {', '.join(archs)} is not supported (expected one of {', '.join(BY_HF_CLASS)})"
        )
    fam = hf_family(known[0])
    keys = ConfigKeys(raw, path)
    get, pos_int = keys.get, keys.count
    if not fam.rope_scaling and raw.get("rope_scaling") not in (None, {}):
        raise UnsupportedError(f"'{path}': rope_scaling {raw['rope_scaling']!r} is not supported (expected null)")
    if raw.get("use_sliding_window"):
        raise UnsupportedError(f"'{path}': use_sliding_window = true is not supported (expected false)")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedError(f"'{path}': hidden_act {act!r} is not supported (expected 'silu')")
    hidden = pos_int("hidden_size")
    heads = pos_int("num_attention_heads")
    layers = pos_int("num_hidden_layers")
    kw = fam.config_keys(keys, hidden, heads, layers)
    quant = raw.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") == "fp8":  # block-scaled FP8 weights, any family
        kw["weight_block"] = keys.fp8_block()
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
    bos = raw.get("bos_token_id")
    config = ModelConfig(
        architecture=fam.architecture,
        vocab_size=pos_int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=kw.pop("intermediate_size", None) or pos_int("intermediate_size"),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kw.pop("num_kv_heads", None) or pos_int("num_key_value_heads", heads),
        head_dim=kw.pop("head_dim", None) or pos_int("head_dim", hidden // heads if hidden % heads == 0 else ...),
        max_position_embeddings=pos_int("max_position_embeddings"),
        # a RoPE base below 1 or past f32's reach turns the rotation tables into inf and NaN; an epsilon of 1 or more
        # swamps the norm it guards: no real model has either
        rope_theta=keys.rope_theta(),
        rms_norm_eps=get("rms_norm_eps", float, 1e-6, lambda v: 0 < v < 1, "a number in (0, 1)"),
        tie_word_embeddings=get("tie_word_embeddings", bool, False),
        attention_bias=kw.pop("attention_bias", None) or get("attention_bias", bool, False),
        bos_token_id=bos if isinstance(bos, int) else None,
        eos_token_id=eos_ids,
        synthetic=bool(raw.get("expertbench_synthetic", False)),
        **kw,
    )
    if config.num_heads % config.num_kv_heads:
        raise CheckpointError(
            f"'{path}': num_attention_heads = {heads} is not a multiple of num_key_value_heads = {config.num_kv_heads}"
        )
    fam.refuse_awaiting(f"'{path}'")  # every key checked, before any tensor is read
    return config


MAX_DIM = 1 << 40  # a dimension past this (a shape like [0, 2**63]) fits no memory and no int64 product

LAYER_TENSOR = re.compile(r"model\.layers\.(\d+)\.")


def split_next_token_layers(config: ModelConfig, raw: dict, tensors: dict[str, TensorInfo],
                            path: Path) -> tuple[dict[str, TensorInfo], dict[str, TensorInfo]]:  # fmt: skip
    """Layers a released folder holds past num_hidden_layers that the model does not read (transformers does not
    load them with it, nor does llama.cpp's converter keep them): DeepSeek-V3's multi-token-prediction module (the
    family's extra_layers). Returns the model's tensors and the module's."""
    extra = family(config.architecture).extra_layers(ConfigKeys(raw, path))
    if not extra:
        return tensors, {}
    mtp = range(config.num_layers, config.num_layers + extra)
    module = {n: t for n, t in tensors.items() if (m := LAYER_TENSOR.match(n)) and int(m.group(1)) in mtp}
    return {n: t for n, t in tensors.items() if n not in module}, module


def next_token_checkpoint(ck: Checkpoint) -> Checkpoint:
    cfg = ck.config
    where = f"'{ck.folder}'"
    if not ck.next_token_tensors:
        said = ck.raw_config.get("num_nextn_predict_layers")
        if Path(ck.folder).is_file():
            why = ("a GGUF file is read without one (llama.cpp's converter leaves DeepSeek-V3's MTP layer out); give a "
                   "draft model, or use the model's Hugging Face folder")  # fmt: skip
        elif isinstance(said, int) and said > 0:
            why = (f"its config says num_nextn_predict_layers = {said}, but it holds no model.layers."
                   f"{cfg.num_layers}.* tensors (a folder saved without its multi-token-prediction layer, as "
                   "transformers saves one); give a draft model instead")  # fmt: skip
        else:
            why = (f"num_nextn_predict_layers = 0 or absent in its config, no model.layers.{cfg.num_layers}.* "
                   "tensors; a draft of the model's own needs one, as DeepSeek-V3's released folders hold: give a "
                   "draft model instead")  # fmt: skip
        raise CheckpointError(f"{where} holds no multi-token-prediction module: {why}")
    fam = family(cfg.architecture)
    if not fam.next_token_names:
        raise UnsupportedError(f"{where}: the multi-token-prediction module of a {fam.title} model is not supported "
                               "yet (DeepSeek-V3's is)")  # fmt: skip
    layers = {int(LAYER_TENSOR.match(n).group(1)) for n in ck.next_token_tensors}
    if len(layers) != 1:
        raise UnsupportedError(f"{where} holds {len(layers)} multi-token-prediction layers ({sorted(layers)}): "
                               "one is supported (DeepSeek-V3's)")  # fmt: skip
    (layer,) = layers
    prefix = f"model.layers.{layer}."
    tensors: dict[str, TensorInfo] = {}
    for name, t in ck.next_token_tensors.items():
        rest = name.removeprefix(prefix)
        own = [to + rest[len(frm) :] if to else None for frm, to in fam.next_token_names if rest.startswith(frm)]
        bound = own[0] if own else "model.layers.0." + rest
        if bound is not None:
            tensors[bound] = replace(t, name=bound, stored_as=t.stored_as or name)
    shared_names = ("model.embed_tokens.", "lm_head.")
    tensors |= {n: t for n, t in ck.tensors.items() if n.startswith(shared_names)}
    for own in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight"):
        if prefix + own not in ck.next_token_tensors:
            raise CheckpointError(
                f"{where}: the multi-token-prediction layer {layer} has no tensor '{prefix + own}': expected enorm, "
                "hnorm, eh_proj and shared_head.norm beside its decoder layer"
            )
    module_cfg = replace(cfg, num_layers=1, first_k_dense_replace=0, next_token_module=True)
    files = sorted({t.file for t in tensors.values()}, key=ck.files.index)
    return Checkpoint(ck.folder, module_cfg, tensors, files, ck.tokenizer, ck.raw_config, module_layer=layer)


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
