"""FP8 weights with block scales (DeepSeek-V3/V4's released checkpoints): the core's format F8_E4M3_B128 and its scale
companion '<name>_scale_inv', through the engine.

The DeepSeek-V3 f32 fixture is rewritten in the released layout: every projection (attention, dense and shared FFNs,
experts, and lm_head here too) as E4M3 bytes with one F32 scale per 128 x 128 block, quantized by numpy; beside it the
same weights dequantized by numpy (E4M3 value times its block's scale, in f32) as an F32 folder. The kernels promise
the products of the dequantized weights, so the two folders give the same logits bit for bit, on every kernel variant
and placement. Bad companions are refused, naming the tensor and what was expected.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from fixture_paths import FIXTURES
from test_bad_input import read_st, write_st

from engine.core import formats
from engine.core.errors import CheckpointError, EngineError, UnsupportedError
from engine.model import Engine, Model

SOURCE = FIXTURES / "deepseek-f32"
FP8 = formats.get("F8_E4M3_B128")
QUANT = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}


def e4m3_values() -> np.ndarray:
    """The 256 E4M3FN codes' values from the definition: (8 + m) * 2^(e - 10), subnormals m * 2^-9, NaN at 0x7F."""
    code = np.arange(256)
    e, m = (code >> 3) & 15, (code & 7).astype(np.float64)
    mag = np.where(e == 0, m * 2.0**-9, (8 + m) * 2.0 ** (e - 10.0))
    mag[(code & 0x7F) == 0x7F] = np.nan
    return np.where(code & 0x80, -mag, mag).astype(np.float32)


def test_the_format_row_and_its_scale_flag_come_from_the_core():
    row = (FP8.code, FP8.block, FP8.block_bytes, FP8.ggml_type, FP8.quantized, FP8.q8_block)
    assert row == (10, 1, 1, -1, False, 0)  # one byte a value, no GGUF type, no integer products
    assert FP8.scale_block == (128, 128) and FP8.needs_scale
    assert [f.name for f in formats.FORMATS.values() if f.needs_scale] == ["F8_E4M3_B128"]
    assert formats.scaled("F8_E4M3", (128, 128)) is FP8 and formats.scaled("F8_E4M3", (64, 64)) is None
    assert FP8.scale_shape((300, 260)) == (3, 3) and FP8.scale_shape((128, 129)) == (1, 2)
    assert formats.row_bytes("F8_E4M3_B128", 7) == 7 and -1 not in formats.BY_GGML_TYPE


def test_every_code_decodes_as_e4m3fn():
    got = formats.dequantize("F8_E4M3_B128", bytes(range(256)), 256)
    want = e4m3_values()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))  # -0 too
    assert got[0x7E] == 448 and got[0x01] == 2.0**-9 and got[0x08] == 2.0**-6


def fp8_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A matrix as E4M3 codes, its 128 x 128 block scales (amax / 448, as DeepSeek's quantizer) and its values as
    the kernels read them: code value times scale, in f32."""
    values = e4m3_values()
    order = np.argsort(np.nan_to_num(values, nan=np.inf), kind="stable")[:-2]  # the 254 numbers, ascending
    rows, cols = w.shape
    gr, gc = FP8.scale_shape(w.shape)
    scale = np.empty((gr, gc), np.float32)
    codes = np.empty(w.shape, np.uint8)
    for i in range(gr):
        for j in range(gc):
            block = w[128 * i : 128 * i + 128, 128 * j : 128 * j + 128]
            scale[i, j] = max(float(np.abs(block).max()), 1e-12) / 448.0
            target = block / scale[i, j]
            at = np.clip(np.searchsorted(values[order], target), 1, len(order) - 1)
            lo, hi = order[at - 1], order[at]
            codes[128 * i : 128 * i + 128, 128 * j : 128 * j + 128] = np.where(
                np.abs(values[lo] - target) <= np.abs(values[hi] - target), lo, hi
            )
    full = np.repeat(np.repeat(scale, 128, 0), 128, 1)[:rows, :cols]
    return codes, scale, values[codes] * full


def scaled(name: str, shape: tuple[int, ...]) -> bool:
    """The tensors DeepSeek's release stores in FP8 (its projections), lm_head too here: matrices but the embedding
    and the router."""
    return len(shape) == 2 and name.endswith("proj.weight") or name == "lm_head.weight"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    """The fixture in the released FP8 layout, and the same weights dequantized as F32."""
    base = tmp_path_factory.mktemp("fp8")
    fp8, f32 = base / "fp8", base / "f32"
    for folder in (fp8, f32):
        shutil.copytree(SOURCE, folder)
    header, data = read_st(SOURCE / "model.safetensors")
    out8, out32, h8, h32 = bytearray(), bytearray(), {}, {}

    def put(out: bytearray, head: dict, name: str, dtype: str, arr: np.ndarray) -> None:
        head[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [len(out), len(out) + arr.nbytes]}
        out += arr.tobytes()

    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        arr = np.frombuffer(data[begin:end], np.float32).reshape(entry["shape"])
        if not scaled(name, arr.shape):
            put(out8, h8, name, "F32", arr)
            put(out32, h32, name, "F32", arr)
            continue
        codes, scale, deq = fp8_weights(arr)
        put(out8, h8, name, "F8_E4M3", codes)
        put(out8, h8, f"{name}_scale_inv", "F32", scale)
        put(out32, h32, name, "F32", deq.astype(np.float32))
    write_st(fp8 / "model.safetensors", h8, bytes(out8))
    write_st(f32 / "model.safetensors", h32, bytes(out32))
    config = json.loads((fp8 / "config.json").read_text())
    (fp8 / "config.json").write_text(json.dumps({**config, "quantization_config": QUANT}))
    return fp8, f32


def logits(folder: Path, kernels: str = "best", placement: str = "") -> np.ndarray:
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, kernels=kernels) as eng, Model(eng, folder) as model:
        if placement:
            model.set_placement(placement)
        with model.context(32) as ctx:
            return np.concatenate([ctx.prefill([1, 2, 3, 4, 5]), *[ctx.decode([t]) for t in (7, 9, 11)]])


@pytest.mark.parametrize("kernels", ["best", "portable"])
def test_fp8_folder_gives_the_logits_of_its_weights_dequantized_by_numpy(folders, kernels):
    fp8, f32 = folders
    assert np.array_equal(logits(fp8, kernels).view(np.uint32), logits(f32, kernels).view(np.uint32))


def test_fp8_experts_on_other_devices_give_the_same_bits(folders):
    fp8, _ = folders
    # hostsim:0 cannot read host memory: its experts are copies, their scale companions with them
    spread = logits(fp8, placement="1=hostsim:0; 2=cpu:1; 3=hostsim:0")
    assert np.array_equal(logits(fp8).view(np.uint32), spread.view(np.uint32))


def test_the_released_checkpoints_fp8_is_a_fraction_of_the_bytes(folders):
    fp8, f32 = folders
    with Engine(runtimes=("cpu",)) as eng, Model(eng, fp8) as a, Model(eng, f32) as b:
        assert a.info["weight_bytes"] < 0.5 * b.info["weight_bytes"]


def rewrite(folder: Path, tmp_path: Path, edit) -> Path:
    """A copy of the folder with its safetensors header and data edited: edit(header) -> None."""
    out = tmp_path / "edited"
    shutil.copytree(folder, out)
    header, data = read_st(out / "model.safetensors")
    edit(header)
    write_st(out / "model.safetensors", header, data)
    return out


NAME = "model.layers.1.mlp.experts.3.down_proj.weight"  # [64, 32]: one scale


def load(folder: Path) -> None:
    with Engine(runtimes=("cpu",)) as eng, Model(eng, folder):
        pass


def missing(h):
    h[f"{NAME}_scales"] = h.pop(f"{NAME}_scale_inv")


def one_dimensional(h):
    h[f"{NAME}_scale_inv"]["shape"] = [1]  # the same 4 bytes


def in_bf16(h):
    begin = h[f"{NAME}_scale_inv"]["data_offsets"][0]
    h[f"{NAME}_scale_inv"].update(dtype="BF16", shape=[1, 2], data_offsets=[begin, begin + 4])


EXPECTED = r"F32 or F8_E8M0 of shape \[1, 1\]: one scale per block of 128 x 128 of \[64, 32\]"
BAD_COMPANIONS = {
    "missing": (missing, rf"tensor '{NAME}' in '.*' is F8_E4M3, which needs its scale companion '{NAME}_scale_inv' "
                         rf"\({EXPECTED}\); the checkpoint has none"),
    "mis-shaped": (one_dimensional, rf"tensor '{NAME}_scale_inv' in '.*' \(the scale companion of '{NAME}'\) is F32 "
                                    rf"of shape \[1\], expected {EXPECTED}"),
    "bf16": (in_bf16, rf"tensor '{NAME}_scale_inv' in '.*' \(the scale companion of '{NAME}'\) is BF16 of shape "
                      rf"\[1, 2\], expected {EXPECTED}"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_COMPANIONS))
def test_a_bad_scale_companion_is_refused_naming_the_tensor_and_the_expected_shape(folders, tmp_path, case):
    edit, message = BAD_COMPANIONS[case]
    with pytest.raises(CheckpointError, match=message):
        load(rewrite(folders[0], tmp_path, edit))


def test_a_scale_companion_beside_an_unscaled_weight_is_refused_by_the_core(folders, tmp_path):
    router = "model.layers.1.mlp.gate.weight"  # F32

    def edit(h):
        h[f"{router}_scale_inv"] = h.pop(f"{NAME}_scale_inv")
        h[f"unused.{NAME}"] = h.pop(NAME)  # out of the model's names: the core is the one to see the stray companion

    folder = rewrite(folders[0], tmp_path, edit)
    with pytest.raises(EngineError, match=rf"tensor '{router}_scale_inv' in '.*' is a scale companion of '{router}', "
                       "which is stored as F32 and takes none"):  # fmt: skip
        load(folder)


def test_a_block_the_core_has_no_format_for_is_refused(folders, tmp_path):
    out = tmp_path / "blocks"
    shutil.copytree(folders[0], out)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = [64, 64]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedError, match=r"F8_E4M3 in scale blocks of 64 x 64 \(quantization_config "
                       r"weight_block_size\) is not supported \(expected one of "
                       r"F8_E4M3_B128 \(128 x 128\)\)"):  # fmt: skip
        load(out)


@pytest.mark.parametrize(
    ("quant", "error", "message"),
    [
        ({"fmt": "e5m2"}, UnsupportedError, r"config.json': quantization_config fmt 'e5m2' is not supported \(expected "
                                            r"'e4m3'\)"),
        ({"activation_scheme": "static"}, UnsupportedError, r"quantization_config activation_scheme 'static' is not "
                                                            r"supported \(expected 'dynamic'\)"),
        ({"weight_block_size": [128]}, CheckpointError, r"quantization_config weight_block_size = \[128\], expected "
                                                        r"two integers \[rows, cols\] in 1..65536"),
        ({"weight_block_size": [0, 128]}, CheckpointError, r"weight_block_size = \[0, 128\], expected two integers"),
        ({"quant_method": "awq"}, UnsupportedError, r"quantization_config quant_method 'awq' is not supported beside "
                                                    r"F8_E4M3 weights \(expected 'fp8'\)"),
    ],
)  # fmt: skip
def test_a_quantization_config_the_engine_does_not_run_is_named(folders, tmp_path, quant, error, message):
    out = tmp_path / "quant"
    shutil.copytree(folders[0], out)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {**config["quantization_config"], **quant}
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(error, match=message):
        load(out)


def test_the_config_says_its_scale_block(folders):
    from engine.checkpoints.checkpoint import read_config

    assert read_config(folders[0]).weight_block == (128, 128)
    assert read_config(folders[1]).weight_block == ()  # the dequantized twin has no quantization_config
