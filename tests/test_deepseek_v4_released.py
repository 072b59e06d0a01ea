"""DeepSeek-V4 in the layout of its released checkpoints (deepseek-ai/DeepSeek-V4-*): names without the 'model.'
prefix (embed.weight, layers.N.attn.kv_norm.weight, hc_head_fn, ...), the attention's, compressors' and shared
expert's matrices FP8 E4M3 with one E8M0 exponent per 128 x 128 block ('<name>.scale'), the routed experts FP4 E2M1
packed two a byte (I8 [rows, cols / 2]) with one E8M0 exponent per 32 values, config.json in the released keys.

The folder is written here from the deepseek4 fixture (tests/fixtures/deepseek-v4-gguf, which llama.cpp's converter
made from a folder in this layout; its config.json is that folder's): its MXFP4 experts repacked into the released
FP4 bytes (the same codes and exponents), its other matrices quantized by numpy to FP8 with power-of-two block scales.
Beside it the same values as F32 under the same names: the core reads the codes as those values, so the two folders
give the same logits bit for bit, on every kernel and placement; bad scales and packings are named.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from fixture_paths import FIXTURES
from test_bad_input import read_st, replace_tensor, write_st
from test_fp8_weights import e4m3_values

from engine.core.errors import CheckpointError, EngineError
from engine.families import deepseek_v4
from engine.model import Engine, Model

SOURCE = FIXTURES / "deepseek-v4-gguf"
# the released checkpoints' FP8 matrices: every layer's projection (.weight, 2-D) but the router and the indexer's head
# weights
NOT_FP8 = ("ffn.gate.weight", "attn.indexer.weights_proj.weight")
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


GLOBAL_NAMES = {  # the deepseek4 file's -> the released checkpoints'
    "token_embd.weight": "embed.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "head.weight",
    "output_hc_fn.weight": "hc_head_fn",
    "output_hc_base.weight": "hc_head_base",
    "output_hc_scale.weight": "hc_head_scale",
}


def released_names() -> dict[str, str]:
    """The deepseek4 file's tensor names -> the released names (the engine's layer map read backwards, the
    attention's key/value norm as the release names it; the experts apart)."""
    out = dict(GLOBAL_NAMES)
    for layer in range(4):
        for g, saved in deepseek_v4.GGUF_LAYER_TENSORS.items():
            out[f"blk.{layer}.{g}"] = f"layers.{layer}.{saved}".replace(".attn.norm.", ".attn.kv_norm.")
    return out


def e8m0_fp8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A matrix as E4M3 codes with one power-of-two scale per 128 x 128 block (2^ceil(log2(amax / 448)), the
    released 'ue8m0' scales, stored as the exponent byte e + 127), and the values the codes mean, in f32."""
    values = e4m3_values()
    order = np.argsort(np.nan_to_num(values, nan=np.inf), kind="stable")[:-2]
    rows, cols = w.shape
    gr, gc = -(-rows // 128), -(-cols // 128)
    exps = np.empty((gr, gc), np.int64)
    codes = np.empty(w.shape, np.uint8)
    for i in range(gr):
        for j in range(gc):
            block = w[128 * i : 128 * i + 128, 128 * j : 128 * j + 128].astype(np.float64)
            exps[i, j] = int(np.ceil(np.log2(max(float(np.abs(block).max()), 1e-30) / 448.0)))
            target = block / 2.0 ** exps[i, j]
            at = np.clip(np.searchsorted(values[order], target), 1, len(order) - 1)
            lo, hi = order[at - 1], order[at]
            codes[128 * i : 128 * i + 128, 128 * j : 128 * j + 128] = np.where(
                np.abs(values[lo] - target) <= np.abs(values[hi] - target), lo, hi
            )
    scale = np.repeat(np.repeat(np.exp2(exps.astype(np.float64)), 128, 0), 128, 1)[:rows, :cols]
    return codes, (exps + 127).astype(np.uint8), (values[codes].astype(np.float64) * scale).astype(np.float32)


def released_fp4(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's block_mxfp4 rows [rows, blocks * 17] -> (codes packed two a byte, element 2i in the low nibble: I8
    [rows, cols / 2]; E8M0 exponents [rows, cols / 32]; the values, f32 [rows, cols])."""
    blk = raw.reshape(raw.shape[0], -1, 17)
    e, qs = blk[..., 0], blk[..., 1:]
    v = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # element j of a block: low nibble of byte j, j + 16 high
    packed = (v[..., 0::2] | (v[..., 1::2] << 4)).astype(np.uint8).reshape(raw.shape[0], -1)
    values = E2M1[v] * np.exp2(e.astype(np.float64) - 127.0)[..., None]
    return packed.view(np.int8), e.astype(np.uint8), values.reshape(raw.shape[0], -1).astype(np.float32)


def put(out: bytearray, head: dict, name: str, dtype: str, arr: np.ndarray) -> None:
    head[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [len(out), len(out) + arr.nbytes]}
    out += np.ascontiguousarray(arr).tobytes()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    """(the released layout, the same values as F32 under the same names)."""
    base = tmp_path_factory.mktemp("released")
    fp8, f32 = base / "fp8", base / "f32"
    names = released_names()
    out8, out32, h8, h32 = bytearray(), bytearray(), {}, {}
    for t in gguf.GGUFReader(SOURCE / "model-mxfp4_moe.gguf").tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        kind = gguf.GGMLQuantizationType(t.tensor_type)
        if t.name.endswith("_exps.weight"):
            layer, proj = t.name.split(".")[1], {"gate": "w1", "up": "w3", "down": "w2"}[t.name.split("_")[1]]
            raw = np.asarray(t.data).reshape(shape[0], shape[1], -1)
            for e in range(shape[0]):
                codes, exps, values = released_fp4(raw[e])
                name = f"layers.{layer}.ffn.experts.{e}.{proj}"
                put(out8, h8, name + ".weight", "I8", codes)
                put(out8, h8, name + ".scale", "F8_E8M0", exps)
                put(out32, h32, name + ".weight", "F32", values)
            continue
        name = names[t.name]
        if kind == gguf.GGMLQuantizationType.I32:
            table = np.asarray(t.data).view(np.int32).reshape(shape).astype(np.int64)
            put(out8, h8, name, "I64", table)
            put(out32, h32, name, "I64", table)
            continue
        arr = gguf.quants.dequantize(t.data, kind).astype(np.float32).reshape(shape)
        if arr.ndim == 2 and name.startswith("layers.") and name.endswith(".weight") and not name.endswith(NOT_FP8):
            codes, exps, values = e8m0_fp8(arr)
            put(out8, h8, name, "F8_E4M3", codes)
            put(out8, h8, name.removesuffix(".weight") + ".scale", "F8_E8M0", exps)
            put(out32, h32, name, "F32", values)
        else:
            put(out8, h8, name, "F32", arr)
            put(out32, h32, name, "F32", arr)
    config = json.loads((SOURCE / "config.json").read_text())
    assert config["quantization_config"]["scale_fmt"] == "ue8m0" and "compress_ratios" in config
    plain = {k: v for k, v in config.items() if k != "quantization_config"}
    for folder, head, out, cfg in ((fp8, h8, out8, config), (f32, h32, out32, plain)):
        folder.mkdir()
        write_st(folder / "model.safetensors", head, bytes(out))
        (folder / "config.json").write_text(json.dumps(cfg))
        shutil.copyfile(SOURCE / "tokenizer.json", folder / "tokenizer.json")
    return fp8, f32


def logits(folder: Path, kernels: str = "best", placement: str = "", precision: str = "f32") -> np.ndarray:
    ref = np.load(SOURCE / "reference-mxfp4_moe.npz")
    ids = [int(i) for i in ref["prompt_ids"][:40]]
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, kernels=kernels) as eng, Model(eng, folder) as model:
        if placement:
            model.set_placement(placement)
        with model.context(64) as ctx:
            ctx.precision = precision
            return np.concatenate([ctx.prefill(ids[:36]), *[ctx.decode([t]) for t in ids[36:]]])


def test_the_folder_holds_the_released_layout(folders):
    header, _ = read_st(folders[0] / "model.safetensors")
    dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    assert dtypes == {"F8_E4M3", "F8_E8M0", "I8", "F32", "I64"}
    assert "layers.0.attn.kv_norm.weight" in header and "embed.weight" in header and "hc_head_fn" in header
    assert header["layers.2.ffn.experts.5.w2.weight"]["shape"] == [32, 16]  # [hidden, moe_intermediate / 2]


@pytest.mark.parametrize("kernels", ["best", "portable"])
def test_the_released_folder_gives_the_logits_of_its_values_as_f32(folders, kernels):
    fp8, f32 = folders
    got, want = logits(fp8, kernels), logits(f32, kernels)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # and they are the model of the deepseek4 file (its Q8_0 matrices rounded again to FP8): its greedy choices
    ref = np.load(SOURCE / "reference-mxfp4_moe.npz")
    assert np.mean(np.argmax(got, -1) == np.argmax(ref["logits"][: len(got)], -1)) > 0.9


def test_the_released_folder_s_experts_on_other_devices_give_the_same_bits(folders):
    fp8, _ = folders
    spread = logits(fp8, placement="0=hostsim:0; 1.2-5=cpu:1; 3=hostsim:0")
    assert np.array_equal(logits(fp8).view(np.uint32), spread.view(np.uint32))


def test_the_released_folder_runs_in_q8_on_every_placement(folders):
    fp8, _ = folders
    base = logits(fp8, precision="q8")
    assert not np.array_equal(base, logits(fp8))
    spread = logits(fp8, placement="0=hostsim:0; 1.2-5=cpu:1; 3=hostsim:0", precision="q8")
    assert np.array_equal(base.view(np.uint32), spread.view(np.uint32))


def edited(folders, tmp_path: Path, edit) -> Path:
    folder = tmp_path / "edited"
    shutil.copytree(folders[0], folder)
    header, data = read_st(folder / "model.safetensors")
    data = edit(header, bytearray(data))
    write_st(folder / "model.safetensors", header, bytes(data))
    return folder


def test_an_fp8_scale_of_the_wrong_grid_is_named(folders, tmp_path):
    def edit(h, data):
        h["layers.1.attn.wq_b.scale"]["shape"] = [1]  # [1, 1] in the file: one byte either way
        return data

    pattern = (
        r"tensor 'layers\.1\.attn\.wq_b\.scale' \(read as 'model\.layers\.1\.attn\.wq_b\.weight_scale_inv'\)"
        r".*expected F32 or F8_E8M0 of shape \[1, 1\]"
    )
    with Engine() as eng, pytest.raises(CheckpointError, match=pattern):
        eng.load(edited(folders, tmp_path, edit))


def test_an_fp4_expert_without_its_scale_is_named(folders, tmp_path):
    folder = edited(folders, tmp_path, lambda h, data: data)
    replace_tensor(folder / "model.safetensors", "layers.3.ffn.experts.6.w3.scale")  # dropped
    pattern = r"'layers\.3\.ffn\.experts\.6\.w3\.weight' \(read as .* has dtype I8, .*FP4 codes beside their E8M0"
    with Engine() as eng, pytest.raises(EngineError, match=pattern):
        eng.load(folder)


def test_an_fp4_scale_of_the_wrong_shape_is_named(folders, tmp_path):
    def edit(h, data):
        h["layers.2.ffn.experts.0.w2.scale"]["shape"] = [16, 2]  # 32 bytes as [32, 1] is
        return data

    pattern = r"tensor 'layers\.2\.ffn\.experts\.0\.w2\.scale' \(read as .*has shape \[16, 2\], expected \[32, 1\]"
    with Engine() as eng, pytest.raises(CheckpointError, match=pattern):
        eng.load(edited(folders, tmp_path, edit))


def test_a_nan_exponent_of_an_fp4_expert_is_refused_naming_the_scale(folders, tmp_path):
    def edit(h, data):
        begin = h["layers.2.ffn.experts.4.w1.scale"]["data_offsets"][0]
        data[begin + 3] = 255  # E8M0's NaN, which MXFP4 would read as 2^127
        return data

    pattern = r"'layers\.2\.ffn\.experts\.4\.w1\.scale' \(read as .*\): scale \[3, 0\] is E8M0's NaN \(255\)"
    with Engine() as eng, pytest.raises(CheckpointError, match=pattern):
        eng.load(edited(folders, tmp_path, edit))


def test_a_nan_exponent_of_an_fp8_matrix_is_refused(folders, tmp_path):
    def edit(h, data):
        data[h["layers.0.attn.wkv.scale"]["data_offsets"][0]] = 255
        return data

    pattern = (
        r"'layers\.0\.attn\.wkv\.weight' \(read as .*\) holds NaN .*its scale companion 'layers\.0\.attn\.wkv\.scale'"
    )
    with Engine() as eng, pytest.raises(CheckpointError, match=pattern):
        eng.load(edited(folders, tmp_path, edit))


def test_a_scale_beside_a_weight_that_takes_none_is_named(folders, tmp_path):
    """A '.scale' is the companion of its weight whatever the weight's format: beside an F32 weight the core refuses it
    (never a scale left unread)."""

    def edit(h, data):
        h["layers.1.attn.indexer.weights_proj.scale"] = {"dtype": "F8_E8M0", "shape": [1, 1],
                                                         "data_offsets": [len(data), len(data) + 1]}  # fmt: skip
        return data + bytes([127])

    pattern = (
        r"'layers\.1\.attn\.indexer\.weights_proj\.scale' \(read as .*\) .*is a scale companion of "
        r"'layers\.1\.attn\.indexer\.weights_proj\.weight' \(read as .*\), which is stored as F32 and takes none"
    )
    with Engine() as eng, pytest.raises(CheckpointError, match=pattern):
        eng.load(edited(folders, tmp_path, edit))
