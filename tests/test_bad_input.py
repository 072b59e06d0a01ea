"""Bad input gets a clear error and nothing crashes.

Every case damages a copy of a fixture (or passes a bad value, or a bad runtime module), expects the most specific
EngineError subclass with a message naming the file / tensor / value and what was expected, and then proves the
process survives: an autouse fixture loads a good model with a fresh Engine and checks one prefill against the
transformers reference.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.checkpoints.checkpoint import Checkpoint
from engine.core.errors import (
    CheckpointError,
    EngineError,
    ModuleLoadError,
    OutOfMemoryError,
    RangeError,
    UnsupportedError,
)
from engine.model import Engine

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
GOOD = FIXTURES / "qwen3-f32"
NATIVE_INCLUDE = ROOT / "native" / "include"
VOCAB = 512  # every fixture's vocab_size


# ---------------------------------------------------------------------------------------------------------------
# Helpers


def q(value: object) -> str:
    """A regex matching str(value) literally."""
    return re.escape(str(value))


def read_st(path: Path) -> tuple[dict, bytes]:
    """A safetensors file as (header JSON object, data bytes)."""
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + hlen]), raw[8 + hlen :]


def write_st(path: Path, header: dict, data: bytes, align: int = 8) -> None:
    """Re-serialise header + 8-byte little-endian length + data (header padded with spaces to `align`)."""
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * ((-(8 + len(blob))) % align)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def edit_header(path: Path, edit) -> None:
    header, data = read_st(path)
    edit(header)
    write_st(path, header, data)


def replace_tensor(path: Path, name: str, dtype: str | None = None, new: bytes | None = None) -> None:
    """Rewrite a safetensors file with one tensor's bytes replaced by new (dtype: its new dtype), or the tensor
    dropped (new None), the later tensors moved: a valid file that differs in that tensor alone."""
    header, data = read_st(path)
    begin, end = header[name]["data_offsets"]
    shift = (0 if new is None else len(new)) - (end - begin)
    if new is None:
        del header[name]
    else:
        header[name].update(dtype=dtype, data_offsets=[begin, begin + len(new)])
    for key, entry in header.items():
        if key != name and isinstance(entry, dict) and "data_offsets" in entry and entry["data_offsets"][0] >= end:
            entry["data_offsets"] = [o + shift for o in entry["data_offsets"]]
    write_st(path, header, data[:begin] + (new or b"") + data[end:])


def drop_tensor(path: Path, name: str) -> None:
    replace_tensor(path, name)


def edit_config(folder: Path, edit) -> Path:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config, indent=2))
    return path


def copy_fixture(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


def load(folder: Path | Checkpoint) -> None:
    """Load a model (expected to fail); closes everything if it unexpectedly succeeds."""
    with Engine() as eng:
        eng.load(folder).close()


def prefill_ok(folder: Path, n_ctx: int = 64) -> None:
    """Load a model and check one prefill against its transformers reference."""
    ref = np.load(folder / "reference.npz")
    prompt = ref["prompt_ids"]
    with Engine() as eng, eng.load(folder) as model, model.context(n_ctx) as ctx:
        logits = ctx.prefill(prompt)
        assert ctx.position == len(prompt)
    want = ref["logits"][: len(prompt)]
    rel = np.linalg.norm(logits - want, axis=1) / np.linalg.norm(want, axis=1)
    assert rel.max() < 1e-4, f"relative error {rel.max():.2e} after a bad input"


@pytest.fixture(autouse=True)
def process_survives():
    """After every bad case, the same process loads a good model with a fresh Engine and runs a prefill."""
    yield
    prefill_ok(GOOD)


def cut_tensors(header: dict, data_size: int) -> str:
    """A regex matching the name of any tensor that reaches past data_size bytes of data."""
    names = [k for k in header if k != "__metadata__" and header[k]["data_offsets"][1] > data_size]
    assert names
    return "(" + "|".join(q(n) for n in names) + ")"


def cut_file(path: Path, remove: int) -> int:
    """Cut `remove` bytes off the end of a file; returns its new size."""
    size = path.stat().st_size - remove
    with path.open("r+b") as f:
        f.truncate(size)
    return size


# ---------------------------------------------------------------------------------------------------------------
# Truncated files and safetensors headers that lie


def test_truncated_in_data(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3moe-f32")
    st = folder / "model.safetensors"
    header, data = read_st(st)
    cut_file(st, 1000)
    left = len(data) - 1000
    expected = rf"{q(st)}.*tensor '{cut_tensors(header, left)}'.*past the end of the data \({left} bytes\)"
    with pytest.raises(CheckpointError, match=expected):
        load(folder)


def test_truncated_inside_header(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    st = folder / "model.safetensors"
    (hlen,) = struct.unpack("<Q", st.read_bytes()[:8])
    with st.open("r+b") as f:
        f.truncate(8 + hlen // 2)
    with pytest.raises(CheckpointError, match=rf"{q(st)}.*header length {hlen} is larger than the file allows"):
        load(folder)


def test_truncated_inside_header_length(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    st = folder / "model.safetensors"
    with st.open("r+b") as f:
        f.truncate(5)
    with pytest.raises(CheckpointError, match=rf"{q(st)}.*5 bytes, too short.*8-byte header length"):
        load(folder)


def test_truncated_shard(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3moe-bf16")
    shard = folder / "model-00003-of-00006.safetensors"
    header, data = read_st(shard)
    cut_file(shard, 2)
    expected = rf"{q(shard)}.*tensor '{cut_tensors(header, len(data) - 2)}'.*past the end of the data"
    with pytest.raises(CheckpointError, match=expected):
        load(folder)


def test_truncated_after_header_was_read(tmp_path):
    """The file shrinks between reading the header and loading: the core's own descriptor check catches it."""
    folder = copy_fixture(tmp_path, "qwen3-f32")
    st = folder / "model.safetensors"
    checkpoint = Checkpoint.open(folder)
    header, data = read_st(st)
    new_size = cut_file(st, 100)
    names = cut_tensors(header, len(data) - 100)
    with pytest.raises(
        CheckpointError, match=rf"tensor '{names}' in '{q(st)}'.*past the end of the file \({new_size} bytes\)"
    ):
        load(checkpoint)


def test_header_offsets_past_end(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    st = folder / "model.safetensors"
    header, data = read_st(st)
    name = "model.layers.0.mlp.gate_proj.weight"
    begin, end = header[name]["data_offsets"]
    size = len(data)
    header[name]["data_offsets"] = [size, size + end - begin]
    write_st(st, header, data)
    expected = rf"{q(st)}.*tensor '{q(name)}'.*\[{size}, {size + end - begin}\].*past the end.*{size} bytes"
    with pytest.raises(CheckpointError, match=expected):
        load(folder)


def test_header_overlapping_tensors(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    st = folder / "model.safetensors"
    a, b = "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"

    def edit(header):
        assert header[a]["shape"] == header[b]["shape"]
        header[b]["data_offsets"] = list(header[a]["data_offsets"])

    edit_header(st, edit)
    with pytest.raises(CheckpointError, match=rf"{q(st)}.*overlap") as err:
        load(folder)
    assert f"'{a}'" in str(err.value) and f"'{b}'" in str(err.value)


def test_header_partially_overlapping_tensors(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3moe-f32")
    st = folder / "model.safetensors"
    name = "model.norm.weight"

    def edit(header):
        begin, end = header[name]["data_offsets"]
        header[name]["data_offsets"] = [begin - 4, end - 4]  # its first element lies in the tensor before it

    edit_header(st, edit)
    with pytest.raises(CheckpointError, match=rf"{q(st)}.*tensors '.*' and '.*' overlap") as err:
        load(folder)
    assert f"'{name}'" in str(err.value)


def test_header_byte_count_wrong_for_shape(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    st = folder / "model.safetensors"
    name = "model.norm.weight"
    edit_header(st, lambda h: h[name].update(shape=[65]))  # 256 bytes hold 64 F32 values, not 65
    with pytest.raises(
        CheckpointError, match=rf"{q(st)}.*tensor '{q(name)}'.*256 bytes for F32 of shape \[65\], expected 260 bytes"
    ):
        load(folder)


def test_header_byte_count_wrong_for_dtype(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    st = folder / "model.safetensors"
    name = "model.embed_tokens.weight"
    edit_header(st, lambda h: h[name].update(dtype="BF16"))  # 131072 bytes of F32, but BF16 needs 65536
    with pytest.raises(CheckpointError, match=rf"{q(st)}.*tensor '{q(name)}'.*131072 bytes.*BF16.*expected 65536"):
        load(folder)


def test_header_not_json(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    st = folder / "model.safetensors"
    raw = st.read_bytes()
    st.write_bytes(raw[:8] + b"{not json" + raw[17:])
    with pytest.raises(CheckpointError, match=rf"{q(st)}.*header is not valid JSON"):
        load(folder)


def test_header_length_cut_into_its_padding_is_refused_not_read_a_byte_early(tmp_path):
    """The header's trailing spaces still parse as JSON when the length is cut short: every tensor would then be read
    from one byte early (NaN logits). The tensors must cover the data exactly, so the file is refused."""
    folder = copy_fixture(tmp_path, "qwen3-f32")
    st = folder / "model.safetensors"
    header, data = read_st(st)
    write_st(st, header, data, align=64)  # room for padding
    raw = bytearray(st.read_bytes())
    (hlen,) = struct.unpack("<Q", raw[:8])
    assert raw[8 + hlen - 1 : 8 + hlen] == b" "
    raw[:8] = struct.pack("<Q", hlen - 1)
    st.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=rf"'{q(st)}': the tensors end at byte .* of the data but the file holds"):
        load(folder)


@pytest.mark.parametrize("where", ["gap", "appended", "front"])
def test_data_the_tensors_do_not_cover_exactly_is_refused(tmp_path, where):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    st = folder / "model.safetensors"
    header, data = read_st(st)
    entries = sorted((e["data_offsets"][0], k) for k, e in header.items() if k != "__metadata__")
    if where == "appended":
        data += b"\0" * 16
    else:  # 16 bytes that belong to no tensor, before the first one or after the second
        cut = entries[0 if where == "front" else 2][0]
        for key, entry in header.items():
            if key != "__metadata__" and entry["data_offsets"][0] >= cut:
                entry["data_offsets"] = [o + 16 for o in entry["data_offsets"]]
        data = data[:cut] + b"\0" * 16 + data[cut:]
    write_st(st, header, data)
    expected = {"gap": "belong to no tensor", "front": "before the first tensor", "appended": "the file holds"}
    with pytest.raises(CheckpointError, match=rf"'{q(st)}': .*{expected[where]}"):
        load(folder)


def test_header_length_absurd(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    st = folder / "model.safetensors"
    raw = st.read_bytes()
    st.write_bytes(struct.pack("<Q", 2**63) + raw[8:])
    with pytest.raises(CheckpointError, match=rf"{q(st)}.*header length {2**63} is larger than the file allows"):
        load(folder)


# ---------------------------------------------------------------------------------------------------------------
# Missing or mis-shaped tensors, dtypes


def test_missing_tensor(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3moe-f32")
    name = "model.layers.0.mlp.experts.3.up_proj.weight"
    drop_tensor(folder / "model.safetensors", name)
    with pytest.raises(CheckpointError, match=rf"tensor '{q(name)}' is missing"):
        load(folder)


def test_missing_tensor_sharded(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3moe-bf16")
    index = folder / "model.safetensors.index.json"
    name = "model.layers.2.self_attn.k_norm.weight"
    data = json.loads(index.read_text())
    del data["weight_map"][name]
    index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=rf"tensor '{q(name)}' is missing"):
        load(folder)


def test_index_puts_tensor_in_wrong_shard(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3moe-bf16")
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    name = "lm_head.weight"
    wrong = next(s for s in sorted(set(data["weight_map"].values())) if s != data["weight_map"][name])
    data["weight_map"][name] = wrong
    index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=rf"{q(index)}.*tensor '{q(name)}' in '{q(wrong)}'.*does not hold it"):
        load(folder)


def test_misshaped_tensor_swapped_dims(tmp_path):
    """Shape changed consistently with the byte count: only the core's shape check can catch it."""
    folder = copy_fixture(tmp_path, "qwen3moe-f32")
    name = "model.layers.0.mlp.experts.0.down_proj.weight"  # [hidden 64, moe_intermediate 32]

    def edit(header):
        assert header[name]["shape"] == [64, 32]
        header[name]["shape"] = [32, 64]

    edit_header(folder / "model.safetensors", edit)
    with pytest.raises(CheckpointError, match=rf"tensor '{q(name)}'.*shape \[32, 64\], expected \[64, 32\]"):
        load(folder)


def test_misshaped_tensor_extra_dim(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    name = "model.layers.1.self_attn.q_norm.weight"  # [head_dim 16]
    edit_header(folder / "model.safetensors", lambda h: h[name].update(shape=[2, 8]))
    with pytest.raises(CheckpointError, match=rf"tensor '{q(name)}'.*shape \[2, 8\], expected \[16\]"):
        load(folder)


def test_config_disagrees_with_tensor_shapes(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    edit_config(folder, lambda c: c.update(intermediate_size=100))  # the tensors are [128, 64]
    with pytest.raises(CheckpointError, match=r"tensor 'model\.layers\.0\.mlp\.\w+_proj\.weight'.*expected \[.*100"):
        load(folder)


@pytest.mark.parametrize(("dtype", "shape"), [("F64", [32]), ("I8", [256]), ("I32", [64]), ("I64", [32])])
def test_unsupported_dtype(tmp_path, dtype, shape):
    """A dtype the format knows but the engine does not run; byte count consistent with the shape."""
    folder = copy_fixture(tmp_path, "qwen3-f32")
    st = folder / "model.safetensors"
    name = "model.norm.weight"  # F32 [64]: 256 bytes
    edit_header(st, lambda h: h[name].update(dtype=dtype, shape=shape))
    with pytest.raises(
        UnsupportedError, match=rf"tensor '{q(name)}' in '{q(st)}'.*dtype {dtype}, expected.*F32.*F16.*BF16"
    ):
        load(folder)


def test_expert_matrices_of_different_dtypes(tmp_path):
    """Each matrix has its own format (a GGUF Q4_K_M stores gate and up as Q4_K and down as Q6_K): an expert whose
    gate is F16 and whose up and down are F32 loads, and computes exactly what the same values stored as F32 give."""
    name = "model.layers.2.mlp.experts.5.gate_proj.weight"
    mixed, widened = copy_fixture(tmp_path / "mixed", "qwen3moe-f32"), copy_fixture(tmp_path / "f32", "qwen3moe-f32")
    header, data = read_st(mixed / "model.safetensors")
    begin, end = header[name]["data_offsets"]
    half = np.frombuffer(data[begin:end], dtype="<f4").astype("<f2")
    replace_tensor(mixed / "model.safetensors", name, "F16", half.tobytes())
    replace_tensor(widened / "model.safetensors", name, "F32", half.astype("<f4").tobytes())
    prompt = np.load(mixed / "reference.npz")["prompt_ids"]
    out = []
    for folder in (mixed, widened):
        with Engine() as eng, eng.load(folder) as model, model.context(64) as ctx:
            out.append(ctx.prefill(prompt))
    assert np.array_equal(out[0], out[1])


def test_dtype_not_in_format(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    st = folder / "model.safetensors"
    name = "model.layers.0.self_attn.o_proj.weight"
    edit_header(st, lambda h: h[name].update(dtype="F33"))
    with pytest.raises(CheckpointError, match=rf"{q(st)}.*tensor '{q(name)}'.*'F33'.*expected") as err:
        load(folder)
    assert "F32" in str(err.value).split("'F33'", 1)[1]  # says which dtypes would have been valid


def test_unaligned_data_still_loads(tmp_path):
    """Not bad input: a header whose length leaves the data unaligned is valid and must load and run correctly."""
    folder = copy_fixture(tmp_path, "qwen3-f32")
    st = folder / "model.safetensors"
    header, data = read_st(st)
    blob = json.dumps(header, separators=(",", ":")).encode()
    if (8 + len(blob)) % 4 == 0:
        blob += b" "
    st.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    assert (8 + len(blob)) % 4 != 0
    prefill_ok(folder)


# ---------------------------------------------------------------------------------------------------------------
# config.json and the sharded index


def test_unsupported_architecture(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    config = edit_config(folder, lambda c: c.update(architectures=["LlamaForCausalLM"]))
    with pytest.raises(
        UnsupportedError, match=rf"{q(config)}.*LlamaForCausalLM is not supported.*expected.*Qwen3ForCausalLM"
    ):
        load(folder)


def test_config_not_json(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    config = folder / "config.json"
    config.write_text('{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64,,}')
    with pytest.raises(CheckpointError, match=rf"{q(config)}.*is not valid JSON"):
        load(folder)


def test_config_missing(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    config = folder / "config.json"
    config.unlink()
    with pytest.raises(CheckpointError, match=rf"{q(config)}.*is missing"):
        load(folder)


def test_config_missing_key(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3moe-f32")
    config = edit_config(folder, lambda c: c.pop("num_experts"))
    with pytest.raises(CheckpointError, match=rf"{q(config)}.*'num_experts' is missing"):
        load(folder)


def test_config_value_wrong_type(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    config = edit_config(folder, lambda c: c.update(hidden_size="64"))
    with pytest.raises(CheckpointError, match=rf"{q(config)}.*'hidden_size' = '64', expected int"):
        load(folder)


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "max_position_embeddings"])
def test_config_value_too_large(tmp_path, key):
    """An integer that does not fit the core's int32 fields is bad input, not an OverflowError from cffi."""
    folder = copy_fixture(tmp_path, "qwen3-f32")
    config = edit_config(folder, lambda c: c.update({key: 2**31}))
    with pytest.raises(CheckpointError, match=rf"{q(config)}.*'{key}' = {2**31}.*expected"):
        load(folder)


@pytest.mark.parametrize(
    ("key", "value"),
    [("rope_theta", 1e-300), ("rope_theta", float("inf")), ("rope_theta", float("nan")), ("rope_theta", 0.5),
     ("rope_theta", 1e300), ("rms_norm_eps", float("inf")), ("rms_norm_eps", 2.0), ("rms_norm_eps", float("nan")),
     ("rms_norm_eps", 0.0)],
)  # fmt: skip
def test_config_float_out_of_range_is_refused(tmp_path, key, value):
    """A tiny or infinite RoPE base (NaN logits) and an infinite epsilon (every logit 0) are refused at load."""
    folder = copy_fixture(tmp_path, "qwen3-f32")
    config = edit_config(folder, lambda c: c.update({key: value}))  # json writes Infinity and NaN literals
    with pytest.raises(CheckpointError, match=rf"{q(config)}.*'{key}' = .*expected a number in"):
        load(folder)


@pytest.mark.parametrize("name", ["qwen3-f32", "qwen3moe-bf16"])
def test_config_with_fewer_layers_than_the_checkpoint_holds_is_refused(tmp_path, name):
    folder = copy_fixture(tmp_path, name)
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    config = edit_config(folder, lambda c: c.update(num_hidden_layers=layers - 1))
    with pytest.raises(
        CheckpointError,
        match=rf"{q(config)}.*num_hidden_layers = {layers - 1}, but the checkpoint holds tensors of layer {layers - 1}"
        rf".*expected num_hidden_layers = {layers}",
    ):
        load(folder)


def test_model_folder_missing(tmp_path):
    folder = tmp_path / "no-such-model"
    with pytest.raises(CheckpointError, match=rf"{q(folder)}.*does not exist"):
        load(folder)


def test_no_weights(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=rf"{q(folder)}.*neither model\.safetensors nor"):
        load(folder)


def test_index_names_missing_shard(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3moe-bf16")
    shard = "model-00004-of-00006.safetensors"
    (folder / shard).unlink()
    index = folder / "model.safetensors.index.json"
    with pytest.raises(CheckpointError, match=rf"{q(index)}.*names shard '{q(shard)}', which does not exist"):
        load(folder)


def test_index_not_json(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3moe-bf16")
    index = folder / "model.safetensors.index.json"
    index.write_text(index.read_text()[:-20])
    with pytest.raises(CheckpointError, match=rf"{q(index)}.*is not valid JSON"):
        load(folder)


# ---------------------------------------------------------------------------------------------------------------
# Token ids, context length, truncate


@pytest.fixture
def ctx():
    with Engine() as eng, eng.load(GOOD) as model, model.context(8) as context:
        yield context


@pytest.mark.parametrize("method", ["prefill", "decode"])
@pytest.mark.parametrize("bad", [-1, VOCAB, VOCAB + 1000, -(2**31)])
def test_token_id_out_of_range(ctx, method, bad):
    ctx.prefill([1, 2, 3])
    before = ctx.decode([4])
    ctx.truncate(3)
    with pytest.raises(RangeError, match=rf"token id {bad}\b.*{VOCAB} tokens"):
        getattr(ctx, method)([5, bad] if method == "prefill" else [bad])
    assert ctx.position == 3
    np.testing.assert_array_equal(ctx.decode([4]), before)  # the cache is as it was


def test_token_id_beyond_int32(ctx):
    ctx.prefill([1, 2])
    with pytest.raises(RangeError, match=rf"token id {2**40}\b.*int32"):
        ctx.prefill([3, 2**40])
    assert ctx.position == 2


def test_context_longer_than_kv_cache(ctx):
    ctx.prefill([1, 2, 3, 4, 5])
    with pytest.raises(RangeError, match=r"9 positions is longer than the KV cache \(8 positions\)"):
        ctx.prefill([6, 7, 8, 9])
    assert ctx.position == 5
    ctx.prefill([6, 7, 8])  # exactly full is fine
    with pytest.raises(RangeError, match=r"9 positions is longer than the KV cache \(8 positions\)"):
        ctx.decode([9])
    assert ctx.position == 8


def test_context_larger_than_model_allows():
    with Engine() as eng, eng.load(GOOD) as model:
        limit = model.config.max_position_embeddings
        with pytest.raises(RangeError, match=rf"context length {limit + 1} out of range: expected 1\.\.{limit}"):
            model.context(limit + 1)


def test_context_length_beyond_int32():
    """A length that does not fit the core's int32 is out of range too, not an OverflowError from cffi."""
    with Engine() as eng, eng.load(GOOD) as model:
        limit = model.config.max_position_embeddings
        with pytest.raises(RangeError, match=rf"context length {2**31} out of range: expected 1\.\.{limit}"):
            model.context(2**31)


def test_truncate_beyond_position(ctx):
    ctx.prefill([1, 2, 3])
    with pytest.raises(RangeError, match=r"truncate to position 4: expected 0\.\.3"):
        ctx.truncate(4)
    with pytest.raises(RangeError, match=r"truncate to position -1: expected 0\.\.3"):
        ctx.truncate(-1)
    assert ctx.position == 3


def test_truncate_beyond_int32(ctx):
    ctx.prefill([1, 2, 3])
    with pytest.raises(RangeError, match=rf"truncate to position {2**40}: expected 0\.\.3"):
        ctx.truncate(2**40)
    assert ctx.position == 3


# ---------------------------------------------------------------------------------------------------------------
# Devices without room


def hostsim_free(eng: Engine) -> int:
    return next(d.memory_free for d in eng.devices if d.name == "hostsim:0")


def test_prefill_without_room_for_its_staging_on_a_device_is_an_error_and_the_context_still_works():
    """hostsim:0 holds every expert and has room left for a short batch's staging, not a long one's: the long prefill
    raises an error naming the device, what it needed and what it had (it used to wait on a completion event never
    created, and crash the process), and then the same context runs short prefills and decodes as without a limit."""
    moe, prompt = FIXTURES / "qwen3moe-f32", list(range(1, 41))
    with Engine(runtimes=("cpu", "hostsim")) as eng, eng.load(moe) as model:
        model.set_placement("*=hostsim:0")
        weights = model.counters()["devices"]["hostsim:0"]["weight_bytes"]
        with model.context(64) as ctx:
            want_short = ctx.prefill(prompt[:3])
            want_next = ctx.decode([4])
            ctx.truncate(0)
            want_long = ctx.prefill(prompt)
    limits = {"hostsim": {"memory_limit": weights + 48_000}}
    with Engine(runtimes=("cpu", "hostsim"), runtime_options=limits) as eng, eng.load(moe) as model:
        model.set_placement("*=hostsim:0")
        with model.context(64) as ctx:
            free = hostsim_free(eng)
            for _ in range(2):  # the failure leaves nothing behind that makes the next one different
                with pytest.raises(OutOfMemoryError) as err:
                    ctx.prefill(prompt)
                found = re.fullmatch(
                    r"hostsim:0: out of device memory: the staging of a batch of 40 tokens \(\d+ expert rows\) needs "
                    r"(\d+) bytes, (\d+) free \(of (\d+)\): evaluate fewer tokens at a time, or place fewer experts "
                    r"on hostsim:0",
                    str(err.value),
                )
                assert found, str(err.value)
                need, left, total = map(int, found.groups())
                assert left < need and total == weights + 48_000
                assert ctx.position == 0
            np.testing.assert_array_equal(ctx.prefill(prompt[:3]), want_short)
            np.testing.assert_array_equal(ctx.decode([4]), want_next)
            with pytest.raises(OutOfMemoryError, match="hostsim:0: out of device memory"):
                ctx.prefill(prompt[4:])
            assert ctx.position == 4
            # in batches that fit, the long prompt gives the logits it gives without a limit
            ctx.truncate(0)
            got = np.concatenate([ctx.prefill(prompt[i : i + 4]) for i in range(0, len(prompt), 4)])
            np.testing.assert_array_equal(got, want_long)
        assert hostsim_free(eng) == free  # the context's staging went with it


def test_a_second_peer_without_room_after_the_first_was_queued_is_an_error_and_the_context_still_works():
    """Experts split between hostsim:0 and hostsim:1 (each with the same room): where hostsim:0's branch fits and
    is queued and hostsim:1's staging does not, the error names hostsim:1, the queued branch is waited for before
    it returns, and the same context then gives the unlimited engine's logits."""
    moe, prompt = FIXTURES / "qwen3moe-f32", list(range(1, 41))
    placement = "*=cpu:0; *.0-3=hostsim:0; *.4-7=hostsim:1"
    two = {"n_devices": 2}
    with Engine(runtimes=("cpu", "hostsim"), runtime_options={"hostsim": two}) as eng, eng.load(moe) as model:
        model.set_placement(placement)
        devices = model.counters()["devices"]
        weights = max(devices[d]["weight_bytes"] for d in ("hostsim:0", "hostsim:1"))
        with model.context(64) as ctx:
            want = ctx.prefill(prompt)
    found = False
    for extra in range(0, 200_000, 2_000):  # the least room where hostsim:0's branch fits and hostsim:1's does not
        limits = {"hostsim": {**two, "memory_limit": weights + extra}}
        with Engine(runtimes=("cpu", "hostsim"), runtime_options=limits) as eng, eng.load(moe) as model:
            model.set_placement(placement)
            with model.context(64) as ctx:
                try:
                    ctx.prefill(prompt)
                except OutOfMemoryError as exc:
                    if not str(exc).startswith("hostsim:1: out of device memory: the staging of a batch of 40"):
                        continue
                else:
                    break
                found = True
                assert ctx.position == 0
                assert_routing_counts_agree(model)  # the layers routed before the failure count their tokens too
                got = np.concatenate([ctx.prefill(prompt[i : i + 4]) for i in range(0, len(prompt), 4)])
                np.testing.assert_array_equal(got, want)
                assert_routing_counts_agree(model)
                break
    assert found, "no room where the first peer's branch fits and the second's does not: the fixture changed?"


def assert_routing_counts_agree(model) -> None:
    """Every MoE layer's hits are top_k per token it routed (a failed step's routed layers count both)."""
    hits, tokens = model.routing_counts()
    moe = model.config.moe_layers
    assert tokens[moe].sum() > 0
    np.testing.assert_array_equal(hits[moe].sum(axis=1), tokens[moe] * model.config.top_k)


def test_a_later_batch_without_room_keeps_the_earlier_ones_and_a_sliding_window_stays_right():
    """An eval longer than the context's batch runs in batches; when a later one fails (here hostsim:0's staging:
    the pairs routed to it differ per batch), the earlier batches' rows stay in the cache and the error says where
    the position now is. Going back to the eval's start was wrong for a sliding-window layer: its ring of window +
    batch - 1 rows had been overwritten for the positions before it (gpt-oss, window 8: the continuation's logits
    were off by more than 1)."""
    gpt_oss = FIXTURES / "gpt-oss-bf16"
    prompt = [int(x) for x in np.random.default_rng(0).integers(1, 500, 32)]
    placement = "*=cpu:0; *.0-3=hostsim:0"
    with Engine(runtimes=("cpu", "hostsim")) as eng, eng.load(gpt_oss) as model:
        model.set_placement(placement)
        weights = model.counters()["devices"]["hostsim:0"]["weight_bytes"]
        with model.context(64, n_batch=4) as ctx:
            want = ctx.prefill(prompt)
    found = False
    for extra in range(0, 40_000, 256):  # the smallest room where a later batch of the continuation fails
        limits = {"hostsim": {"memory_limit": weights + extra}}
        with Engine(runtimes=("cpu", "hostsim"), runtime_options=limits) as eng, eng.load(gpt_oss) as model:
            model.set_placement(placement)
            with model.context(64, n_batch=4) as ctx:
                try:
                    for i in range(8):  # one token at a time: the least staging
                        np.testing.assert_array_equal(ctx.prefill(prompt[i : i + 1]), want[i : i + 1])
                    ctx.prefill(prompt[8:])
                except OutOfMemoryError as exc:
                    message, position = str(exc), ctx.position
                else:
                    break
                if position <= 8:
                    continue  # the room is too small for the first tokens, or for the continuation's first batch
                found = True
                done = position - 8
                assert done % 4 == 0 and 0 < done < 24
                assert message.startswith("hostsim:0: out of device memory: the staging of a batch of 4 tokens")
                assert message.endswith(f"(the first {done} of the 24 tokens were evaluated: the context's position "
                                        f"is now {position})")  # fmt: skip
                rest = np.concatenate([ctx.prefill(prompt[i : i + 1]) for i in range(position, len(prompt))])
                np.testing.assert_array_equal(rest, want[position:])
                break
    assert found, "no room between a batch of the continuation fitting and failing: the fixture's routing changed?"


# ---------------------------------------------------------------------------------------------------------------
# Runtime modules


def build_module(tmp_path: Path, source: str, name: str = "mod.so") -> Path:
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler (cc) to build a test module (run tests/setup.sh)")
    src = tmp_path / (name + ".c")
    src.write_text(source)
    out = tmp_path / name
    subprocess.run([cc, "-shared", "-fPIC", f"-I{NATIVE_INCLUDE}", "-o", str(out), str(src)], check=True)
    return out


MODULE_WITH_TABLE = """
#include "eb_runtime.h"
static const eb_runtime_table table = {.abi_version = %s, .table_size = sizeof(eb_runtime_table), .name = "cpu"};
EB_EXPORT const eb_runtime_table *eb_runtime_module(void) { return %s; }
"""


def test_module_path_does_not_exist():
    path = "/nonexistent/x.so"
    with pytest.raises(ModuleLoadError, match=rf"'cpu'.*{q(path)}.*does not exist"):
        Engine(module_paths={"cpu": path})


def test_module_path_does_not_exist_no_fallback():
    """An explicit path is authoritative: no fallback to the bundled module, even when not strict."""
    path = "/nonexistent/x.so"
    with Engine(module_paths={"cpu": path}, strict=False) as eng:
        assert eng.runtimes == [] and eng.devices == []
        assert path in eng.load_errors["cpu"]


def test_module_wrong_abi_version(tmp_path):
    so = build_module(tmp_path, MODULE_WITH_TABLE % ("EB_RUNTIME_ABI_VERSION + 1", "&table"))
    from engine.core.native import RUNTIME_ABI_VERSION as abi

    with pytest.raises(ModuleLoadError, match=rf"{q(so)}.*ABI version {abi + 1}, expected {abi}"):
        Engine(module_paths={"cpu": str(so)})


def test_module_without_entry_symbol(tmp_path):
    so = build_module(tmp_path, "int not_the_entry(void) { return 1; }\n")
    with pytest.raises(ModuleLoadError, match=rf"{q(so)}.*does not export eb_runtime_module"):
        Engine(module_paths={"cpu": str(so)})


def test_module_returns_no_table(tmp_path):
    so = build_module(tmp_path, MODULE_WITH_TABLE % ("EB_RUNTIME_ABI_VERSION", "(const eb_runtime_table *)0"))
    with pytest.raises(ModuleLoadError, match=rf"{q(so)}.*returned no table"):
        Engine(module_paths={"cpu": str(so)})


def test_module_incomplete_table(tmp_path):
    so = build_module(tmp_path, MODULE_WITH_TABLE % ("EB_RUNTIME_ABI_VERSION", "&table"))
    with pytest.raises(ModuleLoadError, match=rf"{q(so)}.*incomplete function table"):
        Engine(module_paths={"cpu": str(so)})


def test_module_not_a_shared_library(tmp_path):
    so = tmp_path / "fake.so"
    so.write_text("this is not an ELF file\n" * 10)
    with pytest.raises(ModuleLoadError, match=rf"'cpu'.*could not load '{q(so)}'"):
        Engine(module_paths={"cpu": str(so)})


def test_module_path_is_a_folder(tmp_path):
    with pytest.raises(ModuleLoadError, match=rf"'cpu'.*{q(tmp_path)}' is not a regular file"):
        Engine(module_paths={"cpu": str(tmp_path)})


def test_engine_usable_after_failed_module(tmp_path):
    """A failed load leaves the same Engine able to load the real module and run a model."""
    so = build_module(tmp_path, MODULE_WITH_TABLE % ("EB_RUNTIME_ABI_VERSION + 1", "&table"))
    with Engine(runtimes=()) as eng:
        with pytest.raises(ModuleLoadError, match="ABI version"):
            eng.load_runtime("cpu", so)
        with pytest.raises(ModuleLoadError, match="does not exist"):
            eng.load_runtime("cpu", tmp_path / "missing.so")
        eng.load_runtime("cpu")
        with eng.load(GOOD) as model, model.context(8) as ctx:
            assert ctx.prefill([1, 2, 3]).shape == (3, VOCAB)


def test_every_error_is_an_engine_error():
    """The specific classes used above all derive from EngineError, so one except clause catches them."""
    for cls in (CheckpointError, UnsupportedError, RangeError, ModuleLoadError):
        assert issubclass(cls, EngineError)


# ---------------------------------------------------------------------------------------------------------------
# Inputs that used to escape as Python's own errors (RecursionError, OverflowError, TypeError, ValueError)


DEEP = "[" * 1000 + "]" * 1000


def test_json_nested_too_deeply_is_a_checkpoint_error_naming_the_file(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    config = folder / "config.json"
    original = config.read_text()
    config.write_text(original[:-1].rstrip().rstrip("}") + f', "deep": {DEEP}}}')
    with pytest.raises(CheckpointError, match=rf"{q(config)}.*nested too deeply"):
        load(folder)
    config.write_text(original)
    st = folder / "model.safetensors"
    header, data = read_st(st)
    raw = json.dumps(header)[:-1] + f', "__metadata__": {{"x": {DEEP}}}}}'
    blob = raw.encode() + b" " * ((-(8 + len(raw))) % 8)
    st.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    with pytest.raises(CheckpointError, match=rf"{q(st)}.*safetensors header.*nested too deeply"):
        load(folder)


def test_index_nested_too_deeply_and_a_list_for_a_shard_name(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3moe-bf16")
    index = folder / "model.safetensors.index.json"
    original = json.loads(index.read_text())
    index.write_text(json.dumps(original)[:-1] + f', "deep": {DEEP}}}')
    with pytest.raises(CheckpointError, match=rf"{q(index)}.*nested too deeply"):
        load(folder)
    name = next(iter(original["weight_map"]))
    original["weight_map"][name] = ["model-00001-of-00002.safetensors"]
    index.write_text(json.dumps(original))
    with pytest.raises(
        CheckpointError, match=rf"{q(index)}': weight_map\['{q(name)}'\] = \[.*expected the name of a shard"
    ):
        load(folder)


def test_integers_of_thousands_of_digits_are_checkpoint_errors(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    config = folder / "config.json"
    config.write_text(config.read_text().replace('"hidden_size": 64', '"hidden_size": ' + "9" * 5000))
    with pytest.raises(
        CheckpointError, match=rf"{q(config)}' is not valid JSON here: it holds an integer of more than"
    ):
        load(folder)


def test_a_shape_beyond_any_memory_is_refused_with_the_tensor_name(tmp_path):
    folder = copy_fixture(tmp_path, "qwen3-f32")
    st = folder / "model.safetensors"
    name = "model.norm.weight"
    edit_header(st, lambda h: h[name].update(shape=[0, 2**63]))
    with pytest.raises(CheckpointError, match=rf"{q(st)}.*tensor '{q(name)}': shape \[0, {2**63}\] is not a list"):
        load(folder)


# YaRN's values outside the domain of its formulas (a correction dimension is dim * log(original / (2π·beta)) /
# (2 log(rope_theta)); mscale(factor, m) = 0.1·m·ln(factor) + 1 divides): each named by its key, never a math domain
# error, a ZeroDivisionError or an OverflowError
YARN_CASES = [
    ("beta_fast", -1, r"rope_scaling: 'beta_fast' = -1.0, expected a positive number of rotations"),
    ("beta_slow", -1, r"rope_scaling: 'beta_slow' = -1.0, expected a positive number of rotations"),
    ("beta_fast", 0.5, r"rope_scaling: 'beta_fast' = 0.5, expected at least rope_scaling: 'beta_slow' = 1.0"),
    ("beta_fast", 1e308, r"rope_scaling: 'beta_fast' = 1e\+308, expected a number of rotations for .* = 0.0\)"),
    ("beta_slow", 1e-320, r"rope_scaling: 'beta_slow' = 1e-320, expected a number of rotations for .* = inf\)"),
    ("mscale_all_dim", -10 / math.log(4.0), r"rope_scaling: 'mscale_all_dim' = -7.21.*, expected a number >= 0"),
    ("attention_factor", "x", r"rope_scaling: 'attention_factor' = 'x', expected a number"),
    ("original_max_position_embeddings", 10**400, r"rope_scaling: 'original_max_position_embeddings' = 10+, "),
    ("truncate", "no", r"rope_scaling: 'truncate' = 'no', expected true or false"),
    ("rope_theta", 1.0, r"'rope_theta' = 1.0, expected a number > 1 with YaRN scaling"),
]


@pytest.mark.parametrize("name", ["deepseek-f32", "gpt-oss-bf16"])
@pytest.mark.parametrize(("key", "value", "message"), YARN_CASES, ids=[f"{k}={v!r:.8}" for k, v, _ in YARN_CASES])
def test_yarn_values_outside_its_formulas_name_the_key(tmp_path, name, key, value, message):
    folder = copy_fixture(tmp_path, name)

    def edit(c: dict) -> None:
        (c if key == "rope_theta" else c["rope_scaling"])[key] = value

    config = edit_config(folder, edit)
    with pytest.raises(CheckpointError, match=rf"{q(config)}': {message}"):
        load(folder)


def test_a_prompt_that_is_not_utf8_on_the_command_line_is_exit_2_naming_the_byte():
    """Python hands a non-UTF-8 argument over as lone surrogates (surrogateescape), which the tokenizer refuses with a
    TypeError: the command names the prompt and the byte instead."""
    args = [sys.executable, "-m", "engine", "run", "--model", str(FIXTURES / "qwen3moe-f32"), "--no-draft",
            "--no-quality", "-n", "2", "--repeats", "1", "--prompt", b"caf\xe9 au lait"]  # fmt: skip
    done = subprocess.run(args, cwd=ROOT, capture_output=True, timeout=120)
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2, err
    assert err.splitlines() == [
        r"expertbench: error: --prompt b'caf\xe9 au lait' is not valid UTF-8: byte 0xe9 at offset 3 (invalid "
        "continuation byte); expected UTF-8 text"
    ]


def test_a_lone_surrogate_prompt_given_to_main_is_exit_2(capsys):
    from engine.cli import main

    base = ["run", "--model", str(FIXTURES / "qwen3moe-f32"), "--no-draft", "--no-quality", "-n", "2", "--repeats", "1"]
    assert main(base + ["--prompt", "fine", "--prompt", "x\ud800"]) == 2
    assert "--prompt 'x\\ud800' is not valid text: '\\ud800' at index 1 is a lone surrogate" in capsys.readouterr().err
    assert main(base + ["--prompt", "fine"]) == 0
