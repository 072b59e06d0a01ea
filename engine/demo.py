"""The built-in demo model pair: a seeded synthetic Qwen3-MoE target and a dense Qwen3 draft built from it.

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
size must be a multiple of 32 (every size here is).

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
import functools
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

from .errors import ArgumentError, CheckpointError

FORMAT_VERSION = 1
GGUF_FORMAT_VERSION = 1  # of the GGUF files' recipe (their keys and tensor types), beside the weights' FORMAT_VERSION
SEED = 20240604
INIT_STD = 0.1  # of every weight matrix; larger than usual so a random model's greedy output varies
NORM_STD = 0.1  # RMSNorm weights are 1 + NORM_STD * N(0, 1), so the norms are not all ones
EOS = "<|endoftext|>"

DEMO_PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A mixture of experts routes every token to a few small feed forward networks.",
    "In the morning the farmer walks to the market with a basket of apples.",
    "Speculative decoding lets a small draft model propose tokens that a large model verifies.",
]


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


DEEPSEEK_SIZES = {
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


GPT_OSS_SIZES = {
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

# The demo families: name -> the target and the draft in words (family_sizes() has their sizes). The default is the
# Qwen3-MoE pair; a demo of another family is named 'family/size' where one string names a pair (demo_name()).
FAMILIES = {
    "qwen3": ("Qwen3-MoE", "dense Qwen3"),
    "deepseek": ("DeepSeek-V3", "dense DeepSeek-V3"),
    "gpt-oss": ("gpt-oss", "one-expert gpt-oss"),
}
DEFAULT_FAMILY = "qwen3"
FAMILY_FORMATS = {"qwen3": ("safetensors", "gguf"), "deepseek": ("safetensors",), "gpt-oss": ("safetensors",)}
FAMILY_SIZES = {"qwen3": SIZES, "deepseek": DEEPSEEK_SIZES, "gpt-oss": GPT_OSS_SIZES}


def family_sizes(family: str = DEFAULT_FAMILY) -> dict:
    """The sizes of a demo family (ArgumentError naming the families for an unknown one)."""
    return FAMILY_SIZES[check_family(family)]


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


# The demo pair's file formats, and the GGUF quantizations: quant -> (llama.cpp's general.file_type, the experts'
# format, every other matrix's format). Norms and the router stay F32, as llama.cpp keeps them.
DEMO_FORMATS = ("safetensors", "gguf")
QUANTS = {
    "q8_0": (7, "Q8_0", "Q8_0"),  # LLAMA_FTYPE_MOSTLY_Q8_0
    "mxfp4": (38, "MXFP4", "Q8_0"),  # LLAMA_FTYPE_MOSTLY_MXFP4_MOE: MXFP4 experts, Q8_0 elsewhere
}
DEFAULT_QUANT = "q8_0"
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


DemoSpec = DemoSize | DeepSeekDemoSize | GptOssDemoSize  # a size of any family


def recipe(size: DemoSpec, format: str = "safetensors", quant: str | None = None) -> dict:
    """Everything the files depend on: a manifest with another recipe is rebuilt."""
    out = {"format": FORMAT_VERSION, "seed": SEED, "init_std": INIT_STD, "norm_std": NORM_STD, **asdict(size)}
    if spec_family(size) != DEFAULT_FAMILY:
        out["tokenizer_config"] = TOKENIZER_CONFIG
    if format == "gguf":
        out.update(file_format="gguf", gguf_format=GGUF_FORMAT_VERSION, quant=quant)
    return out


def check_format(format: str = "safetensors", quant: str | None = None, family: str = DEFAULT_FAMILY) -> str | None:
    """The quantization a demo format takes (the default one for GGUF); ArgumentError for an unknown format or
    quantization, a quantization given for safetensors, or a format the family is not written in."""
    if format not in DEMO_FORMATS:
        raise ArgumentError(f"demo model format {format!r:.80} is unknown: expected one of {', '.join(DEMO_FORMATS)}")
    if format not in FAMILY_FORMATS[check_family(family)]:
        said = {"safetensors": "safetensors folders", "gguf": "GGUF files"}
        raise ArgumentError(f"the {FAMILIES[family][0]} demo (family {family!r}) is written as "
                            f"{' or '.join(said[f] for f in FAMILY_FORMATS[family])} only, not as "
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


# The weights of a family's safetensors folders where they are not all bf16 (both roles)
FOLDER_FORMATS = {"gpt-oss": "MXFP4 experts, BF16 elsewhere"}


def quant_formats(quant: str | None, role: str = "target", family: str = DEFAULT_FAMILY) -> str:
    """The weight formats of a demo file in words: 'BF16', 'Q8_0', 'MXFP4 experts, Q8_0 elsewhere' (norms and the
    router, F32, not named); a family's folders as FOLDER_FORMATS says."""
    if quant is None:
        return FOLDER_FORMATS.get(family, "BF16")
    _, experts, other = QUANTS[quant]
    return other if experts == other or role == "draft" else f"{experts} experts, {other} elsewhere"


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
            if spec_family(spec) != DEFAULT_FAMILY:  # as real folders have it (llama.cpp's converter needs it)
                config = {**TOKENIZER_CONFIG, "eos_token": json.loads(tokenizer_json)["added_tokens"][0]["content"]}
                (tmp / role / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
            (tmp / role / "config.json").write_text(json.dumps(model_config(spec, role, eos_id), indent=2) + "\n")
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


def model_config(spec: DemoSize, role: str, eos_id: int) -> dict:
    """config.json as transformers writes it for Qwen3MoeForCausalLM (target) / Qwen3ForCausalLM (draft); for a
    DeepSeek size, deepseek_config()'s; for a gpt-oss size, gpt_oss_config()'s."""
    if isinstance(spec, DeepSeekDemoSize):
        return deepseek_config(spec, role, eos_id)
    if isinstance(spec, GptOssDemoSize):
        return gpt_oss_config(spec, role, eos_id)
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


def draft_layer_map(spec: DemoSize) -> list[int]:
    """Target layer carried by each draft layer: evenly spaced, the first and last included (for gpt-oss, evenly
    spaced pairs of a sliding and a full attention layer, so that the draft's layers alternate as the target's do)."""
    if isinstance(spec, GptOssDemoSize):
        pairs, carried = spec.num_layers // 2, spec.draft_layers // 2
        starts = [0] if carried == 1 else [round(j * (pairs - 1) / (carried - 1)) for j in range(carried)]
        return [layer for i in starts for layer in (2 * i, 2 * i + 1)]
    if spec.draft_layers == 1:
        return [0]
    return [round(j * (spec.num_layers - 1) / (spec.draft_layers - 1)) for j in range(spec.draft_layers)]


# A tensor to write: its name, shape and a function producing its float32 values (called once, when written).
Tensor = tuple[str, tuple[int, ...], Callable[[], np.ndarray]]


def model_tensors(spec: DemoSize, role: str) -> Iterator[Tensor]:
    """The tensors of the target or the draft, in file order. Values depend only on (SEED, key), so the draft's
    copy of a target tensor is bit-identical to it. For a DeepSeek size, deepseek_tensors()'s; for a gpt-oss size,
    gpt_oss_tensors()'s."""
    if isinstance(spec, DeepSeekDemoSize):
        yield from deepseek_tensors(spec, role)
        return
    if isinstance(spec, GptOssDemoSize):
        yield from gpt_oss_tensors(spec, role)
        return
    H, inter, hd = spec.hidden_size, spec.moe_intermediate_size, spec.head_dim
    yield "model.embed_tokens.weight", (spec.vocab_size, H), lambda: _normal("embed", (spec.vocab_size, H))
    carried = draft_layer_map(spec)
    layers = range(spec.num_layers) if role == "target" else carried
    for out_index, t in enumerate(layers):
        p = f"model.layers.{t if role == 'target' else out_index}."
        skipped = role == "target" and t not in carried
        scale = spec.skipped_layer_scale if skipped else 1.0
        for norm, n in (("input_layernorm", H), ("post_attention_layernorm", H),
                        ("self_attn.q_norm", hd), ("self_attn.k_norm", hd)):  # fmt: skip
            yield p + norm + ".weight", (n,), _norm_weight(f"{t}.{norm}", n)
        q_rows, kv_rows = spec.num_heads * hd, spec.num_kv_heads * hd
        yield p + "self_attn.q_proj.weight", (q_rows, H), _matrix(f"{t}.q", (q_rows, H))
        yield p + "self_attn.k_proj.weight", (kv_rows, H), _matrix(f"{t}.k", (kv_rows, H))
        yield p + "self_attn.v_proj.weight", (kv_rows, H), _matrix(f"{t}.v", (kv_rows, H))
        yield p + "self_attn.o_proj.weight", (H, q_rows), _matrix(f"{t}.o", (H, q_rows), scale)
        shapes = {"gate_proj": (inter, H), "up_proj": (inter, H), "down_proj": (H, inter)}
        if role == "draft":
            for proj, shape in shapes.items():
                yield p + f"mlp.{proj}.weight", shape, _matrix(f"{t}.base.{proj}", shape)
            continue
        dev = spec.expert_deviation
        yield p + "mlp.gate.weight", (spec.num_experts, H), _matrix(f"{t}.router", (spec.num_experts, H))
        for e in range(spec.num_experts):
            for proj, shape in shapes.items():
                out_scale = scale if proj == "down_proj" else 1.0
                yield p + f"mlp.experts.{e}.{proj}.weight", shape, _expert(t, e, proj, shape, dev, out_scale)
    yield "model.norm.weight", (H,), _norm_weight("final_norm", H)
    yield "lm_head.weight", (spec.vocab_size, H), lambda: _normal("lm_head", (spec.vocab_size, H))


# ---- the DeepSeek-V3 pair ------------------------------------------------------------------------------------


def deepseek_config(spec: DeepSeekDemoSize, role: str, eos_id: int) -> dict:
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


def deepseek_tensors(spec: DeepSeekDemoSize, role: str) -> Iterator[Tensor]:
    """The DeepSeek pair's tensors under transformers' DeepseekV3ForCausalLM names, in file order. Every routed
    expert is the layer's base MLP plus a small deviation; a draft layer holds its target layer's attention and norms
    as they are and, as its dense FFN, the target's dense FFN or [shared expert | base MLP] (gate and up rows stacked,
    down columns side by side, the base's down_proj times routed_scaling_factor)."""
    H, inter, heads = spec.hidden_size, spec.moe_intermediate_size, spec.num_heads
    qk, rope = spec.qk_nope_head_dim + spec.qk_rope_head_dim, spec.qk_rope_head_dim
    shared = inter * spec.n_shared_experts
    yield "model.embed_tokens.weight", (spec.vocab_size, H), lambda: _normal("ds.embed", (spec.vocab_size, H))
    carried = draft_layer_map(spec)
    layers = range(spec.num_layers) if role == "target" else carried
    for out_index, t in enumerate(layers):
        p, k = f"model.layers.{t if role == 'target' else out_index}.", f"ds.{t}"
        scale = spec.skipped_layer_scale if role == "target" and t not in carried else 1.0
        for norm, n in (("input_layernorm", H), ("post_attention_layernorm", H),
                        ("self_attn.q_a_layernorm", spec.q_lora_rank),
                        ("self_attn.kv_a_layernorm", spec.kv_lora_rank)):  # fmt: skip
            yield p + norm + ".weight", (n,), _norm_weight(f"{k}.{norm}", n)
        attention = {
            "q_a_proj": ((spec.q_lora_rank, H), 1.0),
            "q_b_proj": ((heads * qk, spec.q_lora_rank), 1.0),
            "kv_a_proj_with_mqa": ((spec.kv_lora_rank + rope, H), 1.0),
            "kv_b_proj": ((heads * (spec.qk_nope_head_dim + spec.v_head_dim), spec.kv_lora_rank), 1.0),
            "o_proj": ((H, heads * spec.v_head_dim), scale),
        }
        for proj, (shape, s) in attention.items():
            yield p + f"self_attn.{proj}.weight", shape, _matrix(f"{k}.{proj}", shape, s)
        dense = t < spec.first_k_dense_replace
        if dense or role == "draft":
            I = spec.intermediate_size  # noqa: E741
            for proj, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                if dense:
                    make = _matrix(f"{k}.dense.{proj}", shape, scale if proj == "down_proj" else 1.0)
                else:
                    make = _shared_and_base(k, proj, shared, inter, H, spec.routed_scaling_factor)
                yield p + f"mlp.{proj}.weight", shape, make
            continue
        E = spec.num_experts
        yield p + "mlp.gate.weight", (E, H), _matrix(f"{k}.router", (E, H))
        yield p + "mlp.gate.e_score_correction_bias", (E,), _vector(f"{k}.router_bias", E, spec.router_bias_std)
        shapes = {"gate_proj": (inter, H), "up_proj": (inter, H), "down_proj": (H, inter)}
        for e in range(E):
            for proj, shape in shapes.items():
                out_scale = scale if proj == "down_proj" else 1.0
                yield p + f"mlp.experts.{e}.{proj}.weight", shape, _expert(k, e, proj, shape, spec.expert_deviation,
                                                                           out_scale)  # fmt: skip
        for proj in shapes:
            shape, s = ((shared, H), 1.0) if proj != "down_proj" else ((H, shared), scale)
            yield p + f"mlp.shared_experts.{proj}.weight", shape, _matrix(f"{k}.shared.{proj}", shape, s)
    yield "model.norm.weight", (H,), _norm_weight("ds.final_norm", H)
    yield "lm_head.weight", (spec.vocab_size, H), lambda: _normal("ds.lm_head", (spec.vocab_size, H))


def _vector(key: str, n: int, std: float) -> Callable[[], np.ndarray]:
    return lambda: _normal(key, (n,), std)


def _shared_and_base(k: str, proj: str, shared: int, inter: int, H: int, routed_scale: float):
    """A draft FFN matrix standing for a target MoE layer: the shared expert's and the base MLP's side by side."""

    def make() -> np.ndarray:
        if proj == "down_proj":
            base = _normal(f"{k}.base.{proj}", (H, inter))
            base *= np.float32(routed_scale)
            return np.concatenate([_normal(f"{k}.shared.{proj}", (H, shared)), base], axis=1)
        return np.concatenate([_normal(f"{k}.shared.{proj}", (shared, H)), _normal(f"{k}.base.{proj}", (inter, H))])

    return make


# ---- the gpt-oss pair ---------------------------------------------------------------------------------------

# quantization_config of the released gpt-oss checkpoints (openai/gpt-oss-20b's and -120b's config.json)
GPT_OSS_QUANTIZATION = {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                               "lm_head"],
    "quant_method": "mxfp4",
}  # fmt: skip


def gpt_oss_config(spec: GptOssDemoSize, role: str, eos_id: int) -> dict:
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
        "quantization_config": GPT_OSS_QUANTIZATION,
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


def gpt_oss_tensors(spec: GptOssDemoSize, role: str) -> Iterator[Tensor]:
    """The gpt-oss pair's tensors under transformers' GptOssForCausalLM names, the experts in the released MXFP4
    layout (RawTensor: *_blocks and *_scales as uint8), in file order. Target expert e of a layer is its base MLP
    plus a deviation (weights and biases), quantized on its own; a draft layer holds its target layer's attention
    (biases and sinks too) and norms as they are, a router of one expert, and as that expert the MXFP4 of the base
    MLP. The layers the draft skips write small updates: their o_proj and experts' down_proj (with biases) scaled."""
    H, inter, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    yield "model.embed_tokens.weight", (spec.vocab_size, H), lambda: _normal("go.embed", (spec.vocab_size, H))
    carried = draft_layer_map(spec)
    layers = range(spec.num_layers) if role == "target" else carried
    E = spec.num_experts if role == "target" else 1
    dev = spec.expert_deviation if role == "target" else 0.0
    for out_index, t in enumerate(layers):
        p, k = f"model.layers.{t if role == 'target' else out_index}.", f"go.{t}"
        scale = spec.skipped_layer_scale if role == "target" and t not in carried else 1.0
        yield p + "input_layernorm.weight", (H,), _norm_weight(f"{k}.input_layernorm", H)
        q_rows, kv_rows = spec.num_heads * hd, spec.num_kv_heads * hd
        for proj, shape, s in (("q_proj", (q_rows, H), 1.0), ("k_proj", (kv_rows, H), 1.0),
                               ("v_proj", (kv_rows, H), 1.0), ("o_proj", (H, q_rows), scale)):  # fmt: skip
            yield p + f"self_attn.{proj}.weight", shape, _matrix(f"{k}.{proj}", shape, s)
            yield p + f"self_attn.{proj}.bias", shape[:1], _vector(f"{k}.{proj}.bias", shape[0], spec.bias_std * s)
        yield p + "self_attn.sinks", (spec.num_heads,), _vector(f"{k}.sinks", spec.num_heads, spec.sink_std)
        yield p + "post_attention_layernorm.weight", (H,), _norm_weight(f"{k}.post_attention_layernorm", H)
        yield p + "mlp.router.weight", (E, H), _matrix(f"{k}.router", (E, H))
        yield p + "mlp.router.bias", (E,), _vector(f"{k}.router.bias", E, spec.bias_std)
        for proj, rows, cols, s in (("gate_up_proj", 2 * inter, H, 1.0), ("down_proj", H, inter, scale)):
            blocks, scales = _mxfp4_experts(k, proj, E, rows, cols, dev, s)
            yield p + f"mlp.experts.{proj}_blocks", (E, rows, cols // 32, 16), blocks
            yield p + f"mlp.experts.{proj}_scales", (E, rows, cols // 32), scales
            yield p + f"mlp.experts.{proj}_bias", (E, rows), _expert_biases(k, proj, E, rows, dev, spec.bias_std * s)
    yield "model.norm.weight", (H,), _norm_weight("go.final_norm", H)
    yield "lm_head.weight", (spec.vocab_size, H), lambda: _normal("go.lm_head", (spec.vocab_size, H))


def _expert_rows(k: str, proj: str, e: int | None, rows: int, cols: int, deviation: float) -> np.ndarray:
    """One expert's matrix of a gpt-oss layer, one row per output ([rows, cols]): gate_up_proj's rows interleave the
    gate (even rows) and up (odd rows) projections, as the released layout does. e None: the base MLP's."""
    parts = ("gate", "up") if proj == "gate_up_proj" else ("down",)
    out = np.empty((rows, cols), dtype=np.float32)
    for i, part in enumerate(parts):
        w = _normal(f"{k}.base.{part}", (rows // len(parts), cols))
        if e is not None and deviation:
            w += _normal(f"{k}.expert.{e}.{part}", w.shape, INIT_STD * deviation)
        out[i :: len(parts)] = w
    return out


def _expert_biases(k: str, proj: str, E: int, rows: int, deviation: float, std: float) -> Callable[[], np.ndarray]:
    """[E, rows]: each expert's bias is the base bias plus a deviation (gate and up interleaved as the rows are)."""
    parts = ("gate", "up") if proj == "gate_up_proj" else ("down",)

    def make() -> np.ndarray:
        out = np.empty((E, rows), dtype=np.float32)
        for i, part in enumerate(parts):
            base = _normal(f"{k}.base.{part}.bias", (rows // len(parts),), std)
            for e in range(E):
                b = base.copy()
                if deviation:
                    b += _normal(f"{k}.expert.{e}.{part}.bias", b.shape, std * deviation)
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


class RawTensor:
    """The maker of a tensor written as the values it makes (uint8: MXFP4 blocks and scales), not rounded to bf16."""

    dtype = "U8"

    def __init__(self, make: Callable[[], np.ndarray]):
        self.make = make

    def __call__(self) -> np.ndarray:
        return self.make()


def _rng(key: str) -> np.random.Generator:
    digest = hashlib.sha256(key.encode()).digest()
    return np.random.default_rng([SEED, int.from_bytes(digest[:8], "little")])


def _normal(key: str, shape: tuple[int, ...], std: float = INIT_STD) -> np.ndarray:
    a = _rng(key).standard_normal(shape, dtype=np.float32)
    a *= np.float32(std)
    return a


def _matrix(key: str, shape, scale: float = 1.0) -> Callable[[], np.ndarray]:
    return lambda: _normal(key, shape, INIT_STD * scale)


def _norm_weight(key: str, n: int) -> Callable[[], np.ndarray]:
    def make() -> np.ndarray:
        w = _normal(f"norm.{key}", (n,), NORM_STD)
        w += np.float32(1.0)
        return w

    return make


@functools.lru_cache(maxsize=4)
def _base(key: str, shape: tuple[int, ...]) -> np.ndarray:
    """A layer's base MLP matrix, read-only: every expert of the layer adds its deviation to it (kept for the next
    expert: the experts of a layer are written one after the other)."""
    a = _normal(key, shape)
    a.flags.writeable = False
    return a


def _expert(
    layer: int | str, expert: int, proj: str, shape, deviation: float, scale: float
) -> Callable[[], np.ndarray]:
    def make() -> np.ndarray:
        w = _base(f"{layer}.base.{proj}", tuple(shape)).copy()
        w += _normal(f"{layer}.expert.{expert}.{proj}", shape, INIT_STD * deviation)
        if scale != 1.0:
            w *= np.float32(scale)
        return w

    return make


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
    """The tensors of model_tensors() under llama.cpp's names (engine/gguf_file.py's table read backwards), each MoE
    layer's experts merged per projection, in file order; their formats as llama.cpp's quantizer picks them: 1-D
    norms and the router F32, experts QUANTS[quant][1], every other matrix QUANTS[quant][2]."""
    from .families.base import LAYER_TENSORS, MOE_LAYER_TENSORS
    from .gguf_file import EXPERT_TENSORS, GLOBAL_TENSORS

    global_names = {hf: g for g, hf in GLOBAL_TENSORS.items()}
    layer_names = {hf: g for g, hf in (LAYER_TENSORS | MOE_LAYER_TENSORS).items()}
    expert_names = {hf: g for g, hf in EXPERT_TENSORS.items()}
    _, expert_fmt, matrix_fmt = QUANTS[quant]
    out: list[GGUFTensor] = []
    merged: dict[str, GGUFTensor] = {}
    for name, shape, make in model_tensors(spec, role):
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


def check_block_widths(spec: DemoSize, quant: str) -> None:
    """Q8_0 and MXFP4 store each row in blocks of 32 values: every matrix width of the size (its rows' lengths) must
    be a multiple of that, or the size has no GGUF form (ArgumentError naming the width)."""
    from . import formats

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

    from . import formats

    check_block_widths(spec, quant)
    cfg = model_config(spec, role, eos_id)
    arch = "qwen3moe" if role == "target" else "qwen3"
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
    if role == "target":
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
