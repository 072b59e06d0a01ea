"""Weight formats: the one table of what each stored format is (the core's native/include/eb_formats.h is its twin).

A format stores a row of `cols` values as cols / block blocks of `block_bytes` each; float formats are blocks of one.
Nothing else in the engine computes a weight's bytes: every byte count goes through `row_bytes` / `tensor_bytes`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import CheckpointError


@dataclass(frozen=True)
class Format:
    name: str  # as safetensors and the gguf package name it: "BF16", "Q4_K"
    code: int  # eb_dtype in the core
    block: int  # values per block
    block_bytes: int
    ggml_type: int  # the GGUF file's type code
    quantized: bool


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("F32", 0, 1, 4, 0, False),
        Format("F16", 1, 1, 2, 1, False),
        Format("BF16", 2, 1, 2, 30, False),
        Format("Q8_0", 3, 32, 34, 8, True),  # f16 scale, 32 int8
        Format("Q4_K", 4, 256, 144, 12, True),  # f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
        Format("Q5_K", 5, 256, 176, 13, True),  # as Q4_K, plus 32 bytes of fifth bits
        Format("Q6_K", 6, 256, 210, 14, True),  # 128 bytes low nibbles, 64 bytes high 2 bits, 16 int8 scales, f16 d
        Format("MXFP4", 7, 32, 17, 39, True),  # one E8M0 exponent, 16 bytes of E2M1 nibbles
        Format("Q5_0", 8, 32, 22, 6, True),  # f16 d, 32 fifth bits, 16 bytes of nibbles (a K-quant's fallback)
        Format("Q5_1", 9, 32, 24, 7, True),  # f16 d and m, 32 fifth bits, 16 bytes of nibbles
    )
}
BY_GGML_TYPE: dict[int, Format] = {f.ggml_type: f for f in FORMATS.values()}


def get(name: str, where: str = "") -> Format:
    fmt = FORMATS.get(name)
    if fmt is None:
        prefix = f"{where}: " if where else ""
        raise CheckpointError(f"{prefix}weight format {name!r} is not supported (expected one of {', '.join(FORMATS)})")
    return fmt


def row_bytes(name: str, cols: int) -> int:
    """Bytes of one row of `cols` values; a CheckpointError when cols is not a whole number of blocks."""
    fmt = get(name)
    if cols % fmt.block:
        raise CheckpointError(
            f"a row of {cols} values is not a whole number of {name} blocks ({fmt.block} values each)"
        )
    return cols // fmt.block * fmt.block_bytes


def tensor_bytes(name: str, shape: tuple[int, ...] | list[int]) -> int:
    """Bytes of a tensor of `shape` (row-major, the last dimension the row) stored as `name`."""
    if not shape:
        return get(name).block_bytes if get(name).block == 1 else row_bytes(name, 1)
    return math.prod(shape[:-1]) * row_bytes(name, shape[-1])


def dequantize(name: str, data: bytes | memoryview, count: int):
    """`count` values stored as `name` (bytes of whole blocks) as float32, computed by the core: the values its kernels
    multiply with."""
    import numpy as np

    from .native import check, ffi, lib

    fmt = get(name)
    buf = bytes(data)
    out = np.empty(count, dtype=np.float32)
    check(lib.eb_dequantize(fmt.code, ffi.from_buffer(buf), len(buf), count, ffi.from_buffer("float[]", out)))
    return out
