"""Profiles: a tuned placement with everything needed to replay it and to guard it (profiles/README.md).

A profile is a versioned YAML file: the model (a folder, a GGUF file or a demo pair, with a content fingerprint), an
optional draft, the devices it needs, the primary device, the placement (an owner per MoE layer with per-expert
exceptions), run settings, expectations (output hash per prompt, minimum acceptance, minimum speed as a ratio
to a baseline profile) and optionally routing statistics.

Reading is strict: yaml's composer gives a node tree with line marks (no object is ever constructed from a
tag), and every key, type and value is checked here; an error names file:line and the offending value. Checks
that need the model (layer and expert ranges, routing shape) run in check_model(), with the same line numbers.
Saving writes the canonical form atomically (temp file, fsync, os.replace): a crash mid-save leaves the old
file whole. Load-save-load is lossless; comments are not kept (use `description`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ..checkpoints.checkpoint import ModelConfig, read_config_json, read_weights
from ..core.errors import ArgumentError, CheckpointError
from ..core.files import atomic_write
from ..model import WEIGHTS_MODES
from ..placement.placement import Placement
from ..placement.routing import MAX_COUNT, RoutingStats
from ..runs.diverge import SETTINGS, Trail, read_compact
from ..runs.run import KV_CACHES, PRECISIONS, REDUCTION_MODES, output_sha256
from ..runs.speculative import MAX_DRAFT_TOKENS
from .strict_yaml import Reader, Text, compose, dump, flow

# A profile is written in the oldest format version that says all it holds, so an older expertbench still reads
# it; a version newer than the reader's is refused, never read as something else.
FORMAT_VERSION = 5  # the newest format this reads and writes
DEMO_FORMAT_VERSION = 2  # added the demo's `format` and `quant` (model, draft): the demo pair as GGUF files
FAMILY_FORMAT_VERSION = 3  # added the demo's `family` (model, draft): the DeepSeek-V3 demo pair
OUTPUTS_FORMAT_VERSION = 4  # added expectations.outputs: the recorded ids and top-2 gaps (engine.runs.diverge)
SELF_DRAFT_FORMAT_VERSION = 5  # added `draft: {self: true}`: the target's own multi-token-prediction module
VERSION_KEY = "expertbench_profile"
RUNTIMES = ("cpu", "hostsim", "cuda", "hip")
DEFAULT_TOKENS = 32
DEFAULT_REPEATS = 3
DEFAULT_Q = 2
_DEVICE = re.compile(r"^([a-z][a-z0-9_]*):(\d+)$")
_SPAN = re.compile(r"^(\d+)(?:-(\d+))?$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_FINGERPRINT = re.compile(r"^sha256:[0-9a-f]{64}$")
# config.json keys that change when the same weights are re-saved, and say nothing about the model
_VOLATILE_CONFIG_KEYS = ("transformers_version", "_name_or_path")


class ProfileError(ArgumentError):
    """A profile that cannot be used: the message starts with file:line and names the offending value."""


# ---- the profile as data ------------------------------------------------------------------------------------


@dataclass
class ModelRef:
    """A model folder or GGUF file (`path`, relative to the profile's folder) or a demo pair size (`demo`), exactly
    one. A demo names its family too (`family`: engine.checkpoints.demo.FAMILIES; None: the Qwen3-MoE pair), and its
    files' format: `format` (engine.checkpoints.demo.DEMO_FORMATS; None: safetensors) and, for GGUF, `quant`
    (engine.checkpoints.demo.QUANTS; None: engine.checkpoints.demo.DEFAULT_QUANT); all as written, None when not. A demo
    given with its family in one name, as engine.checkpoints.demo.demo_name() writes it ('deepseek/bench': how the
    window knows the pair it opened), is split into the two keys."""

    path: str | None = None
    demo: str | None = None
    fingerprint: str | None = None
    device: str | None = None  # drafts only: the draft's device (default: the profile's primary)
    format: str | None = None  # demos only: the demo pair's file format
    quant: str | None = None  # GGUF demos only: its quantization
    family: str | None = None  # demos only: the demo pair's family
    own: bool = False  # drafts only: the target checkpoint's own multi-token-prediction module (`self: true`)

    def __post_init__(self):
        if isinstance(self.demo, str) and "/" in self.demo and self.family is None:
            self.family, _, self.demo = self.demo.rpartition("/")

    def demo_format(self) -> tuple[str, str | None]:
        """(format, quantization) of a demo: ('safetensors', None), or ('gguf', the quantization or the default)."""
        from ..checkpoints.demo import check_format

        fmt = self.format or "safetensors"
        return fmt, check_format(fmt, self.quant, self.demo_family())

    def demo_family(self) -> str:
        """The demo's family (engine.checkpoints.demo.FAMILIES), the default one when not named."""
        from ..checkpoints.demo import DEFAULT_FAMILY

        return self.family or DEFAULT_FAMILY


@dataclass
class DeviceSpec:
    """How many devices of one runtime the profile needs; threads per device and a memory limit (cpu, hostsim)."""

    devices: int = 1
    threads: int | None = None
    memory_limit: int | None = None


@dataclass
class PlacementSpec:
    """Owners as written: a default device, whole layers (first, last, device), exceptions (layer, first, last,
    device). Layers not listed go to `default`, or to the primary."""

    default: str | None = None
    layers: list[tuple[int, int, str]] = field(default_factory=list)
    experts: list[tuple[int, int, int, str]] = field(default_factory=list)

    def to_placement(self, config: ModelConfig, primary: str) -> Placement:
        placement = Placement.single(config, self.default or primary)
        for lo, hi, device in self.layers:
            for layer in range(lo, hi + 1):
                if config.is_moe_layer(layer):
                    placement.owners[layer] = [device] * config.num_experts
        for layer, lo, hi, device in self.experts:
            for e in range(lo, hi + 1):
                placement.owners[layer][e] = device
        return placement

    @classmethod
    def from_placement(cls, placement: Placement) -> PlacementSpec:
        """The canonical form: each MoE layer owned by its most common device (ties: the first in name order),
        runs of consecutive MoE layers with one owner merged, the other experts as exceptions."""
        moe = [layer for layer, row in enumerate(placement.owners) if row and row[0] is not None]
        owner = {}
        for layer in moe:
            row = placement.owners[layer]
            owner[layer] = max(sorted(set(row)), key=row.count)
        layers: list[tuple[int, int, str]] = []
        for k, layer in enumerate(moe):
            if layers and layers[-1][2] == owner[layer] and moe[k - 1] == layers[-1][1]:
                layers[-1] = (layers[-1][0], layer, owner[layer])
            else:
                layers.append((layer, layer, owner[layer]))
        experts: list[tuple[int, int, int, str]] = []
        for layer in moe:
            for e, device in enumerate(placement.owners[layer]):
                if device == owner[layer]:
                    continue
                last = experts[-1] if experts else None
                if last and last[0] == layer and last[2] == e - 1 and last[3] == device:
                    experts[-1] = (layer, last[1], e, device)
                else:
                    experts.append((layer, e, e, device))
        return cls(None, layers, experts)


@dataclass
class RunSettings:
    """None means the default (prompts: the demo prompts; tokens 32; repeats 3; q 2; mode reference; weights
    auto; precision f32; kv f32)."""

    prompts: list[str | list[int]] | None = None
    tokens: int | None = None
    repeats: int | None = None
    q: int | None = None
    mode: str | None = None
    weights: str | None = None  # how the engine holds the files (engine.model.WEIGHTS_MODES)
    precision: str | None = None  # how activations meet quantized weights (engine.runs.run.PRECISIONS)
    kv: str | None = None  # the KV caches' format (engine.runs.run.KV_CACHES)

    def resolved(self) -> dict:
        from ..checkpoints.demo import DEMO_PROMPTS

        return {
            "prompts": list(self.prompts) if self.prompts is not None else list(DEMO_PROMPTS),
            "tokens_per_prompt": self.tokens or DEFAULT_TOKENS,
            "repeats": self.repeats or DEFAULT_REPEATS,
            "q": self.q or DEFAULT_Q,
            "mode": self.mode or "reference",
            "precision": self.precision or "f32",
            "kv": self.kv or "f32",
            "weights": self.weights or "auto",
        }


@dataclass
class Expectations:
    output_sha256: list[str] | None = None  # one per prompt
    min_accept_rate: float | None = None
    baseline: str | None = None  # another profile, relative to this one's folder
    min_speed_ratio: float | None = None  # decode tokens/s of this profile over the baseline's, same invocation
    # per prompt, the recorded run's ids and top-2 logit gaps (what a changed hash is diagnosed with), and the
    # settings it ran with (engine.runs.diverge.SETTINGS: placement, mode, precision, top_k, q, device, kernels)
    outputs: list[Trail] | None = None
    outputs_settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class RoutingSpec:
    """Routing statistics inline (hits [layers][experts], tokens [layers], top_k) or in a hotness CSV file."""

    hotness_csv: str | None = None
    top_k: int | None = None
    tokens: list[int] | None = None
    hits: list[list[int]] | None = None

    @classmethod
    def inline(cls, stats: RoutingStats) -> RoutingSpec:
        return cls(None, int(stats.top_k), [int(v) for v in stats.tokens], [[int(v) for v in r] for r in stats.hits])


@dataclass
class Profile:
    model: ModelRef
    draft: ModelRef | None = None
    description: str | None = None
    devices: dict[str, DeviceSpec] | None = None  # None: one cpu device
    primary: str | None = None  # None: cpu:0
    placement: PlacementSpec = field(default_factory=PlacementSpec)
    run: RunSettings = field(default_factory=RunSettings)
    expectations: Expectations = field(default_factory=Expectations)
    routing: RoutingSpec | None = None
    version: int = 1  # as read; saving writes at least needed_version()
    # where it was read from, and the line of each checked item (for errors found later); not part of the data
    path: Path | None = field(default=None, compare=False, repr=False)
    lines: dict[tuple, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def name(self) -> str:
        return self.path.stem if self.path is not None else "profile"

    @property
    def primary_device(self) -> str:
        return self.primary or "cpu:0"

    @property
    def device_specs(self) -> dict[str, DeviceSpec]:
        return self.devices if self.devices is not None else {"cpu": DeviceSpec()}

    def device_names(self) -> list[str]:
        return [f"{rt}:{i}" for rt, spec in self.device_specs.items() for i in range(spec.devices)]

    def needed_version(self) -> int:
        """The oldest format version that can say everything this profile holds."""
        refs = [r for r in (self.model, self.draft) if r is not None]
        if self.draft is not None and self.draft.own:
            return SELF_DRAFT_FORMAT_VERSION
        if self.expectations.outputs is not None:
            return OUTPUTS_FORMAT_VERSION
        if any(r.family is not None for r in refs):
            return FAMILY_FORMAT_VERSION
        demo_format = any(r.format is not None or r.quant is not None for r in refs)
        return DEMO_FORMAT_VERSION if demo_format else 1

    def where(self, *key) -> str:
        """file:line of an item (the nearest enclosing item that has a line)."""
        while key and key not in self.lines:
            key = key[:-1]
        line = self.lines.get(key, 1)
        return f"{self.path or '<profile>'}:{line}"

    def error_at(self, key: tuple, message: str) -> str:
        """message at the file:line of key, unless it already names a place in this profile."""
        if self.path is not None and message.startswith(f"{self.path}:"):
            return message
        return f"{self.where(*key)}: {message}"

    def resolve(self, relative: str) -> Path:
        """A path written in the profile: ~ expanded, relative to the profile's folder."""
        p = Path(relative).expanduser()
        return p if p.is_absolute() or self.path is None else self.path.parent / p

    def model_folder(self, ref: ModelRef | None = None, role: str = "target") -> Path:
        """The folder (or GGUF file) of the target (or of `ref`); a demo size is built into the cache when missing."""
        ref = ref or self.model
        if ref.demo is not None:
            from ..checkpoints.demo import ensure_demo_pair

            fmt, quant = ref.demo_format()
            pair = ensure_demo_pair(ref.demo, format=fmt, quant=quant, family=ref.demo_family())
            return pair.target if role == "target" else pair.draft
        return self.resolve(ref.path)

    def placement_for(self, config: ModelConfig) -> Placement:
        self.check_model(config)
        return self.placement.to_placement(config, self.primary_device)

    def check_model(self, config: ModelConfig) -> None:
        """Layer and expert ranges of the placement and the routing shape against the model's config."""
        if config.num_experts <= 0 and (self.placement.layers or self.placement.experts):
            raise ProfileError(f"{self.where('placement')}: placement: the model has no experts to place")
        n, experts = config.num_layers, config.num_experts
        for i, (lo, hi, _device) in enumerate(self.placement.layers):
            if hi >= n:
                raise ProfileError(f"{self.where('placement', 'layers', i)}: placement.layers: layer {hi} out of "
                                   f"range: the model has layers 0..{n - 1}")  # fmt: skip
            if not any(config.is_moe_layer(layer) for layer in range(lo, hi + 1)):
                span = f"{lo}-{hi}" if hi > lo else f"{lo}"
                raise ProfileError(f"{self.where('placement', 'layers', i)}: placement.layers: {span} holds no MoE "
                                   f"layer (MoE layers: {_spans(config.moe_layers)})")  # fmt: skip
        for i, (layer, _lo, hi, _device) in enumerate(self.placement.experts):
            where = self.where("placement", "experts", i)
            if layer >= n or not config.is_moe_layer(layer):
                raise ProfileError(f"{where}: placement.experts: layer {layer} is not an MoE layer of the model "
                                   f"(MoE layers: {_spans(config.moe_layers)})")  # fmt: skip
            if hi >= experts:
                raise ProfileError(f"{where}: placement.experts: expert {hi} out of range: the model has experts "
                                   f"0..{experts - 1}")  # fmt: skip
        if self.routing is not None and self.routing.hits is not None:
            shape = (len(self.routing.hits), len(self.routing.hits[0]) if self.routing.hits else 0)
            if shape != (n, experts) or self.routing.top_k != config.top_k:
                raise ProfileError(f"{self.where('routing')}: routing: {shape[0]} layers x {shape[1]} experts, "
                                   f"top_k {self.routing.top_k}; the model has {n} x {experts}, top_k "
                                   f"{config.top_k}")  # fmt: skip

    def routing_stats(self) -> RoutingStats | None:
        r = self.routing
        if r is None:
            return None
        if r.hotness_csv is not None:
            try:
                return RoutingStats.read_hotness_csv(self.resolve(r.hotness_csv))
            except CheckpointError as exc:
                raise ProfileError(self.error_at(("routing",), f"routing: {exc}")) from None
        return RoutingStats(np.array(r.hits, dtype=np.uint64).reshape(len(r.hits), -1),
                            np.array(r.tokens, dtype=np.uint64), int(r.top_k))  # fmt: skip

    # ---- writing ----------------------------------------------------------------------------------------

    def to_data(self) -> dict:
        """The canonical YAML data (what save() writes)."""
        out: dict[str, Any] = {VERSION_KEY: max(self.version, self.needed_version())}
        if self.description is not None:
            out["description"] = Text(self.description) if len(self.description) > 80 else self.description
        out["model"] = _ref_data(self.model)
        if self.draft is not None:
            out["draft"] = _ref_data(self.draft)
        if self.devices is not None:
            out["devices"] = {rt: _device_data(spec) for rt, spec in self.devices.items()}
        if self.primary is not None:
            out["primary"] = self.primary
        p = self.placement
        if p.default is not None or p.layers or p.experts:
            placement: dict[str, Any] = {}
            if p.default is not None:
                placement["default"] = p.default
            if p.layers:
                placement["layers"] = {_span_key(lo, hi): dev for lo, hi, dev in p.layers}
            if p.experts:
                by_layer: dict[int, dict] = {}
                for layer, lo, hi, dev in p.experts:
                    by_layer.setdefault(layer, {})[_span_key(lo, hi)] = dev
                placement["experts"] = {layer: flow(rules) for layer, rules in by_layer.items()}
            out["placement"] = placement
        run = {k: v for k, v in (("prompts", None if self.run.prompts is None else
                                  [flow(p) if isinstance(p, list) else p for p in self.run.prompts]),
                                 ("tokens", self.run.tokens), ("repeats", self.run.repeats), ("q", self.run.q),
                                 ("mode", self.run.mode), ("precision", self.run.precision), ("kv", self.run.kv),
                                 ("weights", self.run.weights)) if v is not None}  # fmt: skip
        if run:
            out["run"] = run
        e = self.expectations
        exp: dict[str, Any] = {}
        if e.output_sha256 is not None:
            exp["output_sha256"] = list(e.output_sha256)
        if e.min_accept_rate is not None:
            exp["min_accept_rate"] = e.min_accept_rate
        if e.outputs is not None:
            exp["outputs"] = {"settings": flow(dict(e.outputs_settings)),
                              "prompts": [t.compact() for t in e.outputs]}  # fmt: skip
        if e.baseline is not None or e.min_speed_ratio is not None:
            speed = {}
            if e.baseline is not None:
                speed["baseline"] = e.baseline
            if e.min_speed_ratio is not None:
                speed["min_ratio"] = e.min_speed_ratio
            exp["speed"] = speed
        if exp:
            out["expectations"] = exp
        if self.routing is not None:
            r = self.routing
            if r.hotness_csv is not None:
                out["routing"] = {"hotness_csv": r.hotness_csv}
            else:
                out["routing"] = {"top_k": r.top_k, "tokens": flow(r.tokens), "hits": [flow(h) for h in r.hits]}
        return out

    def to_yaml(self) -> str:
        data = self.to_data()
        head = f"# expertbench profile, format {data[VERSION_KEY]} (see profiles/README.md)\n"
        return head + dump(data)

    def save(self, path: str | os.PathLike | None = None) -> Path:
        target = Path(path) if path is not None else self.path
        if target is None:
            raise ArgumentError("profile.save(): no path given and the profile was not read from a file")
        atomic_write(target, self.to_yaml())
        if self.path is None:
            self.path = target
        return target


def _ref_data(ref: ModelRef) -> dict:
    out: dict[str, Any] = {}
    if ref.own:
        out["self"] = True
    if ref.demo is not None:
        out["demo"] = ref.demo
    if ref.family is not None:
        out["family"] = ref.family
    if ref.format is not None:
        out["format"] = ref.format
    if ref.quant is not None:
        out["quant"] = ref.quant
    if ref.path is not None:
        out["path"] = ref.path
    if ref.fingerprint is not None:
        out["fingerprint"] = ref.fingerprint
    if ref.device is not None:
        out["device"] = ref.device
    return out


def _device_data(spec: DeviceSpec):
    if spec.threads is None and spec.memory_limit is None:
        return spec.devices
    out: dict[str, Any] = {"devices": spec.devices}
    if spec.threads is not None:
        out["threads"] = spec.threads
    if spec.memory_limit is not None:
        out["memory_limit"] = spec.memory_limit
    return out


def _span_key(lo: int, hi: int):
    return lo if lo == hi else f"{lo}-{hi}"


def _spans(values: list[int]) -> str:
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][1] == v - 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in out) or "none"


# ---- fingerprint --------------------------------------------------------------------------------------------


def fingerprint(folder: str | os.PathLike) -> str:
    """'sha256:...' of config.json (parsed, keys sorted, minus transformers_version and _name_or_path) and the
    tensor table of the safetensors headers (name, dtype, shape; not the files or offsets, so re-sharding the
    same model keeps it). It changes with the architecture, the sizes, the dtype or any tensor, not with the
    weights' values: the recorded output hashes catch those. A GGUF file (any part of a split one): its header
    metadata (split.* left out: re-splitting keeps it) and its tensor table (name, format, dimensions)."""
    folder = Path(folder)
    if folder.is_file():
        from ..checkpoints.gguf_file import fingerprint_data

        blob = json.dumps(fingerprint_data(folder), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()
    if not folder.is_dir():
        raise CheckpointError(f"model folder or GGUF file '{folder}' does not exist")
    config = read_config_json(folder / "config.json")
    config = {k: v for k, v in config.items() if k not in _VOLATILE_CONFIG_KEYS}
    tensors, _files = read_weights(folder)
    table = sorted((t.name, t.dtype, list(t.shape)) for t in tensors.values())
    blob = json.dumps({"config": config, "tensors": table}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


# ---- reading ------------------------------------------------------------------------------------------------

MAX_INDEX = 65535  # the largest layer or expert index a profile may name
MAX_NODES = 200_000  # what a profile may hold once its aliases are expanded (profiles/ examples: a few thousand)


class _Reader(Reader):
    """The strict reader with a profile's own values: device names and index ranges."""

    def device(self, node, what: str) -> str:
        return self.string(node, what, _DEVICE, "a device name RUNTIME:INDEX such as 'cpu:0' or 'cuda:0'")

    def span(self, node, what: str) -> tuple[int, int]:
        value = self.scalar(node, what)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            lo = hi = value
        else:
            m = _SPAN.match(value) if isinstance(value, str) and len(value) < 64 else None
            if not m or int(m.group(2) or m.group(1)) < int(m.group(1)):
                self.fail(node, f"{what}: expected an index N or a range FIRST-LAST (FIRST <= LAST), got {value!r:.80}")
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi > MAX_INDEX:  # no model has as many layers or experts: an entry per index would never end
            self.fail(node, f"{what}: index {hi} is beyond any model (at most {MAX_INDEX})")
        return lo, hi


def load(path: str | os.PathLike) -> Profile:
    """Read and check a profile file (everything that does not need the model; see Profile.check_model)."""
    path = Path(path)
    if path.exists() and not path.is_file():  # a FIFO would be read forever, a device node makes no sense
        raise ProfileError(f"{path}: not a regular file: expected a profile file (YAML)")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such profile file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    return loads(text, path)


def loads(text: str, path: str | os.PathLike = "<profile>") -> Profile:
    path = Path(path)
    root = compose(text, path, ProfileError, MAX_NODES, "a profile", "a profile (see profiles/README.md)")
    r = _Reader(path, ProfileError)
    keys = (VERSION_KEY, "description", "model", "draft", "devices", "primary", "placement", "run",
            "expectations", "routing")  # fmt: skip
    top = r.mapping(root, "profile", keys, required=(VERSION_KEY, "model"))
    knode, vnode = top[VERSION_KEY]
    version = r.scalar(vnode, VERSION_KEY)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        r.fail(vnode, f"{VERSION_KEY}: expected a format version 1..{FORMAT_VERSION}, got {version!r}")
    if version > FORMAT_VERSION:
        r.fail(vnode, f"{VERSION_KEY}: format {version} is newer than this expertbench reads ({FORMAT_VERSION})")
    profile = Profile(model=ModelRef(), version=version, path=path)
    for key, (knode, _vnode) in top.items():
        r.mark((key,), knode)

    if "description" in top:
        profile.description = r.string(top["description"][1], "description")
    profile.model = _read_ref(r, top["model"][1], "model", version, allow_device=False)
    if "draft" in top:
        profile.draft = _read_ref(r, top["draft"][1], "draft", version, allow_device=True)
    if "devices" in top:
        profile.devices = _read_devices(r, top["devices"][1])
    known = set(profile.device_names())

    def need_device(node, what: str, key: tuple) -> str:
        device = r.device(node, what)
        r.mark(key, node)
        if device not in known:
            r.fail(node, f"{what}: device {device!r} is not among the profile's devices ({', '.join(sorted(known))}); "
                         "list its runtime under 'devices'")  # fmt: skip
        return device

    if "primary" in top:
        profile.primary = need_device(top["primary"][1], "primary", ("primary",))
    elif "cpu:0" not in known:
        r.fail(root, f"primary: not given, and the default 'cpu:0' is not among the profile's devices "
                     f"({', '.join(sorted(known))})")  # fmt: skip
    if profile.draft is not None and profile.draft.device is not None:
        need_device(_find(r, top["draft"][1], "device"), "draft.device", ("draft", "device"))
    if "placement" in top:
        profile.placement = _read_placement(r, top["placement"][1], need_device)
    if "run" in top:
        profile.run = _read_run(r, top["run"][1], has_draft=profile.draft is not None)
    if "expectations" in top:
        profile.expectations = _read_expectations(r, top["expectations"][1], profile)
    if "routing" in top:
        profile.routing = _read_routing(r, top["routing"][1])
    if "placement" not in top:
        r.mark(("placement",), root)
    profile.lines = r.lines
    return profile


def _find(r: _Reader, node, key: str):
    for knode, vnode in node.value:
        if r.scalar(knode, "key") == key:
            return vnode
    raise AssertionError(key)


def _read_ref(r: _Reader, node, what: str, version: int, allow_device: bool) -> ModelRef:
    drafts = ("device", "self") if allow_device else ()
    allowed = ("path", "demo", "family", "format", "quant", "fingerprint", *drafts)
    m = r.mapping(node, what, allowed)
    ref = ModelRef()
    if "self" in m:
        knode, vnode = m["self"]
        if version < SELF_DRAFT_FORMAT_VERSION:
            r.fail(knode, f"{what}.self: the model's own draft needs format version {SELF_DRAFT_FORMAT_VERSION} "
                          f"('{VERSION_KEY}: {SELF_DRAFT_FORMAT_VERSION}'; this file says {version})")  # fmt: skip
        if r.scalar(vnode, f"{what}.self") is not True:
            r.fail(vnode, f"{what}.self: expected true (the model's own multi-token-prediction layer as the draft), "
                          f"got {vnode.value!r:.40}; leave 'draft' out for none")  # fmt: skip
        others = sorted(set(m) - {"self", "device"})
        if others:
            r.fail(m[others[0]][0], f"{what}.{others[0]}: a draft of the model's own ('self: true') is its "
                                    "checkpoint's module: it takes a 'device' only")  # fmt: skip
        ref.own = True
        if "device" in m:
            ref.device = r.device(m["device"][1], f"{what}.device")
        r.mark((what,), node)
        return ref
    if ("path" in m) == ("demo" in m):
        self_too = " or 'self: true' (the model's own MTP layer)" if allow_device else ""
        r.fail(node, f"{what}: give exactly one of 'path' (a model folder or .gguf file) or 'demo' (a demo model "
                     f"size){self_too}")  # fmt: skip
    if "path" in m:
        ref.path = r.string(m["path"][1], f"{what}.path")
    if "family" in m:
        knode = m["family"][0]
        if "demo" not in m:
            r.fail(knode, f"{what}.family: only a demo model takes a family ('demo: SIZE' beside it)")
        if version < FAMILY_FORMAT_VERSION:
            r.fail(knode, f"{what}.family: the demo's family needs format version {FAMILY_FORMAT_VERSION} "
                          f"('{VERSION_KEY}: {FAMILY_FORMAT_VERSION}'; this file says {version})")  # fmt: skip
        from ..checkpoints.demo import check_family

        ref.family = r.string(m["family"][1], f"{what}.family")
        try:
            check_family(ref.family)
        except ArgumentError as exc:
            r.fail(m["family"][1], f"{what}.family: {exc}")
    if "demo" in m:
        from ..checkpoints.demo import family_sizes

        sizes = family_sizes(ref.demo_family())
        ref.demo = r.string(m["demo"][1], f"{what}.demo")
        if ref.demo not in sizes:
            r.fail(m["demo"][1], f"{what}.demo: unknown demo size {ref.demo!r:.80} (expected one of "
                                 f"{', '.join(sizes)})")  # fmt: skip
    for key in ("format", "quant"):
        if key not in m:
            continue
        knode = m[key][0]
        if ref.demo is None:
            r.fail(knode, f"{what}.{key}: only a demo model takes a {key} ('demo: SIZE' beside it); a 'path' is "
                          "read as the files it names")  # fmt: skip
        if version < DEMO_FORMAT_VERSION:
            r.fail(knode, f"{what}.{key}: the demo's format and quant need format version {DEMO_FORMAT_VERSION} "
                          f"('{VERSION_KEY}: {DEMO_FORMAT_VERSION}'; this file says {version})")  # fmt: skip
        setattr(ref, key, r.string(m[key][1], f"{what}.{key}"))
    if ref.format is not None or ref.quant is not None:
        from ..checkpoints.demo import check_format

        try:
            check_format(ref.format or "safetensors", family=ref.demo_family())
        except ArgumentError as exc:
            r.fail(m["format"][1], f"{what}.format: {exc}")
        try:
            check_format(ref.format or "safetensors", ref.quant, ref.demo_family())
        except ArgumentError as exc:
            r.fail(m["quant"][1], f"{what}.quant: {exc}")
    if "fingerprint" in m:
        ref.fingerprint = r.string(m["fingerprint"][1], f"{what}.fingerprint", _FINGERPRINT,
                                   "'sha256:' and 64 lowercase hex digits")  # fmt: skip
        r.mark((what, "fingerprint"), m["fingerprint"][1])
    if "device" in m:
        ref.device = r.device(m["device"][1], f"{what}.device")
    r.mark((what,), node)
    return ref


def _read_devices(r: _Reader, node) -> dict[str, DeviceSpec]:
    out: dict[str, DeviceSpec] = {}
    for knode, vnode in r.pairs(node, "devices"):
        runtime = r.scalar(knode, "devices: key")
        if runtime not in RUNTIMES:
            r.fail(knode, f"devices: unknown runtime {runtime!r} (expected one of {', '.join(RUNTIMES)})")
        what = f"devices.{runtime}"
        r.mark(("devices", runtime), knode)
        if isinstance(vnode, yaml.ScalarNode):
            out[runtime] = DeviceSpec(r.integer(vnode, what, 1, 64))
            continue
        m = r.mapping(vnode, what, ("devices", "threads", "memory_limit"), required=("devices",))
        spec = DeviceSpec(r.integer(m["devices"][1], f"{what}.devices", 1, 64))
        for key, (k, _v) in m.items():
            r.mark(("devices", runtime, key), k)
        if "threads" in m:
            if runtime not in ("cpu", "hostsim"):
                r.fail(m["threads"][0], f"{what}.threads: only cpu and hostsim devices have worker threads")
            spec.threads = r.integer(m["threads"][1], f"{what}.threads", 1, 4096)
        if "memory_limit" in m:
            spec.memory_limit = r.integer(m["memory_limit"][1], f"{what}.memory_limit", 1)
        out[runtime] = spec
    if not out:
        r.fail(node, "devices: empty: expected at least one runtime, e.g. 'cpu: 1'")
    return out


def _read_placement(r: _Reader, node, need_device) -> PlacementSpec:
    m = r.mapping(node, "placement", ("default", "layers", "experts"))
    spec = PlacementSpec()
    if "default" in m:
        spec.default = need_device(m["default"][1], "placement.default", ("placement", "default"))
    if "layers" in m:
        taken: dict[int, int] = {}
        for knode, vnode in r.pairs(m["layers"][1], "placement.layers"):
            lo, hi = r.span(knode, "placement.layers: key")
            for layer in range(lo, hi + 1):
                if layer in taken:
                    r.fail(knode, f"placement.layers: layer {layer} is listed twice (also on line {taken[layer]})")
                taken[layer] = knode.start_mark.line + 1
            i = len(spec.layers)
            device = need_device(vnode, f"placement.layers.{_span_key(lo, hi)}", ("placement", "layers", i))
            r.mark(("placement", "layers", i), knode)
            spec.layers.append((lo, hi, device))
    if "experts" in m:
        for lnode, rules in r.pairs(m["experts"][1], "placement.experts"):
            layer = r.integer(lnode, "placement.experts: key (a layer)", 0)
            taken = {}
            for knode, vnode in r.pairs(rules, f"placement.experts.{layer}"):
                lo, hi = r.span(knode, f"placement.experts.{layer}: key")
                for e in range(lo, hi + 1):
                    if e in taken:
                        r.fail(knode, f"placement.experts.{layer}: expert {e} is listed twice")
                    taken[e] = True
                i = len(spec.experts)
                device = need_device(vnode, f"placement.experts.{layer}.{_span_key(lo, hi)}",
                                     ("placement", "experts", i))  # fmt: skip
                r.mark(("placement", "experts", i), knode)
                spec.experts.append((layer, lo, hi, device))
    return spec


def _read_run(r: _Reader, node, has_draft: bool) -> RunSettings:
    m = r.mapping(node, "run", ("prompts", "tokens", "repeats", "q", "mode", "precision", "kv", "weights"))
    run = RunSettings()
    if "prompts" in m:
        items = r.sequence(m["prompts"][1], "run.prompts")
        if not items:
            r.fail(m["prompts"][1], "run.prompts: empty: expected at least one prompt")
        run.prompts = []
        for i, item in enumerate(items):
            if isinstance(item, yaml.SequenceNode):
                ids = [r.integer(t, f"run.prompts[{i}]: token id", 0, 2**31 - 1) for t in r.sequence(item, "")]
                if not ids:
                    r.fail(item, f"run.prompts[{i}]: empty list of token ids")
                run.prompts.append(ids)
            else:
                run.prompts.append(
                    r.string(item, f"run.prompts[{i}]", expect="a non-empty text or a list of token ids")
                )
        r.mark(("run", "prompts"), m["prompts"][1])
    if "tokens" in m:
        run.tokens = r.integer(m["tokens"][1], "run.tokens", 1, 1 << 20)
    if "repeats" in m:
        run.repeats = r.integer(m["repeats"][1], "run.repeats", 1, 1000)
    if "q" in m:
        if not has_draft:
            r.fail(m["q"][0], "run.q: a draft length needs a 'draft' model")
        run.q = r.integer(m["q"][1], "run.q", 1, MAX_DRAFT_TOKENS)
    if "mode" in m:
        run.mode = r.string(m["mode"][1], "run.mode")
        if run.mode not in REDUCTION_MODES:
            r.fail(m["mode"][1], f"run.mode: expected one of {', '.join(REDUCTION_MODES)}, got {run.mode!r}")
    if "precision" in m:
        run.precision = r.string(m["precision"][1], "run.precision")
        if run.precision not in PRECISIONS:
            r.fail(m["precision"][1], f"run.precision: expected one of {', '.join(PRECISIONS)} (f32: the reference; "
                                      f"q8: int8 activations as llama.cpp), got {run.precision!r}")  # fmt: skip
    if "kv" in m:
        run.kv = r.string(m["kv"][1], "run.kv")
        if run.kv not in KV_CACHES:
            r.fail(m["kv"][1], f"run.kv: expected one of {', '.join(KV_CACHES)} (the KV cache's format; f32: the "
                               f"reference), got {run.kv!r}")  # fmt: skip
    if "weights" in m:
        run.weights = r.string(m["weights"][1], "run.weights")
        if run.weights not in WEIGHTS_MODES:
            r.fail(m["weights"][1], f"run.weights: expected one of {', '.join(WEIGHTS_MODES)}, got {run.weights!r}")
    return run


def _read_expectations(r: _Reader, node, profile: Profile) -> Expectations:
    m = r.mapping(node, "expectations", ("output_sha256", "min_accept_rate", "speed", "outputs"))
    e = Expectations()
    if "output_sha256" in m:
        vnode = m["output_sha256"][1]
        e.output_sha256 = [r.string(h, f"expectations.output_sha256[{i}]", _SHA256, "64 lowercase hex digits")
                           for i, h in enumerate(r.sequence(vnode, "expectations.output_sha256"))]  # fmt: skip
        n_prompts = len(profile.run.resolved()["prompts"])
        if len(e.output_sha256) != n_prompts:
            r.fail(vnode, f"expectations.output_sha256: {len(e.output_sha256)} hashes, expected one per prompt "
                          f"({n_prompts})")  # fmt: skip
        r.mark(("expectations", "output_sha256"), vnode)
    if "min_accept_rate" in m:
        if profile.draft is None:
            r.fail(m["min_accept_rate"][0], "expectations.min_accept_rate: acceptance needs a 'draft' model")
        e.min_accept_rate = r.number(m["min_accept_rate"][1], "expectations.min_accept_rate", 0.0, 1.0)
    if "speed" in m:
        s = r.mapping(m["speed"][1], "expectations.speed", ("baseline", "min_ratio"), required=("baseline",))
        e.baseline = r.string(s["baseline"][1], "expectations.speed.baseline", expect="a profile file")
        if profile.path is not None and profile.resolve(e.baseline).resolve() == profile.path.resolve():
            r.fail(s["baseline"][1], f"expectations.speed.baseline: {e.baseline!r} is this profile itself: a profile "
                                     "cannot be its own baseline")  # fmt: skip
        r.mark(("expectations", "speed", "baseline"), s["baseline"][1])
        if "min_ratio" in s:
            e.min_speed_ratio = r.number(s["min_ratio"][1], "expectations.speed.min_ratio", 0.0, lo_open=True)
    if "outputs" in m:
        _read_outputs(r, m["outputs"][1], profile, e)
    return e


def _read_outputs(r: _Reader, node, profile: Profile, e: Expectations) -> None:
    """expectations.outputs: the settings the recorded run had, and per prompt its ids (as many as run.tokens) and
    their gaps; the ids must hash to expectations.output_sha256."""
    if profile.version < OUTPUTS_FORMAT_VERSION:
        r.fail(node, f"expectations.outputs: the recorded outputs need format version {OUTPUTS_FORMAT_VERSION} "
                     f"('{VERSION_KEY}: {OUTPUTS_FORMAT_VERSION}'; this file says {profile.version})")  # fmt: skip
    m = r.mapping(node, "expectations.outputs", ("settings", "prompts"), required=("settings", "prompts"))
    settings = r.mapping(m["settings"][1], "expectations.outputs.settings", SETTINGS)
    for key, (_knode, vnode) in settings.items():
        what = f"expectations.outputs.settings.{key}"
        if key in ("q", "top_k"):
            value = r.scalar(vnode, what)
            if value is not None:
                value = r.integer(vnode, what, 1)
        else:
            value = r.string(vnode, what)
        e.outputs_settings[key] = value
    rows = r.sequence(m["prompts"][1], "expectations.outputs.prompts")
    resolved = profile.run.resolved()
    if len(rows) != len(resolved["prompts"]):
        r.fail(m["prompts"][1], f"expectations.outputs.prompts: {len(rows)} entries, expected one per prompt "
                                f"({len(resolved['prompts'])})")  # fmt: skip
    e.outputs = []
    for i, row in enumerate(rows):
        what = f"expectations.outputs.prompts[{i}]"
        fields_ = r.mapping(row, what, ("ids", "gaps"), required=("ids", "gaps"))
        data = {key: r.scalar(vnode, f"{what}.{key}") for key, (_knode, vnode) in fields_.items()}
        try:
            trail = read_compact(data, what, resolved["tokens_per_prompt"])
        except ArgumentError as exc:
            r.fail(row, str(exc))
        if e.output_sha256 is not None and output_sha256(trail.ids) != e.output_sha256[i]:
            r.fail(fields_["ids"][1], f"{what}.ids: they do not hash to expectations.output_sha256[{i}] (the ids or "
                                      "the hashes were edited: record the profile again)")  # fmt: skip
        e.outputs.append(trail)
    r.mark(("expectations", "outputs"), node)


def _read_routing(r: _Reader, node) -> RoutingSpec:
    m = r.mapping(node, "routing", ("hotness_csv", "top_k", "tokens", "hits"))
    if "hotness_csv" in m:
        if len(m) > 1:
            r.fail(node, "routing: give either 'hotness_csv' (a file) or 'top_k', 'tokens' and 'hits' (inline)")
        return RoutingSpec(hotness_csv=r.string(m["hotness_csv"][1], "routing.hotness_csv"))
    for key in ("top_k", "tokens", "hits"):
        if key not in m:
            r.fail(node, f"routing: {key!r} is missing (or give 'hotness_csv: FILE')")
    spec = RoutingSpec(top_k=r.integer(m["top_k"][1], "routing.top_k", 1))
    spec.tokens = [r.integer(v, "routing.tokens", 0, MAX_COUNT) for v in r.sequence(m["tokens"][1], "routing.tokens")]
    spec.hits = []
    rows = r.sequence(m["hits"][1], "routing.hits")
    if len(rows) != len(spec.tokens) or not rows:
        r.fail(m["hits"][1], f"routing.hits: {len(rows)} rows, expected one per layer as in routing.tokens "
                             f"({len(spec.tokens)})")  # fmt: skip
    for i, row in enumerate(rows):
        counts = [r.integer(v, f"routing.hits[{i}]", 0, MAX_COUNT) for v in r.sequence(row, f"routing.hits[{i}]")]
        if spec.hits and len(counts) != len(spec.hits[0]):
            r.fail(row, f"routing.hits[{i}]: {len(counts)} counts, expected {len(spec.hits[0])} like row 0")
        spec.hits.append(counts)
    return spec
