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

The files live in the user's cache folder ($XDG_CACHE_HOME or ~/.cache)/expertbench/demo-<size>-v1/, with
target/, draft/ and manifest.json (the size and sha256 of every file, and the recipe they were built from).
Each use checks that every file exists with its recorded size and that the recipe is current (cheap);
`verify=True` (`expertbench demo-model --verify`) also re-hashes every byte. A pair that fails either check
is rebuilt.
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

from .errors import ArgumentError, CheckpointError

FORMAT_VERSION = 1
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
}  # fmt: skip


@dataclass(frozen=True)
class DemoPair:
    target: Path
    draft: Path
    size: str
    built: bool  # False when an intact pair was found in the cache
    reason: str  # why it was built ("missing", "damaged: ..."), or "" when found intact


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or ""
    return (Path(base) if base else Path.home() / ".cache") / "expertbench"


def recipe(size: DemoSize) -> dict:
    """Everything the files depend on: a manifest with another recipe is rebuilt."""
    return {"format": FORMAT_VERSION, "seed": SEED, "init_std": INIT_STD, "norm_std": NORM_STD, **asdict(size)}


def demo_folder(size: str = "default", cache_dir: str | os.PathLike | None = None) -> Path:
    if size not in SIZES:
        raise ArgumentError(f"demo model size {size!r} is unknown: expected one of {', '.join(SIZES)}")
    return (Path(cache_dir) if cache_dir is not None else cache_root()) / f"demo-{size}-v{FORMAT_VERSION}"


def ensure_demo_pair(
    size: str = "default",
    cache_dir: str | os.PathLike | None = None,
    verify: bool = False,
    rebuild: bool = False,
    on_build: Callable[[str], None] | None = None,
) -> DemoPair:
    """The demo pair of this size, built into the cache when missing, damaged or from an older recipe.

    verify: re-hash every file (otherwise only sizes are checked). rebuild: build even when intact.
    on_build(reason) is called before a build starts (to tell the user why this takes a moment).
    """
    folder = demo_folder(size, cache_dir)
    spec = SIZES[size]
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot create the demo model cache '{folder.parent}': {exc.strerror or exc}") from None
    with _locked(folder.parent / f"{folder.name}.lock"):
        reason = "rebuild requested" if rebuild else check_pair(folder, spec, full=verify)
        if reason:
            if on_build is not None:
                on_build(reason)
            build_pair(folder, spec)
        return DemoPair(folder / "target", folder / "draft", size, bool(reason), reason)


def check_pair(folder: Path, spec: DemoSize, full: bool = False) -> str:
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
    if stored_recipe != recipe(spec):
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


def build_pair(folder: Path, spec: DemoSize) -> None:
    """Write the pair into a fresh sibling folder, then swap it in, so a crash never leaves a half-built pair."""
    tmp = folder.with_name(f"{folder.name}.building-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "target").mkdir(parents=True)
        (tmp / "draft").mkdir()
        tokenizer_json = build_tokenizer(spec.vocab_size)
        eos_id = json.loads(tokenizer_json)["added_tokens"][0]["id"]
        for role in ("target", "draft"):
            (tmp / role / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
            (tmp / role / "config.json").write_text(json.dumps(model_config(spec, role, eos_id), indent=2) + "\n")
            write_safetensors(tmp / role, list(model_tensors(spec, role)), spec.shard_bytes)
        files = {}
        for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
            files[path.relative_to(tmp).as_posix()] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
        manifest = {"recipe": recipe(spec), "files": files, "built": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    except OSError as exc:
        raise CheckpointError(f"cannot write the demo model into '{folder}': {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def model_config(spec: DemoSize, role: str, eos_id: int) -> dict:
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


def draft_layer_map(spec: DemoSize) -> list[int]:
    """Target layer carried by each draft layer: evenly spaced, the first and last included."""
    if spec.draft_layers == 1:
        return [0]
    return [round(j * (spec.num_layers - 1) / (spec.draft_layers - 1)) for j in range(spec.draft_layers)]


# A tensor to write: its name, shape and a function producing its float32 values (called once, when written).
Tensor = tuple[str, tuple[int, ...], Callable[[], np.ndarray]]


def model_tensors(spec: DemoSize, role: str) -> Iterator[Tensor]:
    """The tensors of the target or the draft, in file order. Values depend only on (SEED, key), so the draft's
    copy of a target tensor is bit-identical to it."""
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


def _expert(layer: int, expert: int, proj: str, shape, deviation: float, scale: float) -> Callable[[], np.ndarray]:
    def make() -> np.ndarray:
        w = _normal(f"{layer}.base.{proj}", shape)
        w += _normal(f"{layer}.expert.{expert}.{proj}", shape, INIT_STD * deviation)
        if scale != 1.0:
            w *= np.float32(scale)
        return w

    return make


def bf16_bytes(a: np.ndarray) -> bytes:
    """float32 -> bfloat16 (round to nearest even), little-endian bytes. Consumes a (works in place)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))
    return (u >> 16).astype("<u2").tobytes()


def write_safetensors(folder: Path, tensors: list[Tensor], shard_bytes: int) -> None:
    """Write bf16 tensors as model.safetensors, or as shards plus model.safetensors.index.json when they exceed
    shard_bytes. Written one tensor at a time, so memory stays at one tensor whatever the model size.

    (The format is a little-endian u64 header length, a JSON header, then the raw bytes. It is written here
    directly because numpy has no bfloat16 for safetensors' numpy API to take.)"""
    shards: list[list[Tensor]] = [[]]
    used = 0
    for t in tensors:
        nbytes = 2 * int(np.prod(t[1]))
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
        for name, shape, _ in shard:
            nbytes = 2 * int(np.prod(shape))
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
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
                f.write(bf16_bytes(values))
    if len(shards) > 1:
        total = sum(2 * int(np.prod(t[1])) for t in tensors)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


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
