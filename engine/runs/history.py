"""Run history and reference hashes: one bookkeeping for the window, `expertbench run` and `regress`.

A RunRecord is one decode run as the history shows it. Runs whose outputs must be equal share an outputs key
(outputs_key); the first complete run of a key is its reference, and every later run of that key is compared
with it (stable or changed). A model's history is kept across restarts as JSON lines in the user's data folder,
$XDG_DATA_HOME/expertbench/history/<model fingerprint>.jsonl (~/.local/share without XDG_DATA_HOME), one record a
line, appended as runs end; a damaged line is reported and skipped, never fatal.

What a profile may expect of a replay is inferred from this history by engine.profiles.expectations.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from ..core.errors import ArgumentError
from .run import outputs_any_placement, placement_devices


@dataclass
class RunSettings:
    """What the window's run panel asks for (engine.runs.run.DecodeRun's arguments)."""

    prompts: list[str]
    tokens: int = 64
    repeats: int = 1
    q: int = 2
    mode: str = "reference"
    use_draft: bool = True
    precision: str = "f32"  # engine.runs.run.PRECISIONS: f32 the reference, q8 int8 activations (other logits)
    kv: str = "f32"  # engine.runs.run.KV_CACHES: f32 the reference, f16 / bf16 half the cache (other logits)

    @property
    def total_tokens(self) -> int:
        return self.tokens * len(self.prompts) * self.repeats


@dataclass
class RunRecord:
    """One row of the run history."""

    index: int
    started: str  # local date and time, ISO 8601 to the second ('2026-12-02T19:04:02')
    target: str
    draft: str | None
    placement: str
    mode: str
    precision: str
    q: int | None
    tokens: int
    repeats: int
    prompts: int
    decode_tokens_per_second: float
    prefill_tokens_per_second: float
    accept_rate: float | None
    output_hash: str  # sha256 over every prompt's output sha256 (combined_hash); "" when no repeat completed
    reference_hash: str  # the first complete run's hash for the same outputs key (outputs_key)
    cancelled: bool
    seconds: float
    is_reference: bool = False  # the first complete run of its outputs key
    # what a profile saved later may expect (engine.profiles.expectations): the settings, models and per-prompt hashes
    settings: RunSettings | None = None
    target_path: str = ""
    draft_path: str | None = None
    output_sha256: list[str] = field(default_factory=list)  # per prompt, when complete and every repeat agreed
    # the slowest and fastest pass over the prompts (decode_tokens_per_second is the median)
    decode_tokens_per_second_min: float = math.nan
    decode_tokens_per_second_max: float = math.nan
    prefill_tokens_per_second_min: float = math.nan
    prefill_tokens_per_second_max: float = math.nan
    # the cost model's decode tokens/s for the run's placement when it started (target only, one token per step);
    # None before the devices were measured
    predicted_tokens_per_second: float | None = None
    primary: str = ""  # the target's device
    fingerprint: str | None = None  # the target's (engine.profiles.profile.fingerprint)
    # device -> share of the run's step time it spent running kernels (engine.runs.run.RunResult.device_busy_share)
    device_busy_share: dict[str, float] = field(default_factory=dict)
    kernels: str = ""  # the target runtime's kernels (RunResult.kernels)
    top_k: int | None = None  # experts per token where the target decoded with another count than its own
    kv: str = "f32"  # the KV caches' format (engine.runs.run.KV_CACHES)
    # per prompt the generated ids and top-2 logit gaps, compact (engine.runs.diverge.Trail.compact), when complete
    outputs: list[dict] | None = None
    # why the output differs from the reference run's (engine.runs.diverge.Diagnosis.to_dict), when it does
    diagnosis: dict | None = None
    # the quality cost of the run's fast mode against the reference mode (engine.runs.quality.QualityCost.to_dict)
    quality: dict | None = None

    @property
    def short_hash(self) -> str:
        return self.output_hash[:12] if self.output_hash else "-"

    @property
    def stable(self) -> bool | None:
        """True: same output as the reference run; False: changed; None: nothing to compare."""
        if not self.output_hash or not self.reference_hash:
            return None
        return self.output_hash == self.reference_hash

    @classmethod
    def of_run(cls, result, settings: RunSettings, target_path: str, draft_path: str | None = None,
               started: str | None = None, predicted: float | None = None, fingerprint: str | None = None,
               index: int = 0) -> RunRecord:  # fmt: skip
        """The record of an engine.runs.run.RunResult made with these settings (History.add numbers it and sets its
        reference hash)."""
        complete = bool(result.output_sha256) and len(result.output_sha256) == len(settings.prompts)
        return cls(
            index=index,
            started=started or now(),
            target=Path(result.target).name,
            draft=None if result.draft is None else Path(result.draft).name,
            placement=result.placement or "",
            mode=result.mode,
            precision=result.precision,
            q=result.q,
            tokens=settings.tokens,
            repeats=settings.repeats,
            prompts=len(settings.prompts),
            decode_tokens_per_second=result.decode_tokens_per_second,
            prefill_tokens_per_second=result.prefill_tokens_per_second,
            accept_rate=result.accept_rate,
            output_hash=combined_hash(result.output_sha256) if complete else "",
            reference_hash="",
            cancelled=result.cancelled,
            seconds=result.seconds,
            settings=settings,
            target_path=target_path,
            draft_path=draft_path if result.draft is not None else None,
            output_sha256=list(result.output_sha256) if complete and result.repeats_agree else [],
            decode_tokens_per_second_min=result.decode_tokens_per_second_min,
            decode_tokens_per_second_max=result.decode_tokens_per_second_max,
            prefill_tokens_per_second_min=result.prefill_tokens_per_second_min,
            prefill_tokens_per_second_max=result.prefill_tokens_per_second_max,
            predicted_tokens_per_second=predicted,
            primary=result.target_device,
            fingerprint=fingerprint,
            device_busy_share=dict(getattr(result, "device_busy_share", {}) or {}),
            kernels=getattr(result, "kernels", ""),
            top_k=getattr(result, "top_k", None),
            kv=getattr(result, "kv", "f32"),
            outputs=_compact_outputs(result) if complete else None,
        )

    def trails(self) -> list:
        """The kept outputs as engine.runs.diverge Trails (ids and gaps), one per prompt; empty when none were kept."""
        from .diverge import read_compact

        return [read_compact(o, f"outputs[{i}]") for i, o in enumerate(self.outputs or [])]

    def as_outputs(self, label: str | None = None):
        """The run as a diagnosis compares it (engine.runs.diverge.Outputs)."""
        from .diverge import Outputs, settings_of

        return Outputs(label or f"run {self.index}", self.trails(), settings_of(self))

    # ---- JSON --------------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """Plain JSON-ready data (NaN as null)."""
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data) -> RunRecord:
        """The record of to_dict's data; ArgumentError naming the field when one is missing or of the wrong type.
        Fields it does not know are ignored (a newer version's)."""
        if not isinstance(data, dict):
            raise ArgumentError(f"expected an object, got {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        values = {}
        for name, f in known.items():
            if name not in data:
                if f.default is MISSING and f.default_factory is MISSING:
                    raise ArgumentError(f"no '{name}'")
                continue
            values[name] = _checked(name, data[name])
        return cls(**values)


_FLOATS = {"decode_tokens_per_second", "prefill_tokens_per_second", "seconds", "decode_tokens_per_second_min",
           "decode_tokens_per_second_max", "prefill_tokens_per_second_min",
           "prefill_tokens_per_second_max"}  # fmt: skip
_TYPES = {
    "index": int, "q": (int, type(None)), "tokens": int, "repeats": int, "prompts": int, "cancelled": bool,
    "is_reference": bool, "accept_rate": (int, float, type(None)), "draft": (str, type(None)),
    "draft_path": (str, type(None)), "predicted_tokens_per_second": (int, float, type(None)),
    "fingerprint": (str, type(None)), "top_k": (int, type(None)),
}  # fmt: skip


def _compact_outputs(result) -> list[dict] | None:
    """A RunResult's first complete repeat's trails, compact."""
    trails = next((t for t in getattr(result, "trails", []) if len(t) == len(result.prompts)), None)
    return None if not trails else [t.compact() for t in trails]


def _checked(name: str, value):
    if name in _FLOATS:
        if value is None:
            return math.nan
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ArgumentError(f"'{name}' is {value!r}, expected a number")
        return float(value)
    if name == "settings":
        if value is None:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("prompts"), list):
            raise ArgumentError("'settings' is not the run panel's settings (no list of prompts)")
        try:
            return RunSettings(**{k: v for k, v in value.items() if k in {f.name for f in fields(RunSettings)}})
        except TypeError as exc:
            raise ArgumentError(f"'settings': {exc}") from None
    if name == "device_busy_share":
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in value.items()
        ):
            raise ArgumentError("'device_busy_share' is not a map of device names to numbers")
        return {k: float(v) for k, v in value.items()}
    if name == "outputs":
        if value is None:
            return None
        if not isinstance(value, list):
            raise ArgumentError(f"'outputs' is {type(value).__name__}, expected a list (one entry per prompt)")
        from .diverge import read_compact

        for i, entry in enumerate(value):
            read_compact(entry, f"outputs[{i}]")
        return value
    if name in ("diagnosis", "quality"):
        if value is not None and not isinstance(value, dict):
            raise ArgumentError(f"'{name}' is {type(value).__name__}, expected an object")
        return value
    if name == "output_sha256":
        if not isinstance(value, list) or not all(isinstance(h, str) for h in value):
            raise ArgumentError("'output_sha256' is not a list of hashes")
        return value
    want = _TYPES.get(name, str)
    if isinstance(value, bool) and want is int or not isinstance(value, want):
        raise ArgumentError(f"'{name}' is {value!r}, of the wrong type")
    return value


def combined_hash(output_sha256: Sequence[str]) -> str:
    """One hash for a run's outputs: sha256 over its prompts' output hashes in order (the history's Hash column)."""
    return hashlib.sha256("".join(output_sha256).encode()).hexdigest()


def now() -> str:
    """The local date and time as RunRecord.started holds it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S")


# ---- which runs must give the same outputs ------------------------------------------------------------------


def outputs_key(target: str, prompts: Sequence, tokens: int, precision: str, mode: str, placement: str = "",
                devices: Iterable[str] = (), top_k: int | None = None, kv: str = "f32") -> tuple:  # fmt: skip
    """What decides a run's output ids: runs with equal keys must give equal hashes.

    The target (its fingerprint, or its path), the prompts, the tokens per prompt and the precision (q8 gives other
    logits than f32 by design) always; the reduction mode when it is not 'reference' (owner_local sums in another
    association); and the placement whenever the outputs depend on it (engine.runs.run.outputs_any_placement over the
    placement's devices and the others given: owner_local always). The
    draft and q never: speculative greedy decoding gives the target-only greedy output, byte for byte. An experts
    per token override (top_k, None: the model's own) is another model, a half KV cache (kv) other logits. The
    window's saved profiles pick the run
    whose hashes they expect by this key too (engine.profiles.expectations)."""
    prompts = tuple(tuple(p) if isinstance(p, list) else p for p in prompts)
    key = (target, prompts, int(tokens), precision)
    if top_k is not None:
        key += (("top_k", top_k),)
    if kv != "f32":
        key += (("kv", kv),)
    if mode != "reference":
        key += (mode,)
    if not outputs_any_placement(mode, precision, [*placement_devices(placement), *devices]):
        key += (placement,)
    return key


def record_key(record: RunRecord) -> tuple:
    """A record's outputs key (its settings' prompts; without them, the number of prompts)."""
    prompts = record.settings.prompts if record.settings is not None else (record.prompts,)
    target = record.fingerprint or record.target_path or record.target
    devices = [record.primary] if record.primary else []
    return outputs_key(target, prompts, record.tokens, record.precision, record.mode, record.placement, devices,
                       record.top_k, record.kv)  # fmt: skip


class History:
    """A model's runs in order, with the reference hash of every outputs key; kept in `path` when given."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else None
        self.records: list[RunRecord] = []
        self.references: dict[tuple, str] = {}
        self.problems: list[str] = []  # what load() skipped: 'file:line: why'

    @classmethod
    def load(cls, path: str | os.PathLike) -> History:
        """The history kept in a file (none yet: empty). A line that is not a record is skipped and named in
        `problems`; an unreadable file leaves the history empty with its reason there."""
        history = cls(path)
        try:
            with open(history.path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return history
        except OSError as exc:
            history.problems.append(f"{history.path}: cannot read: {exc.strerror or exc}")
            return history
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = RunRecord.from_dict(json.loads(line))
            except (ValueError, RecursionError) as exc:  # json's errors and ArgumentError are ValueErrors
                history.problems.append(f"{history.path}:{number}: not a run record: {exc}")
                continue
            history._take(record)
        return history

    def _take(self, record: RunRecord) -> None:
        key = record_key(record)
        record.is_reference = bool(record.output_hash) and key not in self.references
        if record.output_hash:
            self.references.setdefault(key, record.output_hash)
        record.reference_hash = self.references.get(key, "")
        self.records.append(record)

    @property
    def next_index(self) -> int:
        return max((r.index for r in self.records), default=0) + 1

    def add(self, record: RunRecord) -> RunRecord:
        """Number the record, set its reference hash and whether it is the reference, keep it (appended to the file
        when there is one). The record is in the history even when the file cannot be written: ArgumentError then
        names the file."""
        record.index = self.next_index
        self._take(record)
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as f:  # a new file gets the user's umask
                    f.write(json.dumps(record.to_dict(), separators=(",", ":")) + "\n")
            except OSError as exc:
                raise ArgumentError(f"cannot keep the run in '{self.path}': {exc.strerror or exc}") from None
        return record

    def clear(self) -> None:
        """Forget every run, in the file too."""
        self.records.clear()
        self.references.clear()
        if self.path is not None:
            try:
                self.path.unlink(missing_ok=True)
            except OSError as exc:
                raise ArgumentError(f"cannot remove '{self.path}': {exc.strerror or exc}") from None

    def reference(self, key: tuple) -> RunRecord | None:
        """The reference run of an outputs key."""
        return next((r for r in self.records if r.is_reference and record_key(r) == key), None)


def data_folder() -> Path:
    """$XDG_DATA_HOME/expertbench (an absolute path only, as the XDG spec says), else ~/.local/share/expertbench."""
    base = os.environ.get("XDG_DATA_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".local" / "share"
    return root / "expertbench"


_FINGERPRINT = re.compile(r"^sha256:[0-9a-f]{64}$")


def history_file(fingerprint: str) -> Path:
    """Where a model's history is kept: history/<fingerprint as sha256-HEX>.jsonl in the data folder."""
    if not _FINGERPRINT.match(fingerprint or ""):
        raise ArgumentError(f"model fingerprint {fingerprint!r}: expected 'sha256:' and 64 hex digits")
    return data_folder() / "history" / (fingerprint.replace(":", "-") + ".jsonl")


# ---- what a profile may expect ------------------------------------------------------------------------------


def matching_run(history: Sequence[RunRecord], target_path: str, settings: RunSettings, placement: str,
                 primary: str) -> RunRecord | None:  # fmt: skip
    """The latest complete run of this target (every repeat agreed) whose outputs these settings on this placement
    must give (the same outputs key)."""
    key = outputs_key(target_path, settings.prompts, settings.tokens, settings.precision, settings.mode, placement,
                      [primary], kv=settings.kv)  # fmt: skip
    for record in reversed(history):
        if record.settings is None or not record.output_sha256 or record.target_path != target_path or record.top_k:
            continue
        s = record.settings
        devices = [primary, record.primary] if record.primary else [primary]
        if outputs_key(target_path, s.prompts, s.tokens, s.precision, s.mode, record.placement, devices,
                       kv=s.kv) == key:  # fmt: skip
            return record
    return None


def diagnose_change(ref: RunRecord, run, model=None, prompt_ids=None):
    """Why a run's output (a RunResult, with its top-2 logits, or a RunRecord) differs from its reference run's
    (engine.runs.diverge.Diagnosis); None when they are the same. With the model the run decoded on and the prompts'
    ids, the reference's logits are re-computed where it kept only ids and gaps and ran with the model's settings now
    (engine.runs.diverge.replay_missing)."""
    from .diverge import Outputs, diagnose, replay_missing

    record = run if isinstance(run, RunRecord) else None
    hashes = record.output_hash if record is not None else combined_hash(run.output_sha256)
    if not ref.output_hash or not hashes or ref.output_hash == hashes:
        return None
    a = ref.as_outputs(f"reference run {ref.index}")
    b = record.as_outputs("this run") if record is not None else Outputs.of_result(run, "this run")
    diagnosis = diagnose(a, b)
    if model is not None and prompt_ids is not None:
        replay_missing(diagnosis, a, b, model, prompt_ids)
    return diagnosis
