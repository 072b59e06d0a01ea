"""Weight formats: the core's table of them (EB_FORMATS in native/include/expertbench.h), read through eb_format_info.

A format stores a row of `cols` values as cols / block blocks of `block_bytes` each; float formats are blocks of one.
Nothing else in the engine computes a weight's bytes: every byte count goes through `row_bytes` / `tensor_bytes`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import CheckpointError
from .native import check, ffi, lib


@dataclass(frozen=True)
class Format:
    name: str  # as safetensors and the gguf package name it: "BF16", "Q4_K"
    code: int  # eb_dtype in the core
    block: int  # values per block
    block_bytes: int
    ggml_type: int  # the GGUF file's type code; -1: none
    quantized: bool
    q8_block: int  # the q8 precision's activation block against it; 0: read with f32 activations
    scale_block: tuple[int, int] = (0, 0)  # rows x cols of one scale of its scale companion; (0, 0): it takes none

    @property
    def needs_scale(self) -> bool:
        """Whether its values are multiplied by a scale companion (an F32 tensor beside the weight: one scale per
        scale_block of values, a grid of ceil(rows / scale rows) x ceil(cols / scale cols))."""
        return self.scale_block != (0, 0)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """The shape of the scale companion of a [rows, cols] weight in this format."""
        (br, bc), (rows, cols) = self.scale_block, shape
        return -(-rows // br), -(-cols // bc)


def _core_formats() -> tuple[Format, ...]:
    out = []
    desc = ffi.new("eb_format_desc *")
    for code in range(lib.eb_format_count()):
        check(lib.eb_format_info(code, desc))
        out.append(Format(ffi.string(desc.name).decode(), desc.dtype, desc.block, desc.block_bytes, desc.ggml_type,
                          bool(desc.quantized), desc.q8_block, (desc.scale_rows, desc.scale_cols)))  # fmt: skip
    return tuple(out)


FORMATS: dict[str, Format] = {f.name: f for f in _core_formats()}
BY_GGML_TYPE: dict[int, Format] = {f.ggml_type: f for f in FORMATS.values() if f.ggml_type >= 0}


def scaled(element: str, block: tuple[int, int]) -> Format | None:
    """The format that stores `element` values (a safetensors dtype: "F8_E4M3") with a scale companion of `block`
    (rows x cols) per scale: the core's row named <element>_B<rows> whose scale block is `block`; None where the core
    has none."""
    fmt = FORMATS.get(f"{element}_B{block[0]}")
    return fmt if fmt is not None and fmt.scale_block == tuple(block) else None


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

    fmt = get(name)
    buf = bytes(data)
    out = np.empty(count, dtype=np.float32)
    check(lib.eb_dequantize(fmt.code, ffi.from_buffer(buf), len(buf), count, ffi.from_buffer("float[]", out)))
    return out
