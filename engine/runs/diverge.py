"""Why an output hash changed: where two runs' greedy ids part, how close the choice was there, what differs.

Every run keeps, per prompt and generated token, the chosen id, the runner-up and both logits (a Trail). Two runs of
the same prompts part at the first token index where their ids differ; before it every input was the same, so the
logits there are the first place the runs' arithmetic showed. A choice is a near tie when the gap between the top
two logits is under NEAR_TIE_GAP in either run: the smallest change in the sums (another association, int8
activations, other kernels) may flip it. A gap above it, with settings that must give the same output (reference
mode on any placement, any q), is a bug to look into.

Profiles (`regress --record`) and the run history keep a Trail compactly: the ids as int32 and the gaps as float16,
base64 text (read_compact / Trail.compact). Where one side kept only that, its top-2 logits at the divergence can be
re-computed by replaying its ids in its own mode and precision (replay_choice); the diagnosis says which side was.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from ..core.errors import ArgumentError

# A choice whose top-2 logits are closer than this (in logits) is a near tie: the logit changes of a fast mode (q8
# activations move the demo's logits by 0.05 on average) can flip it. Stated in the output wherever it is used.
NEAR_TIE_GAP = 0.05

# The settings that decide a run's ids, in the order a diagnosis names them
SETTINGS = ("placement", "mode", "precision", "top_k", "q", "device", "kernels")
# Settings a difference in which may legitimately change the output; the placement and q never do in reference mode
# (owner_local sums depend on the placement: its difference counts there)
OUTPUT_SETTINGS = ("mode", "precision", "top_k", "kernels", "device")


def top2(rows) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per logits row: the greedy id (np.argmax's, the lowest id of a tie), the runner-up, and their logits."""
    rows = np.atleast_2d(np.asarray(rows, dtype=np.float32))
    r = np.arange(len(rows))
    first = rows.argmax(axis=1)
    rest = rows.copy()
    rest[r, first] = -np.inf
    second = rest.argmax(axis=1)
    return first.astype(np.int32), second.astype(np.int32), rows[r, first], rows[r, second]


class Trail:
    """One prompt's greedy output: per generated token the id, the gap between the top-2 logits, and (where kept)
    the runner-up id and both logits ([n, 2]: first, second)."""

    __slots__ = ("ids", "gaps", "second", "logits")

    def __init__(self, ids, gaps, second=None, logits=None):
        self.ids = np.asarray(ids, dtype=np.int32)
        self.gaps = np.asarray(gaps, dtype=np.float32)
        self.second = None if second is None else np.asarray(second, dtype=np.int32)
        self.logits = None if logits is None else np.asarray(logits, dtype=np.float32).reshape(-1, 2)

    @classmethod
    def of_rows(cls, rows) -> Trail:
        first, second, l1, l2 = top2(rows)
        return cls(first, l1 - l2, second, np.stack([l1, l2], axis=1))

    @classmethod
    def joined(cls, parts: Sequence[Trail]) -> Trail:
        full = all(p.logits is not None for p in parts)
        return cls(np.concatenate([p.ids for p in parts]), np.concatenate([p.gaps for p in parts]),
                   np.concatenate([p.second for p in parts]) if full else None,
                   np.concatenate([p.logits for p in parts]) if full else None)  # fmt: skip

    def __len__(self) -> int:
        return len(self.ids)

    def __eq__(self, other) -> bool:
        """The same ids and gaps (what a compact record keeps)."""
        if not isinstance(other, Trail):
            return NotImplemented
        return np.array_equal(self.ids, other.ids) and np.array_equal(self.gaps, other.gaps)

    __hash__ = None

    def choice(self, index: int) -> Choice:
        gap = float(self.gaps[index])
        if self.logits is None:
            return Choice(int(self.ids[index]), gap)
        return Choice(int(self.ids[index]), gap, float(self.logits[index, 0]), int(self.second[index]),
                      float(self.logits[index, 1]))  # fmt: skip

    def stored(self) -> Trail:
        """This trail as a compact record keeps it (ids and float16 gaps)."""
        return read_compact(self.compact(), "trail")

    def compact(self) -> dict[str, str]:
        """{"ids": base64 of int32 little-endian, "gaps": base64 of float16 little-endian}: 6 bytes a token."""
        gaps = np.minimum(self.gaps, np.finfo(np.float16).max).astype("<f2")
        return {"ids": _b64(self.ids.astype("<i4")), "gaps": _b64(gaps)}


def _b64(array: np.ndarray) -> str:
    return base64.b64encode(array.tobytes()).decode("ascii")


def _array(text, dtype: str, what: str, expect: str) -> np.ndarray:
    if not isinstance(text, str):
        raise ArgumentError(f"{what}: expected base64 text of {expect}, got {type(text).__name__} {text!r:.40}")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ArgumentError(f"{what}: not base64 text (expected base64 of {expect})") from None
    size = np.dtype(dtype).itemsize
    if len(raw) % size:
        raise ArgumentError(f"{what}: {len(raw)} bytes, not a whole number of {expect} ({size} bytes each)")
    return np.frombuffer(raw, dtype=dtype).copy()  # writable, as the trails of a run are


def read_compact(data, what: str, tokens: int | None = None) -> Trail:
    """The Trail of a compact record ({"ids": ..., "gaps": ...}); ArgumentError naming the field (what.ids,
    what.gaps) and what was expected when one is missing, of the wrong type or length, or not a gap."""
    if not isinstance(data, dict):
        raise ArgumentError(f"{what}: expected a mapping with 'ids' and 'gaps', got {type(data).__name__}")
    for key in ("ids", "gaps"):
        if key not in data:
            raise ArgumentError(f"{what}: {key!r} is missing (expected 'ids' and 'gaps')")
    unknown = sorted(set(data) - {"ids", "gaps"})
    if unknown:
        raise ArgumentError(f"{what}: unknown key {unknown[0]!r} (expected 'ids' and 'gaps')")
    ids = _array(data["ids"], "<i4", f"{what}.ids", "int32 token ids")
    gaps = _array(data["gaps"], "<f2", f"{what}.gaps", "float16 logit gaps")
    if tokens is not None and len(ids) != tokens:
        raise ArgumentError(f"{what}.ids: {len(ids)} ids, expected {tokens} (one per generated token)")
    if len(gaps) != len(ids):
        raise ArgumentError(f"{what}.gaps: {len(gaps)} gaps, expected {len(ids)} (one per id in {what}.ids)")
    if len(ids) and ids.min() < 0:
        raise ArgumentError(f"{what}.ids: token id {int(ids.min())} is negative")
    if not np.all(np.isfinite(gaps)) or (len(gaps) and gaps.min() < 0):
        bad = next(float(g) for g in gaps if not (math.isfinite(g) and g >= 0))
        raise ArgumentError(f"{what}.gaps: {bad} is not a gap (expected finite values >= 0)")
    return Trail(ids, gaps.astype(np.float32))


# ---- one side of a comparison -------------------------------------------------------------------------------


@dataclass
class Choice:
    """What a run chose at one token index: the id and the gap to the runner-up; their logits where known."""

    token: int
    gap: float
    logit: float | None = None
    runner_up: int | None = None
    runner_up_logit: float | None = None

    @property
    def near_tie(self) -> bool:
        return self.gap < NEAR_TIE_GAP

    def describe(self) -> str:
        if self.logit is None:
            return f"{self.token} (gap {self.gap:.4g} to the runner-up; logits not kept)"
        return (f"{self.token} (logit {self.logit:.4f}; runner-up {self.runner_up} at {self.runner_up_logit:.4f}; "
                f"gap {self.gap:.4g})")  # fmt: skip


@dataclass
class Outputs:
    """One run as a comparison sees it: a label ('run 12', 'recorded'), per prompt its Trail (None: not kept) and
    the settings that decide its ids (SETTINGS; a missing one is unknown)."""

    label: str
    trails: list[Trail | None]
    settings: dict[str, object] = field(default_factory=dict)

    @classmethod
    def of_result(cls, result, label: str = "this run", repeat: int | None = None) -> Outputs:
        """An engine.runs.run.RunResult: its first complete repeat (or the given one)."""
        trails = (
            result.trails[repeat]
            if repeat is not None
            else next((t for t in result.trails if len(t) == len(result.prompts)), [])
        )
        return cls(label, list(trails), settings_of(result))


def settings_of(run) -> dict[str, object]:
    """The SETTINGS of a RunResult or a RunRecord (device: the target's primary)."""
    device = getattr(run, "target_device", None) or getattr(run, "primary", None)
    values = {"placement": run.placement or None, "mode": run.mode, "precision": run.precision,
              "top_k": getattr(run, "top_k", None), "q": run.q, "device": device,
              "kernels": getattr(run, "kernels", None) or None}  # fmt: skip
    # q None: no draft; top_k None: the model's own; the others None: unknown
    return {k: v for k, v in values.items() if v is not None or k in ("q", "top_k")}


# ---- the diagnosis ------------------------------------------------------------------------------------------


@dataclass
class Divergence:
    """Where one prompt's outputs part: the first generated token index whose ids differ (None when neither side
    kept its ids, or when one is the other's prefix: then `note` says so) and each side's choice there."""

    prompt: int
    index: int | None
    a: Choice | None = None
    b: Choice | None = None
    note: str = ""

    @property
    def near_tie(self) -> bool | None:
        """Whether either side's top-2 gap there is under NEAR_TIE_GAP (None: not known)."""
        gaps = [c.gap for c in (self.a, self.b) if c is not None]
        return None if not gaps else min(gaps) < NEAR_TIE_GAP


@dataclass
class Diagnosis:
    """Why two runs' outputs differ: per differing prompt a Divergence; the settings that differ (name, a, b);
    whether those may change the output at all (expected); which side's logits were re-computed (rerun)."""

    a: str
    b: str
    divergences: list[Divergence]
    differences: list[tuple[str, object, object]]
    expected: bool
    rerun: str | None = None
    threshold: float = NEAR_TIE_GAP

    @property
    def first(self) -> Divergence | None:
        found = [d for d in self.divergences if d.index is not None]
        return min(found, key=lambda d: (d.index, d.prompt)) if found else (self.divergences or [None])[0]

    def verdict(self) -> str:
        d = self.first
        tie = None if d is None else d.near_tie
        if d is None:
            how = "no prompt's ids differ"
        elif tie is None:
            how = "the ids were not kept on both sides"
        elif tie:
            how = f"a near tie (top-2 gap under {self.threshold:g})"
        else:
            how = f"not a near tie (top-2 gap at least {self.threshold:g} on both sides)"
        names = " and ".join(n for n, _a, _b in self.differences)
        verb = "differs" if len(self.differences) == 1 else "differ"
        if not self.differences:
            why = "the runs' settings are the same: the output should not change (a bug, or a nondeterminism)"
        elif self.expected:
            why = f"the {names} {verb}"
        else:
            why = f"only the {names} {verb}, which must not change the output in reference mode: a bug to look into"
        return f"{how}; {why}"

    def summary(self) -> str:
        """One line: where the first divergence is, and the verdict."""
        d = self.first
        if d is None:
            return f"{self.b} and {self.a}: no prompt differs"
        where = f"prompt {d.prompt}, token {d.index}" if d.index is not None else f"prompt {d.prompt} ({d.note})"
        picks = ""
        if d.a is not None and d.b is not None:
            picks = f": {self.b} chose {d.b.token}, {self.a} {d.a.token}"
        return f"parts from {self.a} at {where}{picks}; {self.verdict()}"

    def lines(self) -> list[str]:
        """The whole diagnosis as text, one fact a line."""
        out = [f"{self.b} parts from {self.a}: {self.verdict()}"]
        for d in self.divergences:
            if d.index is None:
                out.append(f"  prompt {d.prompt}: {d.note}")
                continue
            tie = {True: "a near tie", False: "not a near tie", None: "gaps unknown"}[d.near_tie]
            out.append(f"  prompt {d.prompt}: first differing token {d.index} ({tie})")
            for label, c in ((self.a, d.a), (self.b, d.b)):
                if c is not None:
                    out.append(f"    {label}: {c.describe()}")
        for name, va, vb in self.differences:
            out.append(f"  {name}: {self.a} {_shown(va)}, {self.b} {_shown(vb)}")
        if self.rerun:
            out.append(f"  ({self.rerun})")
        out.append(f"  near tie: a top-2 logit gap under {self.threshold:g}")
        return out

    def to_dict(self) -> dict:
        first = self.first
        return {
            "a": self.a, "b": self.b, "summary": self.summary(), "verdict": self.verdict(), "lines": self.lines(),
            "near_tie_gap": self.threshold, "expected": self.expected, "rerun": self.rerun,
            "first": None if first is None else _divergence_dict(first),
            "divergences": [_divergence_dict(d) for d in self.divergences],
            "differences": [{"setting": n, "a": va, "b": vb} for n, va, vb in self.differences],
        }  # fmt: skip


def _shown(value) -> str:
    return "none" if value is None else str(value)


def _divergence_dict(d: Divergence) -> dict:
    return {"prompt": d.prompt, "index": d.index, "near_tie": d.near_tie, "note": d.note or None,
            "a": None if d.a is None else asdict(d.a), "b": None if d.b is None else asdict(d.b)}  # fmt: skip


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index at which two id sequences differ (the shorter one's length when one is the other's
    prefix); None when they are equal."""
    a, b = np.asarray(a), np.asarray(b)
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    if len(differ):
        return int(differ[0])
    return None if len(a) == len(b) else n


def differences(a: dict, b: dict) -> list[tuple[str, object, object]]:
    """The SETTINGS that differ between two runs (one unknown on either side is not counted)."""
    return [(k, a[k], b[k]) for k in SETTINGS if k in a and k in b and a[k] != b[k]]


def may_differ(diffs: list[tuple[str, object, object]], a: dict, b: dict) -> bool:
    """Whether these differences may legitimately change the output: a mode, precision, top_k, kernels or device,
    or the placement in owner_local mode (its sums follow the placement)."""
    names = {n for n, _a, _b in diffs}
    owner_local = "owner_local" in (a.get("mode"), b.get("mode"))
    return bool(names & set(OUTPUT_SETTINGS)) or (owner_local and "placement" in names)


def diagnose(a: Outputs, b: Outputs, prompts: Sequence[int] | None = None) -> Diagnosis:
    """Compare b with a (a: the reference side) over the prompts whose ids differ (or those given)."""
    n = max(len(a.trails), len(b.trails))
    out = []
    for p in range(n) if prompts is None else prompts:
        ta = a.trails[p] if p < len(a.trails) else None
        tb = b.trails[p] if p < len(b.trails) else None
        if ta is None or tb is None:
            missing = " and ".join(s.label for s, t in ((a, ta), (b, tb)) if t is None)
            out.append(Divergence(p, None, note=f"{missing} kept no ids for this prompt"))
            continue
        index = first_difference(ta.ids, tb.ids)
        if index is None:
            if prompts is not None:
                out.append(Divergence(p, None, note="the ids are the same"))
            continue
        if index >= min(len(ta), len(tb)):
            out.append(Divergence(p, None, note=f"the same first {index} ids, then one run stops"))
            continue
        out.append(Divergence(p, index, ta.choice(index), tb.choice(index)))
    diffs = differences(a.settings, b.settings)
    return Diagnosis(a.label, b.label, out, diffs, may_differ(diffs, a.settings, b.settings))


def replay_choice(model, prompt_ids: Sequence[int], ids: Sequence[int], index: int, mode: str = "reference",
                  precision: str = "f32", top_k: int | None = None) -> Choice:  # fmt: skip
    """The top-2 logits a greedy run in this mode, precision and experts per token (top_k; None: the checkpoint's
    own) had at token `index` of its output `ids`: the prompt prefilled, then ids[:index] fed one at a time as greedy
    decoding feeds them (on the model's current placement: the same logits as the run's where the outputs do not
    depend on the placement)."""
    ctx = model.context(len(prompt_ids) + index + 1)
    try:
        ctx.mode, ctx.precision = mode, precision
        k = top_k if top_k is not None else getattr(model, "native_top_k", None)
        if k and model.config.num_experts > 0 and ctx.top_k != k:  # a count below the loaded one: the context's
            ctx.top_k = k
        row = ctx.prefill(list(prompt_ids), all_rows=False)
        for token in ids[:index]:
            row = ctx.decode([int(token)])[0]
    finally:
        ctx.close()
    return Trail.of_rows(row).choice(0)


def replay_missing(diagnosis: Diagnosis, a: Outputs, b: Outputs, model, prompt_ids: Sequence[Sequence[int]]) -> None:
    """Fill in a's top-2 logits at each divergence where a kept only ids and gaps, by replaying a's ids on this model
    (replay_choice), when that gives a's own logits: a ran with the settings the model has now (b's, b having just
    run on it), the draft length q aside. Says so in diagnosis.rerun; nothing happens otherwise. Where the replay
    does not choose a's kept id, a's choice stays as kept and the divergence's note gives the replay's."""
    keys = [k for k in SETTINGS if k != "q"]
    if any(a.settings.get(k) != b.settings.get(k) for k in keys):
        return
    mode, precision = a.settings.get("mode", "reference"), a.settings.get("precision", "f32")
    top_k = a.settings.get("top_k")
    replayed = []
    for d in diagnosis.divergences:
        if d.index is None or d.a is None or d.a.logit is not None:
            continue
        choice = replay_choice(model, prompt_ids[d.prompt], a.trails[d.prompt].ids, d.index, mode, precision, top_k)
        if choice.token == d.a.token:
            d.a = choice
        else:  # this machine does not reproduce a: its choice stays as kept, the replay's is said
            d.note = (f"replayed here, {a.label}'s ids lead to {choice.describe()}, not to its kept "
                      f"{d.a.token}")  # fmt: skip
        replayed.append(d.prompt)
    if replayed:
        experts = f", top-{top_k} experts" if top_k is not None else ""
        diagnosis.rerun = (f"{a.label}'s top-2 logits re-computed here: its ids replayed as greedy decoding in "
                           f"{mode}, {precision}{experts} on the same placement")  # fmt: skip
