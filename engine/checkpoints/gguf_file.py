"""Reading a GGUF file (llama.cpp's format), whole or split into parts, into the Checkpoint a model folder gives.

The header is walked once with struct first, every length, count, type code, dimension and offset bounded by the
file: gguf.GGUFReader trusts what it reads (a string length past the end gives a short array, an array count of
2**60 loops for ever, an unknown type code raises from deep inside). Only a header that passed is handed to
GGUFReader, whose metadata then becomes a ModelConfig (the `<arch>.*` keys), tensor descriptors under the Hugging
Face names the core binds (llama.cpp's merged expert tensors sliced per expert: no byte is copied) and a
tokenizers.Tokenizer (the `tokenizer.ggml.*` keys). A damaged file is a CheckpointError naming it and what was
expected; a valid file the engine does not run (another architecture, a rope scaling, a format) an UnsupportedError.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import re
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from ..core import formats
from ..core.errors import CheckpointError, EngineError, UnsupportedError
from ..families import BY_GGUF_ARCH, family, gguf_family
from ..families.base import ATTENTION_BIASES, GGUFShape
from .model_config import ModelConfig, TensorInfo

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # the same layout; 3 added big-endian files, which the engine does not read
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_DIM = 1 << 40  # as for safetensors (checkpoint.MAX_DIM): the core refuses more
MAX_ARRAY = 1 << 24  # entries of one metadata array: a vocabulary has some 10**5; a damaged count is refused early
SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")  # llama.cpp's llama_split_path

# GGUF value types (gguf.GGUFValueType): struct format of the scalars
STRING, ARRAY = 8, 9
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
INTS, FLOATS, BOOL = {0, 1, 2, 3, 4, 5, 10, 11}, {6, 12}, 7
TYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32", 7: "bool",
              8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64"}  # fmt: skip

# llama.cpp's tensor names -> the Hugging Face names (engine/model.py binds those)
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
EXPERT_TENSORS = {  # [cols, rows, experts] in GGUF order; expert E's slice is model.layers.N.mlp.experts.E.<proj>
    "ffn_gate_exps.weight": "gate_proj.weight",
    "ffn_up_exps.weight": "up_proj.weight",
    "ffn_down_exps.weight": "down_proj.weight",
}
LAYER_NAME = re.compile(r"blk\.(0|[1-9][0-9]*)\.(.+)")


@dataclass(frozen=True)
class IntTable:
    """A tensor of integers (llama.cpp's I32: DeepSeek-V4's tid2eid), no format the products run: handed to the core
    as raw bytes, which the family that binds it reads (a float weight of this type is refused at bind)."""

    name: str
    ggml_type: int
    size: int  # bytes of one value
    block: int = 1


INT_TABLES = {26: IntTable("I32", 26, 4)}  # ggml's GGML_TYPE_I32

# tokenizer.ggml.pre -> how text is split before BPE, as the original tokenizer.json does it
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# o200k's split (gpt-oss, GPT-4o), as its tokenizer.json writes it
GPT4O_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS = ("qwen2", "gpt-2", "gpt-4o")  # as llama.cpp names them (llama-vocab.cpp)
NO_VOCABULARY = ("none", "no_vocab")  # llama.cpp's names for a file without a tokenizer
CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values (gguf.TokenType) that become added tokens


@dataclass(frozen=True)
class Value:
    """A metadata value as GGUFReader gives it, with its GGUF type (and the item type of an array)."""

    type: int
    value: Any
    item_type: int | None = None

    @property
    def type_name(self) -> str:
        if self.type == ARRAY:
            return f"array of {TYPE_NAMES.get(self.item_type, '?')}" if self.item_type is not None else "empty array"
        return TYPE_NAMES[self.type]


@dataclass(frozen=True)
class RawTensor:
    """One entry of a file's tensor table, checked: GGUF order of dimensions (ne[0] is the row)."""

    name: str
    ne: tuple[int, ...]
    fmt: formats.Format | IntTable
    offset: int  # absolute, in the file
    nbytes: int


@dataclass
class Part:
    """One GGUF file: its metadata (shared between reads of the same header: not to be changed) and its checked
    tensor table."""

    path: Path
    metadata: dict[str, Value]
    tensors: list[RawTensor]


# ---- the header walk --------------------------------------------------------------------------------------


class _Walk:
    """Bounds-checked reads of a header from the file's mapping."""

    def __init__(self, path: Path, buf, size: int):
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def fail(self, message: str) -> NoReturn:
        raise CheckpointError(f"'{self.path}': {message}")

    def take(self, n: int, what: str) -> int:
        if n > self.size - self.pos:
            self.fail(f"{what} ({n} bytes at byte {self.pos}) runs past the end of the file ({self.size} bytes): "
                      "truncated, or a damaged length")  # fmt: skip
        start = self.pos
        self.pos += n
        return start

    def scalar(self, fmt: str, what: str):
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> bytes:
        n = self.scalar("<Q", f"the length of {what}")
        return bytes(self.buf[self.take(n, what) : self.pos])

    def text(self, what: str) -> str:
        raw = self.string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not UTF-8 text: {raw[:40]!r}")


def _skip_value(w: _Walk, vtype: int, key: str) -> Any:
    """Step over one value of `key`; returns a scalar's value (None for strings and arrays)."""
    if vtype in SCALARS:
        return w.scalar(SCALARS[vtype], f"the value of '{key}'")
    if vtype == STRING:
        w.string(f"the value of '{key}'")
        return None
    if vtype != ARRAY:
        w.fail(f"metadata key '{key}' has value type code {vtype}, expected one of 0..12 (the GGUF value types)")
    itype = w.scalar("<I", f"the item type of '{key}'")
    count = w.scalar("<Q", f"the length of the array '{key}'")
    if itype == ARRAY:
        w.fail(f"metadata key '{key}' is an array of arrays, expected an array of numbers or strings")
    if itype != STRING and itype not in SCALARS:
        w.fail(f"metadata key '{key}' is an array of value type code {itype}, expected one of 0..8, 10..12")
    least = 8 if itype == STRING else struct.calcsize(SCALARS[itype])
    if count > MAX_ARRAY or count * least > w.size - w.pos:
        w.fail(f"metadata key '{key}' is an array of {count} {TYPE_NAMES[itype]} items at byte {w.pos}: they take at "
               f"least {count * least} bytes, and the file ends {w.size - w.pos} bytes later (expected at most "
               f"{MAX_ARRAY} items that fit: truncated, or a damaged count)")  # fmt: skip
    if itype == STRING:
        for i in range(count):
            w.string(f"string {i} of the array '{key}'")
    else:
        w.take(count * least, f"the array '{key}'")
    return None


def _walk_header(path: Path, buf, size: int) -> tuple[list[RawTensor], int]:
    """Every structure of the header checked against the file; the tensor table checked as the core needs it.
    Returns the tensors and where the header ends."""
    w = _Walk(path, buf, size)
    if size < 24:
        w.fail(f"{size} bytes, too short for a GGUF file (expected at least the 24-byte header)")
    magic = bytes(buf[:4])
    if magic != MAGIC:
        hint = ""
        if bytes(buf[8:10]) in (b'{"', b"{ "):  # an 8-byte header length, then its JSON
            hint = " (it looks like a safetensors file: a Hugging Face model is opened by its folder)"
        w.fail(f"not a GGUF file: it starts with {magic!r}, expected {MAGIC!r}{hint}")
    w.pos = 4
    version = w.scalar("<I", "the version")
    if version not in VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if version & 0xFFFF == 0 and swapped in VERSIONS:
            raise UnsupportedError(f"'{path}': a big-endian GGUF file (version {swapped}): the engine reads "
                                   "little-endian files only")  # fmt: skip
        cls = UnsupportedError if 1 <= version < 256 else CheckpointError
        raise cls(f"'{path}': GGUF version {version} is not supported (expected {' or '.join(map(str, VERSIONS))})")
    n_tensors = w.scalar("<Q", "the tensor count")
    n_kv = w.scalar("<Q", "the metadata count")
    # a key/value takes at least 13 bytes (name length, type, one byte), a tensor entry 32 (name length, one
    # dimension, type, offset): counts beyond what the file holds are refused before any loop
    if n_kv * 13 + n_tensors * 32 > size - w.pos:
        w.fail(f"the header claims {n_kv} metadata entries and {n_tensors} tensors, more than the file's {size} "
               "bytes can hold: a damaged header")  # fmt: skip
    alignment = DEFAULT_ALIGNMENT
    keys: set[str] = set()
    arch = ""
    for i in range(n_kv):
        key = w.text(f"the name of metadata entry {i}")
        if key in keys:
            w.fail(f"metadata key '{key}' appears twice, expected each key once")
        keys.add(key)
        vtype = w.scalar("<I", f"the value type of '{key}'")
        start = w.pos
        value = _skip_value(w, vtype, key)
        if key == "general.architecture" and vtype == STRING:
            arch = bytes(buf[start + 8 : w.pos]).decode("utf-8", "replace")
        if key == "general.alignment":
            if vtype != 4 or not value or value & (value - 1):
                shown = TYPE_NAMES.get(vtype, f"type {vtype}")
                w.fail(f"general.alignment = {value!r} ({shown}), expected a power of two as a uint32")
            alignment = value
    tensors = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = w.text(f"the name of tensor {i}")
        if name in names:
            w.fail(f"tensor '{name}' appears twice in the tensor table, expected each name once")
        names.add(name)
        n_dims = w.scalar("<I", f"the dimension count of tensor '{name}'")
        if not 1 <= n_dims <= MAX_DIMS:
            w.fail(f"tensor '{name}' has {n_dims} dimensions, expected 1 to {MAX_DIMS}")
        ne = tuple(w.scalar("<Q", f"dimension {d} of tensor '{name}'") for d in range(n_dims))
        ttype = w.scalar("<I", f"the type of tensor '{name}'")
        offset = w.scalar("<Q", f"the data offset of tensor '{name}'")
        tensors.append((name, ne, ttype, offset))
    data_start = -(-w.pos // alignment) * alignment
    try:
        checked = [_check_tensor(w, data_start, alignment, *t) for t in tensors]
    except UnsupportedError:
        # a tensor format the engine does not run, in a file of a family it cannot run yet: the family is the
        # reason to give (its files hold formats that come with its forward pass, such as deepseek4's I32 tables)
        fam = gguf_family(arch)
        if fam is None or not (fam.awaiting or fam.gguf_awaiting):
            raise
        checked = None
    if checked is None:
        fam.refuse_gguf(f"'{path}'")
    spans = sorted(checked, key=lambda t: t.offset)
    for a, b in zip(spans, spans[1:], strict=False):
        if b.offset < a.offset + a.nbytes:
            w.fail(f"tensors '{a.name}' (bytes {a.offset}..{a.offset + a.nbytes}) and '{b.name}' (from byte "
                   f"{b.offset}) overlap: expected each tensor's bytes to be its own")  # fmt: skip
    return checked, w.pos


def _check_tensor(w: _Walk, data_start: int, alignment: int, name: str, ne: tuple[int, ...], ttype: int,
                  offset: int) -> RawTensor:  # fmt: skip
    fmt = formats.BY_GGML_TYPE.get(ttype) or INT_TABLES.get(ttype)
    if fmt is None:
        from gguf import GGMLQuantizationType

        supported = ", ".join(f"{f.name} ({f.ggml_type})" for f in formats.FORMATS.values() if f.ggml_type >= 0)
        try:
            known = GGMLQuantizationType(ttype).name
        except ValueError:
            w.fail(f"tensor '{name}' has type code {ttype}, which is no ggml type (expected one of {supported})")
        raise UnsupportedError(f"'{w.path}': tensor '{name}' is stored as {known}, a format the engine does not run "
                               f"(expected one of {supported})")  # fmt: skip
    if math.prod(ne) >= 1 << 63:
        w.fail(f"tensor '{name}' has dimensions {list(ne)}: their product overflows 64 bits (expected a tensor that "
               "fits in memory)")  # fmt: skip
    for d, n in enumerate(ne):
        if not 1 <= n < MAX_DIM:
            w.fail(f"tensor '{name}' has dimension {d} = {n}, expected 1..{MAX_DIM - 1}")
    if ne[0] % fmt.block:
        w.fail(f"tensor '{name}' has rows of {ne[0]} values, not a whole number of {fmt.name} blocks ({fmt.block} "
               "values each)")  # fmt: skip
    if isinstance(fmt, IntTable):
        nbytes = math.prod(ne) * fmt.size
    else:
        nbytes = formats.tensor_bytes(fmt.name, tuple(reversed(ne)))
    if offset % alignment:
        w.fail(f"tensor '{name}' starts at data offset {offset}, not a multiple of the alignment ({alignment}, "
               "general.alignment): expected aligned tensor data")  # fmt: skip
    begin = data_start + offset
    if begin + nbytes > w.size:
        w.fail(f"tensor '{name}' ({fmt.name} {list(ne)}, {nbytes} bytes) lies at bytes {begin}..{begin + nbytes}, "
               f"past the end of the file ({w.size} bytes): truncated?")  # fmt: skip
    return RawTensor(name, ne, fmt, begin, nbytes)


def _value(field) -> Value:
    types = [int(t) for t in field.types]
    if types[0] == ARRAY:
        return Value(ARRAY, field.contents(), types[1] if len(types) > 1 else None)
    value = field.contents()
    if types[0] == 6:  # a float32 as its shortest text (1e-06, as config.json says it), not 9.99999997e-07
        value = float(str(field.parts[-1][0]))
    return Value(types[0], value)


def _gguf_reader(path: Path):
    """gguf.GGUFReader over a plain ndarray view of its mapping: it slices the map once per value (a vocabulary of
    10**5 strings: some 3 * 10**5 slices), and np.memmap's slices cost three times those of an ndarray. Only what
    the walk passed comes here; should the subclass ever not fit the package, the plain reader reads."""
    import numpy as np
    from gguf import GGUFReader

    class Reader(GGUFReader):
        def _get(self, *args, **kwargs):
            if type(self.data) is not np.ndarray:
                self.data = self.data.view(np.ndarray)  # the view keeps the map open
            return super()._get(*args, **kwargs)

    try:
        return Reader(path)
    except Exception:
        pass
    try:
        return GGUFReader(path)
    except Exception as exc:  # the walk leaves nothing GGUFReader should trip on; has the file changed since?
        raise CheckpointError(f"'{path}': the gguf package could not read the header: {type(exc).__name__}: {exc}"
                              ) from None  # fmt: skip


_PARTS: OrderedDict[tuple, Part] = OrderedDict()  # the last headers parsed, by the file's size and header bytes
_KEEP_PARTS = 4
_PARTS_LOCK = threading.Lock()  # the window reads models on its engine thread, scripts on theirs


def read_part(path: Path) -> Part:
    """One GGUF file's metadata and tensor table, every offset and size checked before GGUFReader parses it. A header
    read again (opening, fingerprinting and configuring one model read it three times) is walked and hashed again,
    not parsed again."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            if size == 0:
                raise CheckpointError(f"'{path}': an empty file, expected a GGUF file")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                tensors, end = _walk_header(path, buf, size)
                key = (size, hashlib.blake2b(buf[:end], digest_size=32).digest())
    except OSError as exc:
        raise CheckpointError(f"'{path}': cannot read: {exc.strerror or exc}") from None
    with _PARTS_LOCK:
        known = _PARTS.get(key)
        if known is not None:
            _PARTS.move_to_end(key)
            return Part(path, known.metadata, tensors)
    reader = _gguf_reader(path)
    metadata = {}
    for name, fld in reader.fields.items():
        if not name.startswith("GGUF."):
            try:
                metadata[name] = _value(fld)
            except UnicodeDecodeError:
                raise CheckpointError(f"'{path}': metadata key '{name}' holds a string that is not UTF-8 text"
                                      ) from None  # fmt: skip
    read = [(t.name, int(t.data_offset)) for t in reader.tensors]
    del reader  # its arrays map the file: let it go now
    if read != [(t.name, t.offset) for t in tensors]:
        raise CheckpointError(f"'{path}': the gguf package read another tensor table than the header holds: has the "
                              "file changed while it was read?")  # fmt: skip
    part = Part(path, metadata, tensors)
    with _PARTS_LOCK:
        _PARTS[key] = part
        while len(_PARTS) > _KEEP_PARTS:
            _PARTS.popitem(last=False)
    return part


# ---- split files ------------------------------------------------------------------------------------------


def _split_int(part: Part, key: str, lo: int, hi: int) -> int | None:
    v = part.metadata.get(key)
    if v is None:
        return None
    if v.type not in INTS or not lo <= v.value <= hi:
        raise CheckpointError(f"'{part.path}': {key} = {v.value!r:.40} ({v.type_name}), expected an integer in "
                              f"{lo}..{hi}")  # fmt: skip
    return v.value


def read_parts(path: str | Path) -> list[Part]:
    """The parts of a model: the file alone, or every part of a split (given any of them), in order, checked to
    be one split: split.count and split.tensors.count agree, split.no is each part's place, every tensor once."""
    path = Path(path)
    given = read_part(path)
    count = _split_int(given, "split.count", 1, 99999)
    if count is None or count == 1:
        return [given]
    m = SPLIT_NAME.match(path.name)
    if m is None or int(m["count"]) != count:
        raise CheckpointError(f"'{path}' is part of a split into {count} files (split.count), but its name is not "
                              f"NAME-0000N-of-{count:05d}.gguf: cannot find the other parts")  # fmt: skip
    names = [path.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    for p in names:
        if not p.is_file():
            raise CheckpointError(f"'{p}' is missing: '{path}' is one of {count} parts (split.count = {count}), "
                                  "expected every part in the same folder")  # fmt: skip
    parts = [given if p == path else read_part(p) for p in names]
    total = _split_int(parts[0], "split.tensors.count", 0, 2**31 - 1)
    seen: dict[str, Path] = {}
    for i, part in enumerate(parts):
        where = f"'{part.path}'"
        if _split_int(part, "split.count", 1, 99999) != count:
            raise CheckpointError(f"{where}: split.count = {part.metadata.get('split.count', Value(0, None)).value}, "
                                  f"expected {count} as in '{path}'")  # fmt: skip
        if _split_int(part, "split.no", 0, 99998) != i:
            raise CheckpointError(f"{where}: split.no = {part.metadata.get('split.no', Value(0, None)).value}, "
                                  f"expected {i} (part {i + 1} of {count}, 0-based)")  # fmt: skip
        if _split_int(part, "split.tensors.count", 0, 2**31 - 1) != total:
            raise CheckpointError(f"{where}: split.tensors.count differs from the first part's ({total})")
        for t in part.tensors:
            if t.name in seen:
                raise CheckpointError(f"tensor '{t.name}' is in both '{seen[t.name]}' and '{part.path}': expected "
                                      "every tensor in one part")  # fmt: skip
            seen[t.name] = part.path
    if total is not None and len(seen) != total:
        raise CheckpointError(f"'{parts[0].path}': the {count} parts hold {len(seen)} tensors, but "
                              f"split.tensors.count = {total}")  # fmt: skip
    return parts


# ---- the model's configuration ----------------------------------------------------------------------------


class _Meta:
    """Typed reads of the first part's metadata; errors name the file and the key."""

    def __init__(self, part: Part):
        self.path, self.md = part.path, part.metadata

    def fail(self, message: str, cls: type[EngineError] = CheckpointError) -> NoReturn:
        raise cls(f"'{self.path}': {message}")

    def get(self, key: str, kind: str, default: Any = ...) -> Any:
        v = self.md.get(key)
        if v is None:
            if default is ...:
                self.fail(f"metadata key '{key}' is missing")
            return default
        ok = {"int": v.type in INTS, "float": v.type in FLOATS | INTS, "bool": v.type == BOOL,
              "str": v.type == STRING}[kind]  # fmt: skip
        if kind == "int" and v.type == ARRAY and v.item_type in INTS and v.value:
            # llama.cpp takes some counts per layer; the engine runs one value for every layer
            if len(set(v.value)) > 1:
                self.fail(f"'{key}' differs between layers ({v.value[:8]}...), expected one value for every layer",
                          UnsupportedError)  # fmt: skip
            return v.value[0]
        if not ok:
            self.fail(f"'{key}' is {v.type_name} {v.value!r:.60}, expected {'a number' if kind == 'float' else kind}")
        return float(v.value) if kind == "float" else v.value

    def count(self, key: str, default: Any = ..., lo: int = 1) -> int:
        value = self.get(key, "int", default)
        if not lo <= value < 2**31:
            self.fail(f"'{key}' = {value}, expected an integer in {lo}..{2**31 - 1}")
        return value

    def number(self, key: str, default: Any, check, expect: str) -> float:
        value = self.get(key, "float", default)
        if not check(value):  # False for NaN
            self.fail(f"'{key}' = {value!r}, expected {expect}")
        return value

    def layer_pattern(self, key: str, layers: int, period: int) -> list[bool]:
        """A flag per layer as llama.cpp reads it (its set_swa_pattern): one flag per layer, or a period whose last
        layer is the unflagged one (the default period when the key is absent)."""
        v = self.md.get(key)
        if v is not None and v.type == ARRAY:
            flags = list(v.value)
            if len(flags) != layers or (flags and v.item_type not in INTS | {BOOL}):
                self.fail(f"'{key}' holds {len(flags)} values, expected one per layer ({layers})")
            return [bool(f) for f in flags]
        period = self.count(key, period)
        return [layer % period < period - 1 for layer in range(layers)]


def _layer_kinds(tensors: dict[str, RawTensor], n_layers: int, key: str, path: Path) -> tuple[set[int], bool]:
    """(the layers holding an expert router, whether the attention has biases), from the tensor names."""
    moe, bias = set(), False
    for name in tensors:
        m = LAYER_NAME.fullmatch(name)
        if m is None:
            continue
        layer = int(m[1])
        if layer >= n_layers:
            raise CheckpointError(f"'{path}': tensor '{name}' is of layer {layer}, but {key} = {n_layers}: "
                                  f"expected layers 0..{n_layers - 1}")  # fmt: skip
        if m[2] == "ffn_gate_inp.weight":
            moe.add(layer)
        bias = bias or m[2] in ATTENTION_BIASES
    return moe, bias


def parse_config(parts: list[Part]) -> ModelConfig:
    """The ModelConfig of a GGUF model from its `<arch>.*` and `tokenizer.ggml.*` keys and its tensor names, with
    the ranges parse_config (checkpoint.py) checks for a folder; the family (engine/families/) reads its own keys."""
    m = _Meta(parts[0])
    arch_name = m.get("general.architecture", "str")
    fam = gguf_family(arch_name)
    if fam is None:
        read = [a for a, f in BY_GGUF_ARCH.items() if not f.gguf_awaiting]  # a family's files refused: not named
        m.fail(f"architecture '{arch_name}' (general.architecture) is not supported (expected one of "
               f"{', '.join(read)})", UnsupportedError)  # fmt: skip
    a = f"{arch_name}."
    tensors = {t.name: t for part in parts for t in part.tensors}
    layers = m.count(a + "block_count")
    hidden = m.count(a + "embedding_length")
    heads = m.count(a + "attention.head_count")
    kv_heads = m.count(a + "attention.head_count_kv", heads)
    head_dim = m.count(a + "attention.key_length", hidden // heads if hidden % heads == 0 else ...)
    embed = tensors.get("token_embd.weight")
    if embed is None or len(embed.ne) != 2:
        found = "missing" if embed is None else f"of dimensions {list(embed.ne)}"
        m.fail(f"tensor 'token_embd.weight' is {found}, expected [embedding_length, vocabulary size]")
    vocab = embed.ne[1]
    stated = m.get(a + "vocab_size", "int", vocab)
    if stated != vocab:
        m.fail(f"'{a}vocab_size' = {stated}, but token_embd.weight holds {vocab} tokens: expected them equal")
    moe_layers, bias = _layer_kinds(tensors, layers, f"'{a}block_count'", m.path)
    intermediate = m.get(a + "feed_forward_length", "int", None)
    shape = GGUFShape(a, layers, hidden, heads, head_dim, intermediate, frozenset(moe_layers), frozenset(tensors))
    fam.refuse_gguf(f"'{m.path}'")
    kw = fam.gguf_keys(m, shape)
    kv_heads = kw.pop("num_kv_heads", kv_heads)
    head_dim = kw.pop("head_dim", head_dim)
    intermediate = kw.pop("intermediate_size", intermediate)
    if heads % kv_heads:
        m.fail(f"'{a}attention.head_count' = {heads} is not a multiple of '{a}attention.head_count_kv' = {kv_heads}")
    if intermediate is None:
        m.fail(f"metadata key '{a}feed_forward_length' is missing")
    ids = {}
    for key in ("bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id"):
        value = m.get(f"tokenizer.ggml.{key}", "int", None)
        if value is not None and not 0 <= value < vocab:
            m.fail(f"'tokenizer.ggml.{key}' = {value}, expected a token id in 0..{vocab - 1}")
        ids[key] = value
    return ModelConfig(
        architecture=fam.architecture,
        vocab_size=m.count(a + "vocab_size", vocab),
        hidden_size=hidden,
        intermediate_size=m.count(a + "feed_forward_length", intermediate),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=m.count(a + "context_length"),
        rope_theta=m.number(a + "rope.freq_base", 10000.0, lambda v: 1.0 <= v <= 1e12, "a number in 1..1e12"),
        rms_norm_eps=m.number(a + "attention.layer_norm_rms_epsilon", ..., lambda v: 0 < v < 1, "a number in (0, 1)"),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias=bias,
        bos_token_id=ids["bos_token_id"],
        eos_token_id=tuple(dict.fromkeys(i for k, i in ids.items() if k != "bos_token_id" and i is not None)),
        synthetic=bool(m.get("expertbench.synthetic", "bool", False)),  # the demo pair's mark (checkpoints/demo.py)
        **kw,
    )


# ---- tensors ----------------------------------------------------------------------------------------------


def map_tensors(parts: list[Part], config: ModelConfig) -> dict[str, TensorInfo]:
    """llama.cpp's names to the Hugging Face names; each merged expert tensor becomes one 2-D slice per expert."""
    fam = family(config.architecture)
    arch, routed = fam.gguf_arch, fam.routed
    layer_names = fam.gguf_layer_tensors
    biases = fam.gguf_expert_biases
    global_names = {**GLOBAL_TENSORS, **fam.gguf_global_tensors}
    expert_names = fam.gguf_expert_tensors or {k: f"mlp.experts.{{e}}.{v}" for k, v in EXPERT_TENSORS.items()}
    out: dict[str, TensorInfo] = {}
    for part in parts:
        for t in part.tensors:
            hf_shape = tuple(reversed(t.ne))
            layer = LAYER_NAME.fullmatch(t.name)
            if t.name in global_names:
                out[global_names[t.name]] = TensorInfo(global_names[t.name], part.path, t.fmt.name, hf_shape,
                                                       t.offset, t.nbytes)  # fmt: skip
            elif layer and layer[2] in layer_names:
                name = f"model.layers.{layer[1]}.{layer_names[layer[2]]}"
                if layer[2] in ("attn_k_b.weight", "attn_v_b.weight") and len(t.ne) == 3:
                    hf_shape = (t.ne[2] * t.ne[1], t.ne[0])  # the heads' matrices stacked: rows of one head follow
                out[name] = TensorInfo(name, part.path, t.fmt.name, hf_shape, t.offset, t.nbytes)
            elif isinstance(t.fmt, IntTable) and not (layer and layer[2] in layer_names):
                raise UnsupportedError(f"'{part.path}': tensor '{t.name}' is stored as {t.fmt.name}, which the engine "
                                       "reads only as a family's integer table (DeepSeek-V4's ffn_gate_tid2eid), not "
                                       "as weights")  # fmt: skip
            elif layer and routed and layer[2] in expert_names:
                if len(t.ne) != 3 or t.ne[2] != config.num_experts:
                    raise CheckpointError(f"'{part.path}': tensor '{t.name}' has dimensions {list(t.ne)}, expected "
                                          f"[cols, rows, {config.num_experts}] (expert_count experts)")  # fmt: skip
                rows, cols = t.ne[1], t.ne[0]
                step = formats.tensor_bytes(t.fmt.name, (rows, cols))
                for e in range(config.num_experts):
                    name = f"model.layers.{layer[1]}." + expert_names[layer[2]].format(e=e)
                    out[name] = TensorInfo(name, part.path, t.fmt.name, (rows, cols), t.offset + e * step, step)
            elif layer and layer[2] in biases:
                if len(t.ne) != 2 or t.ne[1] != config.num_experts:
                    raise CheckpointError(f"'{part.path}': tensor '{t.name}' has dimensions {list(t.ne)}, expected "
                                          f"[n, {config.num_experts}] (one bias vector per expert)")  # fmt: skip
                step = formats.tensor_bytes(t.fmt.name, (t.ne[0],))
                for e in range(config.num_experts):
                    name = f"model.layers.{layer[1]}.mlp.experts.{e}.{biases[layer[2]]}"
                    out[name] = TensorInfo(name, part.path, t.fmt.name, (t.ne[0],), t.offset + e * step, step)
            else:
                known = ", ".join(
                    [*global_names, *(f"blk.N.{n}" for n in layer_names)]
                    + ([f"blk.N.{n}" for n in [*expert_names, *biases]] if routed else [])
                )
                raise UnsupportedError(f"'{part.path}': tensor '{t.name}' is not part of a {arch} model the engine "
                                       f"runs (expected {known})")  # fmt: skip
    return out


# ---- the tokenizer ----------------------------------------------------------------------------------------


def build_tokenizer(part: Part, vocab_size: int):
    """A tokenizers.Tokenizer from the tokenizer.ggml.* keys, built as the original tokenizer.json is (byte-level
    BPE, the pre-tokenizer tokenizer.ggml.pre names, control and user-defined tokens as added tokens); None for a
    file that says it has no vocabulary (tokenizer.ggml.model = none)."""
    m = _Meta(part)
    if "tokenizer.ggml.model" not in m.md:
        m.fail("metadata key 'tokenizer.ggml.model' is missing (expected 'gpt2'; a file without a vocabulary says "
               "'none')")  # fmt: skip
    model = m.get("tokenizer.ggml.model", "str")
    if model in NO_VOCABULARY:
        return None
    if model != "gpt2":
        m.fail(f"tokenizer.ggml.model = '{model}' is not supported (expected 'gpt2', a byte-level BPE)",
               UnsupportedError)  # fmt: skip
    pre = m.get("tokenizer.ggml.pre", "str")
    if pre not in PRE_TOKENIZERS:
        m.fail(f"tokenizer.ggml.pre = '{pre}' is not supported (expected one of {', '.join(PRE_TOKENIZERS)})",
               UnsupportedError)  # fmt: skip
    tokens = _string_array(m, "tokenizer.ggml.tokens")
    merges = _string_array(m, "tokenizer.ggml.merges")
    if len(tokens) > vocab_size:
        m.fail(f"tokenizer.ggml.tokens has {len(tokens)} tokens, more than the model's vocabulary ({vocab_size}, the "
               "rows of token_embd.weight)")  # fmt: skip
    types = m.md.get("tokenizer.ggml.token_type")
    if types is not None and (types.type != ARRAY or len(types.value) != len(tokens)
                              or (types.value and types.item_type not in INTS)):  # fmt: skip
        m.fail(f"tokenizer.ggml.token_type is {types.type_name} of {len(types.value or ())} items, expected an "
               f"integer array with one type per token ({len(tokens)})")  # fmt: skip
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if vocab.setdefault(token, i) != i:
            m.fail(f"tokenizer.ggml.tokens holds {token!r:.40} twice (ids {vocab[token]} and {i}), expected each token "
                   "once")  # fmt: skip
    pairs = []
    for i, merge in enumerate(merges):
        pair = merge.split(" ")
        if len(pair) != 2 or not all(pair):
            m.fail(f"tokenizer.ggml.merges[{i}] = {merge!r:.60}, expected two tokens separated by one space")
        pairs.append((pair[0], pair[1]))
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    try:
        tok = Tokenizer(models.BPE(vocab, pairs, continuing_subword_prefix="", end_of_word_suffix="",
                                   fuse_unk=False, byte_fallback=False))  # fmt: skip
        if pre in ("qwen2", "gpt-4o"):
            if pre == "qwen2":
                tok.normalizer = normalizers.NFC()
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(QWEN2_PATTERN if pre == "qwen2" else GPT4O_PATTERN), behavior="isolated",
                                     invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ])  # fmt: skip
            tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
        else:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
            tok.decoder = decoders.ByteLevel()
        if types is not None:
            control = [AddedToken(tokens[i], special=True, normalized=False)
                       for i, t in enumerate(types.value) if t == CONTROL]  # fmt: skip
            user = [AddedToken(tokens[i], special=False, normalized=False)
                    for i, t in enumerate(types.value) if t == USER_DEFINED]  # fmt: skip
            tok.add_special_tokens(control)
            tok.add_tokens(user)
    except BaseException as exc:  # the tokenizers library raises plain Exceptions, and a Rust panic as a BaseException
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise
        m.fail(f"the tokenizer.ggml.* keys do not make a tokenizer: {exc}")
    return tok


def _string_array(m: _Meta, key: str) -> list[str]:
    v = m.md.get(key)
    if v is None:
        m.fail(f"metadata key '{key}' is missing (a gpt2 tokenizer needs it)")
    if v.type != ARRAY or (v.value and v.item_type != STRING):
        m.fail(f"'{key}' is {v.type_name}, expected an array of strings")
    return v.value


# ---- the checkpoint ---------------------------------------------------------------------------------------


def read_config(path: str | Path) -> ModelConfig:
    """The ModelConfig of a GGUF model (its header only; the tokenizer is not built)."""
    return parse_config(read_parts(path))


def read_checkpoint(path: str | Path) -> tuple[Path, ModelConfig, dict[str, TensorInfo], list[Path], Any, dict]:
    """A GGUF model (a file, or the parts of a split given any of them) as the fields of a Checkpoint, in its order
    (Checkpoint.open makes it): `folder` is the file (the first part of a split), `files` every part, the tensors
    under the Hugging Face names."""
    parts = read_parts(path)
    config = parse_config(parts)
    tensors = map_tensors(parts, config)
    tokenizer = build_tokenizer(parts[0], config.vocab_size)
    raw = {k: v.value for k, v in parts[0].metadata.items() if v.type != ARRAY}
    return parts[0].path, config, tensors, [p.path for p in parts], tokenizer, raw


def fingerprint_data(path: str | Path) -> dict:
    """What a profile's fingerprint of a GGUF model hashes: the metadata (split.* left out, so a re-split keeps
    it) and the tensor table (name, format, dimensions; not the files or offsets)."""
    parts = read_parts(path)
    metadata = {k: [v.type, v.item_type, v.value] for k, v in parts[0].metadata.items() if not k.startswith("split.")}
    table = sorted((t.name, t.fmt.name, list(t.ne)) for part in parts for t in part.tensors)
    return {"format": "gguf", "metadata": metadata, "tensors": table}
