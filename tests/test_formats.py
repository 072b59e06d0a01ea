"""The weight formats: the core's dequantization is the gguf package's, bit for bit, on random blocks and on the edge
values (subnormal and negative f16 scales, E8M0 exponents 0, 1, 254, every nibble and 6-bit value); the Python and C
tables of sizes agree."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from test_format_pairs import f16_put

from engine.core import formats
from engine.core.errors import ArgumentError, CheckpointError, UnsupportedError
from engine.core.native import lib

QUANTIZED = [name for name, f in formats.FORMATS.items() if f.quantized]


def _f16_bits(rng, n: int) -> np.ndarray:
    """f16 scales of every kind that matters: normal and subnormal, positive and negative, zero."""
    normal = rng.uniform(-2.0, 2.0, n).astype(np.float16).view(np.uint16)
    subnormal = rng.integers(1, 0x400, n, dtype=np.uint16) | (rng.integers(0, 2, n, dtype=np.uint16) << 15)
    zero = np.where(rng.integers(0, 2, n) == 1, 0x8000, 0).astype(np.uint16)
    pick = rng.integers(0, 10, n)
    return np.where(pick < 7, normal, np.where(pick < 9, subnormal, zero)).astype(np.uint16)


def _blocks(name: str, n: int, seed: int) -> np.ndarray:
    """n random blocks of a format (uint8, n x block_bytes) with their scales set to the edge values."""
    rng = np.random.default_rng(seed)
    fmt = formats.get(name)
    raw = rng.integers(0, 256, (n, fmt.block_bytes), dtype=np.uint8)
    if name == "MXFP4":
        raw[:, 0] = rng.integers(0, 255, n, dtype=np.uint8)  # E8M0 0..254 (255 is NaN in the spec)
        raw[: min(n, 4), 0] = [0, 1, 254, 127][: min(n, 4)]
    elif name in ("Q6_K", "Q3_K"):  # d after the quants and scales
        at = 208 if name == "Q6_K" else 108
        raw[:, at : at + 2] = _f16_bits(rng, n).view(np.uint8).reshape(n, 2)
    elif name == "IQ1_M":  # d in the top nibbles of the scale words
        f16_put(name, raw, 48, _f16_bits(rng, n))
    elif name == "Q2_K":  # d and dmin after the scales and quants
        raw[:, 80:82] = _f16_bits(rng, n).view(np.uint8).reshape(n, 2)
        raw[:, 82:84] = _f16_bits(rng, n).view(np.uint8).reshape(n, 2)
    else:
        raw[:, 0:2] = _f16_bits(rng, n).view(np.uint8).reshape(n, 2)
        if name in ("Q4_K", "Q5_K", "Q5_1", "Q4_1"):
            raw[:, 2:4] = _f16_bits(rng, n).view(np.uint8).reshape(n, 2)
    return raw


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def test_tables_agree_with_ggml_and_the_core():
    # the formats GGUF has no type for (ggml_type -1) are the ones with a scale companion, which no GGUF file holds
    assert [f.name for f in formats.FORMATS.values() if f.ggml_type < 0] == [
        f.name for f in formats.FORMATS.values() if f.needs_scale
    ]
    for name, fmt in formats.FORMATS.items():
        if fmt.ggml_type < 0:
            continue
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(fmt.ggml_type)]
        assert GGMLQuantizationType(fmt.ggml_type).name == name
        assert (fmt.block, fmt.block_bytes) == (block, type_size), name
        for cols in (fmt.block, 4 * fmt.block, 1024 * fmt.block):
            assert lib.eb_format_row_bytes(fmt.code, cols) == formats.row_bytes(name, cols)
        if fmt.block > 1:
            assert lib.eb_format_row_bytes(fmt.code, fmt.block + 1) == 0
    assert lib.eb_format_row_bytes(len(formats.FORMATS), 256) == 0


def test_the_python_table_is_the_cores():
    """engine.core.formats is read through eb_format_info, code by code: nothing on the Python side to keep in step."""
    from engine.core.errors import RangeError
    from engine.core.native import check, ffi

    assert [f.code for f in formats.FORMATS.values()] == list(range(lib.eb_format_count()))
    assert formats.BY_GGML_TYPE[formats.get("MXFP4").ggml_type].name == "MXFP4"
    assert {f.name: f.q8_block for f in formats.FORMATS.values() if f.q8_block} == {
        "Q8_0": 32, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "MXFP4": 32,
        "Q4_0": 32, "Q4_1": 32, "IQ4_NL": 32, "IQ4_XS": 256, "Q2_K": 256, "Q3_K": 256,
        "IQ2_XXS": 256, "IQ3_XXS": 256, "IQ2_XS": 256, "IQ3_S": 256, "IQ1_S": 256, "IQ1_M": 256, "IQ2_S": 256,
    }  # fmt: skip
    desc = ffi.new("eb_format_desc *")
    for bad in (-1, lib.eb_format_count()):
        with pytest.raises(RangeError, match=f"code {bad} is not one of 0..{lib.eb_format_count() - 1}"):
            check(lib.eb_format_info(bad, desc))
    with pytest.raises(ArgumentError, match="out is NULL"):
        check(lib.eb_format_info(0, ffi.NULL))


@pytest.mark.parametrize("name", QUANTIZED)
def test_dequantize_matches_the_gguf_package_bit_for_bit(name):
    fmt = formats.get(name)
    blocks = _blocks(name, 4096, seed=fmt.code)
    ours = formats.dequantize(name, blocks.tobytes(), blocks.shape[0] * fmt.block)
    with np.errstate(over="ignore"):  # E8M0 254 times the largest E2M1 value is inf there and here
        theirs = gguf_dequantize(blocks, GGMLQuantizationType(fmt.ggml_type)).reshape(-1)
    assert ours.shape == theirs.shape
    assert np.array_equal(_bits(ours), _bits(theirs)), f"{name}: {np.sum(_bits(ours) != _bits(theirs))} values differ"
    assert np.isfinite(theirs).mean() > 0.99  # the comparison is of numbers, not of NaNs


# how many quant values each format's codes name
LEVELS = {"Q8_0": 256, "MXFP4": 16, "Q4_K": 16, "Q5_K": 32, "Q6_K": 64, "Q5_0": 32, "Q5_1": 32, "Q4_0": 16}
LEVELS |= {"Q4_1": 16, "IQ4_NL": 16, "IQ4_XS": 16, "Q2_K": 4, "Q3_K": 8}
# the i-quants: every codebook entry, and with it every sign index and chunk scale (v modulo their counts)
LEVELS |= {"IQ2_XXS": 256, "IQ3_XXS": 256, "IQ2_XS": 512, "IQ3_S": 512, "IQ1_S": 2048, "IQ1_M": 2048, "IQ2_S": 1024}


@pytest.mark.parametrize("name", QUANTIZED)
def test_every_quant_value_is_reached(name):
    """One block per quant value v (every nibble of MXFP4, every 6-bit value of Q6_K, ...) with scale 1 and no
    minimum: each value dequantizes as the gguf package says, so no bit of the packing goes unread."""
    fmt = formats.get(name)
    levels = LEVELS[name]
    blocks = _blocks(name, levels * 8, seed=1)
    # random bytes reach every value with overwhelming probability; make it certain with one value per block
    for v in range(levels):
        b = blocks[v]
        if name == "Q8_0":
            b[2:] = v
        elif name == "MXFP4":
            b[1:] = v | (v << 4)
        elif name == "Q4_K":
            b[16:] = (v & 0xF) * 0x11
        elif name == "Q5_K":
            b[16:48] = 0xFF if v & 16 else 0
            b[48:] = (v & 0xF) * 0x11
        elif name == "Q6_K":
            b[0:128] = (v & 0xF) * 0x11
            b[128:192] = ((v >> 4) & 3) * 0x55
        elif name in ("Q4_0", "Q4_1", "IQ4_NL", "IQ4_XS"):
            b[{"Q4_1": 4, "IQ4_XS": 8}.get(name, 2) :] = v * 0x11
        elif name == "Q2_K":  # the quants between the scales and d
            b[16:80] = v * 0x55
        elif name == "Q3_K":  # the third bits, then the 2-bit fields
            b[0:32] = 0xFF if v & 4 else 0
            b[32:96] = (v & 3) * 0x55
        elif name == "IQ2_XXS":  # per chunk four grid indices, then four 7-bit sign indices and a 4-bit scale
            word = sum((v % 128) << (7 * g) for g in range(4)) | (v % 16) << 28
            chunk = np.array([v] * 4, dtype=np.uint8).tobytes() + np.array([word], dtype=np.uint32).tobytes()
            b[2:] = np.frombuffer(chunk * 8, dtype=np.uint8)
        elif name == "IQ3_XXS":  # 64 grid indices, then per chunk four 7-bit sign indices and a 4-bit scale
            word = sum((v % 128) << (7 * g) for g in range(4)) | (v % 16) << 28
            b[2:66] = v
            b[66:98] = np.frombuffer(np.array([word] * 8, dtype=np.uint32).tobytes(), dtype=np.uint8)
        elif name == "IQ2_XS":  # per group of 8 a 9-bit grid index and a 7-bit sign index, then the scales
            b[2:66] = np.frombuffer(np.array([v | (v % 128) << 9] * 32, dtype=np.uint16).tobytes(), dtype=np.uint8)
            b[66:74] = v % 256
        elif name == "IQ2_S":  # the indices' low 8 bits, the signs, their top 2 bits, the scales
            b[2:34], b[34:66], b[66:74], b[74:82] = v & 255, v % 256, (v >> 8) * 0x55, (v % 16) * 0x11
        elif name == "IQ3_S":  # the indices' low 8 bits, their ninth, the signs, the scales
            b[2:66], b[66:74], b[74:106], b[106:110] = v & 255, 0xFF if v & 256 else 0, v % 256, (v % 16) * 0x11
        elif name == "IQ1_S":  # the indices' low 8 bits, then per chunk their top 3, a scale and the delta's sign
            top = v >> 8
            word = top | top << 3 | top << 6 | top << 9 | (v % 8) << 12 | (v // 8 % 2) << 15
            b[2:34] = v & 255
            b[34:50] = np.frombuffer(np.array([word] * 8, dtype=np.uint16).tobytes(), dtype=np.uint8)
        elif name == "IQ1_M":  # the indices' low 8 bits, per group their top 3 and the delta's sign, the scales
            nibble = v >> 8 | (v // 8 % 2) << 3
            scales = (v % 8) * 0o1111  # the four 3-bit scales of a word; its top nibble (d's) kept below
            b[0:32], b[32:48] = v & 255, nibble | nibble << 4
            b[48:56:2] = scales & 0xFF
            b[49:56:2] = (b[49:56:2] & 0xF0) | scales >> 8
        elif name in ("Q5_0", "Q5_1"):  # d (and m), the fifth bits, the nibbles
            qh = 2 if name == "Q5_0" else 4
            b[qh : qh + 4] = 0xFF if v & 16 else 0
            b[qh + 4 :] = (v & 0xF) * 0x11
    ours = formats.dequantize(name, blocks.tobytes(), blocks.shape[0] * fmt.block)
    with np.errstate(over="ignore"):
        theirs = gguf_dequantize(blocks, GGMLQuantizationType(fmt.ggml_type)).reshape(-1)
    assert np.array_equal(_bits(ours), _bits(theirs))


# where each format keeps its f16 scales (d, and a minimum's dmin or m): byte offsets in its block
F16_SCALES = {"Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "Q5_0": [0], "Q5_1": [0, 2], "Q4_0": [0]}
F16_SCALES |= {"Q4_1": [0, 2], "IQ4_NL": [0], "IQ4_XS": [0], "Q2_K": [80, 82], "Q3_K": [108]}
F16_SCALES |= {"IQ2_XXS": [0], "IQ3_XXS": [0], "IQ2_XS": [0], "IQ3_S": [0], "IQ1_S": [0], "IQ1_M": [48], "IQ2_S": [0]}
# the largest, smallest normal and smallest subnormal f16 magnitudes, both signs, and both zeros
EXTREME_F16 = [0x7BFF, 0xFBFF, 0x0400, 0x8400, 0x0001, 0x8001, 0x0000, 0x8000]


@pytest.mark.parametrize("name", list(F16_SCALES))
def test_extreme_scales_with_every_code(name):
    """Blocks whose f16 scales are the extremes (every pair of them where a block has two) over random codes and
    over blocks of one code repeated (0x00, 0xFF, 0x0F, 0xF0, 0x55, 0xAA bytes): the gguf package's values, bit for bit,
    infinities where its products overflow included."""
    fmt = formats.get(name)
    fields = F16_SCALES[name]
    pairs = [(a, b) for a in EXTREME_F16 for b in EXTREME_F16] if len(fields) == 2 else [(a,) for a in EXTREME_F16]
    fills = [None, 0x00, 0xFF, 0x0F, 0xF0, 0x55, 0xAA]
    rng = np.random.default_rng(fmt.code)
    blocks = rng.integers(0, 256, (len(pairs) * len(fills), fmt.block_bytes), dtype=np.uint8)
    for i, (scales, fill) in enumerate((p, f) for p in pairs for f in fills):
        if fill is not None:
            blocks[i, :] = fill
        for off, bits in zip(fields, scales, strict=True):
            f16_put(name, blocks[i : i + 1], off, bits)
    ours = formats.dequantize(name, blocks.tobytes(), blocks.shape[0] * fmt.block)
    with np.errstate(over="ignore", invalid="ignore"):
        theirs = gguf_dequantize(blocks, GGMLQuantizationType(fmt.ggml_type)).reshape(-1)
    assert np.array_equal(_bits(ours), _bits(theirs)), f"{name}: {np.sum(_bits(ours) != _bits(theirs))} values differ"


def test_float_formats_dequantize_to_their_values():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(512).astype(np.float32)
    assert np.array_equal(formats.dequantize("F32", x.tobytes(), 512), x)
    h = x.astype(np.float16)
    assert np.array_equal(formats.dequantize("F16", h.tobytes(), 512), h.astype(np.float32))
    bf = (x.view(np.uint32) >> 16).astype(np.uint16)
    assert np.array_equal(formats.dequantize("BF16", bf.tobytes(), 512), (bf.astype(np.uint32) << 16).view(np.float32))


def test_bad_arguments_are_named():
    with pytest.raises(CheckpointError, match="'TQ1_0' is not supported"):
        formats.get("TQ1_0")
    with pytest.raises(CheckpointError, match="300 values is not a whole number of Q4_K blocks"):
        formats.row_bytes("Q4_K", 300)
    with pytest.raises(ArgumentError, match="not a whole number of Q8_0 blocks"):
        formats.dequantize("Q8_0", b"\0" * 34, 33)
    with pytest.raises(Exception, match="need 68 bytes, 34 given"):
        formats.dequantize("Q8_0", b"\0" * 34, 64)
    with pytest.raises(UnsupportedError, match="format code 99"):
        from engine.core.native import check, ffi

        out = np.empty(32, dtype=np.float32)
        check(lib.eb_dequantize(99, b"\0" * 64, 64, 32, ffi.from_buffer("float[]", out)))


def test_the_codebook_header_is_what_its_script_writes():
    """native/include/eb_iq_tables.h is generated from the gguf package's tables: committed as its script writes it."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "native" / "tools" / "gen_iq_tables.py"
    spec = importlib.util.spec_from_file_location("gen_iq_tables", script)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.HEADER.read_text() == gen.render(), f"run {script.name}: the header is not what it writes"
