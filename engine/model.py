"""The engine API: runtimes and devices (Engine), a loaded checkpoint (Model), a KV cache (Context).

Native handles are released by close() or a with-block, never left to the garbage collector: device memory
and mapped files are too valuable to free at an unknown time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import threading
import time
from dataclasses import dataclass

import numpy as np

from .checkpoints.checkpoint import Checkpoint, ModelConfig
from .core import formats
from .core.errors import (
    ArgumentError,
    CheckpointError,
    EngineError,
    OutOfMemoryError,
    RangeError,
    StateError,
    UnsupportedError,
)
from .core.greedy import greedy_choice
from .core.native import check, ffi, lib, text
from .core.trace import SPAN_KINDS, Span
from .families import family
from .placement.placement import Placement

# eb_dtype's code for raw bytes: a Hugging Face MXFP4 checkpoint's *_blocks and *_scales, which the core packs at load
RAW_U8 = 63
INT_BYTES = {"I64": 8, "I32": 4}  # integer tables (DeepSeek-V4's tid2eid: a folder's I64, a GGUF file's I32)
# How the core holds a model's files in host memory (eb_weights_mode): "copy" reads them into private memory
# advised for transparent huge pages (faster to stream), "map" memory-maps them, "auto" copies where huge pages
# are enabled and the files take at most half of the memory available.
WEIGHTS_MODES = {"auto": 0, "map": 1, "copy": 2}
_WEIGHTS_NAMES = {code: name for name, code in WEIGHTS_MODES.items()}
# The most spans a context's trace holds between two reads: a step records about 16 per layer (DecodeRun asks for
# 16 per layer and pass), so this is hundreds of steps of the largest models; the core allows 2**26, which is
# gigabytes held twice (in the core and in the context's read buffer) for nothing a run needs.
MAX_TRACE_SPANS = 1 << 22


@dataclass(frozen=True)
class RuntimeInfo:
    name: str
    path: str
    kernel_variant: str
    abi_version: int
    n_devices: int
    extensions: tuple[str, ...] = ()  # the family operations its devices run as the primary: "mla/1"


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str  # "cpu:0"
    kind: str
    description: str
    memory_total: int
    memory_free: int
    threads: int
    formats: tuple[str, ...] = ()  # the weight formats its kernels read (engine/core/formats.py names)
    precisions: tuple[str, ...] = ()  # the activation precisions its kernels run (Context.PRECISIONS names)
    kv_caches: tuple[str, ...] = ("f32",)  # the KV cache formats a context may keep there (Context.KV_CACHES names)
    queued: bool = False  # its forward operations return before they have run (a GPU's stream), as the primary

    def reads(self, fmt: str) -> bool:
        return fmt in self.formats


def _name(value, what: str) -> bytes:
    """A device or runtime name as the core takes it: text without NUL (which would cut it short there)."""
    if not isinstance(value, str):
        raise ArgumentError(f"{what} must be a name (text) like 'cpu:0', got {value!r}")
    if "\0" in value:
        raise ArgumentError(f"{what} {value!r} contains a NUL character")
    return check_text(value, what).encode()


def check_text(value, what: str) -> str:
    """Text the tokenizer or the core takes: a str that encodes as UTF-8 (not a lone surrogate, which a non-UTF-8
    byte of a command line becomes, nor bytes); ArgumentError naming `what` and the first bad character."""
    if not isinstance(value, str):
        raise ArgumentError(f"{what} must be text (str), got {type(value).__name__} {value!r:.80}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = f"{value[exc.start]!r} at index {exc.start} is a lone surrogate"
        raise ArgumentError(
            f"{what} {value!r:.80} is not valid Unicode text: {bad} (expected text that is UTF-8)"
        ) from None
    return value


def _count(value, what: str, lo: int, hi: int) -> int:
    """An integer option the core takes in lo..hi (Python's ints reach past any C field: check before cffi)."""
    if not _is_int(value) or not lo <= value <= hi:
        raise ArgumentError(f"{what} = {value!r}: expected an integer in {lo}..{hi}")
    return int(value)


def _locked(method):
    """Run a method holding its handle's lock: the one lock of an engine, shared by its models and their contexts.
    A close() on one thread while another is inside a call waits for that call to return (it then finds the handle
    closed); calls on one engine's objects from several threads run one at a time, the native work with the GIL
    released."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return call


class _Handle:
    """A native handle with an explicit close()."""

    _ptr = ffi.NULL
    _lock: threading.RLock

    def _live(self):
        if self._ptr == ffi.NULL:
            raise StateError(f"this {type(self).__name__} is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr == ffi.NULL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# The CPU kernels an engine may use (eb_cpu_kernels): the q8 precision's AVX-512 VNNI products give the AVX2 ones'
# bits, so "avx2" changes speed only; the portable kernels sum floats in another order.
CPU_KERNELS = {"best": 0, "portable": 1, "avx2": 2}


GPU_APIS = {"cuda": ("CUDA", "NVIDIA", "nvcc"), "hip": ("HIP", "AMD", "hipcc")}


def describe_load_error(runtime: str, reason: str) -> str:
    """A runtime that did not load, in its user's words: a GPU module not built, no driver or no GPU, rather than the
    loader's own text (which stays the detail: Engine.load_errors)."""
    api, vendor, compiler = GPU_APIS.get(runtime, (runtime, "", ""))
    text = reason.removeprefix(f"runtime module '{runtime}': ")
    if "does not exist" in text and compiler:
        return f"{api} module not built ({compiler} was not found when expertbench was installed)"
    if "driver version is insufficient" in text or "no CUDA-capable device" in text or "hipErrorNoDevice" in text:
        return f"no {vendor} GPU or driver on this machine"
    if "cannot open shared object" in text and compiler:
        return f"{api} module built, but this machine has no {api} runtime library"
    return text


def _kernels_choice(kernels: str | None, portable: bool | None) -> int:
    if portable:
        if kernels not in (None, "portable"):
            raise ArgumentError(f"kernels {kernels!r} and portable=True: give one of them")
        return CPU_KERNELS["portable"]
    where = "kernels"
    if kernels is None:
        kernels, where = os.environ.get("EXPERTBENCH_CPU_KERNELS") or "best", "EXPERTBENCH_CPU_KERNELS"
    if kernels not in CPU_KERNELS:
        raise ArgumentError(f"{where} {kernels!r}: expected one of {', '.join(CPU_KERNELS)}")
    return CPU_KERNELS[kernels]


class Engine(_Handle):
    """The runtimes loaded in this process and their devices.

    runtimes: names of modules to load ("cpu"); module_paths: explicit files for some of them (authoritative).
    cpu_devices / cpu_threads split the CPU into devices of worker threads. kernels: the most the CPU kernels may
    use, "best" (AVX2, and AVX-512 VNNI for the q8 precision, where the CPU has them), "avx2" or "portable" (the C
    kernels); None reads EXPERTBENCH_CPU_KERNELS (default best); portable=True is kernels="portable".
    runtime_options: per runtime name, any of n_devices, threads_per_device, memory_limit (bytes).
    The "hostsim" runtime (CPU-backed devices that behave like a discrete accelerator) defaults to one device
    of one thread. A runtime that fails to load is recorded in load_errors (name -> reason) unless strict.
    """

    def __init__(
        self,
        runtimes: tuple[str, ...] = ("cpu",),
        module_paths: dict[str, str] | None = None,
        cpu_devices: int = 0,
        cpu_threads: int = 0,
        portable: bool | None = None,
        strict: bool = True,
        runtime_options: dict[str, dict] | None = None,
        kernels: str | None = None,
    ):
        cpu_devices = _count(cpu_devices, "cpu_devices", 0, 64)  # 0: one per NUMA node
        cpu_threads = _count(cpu_threads, "cpu_threads", 0, 1024)  # 0: the cores shared out
        self._kernels = _kernels_choice(kernels, portable)  # before anything native exists to release
        self._lock = threading.RLock()
        ptr = ffi.new("eb_engine **")
        check(lib.eb_engine_create(ptr))
        self._ptr = ptr[0]
        self._models: list[Model] = []
        self.load_errors: dict[str, str] = {}
        self._runtime_options = {
            "cpu": {"n_devices": cpu_devices, "threads_per_device": cpu_threads},
            "hostsim": {"n_devices": 1, "threads_per_device": 1},
        }
        for name, opts in (runtime_options or {}).items():
            self._runtime_options.setdefault(name, {}).update(opts)
        try:
            for name in runtimes:
                try:
                    self.load_runtime(name, (module_paths or {}).get(name))
                except Exception as exc:
                    if strict:
                        raise
                    self.load_errors[name] = str(exc)
        except BaseException:
            self.close()
            raise

    @_locked
    def load_runtime(self, name: str, path: str | os.PathLike | None = None) -> None:
        cname = _name(name, "runtime name")
        if path is not None and "\0" in os.fspath(path):
            raise ArgumentError(f"runtime {name!r}: module path {path!r} contains a NUL character")
        cpath = ffi.NULL if path is None else ffi.new("char[]", os.fsencode(path))
        given = self._runtime_options.get(name, {})
        unknown = set(given) - {"n_devices", "threads_per_device", "memory_limit"}
        if unknown:
            raise ArgumentError(f"runtime {name!r}: unknown option {sorted(unknown)[0]!r} (expected n_devices, "
                                "threads_per_device, memory_limit)")  # fmt: skip
        limits = {"n_devices": (0, 64), "threads_per_device": (0, 1024), "memory_limit": (0, 2**64 - 1)}
        given = {k: _count(v, f"runtime {name!r}: {k}", *limits[k]) for k, v in given.items()}
        opts = ffi.new("eb_runtime_options *", {**given, "kernels": self._kernels})
        check(lib.eb_engine_load_runtime(self._live(), cname, cpath, opts))

    @property
    @_locked
    def runtimes(self) -> list[RuntimeInfo]:
        out = []
        info = ffi.new("eb_runtime_info *")
        for i in range(lib.eb_engine_runtime_count(self._live())):
            check(lib.eb_engine_runtime_info(self._ptr, i, info))
            out.append(
                RuntimeInfo(
                    text(info.name),
                    text(info.path),
                    text(info.kernel_variant),
                    info.abi_version,
                    info.n_devices,
                    tuple(e for e in text(info.extensions).split(",") if e),
                )
            )
        return out

    @property
    @_locked
    def devices(self) -> list[DeviceInfo]:
        out = []
        info = ffi.new("eb_device_info *")
        for i in range(lib.eb_engine_device_count(self._live())):
            check(lib.eb_engine_device_info(self._ptr, i, info))
            reads = tuple(f.name for f in formats.FORMATS.values() if info.formats >> f.code & 1)
            runs = tuple(p for p, code in Context.PRECISIONS.items() if info.precisions >> code & 1)
            caches = tuple(k for k, code in Context.KV_CACHES.items() if info.kv_caches >> code & 1)
            out.append(
                DeviceInfo(i, text(info.name), text(info.kind), text(info.description), info.memory_total,
                           info.memory_free, info.threads, reads, runs, caches, bool(info.queued_ops))
            )  # fmt: skip
        return out

    @_locked
    def device_index(self, name: str) -> int:
        idx = ffi.new("int32_t *")
        cname = _name(name, "device")
        try:
            check(lib.eb_engine_find_device(self._live(), cname, idx))
        except RangeError as exc:
            runtime = name.partition(":")[0]
            if runtime in self.load_errors:
                raise RangeError(f"{exc}: runtime '{runtime}' did not load: {self.load_errors[runtime]}") from None
            if runtime not in [r.name for r in self.runtimes]:
                hint = f"--runtime {runtime} on the command line, Engine(runtimes=(..., '{runtime}')) from Python"
                raise RangeError(f"{exc}: runtime '{runtime}' is not loaded (load it too: {hint})") from None
            raise
        return idx[0]

    def load(self, model: str | os.PathLike | Checkpoint, device: str = "cpu:0", weights: str = "auto",
             top_k: int | None = None, check_weights: bool = True, head_of: Model | None = None) -> Model:  # fmt: skip
        return Model(self, model, device, weights, top_k, check_weights, head_of)

    @_locked
    def close(self) -> None:
        for m in list(self._models):
            m.close()
        if self._ptr != ffi.NULL:
            lib.eb_engine_destroy(self._ptr)
            self._ptr = ffi.NULL


# Safetensors dtypes whose weights are stored with a scale companion '<name>_scale_inv' (DeepSeek-V3/V4's released
# FP8 checkpoints, transformers' finegrained FP8): read as the core's format for the config's weight_block (its
# quantization_config's weight_block_size; 128 x 128 where it has none).
SCALED_ELEMENTS = ("F8_E4M3",)


def _scaled_formats(checkpoint: Checkpoint, tensors) -> dict[str, int]:
    """The core's format code of every weight stored as a scaled element (SCALED_ELEMENTS), each checked against its
    scale companion '<name>_scale_inv': present, F32, of the grid the block makes of the weight. Errors name the
    tensor, its file and what was expected."""
    scaled = [t for t in tensors if t.dtype in SCALED_ELEMENTS]
    if not scaled:
        return {}
    quant = checkpoint.raw_config.get("quantization_config")
    if quant is not None and not checkpoint.config.weight_block:
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        raise UnsupportedError(f"'{checkpoint.folder}': quantization_config quant_method {method!r:.80} is not "
                               f"supported beside {scaled[0].dtype} weights (expected 'fp8')")  # fmt: skip
    block = checkpoint.config.weight_block or (128, 128)  # (the config's quantization_config, checked where read)
    codes = {}
    for t in scaled:
        fmt = formats.scaled(t.dtype, (block[0], block[1]))
        if fmt is None:
            have = [f"{f.name} ({f.scale_block[0]} x {f.scale_block[1]})" for f in formats.FORMATS.values()
                    if f.needs_scale]  # fmt: skip
            raise UnsupportedError(f"tensor '{t.name}' in '{t.file}': {t.dtype} in scale blocks of {block[0]} x "
                                   f"{block[1]} (quantization_config weight_block_size) is not supported (expected "
                                   f"one of {', '.join(have)})")  # fmt: skip
        name = f"{t.name}_scale_inv"
        companion = checkpoint.tensors.get(name)
        want = fmt.scale_shape(t.shape) if len(t.shape) == 2 else None
        if want is None:
            raise CheckpointError(f"tensor '{t.name}' in '{t.file}' is {t.dtype} of shape {list(t.shape)}, expected a "
                                  "matrix [rows, cols] (a scaled format is for matrices)")  # fmt: skip
        expected = (
            f"F32 or F8_E8M0 of shape {list(want)}: one scale per block of {block[0]} x {block[1]} of {list(t.shape)}"
        )
        if companion is None:
            raise CheckpointError(f"tensor '{t.name}' in '{t.file}' is {t.dtype}, which needs its scale companion "
                                  f"'{name}' ({expected}); the checkpoint has none")  # fmt: skip
        if companion.dtype not in ("F32", "F8_E8M0") or tuple(companion.shape) != want:
            got = f"{companion.dtype} of shape {list(companion.shape)}"
            raise CheckpointError(f"tensor '{name}' in '{companion.file}' (the scale companion of '{t.name}') is "
                                  f"{got}, expected {expected}")  # fmt: skip
        codes[t.name] = fmt.code
    return codes


def _as_stored(checkpoint: Checkpoint, exc: EngineError) -> EngineError:
    """exc with each tensor the family reads under another name (TensorInfo.stored_as) called by its name in the file
    too: a user of a released DeepSeek-V4 folder looks for 'layers.1.attn.wq_b.scale', not the name it is bound by."""
    text = str(exc)
    names = {t.name: t.stored_as for t in checkpoint.tensors.values() if t.stored_as}
    # a missing companion: named as the file would hold it beside the weight (a released DeepSeek-V4 folder's
    # '.scale'; a module of the checkpoint's own under the name its weight has there, its companion's suffix kept)
    module = checkpoint.config.next_token_module
    companions = {f"{t.name}_scale_inv": (t.stored_as + "_scale_inv" if module else
                                          t.stored_as.removesuffix(".weight") + ".scale")
                  for t in checkpoint.tensors.values() if t.stored_as.endswith(".weight")}  # fmt: skip
    names = companions | names  # (a tensor of the file keeps its own name)
    renamed = [(bound, stored) for bound, stored in names.items() if f"'{bound}'" in text]
    for bound, stored in renamed:
        text = text.replace(f"'{bound}'", f"'{stored}' (read as '{bound}')")
    # a tensor the module's layer lacks: named under the file's layer (model.layers.0. is the module's one layer)
    missing = []
    if module and checkpoint.module_layer is not None:
        for name in set(re.findall(r"'(model\.layers\.0\.[^']*)'", text)) - set(names):
            stored = f"model.layers.{checkpoint.module_layer}." + name.removeprefix("model.layers.0.")
            missing.append(name)
            text = text.replace(f"'{name}'", f"'{stored}' (read as '{name}')")
    return type(exc)(text) if renamed or missing else exc


class Model(_Handle):
    """A checkpoint bound to an engine: weights mapped or copied into host memory (weights: see WEIGHTS_MODES),
    the primary device chosen. top_k: experts per token to decode with instead of the checkpoint's own
    (num_experts_per_tok), a speed choice with a quality cost (engine.runs.quality), and the most a context of it can
    decode with: fewer is a context's setting (Context.top_k), more is another load of the checkpoint (native_top_k
    keeps the checkpoint's own). check_weights: every value of every weight is checked at load to be a number (no
    NaN or inf, as a damaged file or block scale makes) and the load refused naming the file, the tensor and the
    index; False loads them unchecked (a bad value then fails the first greedy choice from its NaN logits)."""

    def __init__(self, engine: Engine, source: str | os.PathLike | Checkpoint, device: str = "cpu:0",
                 weights: str = "auto", top_k: int | None = None, check_weights: bool = True,
                 head_of: Model | None = None):  # fmt: skip
        if not isinstance(weights, str) or weights not in WEIGHTS_MODES:
            raise ArgumentError(f"weights {weights!r}: expected one of {', '.join(WEIGHTS_MODES)}")
        if not isinstance(check_weights, bool):
            raise ArgumentError(f"check_weights {check_weights!r:.80}: expected True or False")
        if head_of is not None and (not isinstance(head_of, Model) or head_of.engine is not engine):
            raise ArgumentError(f"head_of {head_of!r:.80}: expected a model of the same engine (its embeddings and "
                                "head read where both models have the same primary)")  # fmt: skip
        if not isinstance(source, (str, os.PathLike, Checkpoint)):
            raise ArgumentError(f"model must be the path of a model folder or GGUF file (str or os.PathLike) or a "
                                f"Checkpoint, got {type(source).__name__} {source!r:.80}")  # fmt: skip
        self.checkpoint = source if isinstance(source, Checkpoint) else Checkpoint.open(source)
        self.native_top_k = self.checkpoint.config.top_k
        if top_k is not None:
            self.checkpoint = _with_top_k(self.checkpoint, top_k)
        self.engine = engine
        self._lock = engine._lock
        cfg = self.checkpoint.config
        self._keep = []  # cffi buffers that must outlive the call
        files = [ffi.new("char[]", os.fsencode(f)) for f in self.checkpoint.files]
        file_index = {f: i for i, f in enumerate(self.checkpoint.files)}
        usable = [t for t in self.checkpoint.tensors.values() if t.name.startswith(("model.", "lm_head.", "head."))]

        tables = family(cfg.architecture).int_tables

        def raw(t) -> bool:
            """Bytes the core packs or reads as they are: MXFP4 blocks and scales in transformers' layout, E8M0 scales,
            FP4 codes packed two a byte (I8 beside their '.scale'), the family's integer tables (their bytes a last
            dimension)."""
            packed = t.dtype == "U8" and t.name.endswith(("_blocks", "_scales"))
            fp4 = t.dtype == "I8" and t.name.endswith(".weight") and t.name[:-7] + ".scale" in self.checkpoint.tensors
            return packed or fp4 or t.dtype == "F8_E8M0" or (t.dtype in INT_BYTES and t.name.endswith(tables))

        try:
            codes = _scaled_formats(self.checkpoint, usable)
        except EngineError as exc:
            raise _as_stored(self.checkpoint, exc) from None
        for t in usable:
            if t.dtype not in formats.FORMATS and not raw(t) and t.name not in codes:
                stem = t.name.removesuffix(".weight")
                fp4 = f" (or I8 FP4 codes beside their E8M0 scales '{stem}.scale')" if t.dtype == "I8" else ""
                raise _as_stored(self.checkpoint, UnsupportedError(
                    f"tensor '{t.name}' in '{t.file}' has dtype {t.dtype}, expected one of "
                    f"{', '.join(formats.FORMATS)}{fp4}"))  # fmt: skip
            if not 1 <= len(t.shape) <= 4:
                raise UnsupportedError(
                    f"tensor '{t.name}' in '{t.file}' has {len(t.shape)} dimensions, expected 1 to 4"
                )
        descs = ffi.new("eb_tensor_desc[]", max(1, len(usable)))
        names = []
        for d, t in zip(descs, usable, strict=False):
            names.append(ffi.new("char[]", t.name.encode()))
            d.name = names[-1]
            d.file_index = file_index[t.file]
            d.dtype = RAW_U8 if raw(t) else codes[t.name] if t.name in codes else formats.FORMATS[t.dtype].code
            shape = (*t.shape, INT_BYTES[t.dtype]) if raw(t) and t.dtype in INT_BYTES else t.shape
            d.ndim = len(shape)
            for i, s in enumerate(shape):
                d.shape[i] = s
            d.offset = t.offset
            d.nbytes = t.nbytes
        mlp_only = ffi.new("int32_t[]", list(cfg.mlp_only_layers) or [0])
        c = ffi.new("eb_model_config *")
        c.arch = family(cfg.architecture).native_code
        for field in ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_layers",
                      "num_heads", "num_kv_heads", "head_dim", "num_experts", "top_k", "decoder_sparse_step",
                      "max_position_embeddings"):  # fmt: skip
            setattr(c, field, getattr(cfg, field))
        c.norm_topk_prob = int(cfg.norm_topk_prob)
        c.tie_word_embeddings = int(cfg.tie_word_embeddings)
        c.attention_bias = int(cfg.attention_bias)
        c.rope_theta = cfg.rope_theta
        c.rms_norm_eps = cfg.rms_norm_eps
        c.mlp_only_layers = mlp_only
        c.n_mlp_only_layers = len(cfg.mlp_only_layers)
        for field in ("rope_dim", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                      "n_shared_experts", "first_k_dense_replace", "n_group", "topk_group", "routed_scaling_factor",
                      "rope_attention_factor", "attention_scale"):  # fmt: skip
            setattr(c, field, getattr(cfg, field))
        c.rope_interleave = int(cfg.rope_interleave)
        c.next_token_module = int(cfg.next_token_module)
        windows = ffi.new("int32_t[]", list(cfg.layer_windows) or [0])
        c.layer_window = windows if cfg.layer_windows else ffi.NULL
        c.n_layer_window = len(cfg.layer_windows)
        c.swiglu_limit = cfg.swiglu_limit
        c.swiglu_alpha = cfg.swiglu_alpha
        inv_freq = ffi.new("float[]", list(cfg.rope_inv_freq) or [0.0])
        c.rope_inv_freq = inv_freq if cfg.rope_inv_freq else ffi.NULL
        arrays = []  # a family's own fields (kept alive through the load)
        for field, value in cfg.native_fields:
            if isinstance(value, tuple):
                arrays.append(ffi.new("float[]" if any(isinstance(v, float) for v in value) else "int32_t[]",
                                      list(value) or [0]))  # fmt: skip
                value = arrays[-1]
            setattr(c, field, value)
        out = ffi.new("eb_model **")
        file_array = ffi.new("char *[]", files)
        checking = lib.EB_CHECK_WEIGHTS_ON if check_weights else lib.EB_CHECK_WEIGHTS_OFF
        lender = ffi.NULL if head_of is None else head_of._live()
        options = ffi.new(
            "eb_load_options *", {"weights": WEIGHTS_MODES[weights], "check_weights": checking, "head_of": lender}
        )
        with self._lock:  # a close of the engine meanwhile waits for the load, then closes this model too
            dev = engine.device_index(device)
            try:
                check(lib.eb_model_load(engine._live(), c, file_array, len(files), descs, len(usable), dev, options,
                                        out))  # fmt: skip
            except EngineError as exc:  # the core names tensors; the user needs to know which checkpoint too
                folder = str(self.checkpoint.folder)
                named = _as_stored(self.checkpoint, exc)
                if folder not in str(named):
                    raise type(exc)(f"'{folder}': {named}") from None
                if named is not exc:
                    raise named from None
                raise
            self._ptr = out[0]
            self.device = device
            self._contexts: list[Context] = []
            self._routing_paused = 0  # nesting depth of routing_paused()
            engine._models.append(self)

    @property
    def config(self) -> ModelConfig:
        return self.checkpoint.config

    @property
    def tokenizer(self):
        return self.checkpoint.tokenizer

    @property
    @_locked
    def info(self) -> dict:
        info = ffi.new("eb_model_info *")
        check(lib.eb_model_get_info(self._live(), info))
        out = {k: getattr(info, k) for k in ("n_layers", "n_moe_layers", "weight_bytes", "expert_bytes",
                                             "bytes_per_token", "file_bytes", "huge_page_bytes", "kv_bytes_per_token",
                                             "kv_window_bytes", "shared_expert_bytes")}  # fmt: skip
        out["weights"] = _WEIGHTS_NAMES[info.weights]
        return out

    # ---- placement -----------------------------------------------------------------------------------

    def _owner_count(self) -> int:
        return self.config.num_layers * max(self.config.num_experts, 0)

    @property
    @_locked
    def placement(self) -> Placement:
        n = self._owner_count()
        if n == 0:
            raise UnsupportedError(f"model '{self.checkpoint.folder}' has no experts to place")
        owners = np.empty(n, dtype=np.int32)
        check(lib.eb_model_get_placement(self._live(), ffi.from_buffer("int32_t[]", owners, require_writable=True), n))
        names = [d.name for d in self.engine.devices]
        E = self.config.num_experts
        return Placement(
            [[names[o] if o >= 0 else None for o in owners[layer * E : (layer + 1) * E]]
             for layer in range(self.config.num_layers)]
        )  # fmt: skip

    def _owners(self, placement: Placement | str) -> np.ndarray:
        if not isinstance(placement, (Placement, str)):
            raise ArgumentError(f"placement must be a Placement or its text form, got {placement!r:.80}")
        if isinstance(placement, str):
            placement = Placement.parse(placement, self.config, default=self.device)
        if len(placement.owners) != self.config.num_layers or any(
            len(row) != self.config.num_experts for row in placement.owners
        ):
            raise ArgumentError(
                f"placement has {len(placement.owners)} layers, expected {self.config.num_layers} layers of "
                f"{self.config.num_experts} experts"
            )
        return placement.to_owner_array(self.engine.device_index)

    @_locked
    def set_placement(self, placement: Placement | str) -> None:
        """Move experts; checked first, and on any failure the previous placement stays intact."""
        owners = self._owners(placement)
        check(lib.eb_model_set_placement(self._live(), ffi.from_buffer("int32_t[]", owners), len(owners)))

    @_locked
    def placement_bytes(self, placement: Placement | str) -> dict[str, int]:
        """Expert weight bytes each device would own under a placement (nothing is moved)."""
        owners = self._owners(placement)
        devices = self.engine.devices
        out = np.zeros(len(devices), dtype=np.uint64)
        cowners = ffi.from_buffer("int32_t[]", owners)
        cout = ffi.from_buffer("uint64_t[]", out, require_writable=True)
        check(lib.eb_model_placement_bytes(self._live(), cowners, len(owners), cout, len(out)))
        return {d.name: int(b) for d, b in zip(devices, out, strict=True)}

    @_locked
    def counters(self) -> dict:
        """Scheduler counters since load or reset_counters(); busy_seconds is the device's running total."""
        mc = ffi.new("eb_model_counters *")
        check(lib.eb_model_get_counters(self._live(), mc))
        out = {k: int(getattr(mc, k)) for k in ("joins", "layer_steps", "arena_allocations", "uploads",
               "host_round_trips", "graph_captures", "graph_launches")}  # fmt: skip
        devices = {}
        for name, dc in self._device_counters():
            devices[name] = {k: int(getattr(dc, k)) for k in ("experts_run", "rows", "bytes_to_device",
                             "bytes_from_device", "waits", "weight_bytes", "allocated_bytes")}  # fmt: skip
            devices[name]["busy_seconds"] = dc.busy_ns / 1e9
        out["devices"] = devices
        return out

    def _device_counters(self):
        """(device name, its eb_device_counters for this model), device by device (the caller holds the lock)."""
        dc = ffi.new("eb_device_counters *")
        for d in self.engine.devices:
            check(lib.eb_model_device_counters(self._ptr, d.index, dc))
            yield d.name, dc

    @_locked
    def busy_seconds(self) -> dict[str, float]:
        """Each device's running total of time spent running kernels (counters()' busy_seconds alone: cheap enough
        to read after every decode step)."""
        return {name: dc.busy_ns / 1e9 for name, dc in self._device_counters()}

    @_locked
    def reset_counters(self) -> None:
        lib.eb_model_reset_counters(self._live())

    @_locked
    def routing_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(hits [layers, experts], tokens [layers]): how often the router picked each expert since load or
        reset_routing(), and how many tokens each layer routed."""
        L, E = self.config.num_layers, max(self.config.num_experts, 0)
        hits = np.zeros(L * E, dtype=np.uint64)
        tokens = np.zeros(L, dtype=np.uint64)
        chits = ffi.from_buffer("uint64_t[]", hits, require_writable=True) if E else ffi.NULL
        check(lib.eb_model_routing_counts(self._live(), chits, L * E,
                                          ffi.from_buffer("uint64_t[]", tokens, require_writable=True), L))  # fmt: skip
        return hits.reshape(L, E), tokens

    @contextlib.contextmanager
    def routing_paused(self):
        """Decodes inside do not count into the routing statistics (measurements, calibrations: their routing is
        not the workload's). Nests; the counting resumes on leaving the outermost."""
        with self._lock:
            self._routing_paused += 1
            check(lib.eb_model_set_routing_counting(self._live(), 0))
        try:
            yield self
        finally:
            with self._lock:
                self._routing_paused -= 1
                if self._routing_paused == 0 and not self.closed:
                    check(lib.eb_model_set_routing_counting(self._ptr, 1))

    @_locked
    def reset_routing(self) -> None:
        lib.eb_model_reset_routing(self._live())

    def context(self, n_ctx: int | None = None, n_batch: int = 512, kv: str = "f32") -> Context:
        """A KV cache of n_ctx positions (default: max_position_embeddings), kept in kv (Context.KV_CACHES)."""
        return Context(self, self.config.max_position_embeddings if n_ctx is None else n_ctx, n_batch, kv)

    def encode(self, text_: str) -> list[int]:
        if self.tokenizer is None:
            raise StateError(
                f"model '{self.checkpoint.folder}' has no tokenizer (a folder without tokenizer.json, or a GGUF file "
                "without a vocabulary): pass token ids instead"
            )
        return self.tokenizer.encode(check_text(text_, "text to encode"), add_special_tokens=False).ids

    def decode_text(self, ids) -> str:
        if hasattr(ids, "__len__") and len(ids) == 0:
            return ""
        ids = _ids_array(ids)
        bad = ids[(ids < 0) | (ids >= self.config.vocab_size)]
        if bad.size:
            raise RangeError(f"token id {int(bad[0])} out of range: expected 0..{self.config.vocab_size - 1}")
        ids = ids.tolist()
        if self.tokenizer is None:
            return " ".join(str(i) for i in ids)
        return self.tokenizer.decode(list(ids))

    @_locked
    def close(self) -> None:
        for ctx in list(self._contexts):
            ctx.close()
        if self._ptr != ffi.NULL:
            lib.eb_model_free(self._ptr)
            self._ptr = ffi.NULL
            self.engine._models.remove(self)


def _with_top_k(checkpoint: Checkpoint, top_k) -> Checkpoint:
    """The checkpoint with another number of experts per token (1..num_experts; an MoE model only)."""
    cfg = checkpoint.config
    if cfg.num_experts <= 0:
        raise ArgumentError(f"model '{checkpoint.folder}' has no experts: experts per token needs an MoE model")
    if not _is_int(top_k) or not 1 <= top_k <= cfg.num_experts:
        raise ArgumentError(f"experts per token (top_k) {top_k!r}: expected an integer 1..{cfg.num_experts} (the "
                            f"model's experts; its own count is {cfg.top_k})")  # fmt: skip
    group = cfg.num_experts // cfg.n_group if cfg.n_group > 1 else 0
    if group and top_k > cfg.topk_group * group:
        raise ArgumentError(f"experts per token (top_k) {top_k}: at most {cfg.topk_group * group} (the "
                            f"{cfg.topk_group} kept groups of {group} experts)")  # fmt: skip
    return dataclasses.replace(checkpoint, config=dataclasses.replace(cfg, top_k=int(top_k)))


def check_context_top_k(cfg: ModelConfig, top_k) -> int:
    """Experts per token a context of a model loaded with this config can decode with (Context.top_k): 1..its count,
    and with grouped routing at most the kept groups' experts. ArgumentError / RangeError saying why not."""
    if cfg.num_experts <= 0:
        raise ArgumentError(f"experts per token (top_k) {top_k!r}: the model has no experts")
    if not _is_int(top_k):
        raise ArgumentError(f"experts per token (top_k) {top_k!r}: expected an integer 1..{cfg.top_k}")
    group = cfg.num_experts // cfg.n_group if cfg.n_group > 1 else 0
    if top_k < 1:
        raise RangeError(f"experts per token (top_k) {top_k}: expected 1..{cfg.top_k} (at least one expert)")
    if top_k > cfg.top_k:
        raise RangeError(f"experts per token (top_k) {top_k}: expected 1..{cfg.top_k} (the count the model was loaded "
                         f"with; more needs a load with more: Engine.load(..., top_k=N))")  # fmt: skip
    if group and top_k > cfg.topk_group * group:
        raise RangeError(f"experts per token (top_k) {top_k}: at most {cfg.topk_group * group} (the "
                         f"{cfg.topk_group} kept groups of {group} experts)")  # fmt: skip
    return int(top_k)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _ids_array(ids) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise ArgumentError(f"token ids must be a 1-D sequence, got shape {arr.shape}")
    if arr.size == 0:
        raise ArgumentError("token ids are empty: expected at least one token")
    if arr.dtype.kind not in "iu":
        raise ArgumentError(f"token ids must be integers, got dtype {arr.dtype}")
    if arr.min() < -(2**31) or arr.max() >= 2**31:
        raise RangeError(f"token id {int(arr.max() if arr.max() >= 2**31 else arr.min())} does not fit in int32")
    return np.ascontiguousarray(arr, dtype=np.int32)


@dataclass
class GenerateResult:
    ids: list[int]
    prefill_tokens: int
    prefill_seconds: float
    decode_tokens: int
    decode_seconds: float

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else float("nan")

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else float("nan")


class Context(_Handle):
    """A KV cache over one sequence: prefill, decode (one logits row per input position), truncate."""

    # The KV cache's formats: f32 (the reference) or half the bytes, each key and value rounded to the nearest when
    # stored (f16: 10 mantissa bits, a range to 65504; bf16: 7 bits, f32's range): a fast mode, not the reference's
    # output, whose quality cost runs report (engine.runs.quality). The formats' codes in the core.
    KV_CACHES = {"f32": formats.FORMATS["F32"].code, "f16": formats.FORMATS["F16"].code,
                 "bf16": formats.FORMATS["BF16"].code}  # fmt: skip

    def __init__(self, model: Model, n_ctx: int, n_batch: int = 512, kv: str = "f32"):
        out = ffi.new("eb_context **")
        limit = model.config.max_position_embeddings
        if not _is_int(n_ctx) or not 1 <= n_ctx <= limit:
            raise RangeError(f"context length {n_ctx!r} out of range: expected 1..{limit} (max_position_embeddings)")
        if not _is_int(n_batch) or not 1 <= n_batch <= 65536:
            raise RangeError(f"batch size {n_batch!r} out of range: expected 1..65536")
        if not isinstance(kv, str) or kv not in self.KV_CACHES:
            raise ArgumentError(f"KV cache {kv!r}: expected one of {', '.join(self.KV_CACHES)}")
        self.kv = kv  # the KV cache's format, fixed for the context's life
        self._mode = "reference"
        self._precision = "f32"
        self._graphs = True
        self._trace = 0
        self._trace_buf = None
        self.trace_lost = 0
        self.model = model
        self.vocab_size = model.config.vocab_size
        self.n_batch = int(n_batch)  # the most positions a step evaluates at once
        # the trace's device indexes, named once (a runtime loaded later makes the core refuse this context)
        self._device_names = [d.name for d in model.engine.devices]
        self._lock = model._lock
        with self._lock:
            check(lib.eb_context_create_kv(model._live(), n_ctx, n_batch, self.KV_CACHES[kv], out))
            self._ptr = out[0]
            model._contexts.append(self)

    @property
    @_locked
    def position(self) -> int:
        return lib.eb_context_position(self._live())

    @property
    @_locked
    def capacity(self) -> int:
        return lib.eb_context_capacity(self._live())

    MODES = {"reference": 0, "owner_local": 1}

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    @_locked
    def mode(self, mode: str) -> None:
        """How expert outputs are reduced: "reference" (placement-invariant) or "owner_local" (faster)."""
        if not isinstance(mode, str) or mode not in self.MODES:
            raise ArgumentError(f"reduction mode {mode!r}: expected 'reference' or 'owner_local'")
        check(lib.eb_context_set_mode(self._live(), self.MODES[mode]))
        self._mode = mode

    PRECISIONS = {"f32": 0, "q8": 1}

    @property
    def precision(self) -> str:
        return self._precision

    @precision.setter
    @_locked
    def precision(self, precision: str) -> None:
        """How activations meet quantized weights: "f32" (exactly dequantized weights, f32 sums: the reference, the
        same on every placement) or "q8" (activations quantized to int8 per block of 32 or 256 values, integer
        products, as llama.cpp runs them: faster, deterministic, the same bits on every placement of a primary over CPU
        and GPU devices, not the reference's output). Float weights are read in f32 either way. A device whose
        kernels do not run the precision (DeviceInfo.precisions) is refused by name, here and at every step."""
        if not isinstance(precision, str) or precision not in self.PRECISIONS:
            raise ArgumentError(f"precision {precision!r}: expected one of {', '.join(self.PRECISIONS)}")
        check(lib.eb_context_set_precision(self._live(), self.PRECISIONS[precision]))
        self._precision = precision

    @property
    def graphs(self) -> bool:
        return self._graphs

    @graphs.setter
    @_locked
    def graphs(self, enabled: bool) -> None:
        """A GPU primary records a one-token step into graphs, one per part between host round trips (a single
        one while every expert is on it), and replays them (True, the default); False queues each step's work
        anew. The results are the same."""
        if not isinstance(enabled, bool):
            raise ArgumentError(f"graphs must be True or False, got {enabled!r}")
        check(lib.eb_context_set_graphs(self._live(), int(enabled)))
        self._graphs = enabled

    @property
    @_locked
    def top_k(self) -> int:
        return lib.eb_context_top_k(self._live())

    @top_k.setter
    @_locked
    def top_k(self, top_k: int) -> None:
        """Experts per token of this context's steps: 1..the count its model was loaded with (model.config.top_k, the
        default; with grouped routing at most the kept groups' experts). Fewer is a speed choice with a quality cost
        (engine.runs.quality); more needs a model loaded with more (Engine.load(..., top_k=N)). The routing statistics
        count the experts chosen."""
        check(lib.eb_context_set_top_k(self._live(), check_context_top_k(self.model.config, top_k)))

    @property
    def trace(self) -> int:
        return self._trace

    @trace.setter
    @_locked
    def trace(self, capacity: int) -> None:
        """The per-token trace: room for `capacity` spans between two trace_spans() reads (0, the default: off).
        Spans that do not fit are counted in trace_lost, not kept."""
        if not _is_int(capacity) or not 0 <= capacity <= MAX_TRACE_SPANS:
            size = MAX_TRACE_SPANS * ffi.sizeof("eb_trace_span") >> 20
            raise RangeError(f"trace capacity {capacity!r}: expected 0 (off) .. {MAX_TRACE_SPANS} spans (at most "
                             f"{size} MiB in the core and as much here)")  # fmt: skip
        self._live()
        # The read buffer first: if it cannot be had, the core has not been touched and keeps tracing as before
        # (its own allocation failing leaves it as it was too).
        try:
            buf = ffi.new("eb_trace_span[]", int(capacity)) if capacity else None  # kept: reads allocate none
        except MemoryError:
            raise OutOfMemoryError(f"out of memory for a trace of {capacity} spans: tracing left at "
                                   f"{self._trace or 'off'}") from None  # fmt: skip
        check(lib.eb_context_set_trace(self._ptr, int(capacity)))
        self._trace, self._trace_buf = int(capacity), buf
        self.trace_lost = 0

    @_locked
    def trace_spans(self, model: str = "target") -> list[Span]:
        """The spans recorded since the last read, oldest first (they are moved out of the core), tagged with
        model; trace_lost accumulates those that did not fit."""
        if not self._trace:
            return []
        room, buf = self._trace, self._trace_buf
        n, lost = ffi.new("int64_t *"), ffi.new("int64_t *")
        check(lib.eb_context_read_trace(self._live(), buf, room, n, lost))
        self.trace_lost += lost[0]
        names = self._device_names
        return [
            Span(SPAN_KINDS[s.kind], names[s.device], s.layer, s.token, s.rows, s.start_ns, s.end_ns, model)
            for s in (buf[i] for i in range(n[0]))
        ]

    @_locked
    def _eval(self, ids, all_rows: bool, hidden_in=None, hidden_out: bool = False):
        arr = _ids_array(ids)
        rows = len(arr) if all_rows else 1
        logits = np.empty((rows, self.vocab_size), dtype=np.float32)
        H = self.model.config.hidden_size
        if self.model.config.next_token_module and hidden_in is None:
            raise ArgumentError(f"'{self.model.checkpoint.folder}' is a multi-token-prediction module: each position "
                                "reads the target's hidden state beside its token (hidden_in)")  # fmt: skip
        if hidden_in is not None:
            if not self.model.config.next_token_module:
                raise ArgumentError(
                    "hidden_in is for a multi-token-prediction module; this model reads token ids alone"
                )
            hidden_in = np.ascontiguousarray(hidden_in, dtype=np.float32)
            if hidden_in.shape != (len(arr), H):
                raise ArgumentError(f"hidden_in has shape {hidden_in.shape}, expected ({len(arr)}, {H}): one hidden "
                                    "state of hidden_size per token")  # fmt: skip
        hidden = np.empty((len(arr), H), dtype=np.float32) if hidden_out else None
        check(
            lib.eb_context_eval_hidden(
                self._live(),
                ffi.from_buffer("int32_t[]", arr),
                len(arr),
                ffi.from_buffer("float[]", logits, require_writable=True),
                int(all_rows),
                ffi.NULL if hidden_in is None else ffi.from_buffer("float[]", hidden_in),
                ffi.NULL if hidden is None else ffi.from_buffer("float[]", hidden, require_writable=True),
            )
        )
        return logits, hidden

    def eval_hidden(self, ids, all_rows: bool = True, hidden_in=None, hidden_out: bool = True):
        """Append positions and return (logits, hidden): logits as prefill gives them ([len(ids), vocab], or [vocab]
        for the last position alone), hidden [len(ids), hidden_size] each position's last hidden state after the
        final norm (what the head reads; None with hidden_out False). hidden_in: for a multi-token-prediction module
        (Checkpoint.next_token_module), the target's hidden state at the position before each token's,
        [len(ids), hidden_size]."""
        logits, hidden = self._eval(ids, all_rows, hidden_in, hidden_out)
        return (logits if all_rows else logits[0]), hidden

    def prefill(self, ids, all_rows: bool = True) -> np.ndarray:
        """Append a prompt. Returns logits [len(ids), vocab] (or [vocab] for the last position only)."""
        logits, _ = self._eval(ids, all_rows)
        return logits if all_rows else logits[0]

    def decode(self, ids) -> np.ndarray:
        """Append positions (one, or q+1 to verify a draft); returns one logits row per position."""
        return self._eval(ids, True)[0]

    @_locked
    def truncate(self, pos: int) -> None:
        """Forget every position from pos on."""
        if not _is_int(pos):
            raise ArgumentError(f"truncate position must be an integer, got {pos!r}")
        if not 0 <= pos <= self.position:
            raise RangeError(f"truncate to position {pos}: expected 0..{self.position} (the current position)")
        check(lib.eb_context_truncate(self._live(), int(pos)))

    def greedy(self, first: int, n: int, stop_ids=()) -> list[int]:
        """Greedy decoding from the token first (already chosen): appends it, chooses the argmax of its logits, and so
        on until n tokens are chosen (first included) or one of stop_ids is; every chosen token but the last is
        appended. The loop runs in the core, with no return to Python between tokens."""
        if not _is_int(n) or n < 1:
            raise ArgumentError(f"number of tokens to choose must be a positive integer, got {n!r}")
        if not _is_int(first):
            raise ArgumentError(f"first token must be an integer, got {first!r}")
        if not 0 <= first < self.vocab_size:  # (past int32, cffi would raise OverflowError)
            raise RangeError(f"greedy: first token id {first} out of range: the vocabulary has {self.vocab_size} "
                             f"tokens (ids 0..{self.vocab_size - 1})")  # fmt: skip
        room = self.capacity - self.position + 1  # every chosen token but the last is appended
        if n > room:
            raise RangeError(
                f"{n} tokens to choose need {n - 1} more positions, but the KV cache has {room - 1} left "
                f"(capacity {self.capacity}, at position {self.position})"
            )
        return self._greedy(int(first), n, self._stop_array(stop_ids))

    def _stop_array(self, stop_ids) -> np.ndarray:
        bad = ArgumentError(f"stop ids must be integers, got {stop_ids!r:.80} (stop_ids: expected a list of token ids)")
        if isinstance(stop_ids, (str, bytes)):  # bytes would list as small integers
            raise bad
        try:
            stop_list = list(stop_ids)
        except TypeError:
            raise bad from None
        if not all(_is_int(s) for s in stop_list):
            raise bad
        # ids outside the vocabulary can never be chosen
        return np.array([s for s in stop_list if 0 <= s < self.vocab_size], dtype=np.int32)

    @_locked
    def _greedy(self, first: int, n: int, stops: np.ndarray) -> list[int]:
        out = np.empty(n, dtype=np.int32)
        chosen = ffi.new("int32_t *")
        status = lib.eb_context_greedy(
            self._live(),
            first,
            n,
            ffi.from_buffer("int32_t[]", stops),
            len(stops),
            ffi.from_buffer("int32_t[]", out, require_writable=True),
            chosen,
        )
        check(status)
        return out[: chosen[0]].tolist()

    @_locked
    def generate(self, prompt_ids, n: int, stop_ids=()) -> GenerateResult:
        """Greedy decoding of up to n tokens after the prompt (appended at the current position)."""
        if not _is_int(n) or n < 1:
            raise ArgumentError(f"number of tokens to generate must be a positive integer, got {n!r}")
        prompt = _ids_array(prompt_ids)
        stops = self._stop_array(stop_ids)  # checked before anything is appended
        if self.position + len(prompt) + n - 1 > self.capacity:
            raise RangeError(
                f"prompt of {len(prompt)} tokens plus {n} generated needs {self.position + len(prompt) + n - 1} "
                f"positions, more than the KV cache ({self.capacity})"
            )
        t0 = time.perf_counter()
        last = self.prefill(prompt, all_rows=False)
        t1 = time.perf_counter()
        ids = self._greedy(greedy_choice(last, 0, self.position - 1), n, stops)
        t2 = time.perf_counter()
        return GenerateResult(ids, len(prompt), t1 - t0, len(ids) - 1, t2 - t1)

    @_locked
    def close(self) -> None:
        if self._ptr != ffi.NULL:
            lib.eb_context_free(self._ptr)
            self._ptr = ffi.NULL
            self.model._contexts.remove(self)
