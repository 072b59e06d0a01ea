"""The built-in demo model pair: a seeded synthetic Qwen3-MoE target and a dense Qwen3 draft built from it.

Each family's pair is its recipe (engine/families/<family>.py: its sizes, config.json and tensors, made of the seeded
weights of engine/families/synthetic.py); this module builds, writes (safetensors, GGUF) and caches them.

Nothing is downloaded: the weights are random numbers with a structure chosen so that the pair behaves like a
real target and draft (numpy, a byte-level BPE tokenizer trained on a built-in corpus, safetensors files).

How the pair is made to agree (speculative acceptance at q=2 between 70 % and 85 % on DEMO_PROMPTS):

* Every MoE expert of the target is a shared base MLP plus a small per-expert deviation. The router weights sum
  to one over the chosen experts (norm_topk_prob), so the MoE output is the base MLP's output plus a weighted
  mix of deviations.
* The draft is dense and carries the base MLP of some target layers (with the same attention, norms,
  embeddings and lm_head). The other target layers, which the draft skips, write only a small update to the
  residual stream (their o_proj and down_proj are scaled down).
* expert_deviation and skipped_layer_scale (per size) set how far the target strays from the draft. A random
  model's top logits lie close together, so small values already move acceptance a lot; they were tuned by
  measuring acceptance, and a test holds the default size in range.

The same pair is written as GGUF files too (`format="gguf"`, `expertbench demo-model --format gguf --quant Q`), the
way llama.cpp converts and quantizes the safetensors pair: the same bf16 weights, matrices quantized with the gguf
package's gguf.quants (Q8_0 everywhere for `q8_0`; MXFP4 experts and Q8_0 elsewhere for `mxfp4`, llama.cpp's
MXFP4_MOE), norms and the expert router kept in F32, each MoE layer's experts merged into one tensor per projection,
the tokenizer as tokenizer.ggml.* keys. Q8_0 and MXFP4 store rows in blocks of 32 values: every matrix width of a
size must be a multiple of 32 (every size here is). The target file is the safetensors target quantized, whatever the
quantization; so is the draft of `q8_0`. The draft of `mxfp4` is another model (MOE_DRAFTS): a small Qwen3-MoE of the
target's carried layers, each with its router and its experts as the target file holds them (MXFP4), routing every
token to its top 2 experts where the target takes 4. A dense draft cannot follow MXFP4 experts: each is quantized on
its own, so a deviation flips some of the base MLP's 4-bit codes a whole step, and the quantized experts stray from
the base MLP (and from their mean) several times further than the deviations the float pair's acceptance was tuned
on (the base MLP's draft accepted 44 %, the mean of the quantized experts 57 %). The MoE draft reads about as many
bytes per token as the dense one (its two MXFP4 experts against one Q8_0 FFN): 0.46 of the target's bytes, 0.40 of its
multiply-adds at the default size.

A second family, `deepseek` (`expertbench demo-model --family deepseek`), is a DeepSeek-V3-shaped pair built the
same way: the target a DeepseekV3ForCausalLM (MLA attention with q_lora_rank, grouped sigmoid routing with a router
correction bias, one shared expert, a dense first layer, YaRN), the draft a DeepseekV3ForCausalLM whose every layer is
dense. Each draft layer carries a target layer: its attention and norms as they are, and as its FFN the target's
dense FFN (the first layer) or the shared expert and the base MLP side by side, the base MLP's down_proj scaled by
routed_scaling_factor, which is what the MoE layer computes up to the experts' deviations (the router weights sum to
routed_scaling_factor over the chosen experts). The DeepSeek pair is written as safetensors folders only.

A third family, `gpt-oss` (`expertbench demo-model --family gpt-oss`), is a GptOssForCausalLM pair in the layout of the
released checkpoints: the experts' gate_up_proj and down_proj as MXFP4 blocks and scales (uint8, with
quantization_config quant_method mxfp4), every other tensor bf16; sliding and full attention layers alternating,
attention sinks, biases on the attention, the router and the experts, the clamped SwiGLU and YaRN. Every gpt-oss
layer routes, so the draft is a gpt-oss too: fewer layers (pairs of a sliding and a full layer, so that they still
alternate), each with one expert (top-1: its softmax weight is 1) that is the MXFP4 of its target layer's base MLP,
and the target layer's attention, sinks and norms as they are. Each target expert is the base MLP plus a small
deviation, quantized to MXFP4 on its own: a deviation flips some of the base's 4-bit codes, a step each, so the
quantized experts stray further than the deviation says, and the gpt-oss sizes take smaller deviations.

The files live in the user's cache folder ($XDG_CACHE_HOME or ~/.cache)/expertbench/: demo-<size>-v1/ holds
target/, draft/ and manifest.json (the size and sha256 of every file, and the recipe they were built from;
demo-deepseek-<size>-v1/ and demo-gpt-oss-<size>-v1/ for the other families);
demo-<size>-gguf-<quant>-v1/ holds target.gguf, draft.gguf and its manifest.json. Each use checks that every file
exists with its recorded size and that the recipe is current (cheap); `verify=True` (`expertbench demo-model
--verify`) also re-hashes every byte. A pair that fails either check is rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .. import families
from ..core.errors import ArgumentError, CheckpointError
from ..families.qwen3 import DemoSize
from ..families.synthetic import FORMAT_VERSION, INIT_STD, NORM_STD, SEED, DemoRecipe, RawTensor, Tensor

# of the GGUF files' recipe (their keys and tensor types), beside the weights' FORMAT_VERSION; 2: the draft's FFN of
# a pair with coarser experts (mxfp4) is the mean of its target layer's quantized experts; 3: that draft is a small
# MoE (MOE_DRAFTS)
GGUF_FORMAT_VERSION = 3
EOS = "<|endoftext|>"

DEMO_PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A mixture of experts routes every token to a few small feed forward networks.",
    "In the morning the farmer walks to the market with a basket of apples.",
    "Speculative decoding lets a small draft model propose tokens that a large model verifies.",
]


# The demo families, each a family's recipe (engine/families/<family>.py: DEMO): name -> recipe. The default is the
# Qwen3-MoE pair; a demo of another family is named 'family/size' where one string names a pair (demo_name()).
RECIPES: dict[str, DemoRecipe] = {f.demo.name: f.demo for f in families.FAMILIES if f.demo is not None}
FAMILIES = {name: (r.target, r.draft) for name, r in RECIPES.items()}  # the target and the draft in words
DEFAULT_FAMILY = "qwen3"
SIZES = RECIPES[DEFAULT_FAMILY].sizes  # the default family's sizes
# The weights of a family's safetensors folders where they are not all bf16 (both roles)
FOLDER_FORMATS = {name: r.folder_weights for name, r in RECIPES.items() if r.folder_weights}


def family_sizes(family: str = DEFAULT_FAMILY) -> dict:
    """The sizes of a demo family (ArgumentError naming the families for an unknown one)."""
    return RECIPES[check_family(family)].sizes


def check_family(family) -> str:
    if family not in FAMILIES:
        raise ArgumentError(f"demo model family {family!r:.80} is unknown: expected one of {', '.join(FAMILIES)}")
    return family


def demo_name(size: str, family: str = DEFAULT_FAMILY) -> str:
    """One string naming a demo pair: its size for the default family ('bench'), else 'family/size'
    ('deepseek/bench'). ensure_demo_pair() takes it as its size."""
    return size if family == DEFAULT_FAMILY else f"{family}/{size}"


def split_demo(name: str, family: str | None = None) -> tuple[str, str]:
    """(family, size) of a demo name ('bench', 'deepseek/bench'), the family given apart or the default; an unknown
    family or size, or a name whose family is not the one given, is an ArgumentError naming the accepted ones."""
    named, sep, size = name.rpartition("/") if isinstance(name, str) else ("", "", name)
    if sep:
        check_family(named)
        if family is not None and family != named:
            raise ArgumentError(f"demo {name!r:.80} is of family {named!r}, not {family!r}")
        family = named
    family = check_family(DEFAULT_FAMILY if family is None else family)
    sizes = family_sizes(family)
    if size not in sizes:
        raise ArgumentError(f"demo model size {size!r:.80} is unknown: expected one of {', '.join(sizes)}")
    return family, size


def spec_family(spec) -> str:
    return getattr(spec, "family", DEFAULT_FAMILY)


def spec_recipe(spec) -> DemoRecipe:
    """The recipe of a size of any family."""
    return RECIPES[spec_family(spec)]


def model_config(spec, role: str, eos_id: int) -> dict:
    """config.json of the target or the draft of a size of any family, as its recipe writes it."""
    return spec_recipe(spec).config(spec, role, eos_id)


def model_tensors(spec, role: str) -> Iterator[Tensor]:
    """The tensors of the target or the draft of a size of any family, in file order (shapes are known before any
    value is made)."""
    return spec_recipe(spec).tensors(spec, role)


def draft_layer_map(spec) -> list[int]:
    """The target layer each draft layer carries."""
    return spec_recipe(spec).layer_map(spec)


# The demo pair's file formats, and the GGUF quantizations: quant -> (llama.cpp's general.file_type, the experts'
# format, every other matrix's format). Norms and the router stay F32, as llama.cpp keeps them.
DEMO_FORMATS = ("safetensors", "gguf")
QUANTS = {
    "q8_0": (7, "Q8_0", "Q8_0"),  # LLAMA_FTYPE_MOSTLY_Q8_0
    "mxfp4": (38, "MXFP4", "Q8_0"),  # LLAMA_FTYPE_MOSTLY_MXFP4_MOE: MXFP4 experts, Q8_0 elsewhere
}
DEFAULT_QUANT = "q8_0"
# The quantizations whose draft is a small MoE, and its top-k: the target's carried layers with their routers and every
# expert as the file holds them, each token through the router's top 2 (the dense draft's base MLP strays from MXFP4
# experts by 4-bit rounding steps, far more than the deviations the float pair's acceptance was tuned on)
MOE_DRAFTS = {"mxfp4": 2}
SYNTHETIC_KEY = "expertbench.synthetic"  # the GGUF files' mark (config.json says expertbench_synthetic)


@dataclass(frozen=True)
class DemoPair:
    target: Path  # a model folder, or a .gguf file
    draft: Path
    size: str
    built: bool  # False when an intact pair was found in the cache
    reason: str  # why it was built ("missing", "damaged: ..."), or "" when found intact
    format: str = "safetensors"
    quant: str | None = None  # the GGUF quantization (QUANTS), None for safetensors
    family: str = DEFAULT_FAMILY  # FAMILIES


def is_synthetic(checkpoint) -> bool:
    """Whether a checkpoint is a demo model: its config.json says expertbench_synthetic, or its GGUF metadata says
    expertbench.synthetic."""
    return bool(checkpoint.config.synthetic)


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or ""
    return (Path(base) if base else Path.home() / ".cache") / "expertbench"


# The DeepSeek pair's tokenizer_config.json: the tokenizer.json as it is (transformers would otherwise take the
# Llama tokenizer class that deepseek_v3 maps to, and llama.cpp's converter fails on this vocabulary)
TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "model_max_length": 1 << 20,
    "clean_up_tokenization_spaces": False,
}


def recipe(size, format: str = "safetensors", quant: str | None = None) -> dict:
    """Everything the files depend on: a manifest with another recipe is rebuilt."""
    out = {"format": FORMAT_VERSION, "seed": SEED, "init_std": INIT_STD, "norm_std": NORM_STD, **asdict(size)}
    if spec_recipe(size).tokenizer_config:
        out["tokenizer_config"] = TOKENIZER_CONFIG
    if format == "gguf":
        out.update(file_format="gguf", gguf_format=GGUF_FORMAT_VERSION, quant=quant)
    return out


def check_format(format: str = "safetensors", quant: str | None = None, family: str = DEFAULT_FAMILY) -> str | None:
    """The quantization a demo format takes (the default one for GGUF); ArgumentError for an unknown format or
    quantization, a quantization given for safetensors, or a format the family is not written in."""
    if format not in DEMO_FORMATS:
        raise ArgumentError(f"demo model format {format!r:.80} is unknown: expected one of {', '.join(DEMO_FORMATS)}")
    if format not in RECIPES[check_family(family)].formats:
        said = {"safetensors": "safetensors folders", "gguf": "GGUF files"}
        raise ArgumentError(f"the {FAMILIES[family][0]} demo (family {family!r}) is written as "
                            f"{' or '.join(said[f] for f in RECIPES[family].formats)} only, not as "
                            f"{said[format]}")  # fmt: skip
    if format == "safetensors":
        if quant is not None and family in FOLDER_FORMATS:
            raise ArgumentError(f"demo quantization {quant!r:.80}: the {FAMILIES[family][0]} demo's folders take "
                                f"none ({FOLDER_FORMATS[family]}, as released)")  # fmt: skip
        if quant is not None:
            raise ArgumentError(f"demo quantization {quant!r:.80}: only the GGUF demo is quantized (format 'gguf'); "
                                "the safetensors demo is bf16")  # fmt: skip
        return None
    quant = DEFAULT_QUANT if quant is None else quant
    if quant not in QUANTS:
        raise ArgumentError(f"demo quantization {quant!r:.80} is unknown: expected one of {', '.join(QUANTS)} (q8_0: "
                            "every matrix Q8_0; mxfp4: MXFP4 experts, Q8_0 elsewhere, as llama.cpp's "
                            "MXFP4_MOE)")  # fmt: skip
    return quant


def quant_formats(quant: str | None, role: str = "target", family: str = DEFAULT_FAMILY) -> str:
    """The weight formats of a demo file in words: 'BF16', 'Q8_0', 'MXFP4 experts, Q8_0 elsewhere' (norms and the
    router, F32, not named); a family's folders as FOLDER_FORMATS says."""
    if quant is None:
        return FOLDER_FORMATS.get(family, "BF16")
    _, experts, other = QUANTS[quant]
    dense = role == "draft" and quant not in MOE_DRAFTS
    return other if experts == other or dense else f"{experts} experts, {other} elsewhere"


def draft_kind(family: str = DEFAULT_FAMILY, quant: str | None = None) -> str:
    """The draft of a demo pair in words: its family's (FAMILIES), or a MoE draft's (MOE_DRAFTS)."""
    if quant in MOE_DRAFTS:
        return f"{FAMILIES[family][0]} of the target's layers, top-{MOE_DRAFTS[quant]}"
    return FAMILIES[family][1]


def demo_folder(size: str = "default", cache_dir: str | os.PathLike | None = None, format: str = "safetensors",
                quant: str | None = None, family: str | None = None) -> Path:  # fmt: skip
    """The cache folder of a demo pair: demo-<size>[-gguf-<quant>]-v1, demo-<family>-<size>-v1 for another family than
    the default. size may name the family too ('deepseek/bench', demo_name())."""
    family, size = split_demo(size, family)
    quant = check_format(format, quant, family)
    kind = "" if format == "safetensors" else f"-gguf-{quant}"
    prefix = "" if family == DEFAULT_FAMILY else f"{family}-"
    return (Path(cache_dir) if cache_dir is not None else cache_root()) / f"demo-{prefix}{size}{kind}-v{FORMAT_VERSION}"


def ensure_demo_pair(
    size: str = "default",
    cache_dir: str | os.PathLike | None = None,
    verify: bool = False,
    rebuild: bool = False,
    on_build: Callable[[str], None] | None = None,
    format: str = "safetensors",
    quant: str | None = None,
    family: str | None = None,
) -> DemoPair:
    """The demo pair of this size, built into the cache when missing, damaged or from an older recipe.

    verify: re-hash every file (otherwise only sizes are checked). rebuild: build even when intact.
    on_build(reason) is called before a build starts (to tell the user why this takes a moment).
    format: "safetensors" (model folders, bf16) or "gguf" (GGUF files quantized as `quant`: "q8_0", the default,
    or "mxfp4"); each format and quantization is a cache entry of its own.
    family: FAMILIES ("qwen3", the default, or "deepseek" or "gpt-oss", safetensors only); size may name it instead
    ("deepseek/bench", demo_name()).
    """
    family, size = split_demo(size, family)
    quant = check_format(format, quant, family)
    folder = demo_folder(size, cache_dir, format, quant, family)
    spec = family_sizes(family)[size]
    if format == "gguf":
        check_block_widths(spec, quant)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot create the demo model cache '{folder.parent}': {exc.strerror or exc}") from None
    with _locked(folder.parent / f"{folder.name}.lock"):
        reason = "rebuild requested" if rebuild else check_pair(folder, spec, full=verify, format=format, quant=quant)
        if reason:
            if on_build is not None:
                on_build(reason)
            build_pair(folder, spec, format, quant)
        names = ("target", "draft") if format == "safetensors" else ("target.gguf", "draft.gguf")
        return DemoPair(folder / names[0], folder / names[1], size, bool(reason), reason, format, quant, family)


def check_pair(folder: Path, spec: DemoSize, full: bool = False, format: str = "safetensors",
               quant: str | None = None) -> str:  # fmt: skip
    """'' when the pair in folder is intact, else what is wrong (sizes always, sha256 too when full)."""
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        return "missing" if not folder.exists() else "incomplete (no manifest.json)"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
        stored_recipe = manifest["recipe"]
    except (OSError, ValueError, KeyError, TypeError):
        return "damaged (manifest.json unreadable)"
    if stored_recipe != recipe(spec, format, quant):
        return "built from an older recipe"
    if not isinstance(files, dict) or not files:
        return "damaged (manifest.json lists no files)"
    for rel, entry in files.items():
        path = folder / rel
        try:
            if path.stat().st_size != entry["bytes"]:
                return f"damaged ({rel} has {path.stat().st_size} bytes, expected {entry['bytes']})"
        except OSError:
            return f"damaged ({rel} is missing)"
        except (KeyError, TypeError):
            return "damaged (manifest.json unreadable)"
    if full:
        for rel, entry in files.items():
            if _sha256(folder / rel) != entry.get("sha256"):
                return f"damaged ({rel} does not match its sha256)"
    return ""


def build_pair(folder: Path, spec: DemoSize, format: str = "safetensors", quant: str | None = None) -> None:
    """Write the pair into a fresh sibling folder, then swap it in, so a crash never leaves a half-built pair."""
    quant = check_format(format, quant, spec_family(spec))
    tmp = folder.with_name(f"{folder.name}.building-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        tokenizer_json = build_tokenizer(spec.vocab_size)
        eos_id = json.loads(tokenizer_json)["added_tokens"][0]["id"]
        for role in ("target", "draft"):
            if format == "gguf":
                write_gguf(tmp / f"{role}.gguf", spec, role, quant, tokenizer_json, eos_id)
                continue
            (tmp / role).mkdir()
            (tmp / role / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
            if spec_recipe(spec).tokenizer_config:  # as real folders have it (llama.cpp's converter needs it)
                config = {**TOKENIZER_CONFIG, "eos_token": json.loads(tokenizer_json)["added_tokens"][0]["content"]}
                (tmp / role / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
            config = model_config(spec, role, eos_id)
            (tmp / role / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            write_safetensors(tmp / role, list(model_tensors(spec, role)), spec.shard_bytes)
        files = {}
        for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
            files[path.relative_to(tmp).as_posix()] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
        manifest = {"recipe": recipe(spec, format, quant), "files": files,
                    "built": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    except OSError as exc:
        raise CheckpointError(f"cannot write the demo model into '{folder}': {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bf16_bytes(a: np.ndarray) -> bytes:
    """float32 -> bfloat16 (round to nearest even), little-endian bytes. Consumes a (works in place)."""
    return (bf16_rounded(a).view(np.uint32) >> 16).astype("<u2").tobytes()


def _stored(make: Callable[[], np.ndarray]) -> tuple[str, int]:
    """The safetensors dtype of a tensor and its bytes per value: BF16, or U8 for a RawTensor."""
    return ("U8", 1) if isinstance(make, RawTensor) else ("BF16", 2)


def write_safetensors(folder: Path, tensors: list[Tensor], shard_bytes: int) -> None:
    """Write bf16 tensors (uint8 for a RawTensor: MXFP4 blocks and scales) as model.safetensors, or as shards plus
    model.safetensors.index.json when they exceed shard_bytes. Written one tensor at a time, so memory stays at one
    tensor whatever the model size.

    (The format is a little-endian u64 header length, a JSON header, then the raw bytes. It is written here
    directly because numpy has no bfloat16 for safetensors' numpy API to take.)"""
    shards: list[list[Tensor]] = [[]]
    used = 0
    for t in tensors:
        nbytes = _stored(t[2])[1] * int(np.prod(t[1]))
        if shards[-1] and used + nbytes > shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(t)
        used += nbytes
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    weight_map = {}
    for file_name, shard in zip(names, shards, strict=True):
        header: dict = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, shape, make in shard:
            dtype, size = _stored(make)
            nbytes = size * int(np.prod(shape))
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = file_name
        head = json.dumps(header, separators=(",", ":")).encode()
        head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
        with (folder / file_name).open("wb") as f:
            f.write(struct.pack("<Q", len(head)) + head)
            for name, shape, make in shard:
                values = make()
                if values.shape != tuple(shape):
                    raise AssertionError(f"{name}: made shape {values.shape}, declared {shape}")
                f.write(values.astype(np.uint8).tobytes() if isinstance(make, RawTensor) else bf16_bytes(values))
    if len(shards) > 1:
        total = sum(_stored(t[2])[1] * int(np.prod(t[1])) for t in tensors)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


# ---- the GGUF form ------------------------------------------------------------------------------------------


@dataclass
class GGUFTensor:
    """A tensor of a GGUF file to write: llama.cpp's name, numpy shape, format, and the makers of its values (one, or
    one per expert of a merged [experts, rows, cols] tensor)."""

    name: str
    shape: tuple[int, ...]
    fmt: str
    makers: list[Callable[[], np.ndarray]]

    def values(self) -> np.ndarray:
        if len(self.makers) == 1:
            return self.makers[0]()
        return np.stack([make() for make in self.makers])


def gguf_tensors(spec: DemoSize, role: str, quant: str) -> list[GGUFTensor]:
    """The tensors of model_tensors() under llama.cpp's names (engine/checkpoints/gguf_file.py's table read backwards),
    each MoE layer's experts merged per projection, in file order; their formats as llama.cpp's quantizer picks them:
    1-D norms and the router F32, experts QUANTS[quant][1], every other matrix QUANTS[quant][2] (a MoE draft,
    MOE_DRAFTS, holds the target's carried layers: moe_draft_tensors)."""
    from ..families.base import LAYER_TENSORS, MOE_LAYER_TENSORS
    from .gguf_file import EXPERT_TENSORS, GLOBAL_TENSORS

    global_names = {hf: g for g, hf in GLOBAL_TENSORS.items()}
    layer_names = {hf: g for g, hf in (LAYER_TENSORS | MOE_LAYER_TENSORS).items()}
    expert_names = {hf: g for g, hf in EXPERT_TENSORS.items()}
    _, expert_fmt, matrix_fmt = QUANTS[quant]
    out: list[GGUFTensor] = []
    merged: dict[str, GGUFTensor] = {}
    moe_draft = role == "draft" and quant in MOE_DRAFTS
    for name, shape, make in moe_draft_tensors(spec) if moe_draft else model_tensors(spec, role):
        if name in global_names:
            out.append(GGUFTensor(global_names[name], shape, "F32" if len(shape) == 1 else matrix_fmt, [make]))
            continue
        _, _, layer, rest = name.split(".", 3)  # model.layers.N.<rest>
        expert, _, proj = rest.removeprefix("mlp.experts.").partition(".")
        if rest.startswith("mlp.experts."):
            gname = f"blk.{layer}.{expert_names[proj]}"
            if gname not in merged:
                merged[gname] = GGUFTensor(gname, shape, expert_fmt, [])
                out.append(merged[gname])
            merged[gname].makers.append(make)
            continue
        router = rest == "mlp.gate.weight"
        out.append(GGUFTensor(f"blk.{layer}.{layer_names[rest]}", shape,
                              "F32" if len(shape) == 1 or router else matrix_fmt, [make]))  # fmt: skip
    for t in merged.values():
        t.shape = (len(t.makers), *t.shape)
    return out


def moe_draft_tensors(spec) -> Iterator[Tensor]:
    """The tensors of a MoE draft (MOE_DRAFTS): the target's carried layers (draft_layer_map) renumbered, each with its
    router and every expert, as the target has them; nothing of the layers the draft skips."""
    carried = {t: j for j, t in enumerate(draft_layer_map(spec))}
    for name, shape, make in model_tensors(spec, "target"):
        if name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            if int(layer) not in carried:
                continue
            name = f"model.layers.{carried[int(layer)]}.{rest}"
        yield name, shape, make


def gguf_config(spec, role: str, quant: str, eos_id: int) -> dict:
    """config.json of the model a GGUF demo file holds: model_config(), except a MoE draft's (MOE_DRAFTS), which is the
    target's with the draft's layers and top-k."""
    if role == "draft" and quant in MOE_DRAFTS:
        target = model_config(spec, "target", eos_id)
        return {**target, "num_hidden_layers": spec.draft_layers, "max_window_layers": spec.draft_layers,
                "num_experts_per_tok": MOE_DRAFTS[quant]}  # fmt: skip
    return model_config(spec, role, eos_id)


def check_block_widths(spec: DemoSize, quant: str) -> None:
    """Q8_0 and MXFP4 store each row in blocks of 32 values: every matrix width of the size (its rows' lengths) must
    be a multiple of that, or the size has no GGUF form (ArgumentError naming the width)."""
    from ..core import formats

    block = max(formats.get(f).block for f in QUANTS[quant][1:])
    widths = {"hidden_size": spec.hidden_size, "moe_intermediate_size": spec.moe_intermediate_size,
              "num_heads x head_dim": spec.num_heads * spec.head_dim}  # fmt: skip
    bad = [f"{what} = {n}" for what, n in widths.items() if n % block]
    if bad:
        raise ArgumentError(f"demo size '{spec.name}' cannot be written as GGUF {quant}: {', '.join(bad)} is not a "
                            f"multiple of {block} ({' and '.join(dict.fromkeys(QUANTS[quant][1:]))} store rows in "
                            f"blocks of {block} values)")  # fmt: skip


def bf16_rounded(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 as bf16_bytes() rounds them, still float32 (the safetensors pair's values).
    Consumes a (works in place)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))
    u &= np.uint32(0xFFFF0000)
    return u.view(np.float32)


def tokenizer_keys(tokenizer_json: str) -> dict:
    """tokenizer.ggml.* values of a byte-level BPE tokenizer.json as llama.cpp's converter writes them: the vocabulary
    by id, token types (1 normal, 3 control for special added tokens, 4 user-defined for the others), the merges as
    'a b' strings (the pre-tokenizer, 'gpt-2', is the GPT-2 split the demo tokenizer's ByteLevel makes)."""
    tj = json.loads(tokenizer_json)
    by_id = {i: t for t, i in tj["model"]["vocab"].items()}
    types = dict.fromkeys(by_id, 1)
    for added in tj["added_tokens"]:
        by_id[added["id"]] = added["content"]
        types[added["id"]] = 3 if added["special"] else 4
    if sorted(by_id) != list(range(len(by_id))):
        raise AssertionError("the demo tokenizer's ids are not 0..n-1")
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    return {"tokens": [by_id[i] for i in range(len(by_id))], "types": [types[i] for i in range(len(by_id))],
            "merges": merges}  # fmt: skip


def write_gguf(path: Path, spec: DemoSize, role: str, quant: str, tokenizer_json: str, eos_id: int) -> None:
    """The target (qwen3moe) or draft (qwen3) as one GGUF file: the `<arch>.*` keys from the config, the tokenizer as
    tokenizer.ggml.*, the bf16 weights quantized with gguf.quants. Written one tensor at a time (the tensor table
    first, from the shapes), so memory stays at one tensor whatever the size."""
    import gguf

    from ..core import formats

    check_block_widths(spec, quant)
    cfg = gguf_config(spec, role, quant, eos_id)
    arch = "qwen3moe" if "num_experts" in cfg else "qwen3"
    w = gguf.GGUFWriter(None, arch)
    w.add_type("model")
    w.add_name(f"expertbench demo {spec.name} {role}")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if "num_experts" in cfg:
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    tok = tokenizer_keys(tokenizer_json)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # llama.cpp's name for the GPT-2 split (llama-vocab.cpp)
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    w.add_token_merges(tok["merges"])
    w.add_bos_token_id(eos_id)
    w.add_eos_token_id(eos_id)
    w.add_pad_token_id(eos_id)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_bool(SYNTHETIC_KEY, True)
    w.add_string("expertbench.demo.size", spec.name)
    w.add_string("expertbench.demo.role", role)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_file_type(QUANTS[quant][0])
    tensors = gguf_tensors(spec, role, quant)
    qtype = {t.fmt: gguf.GGMLQuantizationType(formats.get(t.fmt).ggml_type) for t in tensors}
    for t in tensors:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), formats.tensor_bytes(t.fmt, t.shape),
                          raw_dtype=qtype[t.fmt])  # fmt: skip
    try:
        w.write_header_to_file(path)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t in tensors:
            values = t.values()
            if values.shape != t.shape:
                raise AssertionError(f"{t.name}: made shape {values.shape}, declared {t.shape}")
            values = bf16_rounded(values)  # the safetensors pair's values, which llama.cpp's converter would read
            w.write_tensor_data(values if t.fmt == "F32" else gguf.quants.quantize(values, qtype[t.fmt]))
    finally:
        w.close()


# The tokenizer's training text: plain English (so the prompts tokenize into words), then made-up words drawn
# from a seeded generator, so byte-level BPE finds enough merges to fill any vocabulary size exactly.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog does not move; it sleeps in the warm sun by the old "
    "barn, and the fox runs away into the green field beyond the river.",
    "A mixture of experts is a neural network layer made of many small feed forward networks, called experts, "
    "and a router. For every token the router picks the top few experts, and only those experts are run. The "
    "outputs of the chosen experts are weighted by the router scores and added together.",
    "Language models read text as a sequence of tokens. Each token is turned into a vector, passed through many "
    "layers of attention and feed forward blocks, and finally mapped back to a score for every word in the "
    "vocabulary. Greedy decoding simply takes the token with the highest score and repeats.",
    "Speculative decoding lets a small draft model propose a few tokens, and the large target model verifies "
    "them all in one pass. Tokens the target agrees with are kept; at the first disagreement the target's own "
    "choice is used, so the output is exactly what the target alone would have written.",
    "In the morning the farmer walks to the market with a basket of apples, bread and cheese. She sells most of "
    "it before noon, buys some coffee, and talks with her neighbours about the weather, the harvest and the "
    "price of grain. In the evening she returns home and reads a book.",
    "Numbers such as 1, 2, 3, 10, 42 and 2024 appear in text too, as do symbols like +, -, *, /, =, (, ), [, ], "
    "{, }, and quotes. A good tokenizer handles all of them, because byte level encoding can represent any "
    "string at all.",
]
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]


def build_tokenizer(vocab_size: int) -> str:
    """A byte-level BPE tokenizer with exactly vocab_size tokens (EOS included), as tokenizer.json text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = np.random.default_rng([SEED, vocab_size])
    n_words = max(2000, vocab_size * 4)
    lengths = rng.integers(1, 5, size=n_words)
    picks = rng.integers(0, len(SYLLABLES), size=int(lengths.sum()))
    words, at = [], 0
    for n in lengths.tolist():
        words.append("".join(SYLLABLES[i] for i in picks[at : at + n]))
        at += n
    lines = [" ".join(words[i : i + 16]) for i in range(0, len(words), 16)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(CORPUS * 4 + lines, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise AssertionError(f"demo tokenizer has {tok.get_vocab_size()} tokens, expected {vocab_size}")
    return tok.to_str()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _locked(path: Path):
    """One builder at a time per pair (two processes starting at once would otherwise both build)."""
    try:
        import fcntl
    except ImportError:  # no advisory locks on this platform: builds still swap in atomically
        yield
        return
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
