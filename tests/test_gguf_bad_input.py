"""Bad GGUF input gets a clear error naming the file and what was expected, before anything reaches the core.

Each case damages a copy of a small valid file (the qwen3moe-f32 fixture converted, tests/gguf_models.py) at a
known byte, or writes one with a bad key, and expects the most specific EngineError subclass: CheckpointError for
a damaged file, UnsupportedError for a valid one the engine does not run.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from fixture_paths import FIXTURES
from gguf_models import Layout, gguf_tensors, to_gguf

from engine.checkpoints.checkpoint import Checkpoint
from engine.core.errors import CheckpointError, UnsupportedError
from engine.model import Engine

SOURCE = FIXTURES / "qwen3moe-f32"
V = gguf.GGUFValueType


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> bytes:
    return to_gguf(SOURCE, tmp_path_factory.mktemp("good") / "good.gguf")[0].read_bytes()


@pytest.fixture(scope="module")
def layout(good) -> Layout:
    return Layout(good)


def q(value: object) -> str:
    return re.escape(str(value))


def patched(tmp_path: Path, raw: bytes, *edits: tuple[int, bytes], cut: int | None = None) -> Path:
    """A copy of raw with bytes replaced at the given positions (and cut short at `cut`)."""
    data = bytearray(raw)
    for pos, new in edits:
        data[pos : pos + len(new)] = new
    path = tmp_path / "damaged.gguf"
    path.write_bytes(bytes(data[:cut]) if cut is not None else bytes(data))
    return path


def refused(path: Path, cls: type, pattern: str) -> str:
    with pytest.raises(cls, match=pattern) as info:
        Checkpoint.open(path)
    assert str(path) in str(info.value), f"the message names no file: {info.value}"
    assert type(info.value) is cls
    return str(info.value)


def write(tmp_path: Path, **kw) -> Path:
    return to_gguf(SOURCE, tmp_path / "m.gguf", **kw)[0]


# ---- the header's structure -------------------------------------------------------------------------------


def test_wrong_magic(tmp_path, good):
    path = patched(tmp_path, good, (0, b"GGML"))
    refused(path, CheckpointError, r"not a GGUF file: it starts with b'GGML', expected b'GGUF'")


def test_a_safetensors_file_is_not_taken_for_gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes((SOURCE / "model.safetensors").read_bytes())
    refused(path, CheckpointError, r"not a GGUF file.*expected b'GGUF' \(it looks like a safetensors file: a Hugging "
                                   r"Face model is opened by its folder\)")  # fmt: skip


def test_an_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    refused(path, CheckpointError, r"an empty file, expected a GGUF file")


@pytest.mark.parametrize("version, cls", [(7, UnsupportedError), (1, UnsupportedError), (0xDEADBEEF, CheckpointError)])
def test_wrong_version(tmp_path, good, version, cls):
    path = patched(tmp_path, good, (4, struct.pack("<I", version)))
    refused(path, cls, rf"GGUF version {version} is not supported \(expected 2 or 3\)")


def test_a_big_endian_file(tmp_path, good):
    path = patched(tmp_path, good, (4, struct.pack(">I", 3)))
    refused(path, UnsupportedError, r"a big-endian GGUF file \(version 3\).*little-endian files only")


def test_truncated_metadata(tmp_path, good, layout):
    _start, _vpos, end = layout.kv["tokenizer.ggml.tokens"]
    path = patched(tmp_path, good, cut=end - 3)
    refused(path, CheckpointError, r"string 511 of the array 'tokenizer.ggml.tokens' \(\d+ bytes at byte \d+\) "
                                   r"runs past the end of the file \(\d+ bytes\): truncated, or a damaged")  # fmt: skip
    _start, vpos, end = layout.kv["tokenizer.ggml.merges"]
    path = patched(tmp_path, good, cut=vpos + 100)
    refused(path, CheckpointError, r"'tokenizer.ggml.merges' is an array of 255 string items at byte \d+: they take "
                                   r"at least 2040 bytes, and the file ends \d+ bytes later")  # fmt: skip


def test_truncated_before_the_counts(tmp_path, good):
    refused(patched(tmp_path, good, cut=20), CheckpointError, r"20 bytes, too short for a GGUF file")


def test_string_length_past_the_end(tmp_path, good, layout):
    _start, vpos, _end = layout.kv["general.architecture"]
    path = patched(tmp_path, good, (vpos + 4, struct.pack("<Q", 1 << 40)))
    refused(path, CheckpointError, r"the value of 'general.architecture' \(1099511627776 bytes at byte \d+\) runs "
                                   r"past the end of the file \(\d+ bytes\)")  # fmt: skip


def test_key_length_past_the_end(tmp_path, good, layout):
    start, _vpos, _end = layout.kv["general.architecture"]
    path = patched(tmp_path, good, (start, struct.pack("<Q", 2**63)))
    refused(path, CheckpointError, r"the name of metadata entry \d+ .* runs past the end of the file")


@pytest.mark.parametrize("count", [1 << 40, 10**6])
def test_array_length_past_the_end(tmp_path, good, layout, count):
    _start, vpos, _end = layout.kv["tokenizer.ggml.tokens"]
    path = patched(tmp_path, good, (vpos + 8, struct.pack("<Q", count)))
    refused(path, CheckpointError, rf"'tokenizer.ggml.tokens' is an array of {count} string items at byte \d+: they "
                                   r"take at least \d+ bytes, and the file ends \d+ bytes later")  # fmt: skip


def test_a_byte_array_count_past_the_end(tmp_path, good, layout):
    # GGUFReader loops over such an array item by item past the end of the file, for ever
    _start, vpos, _end = layout.kv["tokenizer.ggml.token_type"]
    path = patched(tmp_path, good, (vpos + 4, struct.pack("<IQ", 0, 1 << 40)))
    refused(path, CheckpointError, r"'tokenizer.ggml.token_type' is an array of 1099511627776 uint8 items at byte")


def test_unknown_value_type_code(tmp_path, good, layout):
    _start, vpos, _end = layout.kv["qwen3moe.block_count"]
    path = patched(tmp_path, good, (vpos, struct.pack("<I", 13)))
    refused(path, CheckpointError, r"'qwen3moe.block_count' has value type code 13, expected one of 0..12")


def test_unknown_array_item_type(tmp_path, good, layout):
    _start, vpos, _end = layout.kv["tokenizer.ggml.token_type"]
    path = patched(tmp_path, good, (vpos + 4, struct.pack("<I", 99)))
    refused(path, CheckpointError, r"'tokenizer.ggml.token_type' is an array of value type code 99")


def test_an_array_of_arrays(tmp_path, good, layout):
    _start, vpos, _end = layout.kv["tokenizer.ggml.token_type"]
    path = patched(tmp_path, good, (vpos + 4, struct.pack("<I", 9)))
    refused(path, CheckpointError, r"'tokenizer.ggml.token_type' is an array of arrays, expected an array of numbers")


def test_a_key_twice(tmp_path, good, layout):
    start, _vpos, _end = layout.kv["tokenizer.ggml.eos_token_id"]
    path = patched(tmp_path, good, (start + 8, b"tokenizer.ggml.bos_token_id"))
    refused(path, CheckpointError, r"metadata key 'tokenizer.ggml.bos_token_id' appears twice")


def test_a_metadata_string_that_is_not_utf8(tmp_path, good, layout):
    _start, vpos, _end = layout.kv["general.architecture"]
    path = patched(tmp_path, good, (vpos + 12, b"\xff"))
    refused(path, CheckpointError, r"metadata key 'general.architecture' holds a string that is not UTF-8 text")


def test_alignment_not_a_power_of_two(tmp_path):
    path = write(tmp_path, extra={"general.alignment": (48, V.UINT32)})
    refused(path, CheckpointError, r"general.alignment = 48 \(uint32\), expected a power of two as a uint32")


def test_counts_larger_than_the_file(tmp_path, good):
    path = patched(tmp_path, good, (8, struct.pack("<Q", 1 << 50)))
    refused(path, CheckpointError, rf"claims \d+ metadata entries and {1 << 50} tensors, more than the file's")


# ---- the tensor table -------------------------------------------------------------------------------------


def test_unknown_tensor_type_code(tmp_path, good, layout):
    path = patched(tmp_path, good, (layout.tensors["blk.0.attn_q.weight"]["type"], struct.pack("<I", 99)))
    refused(path, CheckpointError, r"tensor 'blk.0.attn_q.weight' has type code 99, which is no ggml type \(expected "
                                   r"one of F32 \(0\), F16 \(1\), BF16 \(30\), Q8_0 \(8\)")  # fmt: skip


def test_a_ggml_type_the_engine_does_not_run(tmp_path, good, layout):
    path = patched(tmp_path, good, (layout.tensors["blk.0.attn_q.weight"]["type"], struct.pack("<I", 34)))
    refused(path, UnsupportedError, r"tensor 'blk.0.attn_q.weight' is stored as TQ1_0, a format the engine does not "
                                    r"run \(expected one of F32")  # fmt: skip


def test_an_integer_table_where_weights_belong(tmp_path, good, layout):
    """I32 is read as a family's integer table (DeepSeek-V4's tid2eid); as an expert tensor (the same bytes as F32)
    it is refused naming the tensor, never bound as weights."""
    path = patched(tmp_path, good, (layout.tensors["blk.0.ffn_up_exps.weight"]["type"], struct.pack("<I", 26)))
    refused(path, UnsupportedError, r"tensor 'blk\.0\.ffn_up_exps\.weight' is stored as I32, which the engine reads "
                                    r"only as a family's integer table")  # fmt: skip


def test_more_than_four_dimensions(tmp_path, good, layout):
    path = patched(tmp_path, good, (layout.tensors["blk.0.ffn_up_exps.weight"]["n_dims"], struct.pack("<I", 5)))
    refused(path, CheckpointError, r"tensor 'blk.0.ffn_up_exps.weight' has 5 dimensions, expected 1 to 4")


def test_no_dimensions(tmp_path, good, layout):
    path = patched(tmp_path, good, (layout.tensors["output_norm.weight"]["n_dims"], struct.pack("<I", 0)))
    refused(path, CheckpointError, r"tensor 'output_norm.weight' has 0 dimensions, expected 1 to 4")


def test_dimension_product_overflow(tmp_path, good, layout):
    dims = layout.tensors["blk.0.attn_q.weight"]["dims"]
    path = patched(tmp_path, good, (dims, struct.pack("<QQ", 1 << 32, 1 << 32)))
    refused(path, CheckpointError, r"tensor 'blk.0.attn_q.weight' has dimensions \[4294967296, 4294967296\]: their "
                                   r"product overflows 64 bits")  # fmt: skip


def test_a_zero_dimension(tmp_path, good, layout):
    dims = layout.tensors["blk.0.attn_q.weight"]["dims"]
    path = patched(tmp_path, good, (dims + 8, struct.pack("<Q", 0)))
    refused(path, CheckpointError, r"tensor 'blk.0.attn_q.weight' has dimension 1 = 0, expected 1..")


def test_tensor_data_past_the_end(tmp_path, good, layout):
    last = max(layout.tensors, key=layout.offset_of)
    path = patched(tmp_path, good, cut=len(good) - 100)
    refused(path, CheckpointError, rf"tensor '{q(last)}' \(F32 \[.*\], \d+ bytes\) lies at bytes \d+..\d+, past the "
                                   rf"end of the file \({len(good) - 100} bytes\): truncated\?")  # fmt: skip


def test_tensor_offset_past_the_end(tmp_path, good, layout):
    entry = layout.tensors["output_norm.weight"]["offset"]
    path = patched(tmp_path, good, (entry, struct.pack("<Q", 1 << 62)))
    refused(path, CheckpointError, r"tensor 'output_norm.weight' .* past the end of the file")


def test_misaligned_tensor_data(tmp_path, good, layout):
    name = "blk.2.attn_k.weight"
    path = patched(tmp_path, good, (layout.tensors[name]["offset"], struct.pack("<Q", layout.offset_of(name) + 4)))
    refused(path, CheckpointError, rf"tensor '{q(name)}' starts at data offset \d+, not a multiple of the alignment "
                                   r"\(32, general.alignment\)")  # fmt: skip


def test_overlapping_tensors(tmp_path, good, layout):
    a, b = "blk.0.attn_q.weight", "blk.0.attn_k.weight"
    path = patched(tmp_path, good, (layout.tensors[b]["offset"], struct.pack("<Q", layout.offset_of(a) + 32)))
    refused(path, CheckpointError, rf"tensors '{q(a)}' \(bytes \d+..\d+\) and '{q(b)}' \(from byte \d+\) overlap")


def test_a_tensor_twice_in_the_table(tmp_path, good, layout):
    entry = layout.tensors["blk.0.attn_k.weight"]["start"]
    path = patched(tmp_path, good, (entry + 8, b"blk.0.attn_q.weight"))
    refused(path, CheckpointError, r"tensor 'blk.0.attn_q.weight' appears twice in the tensor table")


def test_a_row_that_is_not_whole_blocks(tmp_path):
    path = write(tmp_path, qtypes={"blk.0.attn_q.weight": gguf.GGMLQuantizationType.Q8_0})
    layout = Layout(path.read_bytes())
    path = patched(tmp_path, path.read_bytes(), (layout.tensors["blk.0.attn_q.weight"]["dims"], struct.pack("<Q", 48)))
    refused(path, CheckpointError, r"tensor 'blk.0.attn_q.weight' has rows of 48 values, not a whole number of Q8_0 "
                                   r"blocks \(32 values each\)")  # fmt: skip


def test_an_unknown_tensor_name(tmp_path):
    tensors = gguf_tensors(SOURCE) | {"rope_freqs.weight": np.ones(16, np.float32)}
    path = write(tmp_path, tensors=tensors)
    refused(path, UnsupportedError, r"tensor 'rope_freqs.weight' is not part of a qwen3moe model the engine runs "
                                    r"\(expected token_embd.weight, .*blk.N.ffn_gate_exps.weight")  # fmt: skip


def test_an_expert_tensor_of_the_wrong_expert_count(tmp_path):
    path = write(tmp_path, extra={"qwen3moe.expert_count": (4, V.UINT32)})
    refused(path, CheckpointError, r"tensor 'blk.0.ffn_gate_exps.weight' has dimensions \[64, 32, 8\], expected "
                                   r"\[cols, rows, 4\]")  # fmt: skip


def test_a_tensor_of_a_layer_past_block_count(tmp_path):
    path = write(tmp_path, extra={"qwen3moe.block_count": (2, V.UINT32)})
    refused(path, CheckpointError, r"tensor 'blk.2\..*' is of layer 2, but 'qwen3moe.block_count' = 2: expected "
                                   r"layers 0..1")  # fmt: skip


def test_a_missing_tensor_is_named_by_the_core_with_the_file(tmp_path):
    path = write(tmp_path, drop_tensors=("output_norm.weight",))
    with Engine() as eng, pytest.raises(CheckpointError, match=rf"{q(path)}.*'model.norm.weight' is missing"):
        eng.load(path).close()


# ---- the configuration ------------------------------------------------------------------------------------


def test_an_unsupported_architecture(tmp_path):
    path = write(tmp_path, extra={"general.architecture": ("llama", V.STRING)})
    refused(path, UnsupportedError, r"architecture 'llama' \(general.architecture\) is not supported \(expected one "
                                    r"of qwen3moe, qwen3, deepseek2, gpt-oss, deepseek4\)")  # fmt: skip


def test_a_missing_config_key(tmp_path):
    path = write(tmp_path, drop_keys=("qwen3moe.attention.layer_norm_rms_epsilon",))
    refused(path, CheckpointError, r"metadata key 'qwen3moe.attention.layer_norm_rms_epsilon' is missing")


@pytest.mark.parametrize("key, value, pattern", [
    ("qwen3moe.block_count", ("three", V.STRING), r"'qwen3moe.block_count' is string 'three', expected int"),
    ("qwen3moe.embedding_length", (0, V.UINT32), r"'qwen3moe.embedding_length' = 0, expected an integer in 1.."),
    ("qwen3moe.rope.freq_base", (float("nan"), V.FLOAT32), r"'qwen3moe.rope.freq_base' = nan, expected a number"),
    ("qwen3moe.attention.layer_norm_rms_epsilon", (1.5, V.FLOAT32), r"= 1.5, expected a number in \(0, 1\)"),
    ("qwen3moe.expert_used_count", (9, V.UINT32), r"'qwen3moe.expert_used_count' = 9, expected 1..8"),
    ("qwen3moe.attention.head_count_kv", (3, V.UINT32), r"head_count' = 4 is not a multiple of .*head_count_kv' = 3"),
    ("qwen3moe.vocab_size", (600, V.UINT32), r"'qwen3moe.vocab_size' = 600, but token_embd.weight holds 512 tokens"),
    ("tokenizer.ggml.eos_token_id", (512, V.UINT32), r"'tokenizer.ggml.eos_token_id' = 512, expected a token id in "),
], ids=lambda v: v if isinstance(v, str) and not v.startswith(("'", "(")) else "")  # fmt: skip
def test_bad_config_values(tmp_path, key, value, pattern):
    refused(write(tmp_path, extra={key: value}), CheckpointError, pattern)


@pytest.mark.parametrize("key, value, pattern", [
    ("qwen3moe.rope.scaling.type", ("yarn", V.STRING), r"'qwen3moe.rope.scaling.type' = 'yarn' is not supported"),
    ("qwen3moe.rope.scaling.factor", (4.0, V.FLOAT32), r"'qwen3moe.rope.scaling.factor' = 4.0 is not supported"),
    ("qwen3moe.attention.sliding_window", (128, V.UINT32), r"sliding_window' = 128 is not supported \(expected 0"),
    ("qwen3moe.rope.dimension_count", (16, V.UINT32), r"dimension_count' = 16 is not supported \(expected the head"),
    ("qwen3moe.expert_gating_func", (2, V.UINT32), r"'qwen3moe.expert_gating_func' = 2 is not supported"),
], ids=lambda v: v if isinstance(v, str) and not v.startswith(("'", "(")) else "")  # fmt: skip
def test_computations_the_engine_does_not_run(tmp_path, key, value, pattern):
    refused(write(tmp_path, extra={key: value}), UnsupportedError, pattern)


def test_per_layer_counts_that_differ(tmp_path):
    path = write(tmp_path, extra={"qwen3moe.attention.head_count_kv": ([2, 1, 2], V.ARRAY)})
    refused(path, UnsupportedError, r"'qwen3moe.attention.head_count_kv' differs between layers")


# ---- the tokenizer ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                                 "tokenizer.ggml.merges"])  # fmt: skip
def test_a_missing_tokenizer_key(tmp_path, key):
    refused(write(tmp_path, drop_keys=(key,)), CheckpointError, rf"metadata key '{q(key)}' is missing")


def test_no_vocabulary_means_no_tokenizer(tmp_path):
    path = write(tmp_path, extra={"tokenizer.ggml.model": ("none", V.STRING)})
    assert Checkpoint.open(path).tokenizer is None


def test_an_unknown_pre_tokenizer(tmp_path):
    refused(write(tmp_path, pre="llama-bpe"), UnsupportedError,
            r"tokenizer.ggml.pre = 'llama-bpe' is not supported \(expected one of qwen2, gpt-2, gpt-4o\)")  # fmt: skip


def test_another_tokenizer_model(tmp_path):
    path = write(tmp_path, extra={"tokenizer.ggml.model": ("llama", V.STRING)})
    refused(path, UnsupportedError, r"tokenizer.ggml.model = 'llama' is not supported \(expected 'gpt2'")


def test_a_merge_of_unknown_tokens(tmp_path):
    path = write(tmp_path, extra={"tokenizer.ggml.merges": (["Ġ t", "nosuch token"], V.ARRAY)})
    refused(path, CheckpointError, r"the tokenizer.ggml.\* keys do not make a tokenizer")


def test_a_token_type_list_of_another_length(tmp_path):
    path = write(tmp_path, extra={"tokenizer.ggml.token_type": ([1, 1, 1], V.ARRAY)})
    refused(path, CheckpointError, r"tokenizer.ggml.token_type is array of int32 of 3 items, expected .* \(512\)")


# ---- split files ------------------------------------------------------------------------------------------


def split(tmp_path) -> list[Path]:
    return to_gguf(SOURCE, tmp_path / "s.gguf", split_max_tensors=13)


def test_a_missing_split_part(tmp_path):
    parts = split(tmp_path)
    parts[1].unlink()
    for given in (parts[0], parts[2]):
        with pytest.raises(CheckpointError, match=rf"'{q(parts[1])}' is missing: '{q(given)}' is one of 3 parts "
                                                  r"\(split.count = 3\)"):  # fmt: skip
            Checkpoint.open(given)


def test_a_split_part_renamed(tmp_path):
    parts = split(tmp_path)
    renamed = parts[0].with_name("model.gguf")
    parts[0].rename(renamed)
    refused(renamed, CheckpointError, r"is part of a split into 3 files \(split.count\), but its name is not "
                                      r"NAME-0000N-of-00003.gguf")  # fmt: skip


def test_a_split_part_out_of_place(tmp_path):
    parts = split(tmp_path)
    pos = Layout(parts[1].read_bytes()).kv["split.no"][1]
    patched_part = patched(tmp_path, parts[1].read_bytes(), (pos + 4, struct.pack("<H", 0)))
    patched_part.replace(parts[1])
    with pytest.raises(CheckpointError, match=rf"'{q(parts[1])}': split.no = 0, expected 1 \(part 2 of 3"):
        Checkpoint.open(parts[0])


def test_a_tensor_in_two_parts(tmp_path):
    parts = split(tmp_path)
    first, second = (Layout(p.read_bytes()) for p in parts[:2])
    name = next(n for n in second.tensors if n.replace("blk.1.", "blk.0.", 1) in first.tensors and n != n.replace(
        "blk.1.", "blk.0.", 1))  # fmt: skip
    twin = name.replace("blk.1.", "blk.0.", 1)
    damaged = patched(tmp_path, parts[1].read_bytes(), (second.tensors[name]["start"] + 8, twin.encode()))
    damaged.replace(parts[1])
    with pytest.raises(CheckpointError, match=rf"tensor '{q(twin)}' is in both '{q(parts[0])}' and '{q(parts[1])}'"):
        Checkpoint.open(parts[2])


def test_a_split_whose_tensor_count_is_wrong(tmp_path):
    parts = split(tmp_path)
    for p in parts:
        pos = Layout(p.read_bytes()).kv["split.tensors.count"][1]
        patched(tmp_path, p.read_bytes(), (pos + 4, struct.pack("<i", 40))).replace(p)
    with pytest.raises(CheckpointError, match=rf"'{q(parts[0])}': the 3 parts hold 38 tensors, but "
                                              r"split.tensors.count = 40"):  # fmt: skip
        Checkpoint.open(parts[0])


# ---- YaRN keys and head sizes of the DeepSeek and gpt-oss files ----------------------------------------------

YARN_FILES = {"deepseek2": FIXTURES / "deepseek-gguf" / "model-f32.gguf",
              "gpt-oss": FIXTURES / "gpt-oss-gguf" / "model-mxfp4_moe.gguf"}  # fmt: skip


def with_value(tmp_path: Path, source: Path, key: str, fmt: str, value: float) -> Path:
    """A copy of source with the scalar value of `key` rewritten in place (same type, same size)."""
    raw = source.read_bytes()
    _, vpos, end = Layout(raw).kv[key]
    assert end - vpos - 4 == struct.calcsize(fmt)
    return patched(tmp_path, raw, (vpos + 4, struct.pack(fmt, value)))


def loads_and_runs(path: Path) -> None:
    """The process goes on: the file the bad one was made from loads and decodes."""
    with Engine(cpu_devices=1, cpu_threads=1) as eng, eng.load(path) as model, model.context(8) as ctx:
        assert np.isfinite(ctx.prefill([1, 2, 3])).all()


@pytest.mark.parametrize("arch", sorted(YARN_FILES))
@pytest.mark.parametrize(("key", "fmt", "value", "pattern"), [
    ("rope.freq_base", "<f", 1.0, r"'{a}rope.freq_base' = 1.0, expected a number > 1 with YaRN scaling"),
    ("rope.scaling.yarn_beta_fast", "<f", 0.5,
     r"'{a}rope.scaling.yarn_beta_fast' = 0.5, expected at least '{a}rope.scaling.yarn_beta_slow' = 1.0"),
    ("rope.scaling.yarn_beta_fast", "<f", -1.0, r"'{a}rope.scaling.yarn_beta_fast' = -1.0, expected a positive"),
    ("rope.scaling.yarn_beta_slow", "<f", -1.0, r"'{a}rope.scaling.yarn_beta_slow' = -1.0, expected a positive"),
], ids=["freq_base=1", "beta_fast<beta_slow", "beta_fast=-1", "beta_slow=-1"])  # fmt: skip
def test_yarn_keys_outside_its_formulas_are_named(tmp_path, arch, key, fmt, value, pattern):
    a = re.escape(arch + ".")
    path = with_value(tmp_path, YARN_FILES[arch], arch + "." + key, fmt, value)
    refused(path, CheckpointError, pattern.format(a=a))
    loads_and_runs(YARN_FILES[arch])


def test_an_odd_gpt_oss_key_length_is_named(tmp_path):
    path = with_value(tmp_path, YARN_FILES["gpt-oss"], "gpt-oss.attention.key_length", "<I", 33)
    refused(path, CheckpointError, r"'gpt-oss.attention.key_length' = 33, expected an even number \(RoPE rotates")
    loads_and_runs(YARN_FILES["gpt-oss"])
