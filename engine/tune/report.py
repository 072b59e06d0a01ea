"""What `expertbench tune` reports: the front as data and as text, and the chosen point as a profile."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from ..placement.placement import mib
from ..placement.routing import RoutingStats
from .bench import TuneResult
from .search import Point

# ---- the report -----------------------------------------------------------------------------------------------


def _number(v):
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def _quality_dict(cost) -> dict | None:
    if cost is None:
        return None
    return {"mean_kl": cost.mean_kl, "max_kl": cost.max_kl, "agreement": cost.agreement,
            "first_divergence": cost.first_divergence, "positions": cost.positions,
            "summary": cost.summary()}  # fmt: skip


def point_dict(p: Point, fast: str, quality: Callable | None = None) -> dict:
    """quality(point) -> its measured engine.runs.quality.QualityCost or None (KLConstraint.cost)."""
    lo, hi = p.spread
    m = p.last
    return {
        "placement": p.candidate.placement.describe(),
        "q": p.candidate.q,
        "mode": p.candidate.mode,
        "origin": p.candidate.origin,
        "decode_tokens_per_second": _number(p.speed),
        "decode_tokens_per_second_min": _number(lo),
        "decode_tokens_per_second_max": _number(hi),
        "accept_rate": _number(m.accept_rate),
        "device_bytes": dict(p.candidate.device_bytes),
        "fast_bytes": p.fast_bytes(fast),
        "output_sha256": list(m.output_sha256),
        "same_as_reference": p.same_as_reference,
        "flagged": p.flagged,
        "quality": _quality_dict(None if quality is None else quality(p)),
        "predicted_tokens_per_second": _number(p.candidate.predicted),
        "tokens_per_prompt": m.tokens,
        "repeats": len(p.rates),  # the deepest rung's runs pooled
        "rung": p.rung,
        "excluded": p.excluded,
    }


def report(result: TuneResult, quality: Callable | None = None) -> dict:
    """One JSON-ready document: the front (bytes ascending), every point measured, the chosen one, the flagged
    (a reference-mode hash not one device's) and the excluded ones (with why), the references. quality: as for
    point_dict."""
    s = result.search
    chosen = s.chosen()

    def pd(p: Point) -> dict:
        return point_dict(p, s.fast, quality)

    return {
        "front": [pd(p) for p in s.front],
        "chosen": None if chosen is None else pd(chosen),
        "why_chosen": s.why_chosen(),  # why it is not the fastest the front lists (None when it is)
        "differing": [pd(p) for p in s.points if p.flagged],
        "excluded": [pd(p) for p in s.points if p.excluded is not None],
        "points": [pd(p) for p in sorted(s.points, key=lambda p: p.fast_bytes(s.fast))],
        "mode": ",".join(result.modes),  # the modes searched, as --modes takes them
        "modes": list(result.modes),
        "primary": result.primary,
        "fast": s.fast,
        "devices": result.devices,
        "budgets": result.budgets,
        "caps": result.caps,
        "reference": {"placement": f"*={result.primary}", "draft": None,
                      "output_sha256": {str(t): h for t, h in sorted(s.references.items())}},
        "rungs": [{"tokens_per_prompt": r.tokens, "repeats": r.repeats,
                   "planned": s.planned[i] if i < len(s.planned) else 0,
                   "measured": sum(1 for p in s.points if p.rung >= i)} for i, r in enumerate(s.rungs)],
        "candidates": result.candidates,
        "measurements": sum(len(p.measurements) for p in s.points),
        "seeded_by": result.calibrated,
        "routing": result.routing_source,
        "seconds": s.seconds,
        "cancelled": s.cancelled,
        "stopped": s.stopped or None,
        "notes": result.notes,
    }  # fmt: skip


def _elided(placement: str, width: int = 60) -> str:
    """A long placement's start (the JSON report has it whole)."""
    return placement if len(placement) <= width else placement[: width - 3] + "..."


def text(doc: dict, synthetic_note: str = "") -> str:
    """The report for a person: the front as a table, the chosen point, any hash that differs, the excluded points."""
    fast, modes = doc["fast"], doc.get("modes", ["reference"])
    mixed = modes != ["reference"]
    lines = [f"tuned      {doc['candidates']} candidates, {doc['measurements']} measurements in {doc['seconds']:.1f} s"
             f"{' (cancelled: partial)' if doc['cancelled'] else ''}{synthetic_note}",
             f"seeded by  {doc['seeded_by']}"]  # fmt: skip
    if doc["stopped"] and not doc["cancelled"]:
        lines.append(f"stopped    {doc['stopped']}")
    hashes = f"{'reference-mode hashes' if mixed else 'hashes'} against one device, {doc['primary']}"
    if "owner_local" in modes:
        hashes += "; owner_local's own hashes: 'own'"
    lines.append(f"front      decode tokens/s against experts on {fast} (mode {', '.join(modes)}; {hashes})")
    mode_col = f"  {'mode':11}" if mixed else ""
    lines.append(f"  {'tokens/s':>9}  {'min-max':>15}  {'on ' + fast:>12}  {'q':>2}{mode_col}  {'hash':8}  placement")
    for p in doc["front"]:
        lo, hi = p["decode_tokens_per_second_min"], p["decode_tokens_per_second_max"]
        spread = f"{lo:.1f}-{hi:.1f}" if lo is not None else "-"
        same = "same" if p["same_as_reference"] else "DIFFERS" if p["flagged"] else "own"
        q = "-" if p["q"] is None else p["q"]
        mode = f"  {p['mode']:11}" if mixed else ""
        lines.append(f"  {p['decode_tokens_per_second']:9.1f}  {spread:>15}  {mib(p['fast_bytes']):>12}  {q:>2}{mode}  "
                     f"{same:8}  {_elided(p['placement'])}  ({p['origin']})")  # fmt: skip
    c = doc["chosen"]
    if c is not None:
        mode = f", mode {c['mode']}" if mixed else ""
        lines.append(f"chosen     {c['decode_tokens_per_second']:.1f} tokens/s, q {c['q']}{mode}, {c['placement']} "
                     f"({c['origin']}; {c['repeats']} runs of {c['tokens_per_prompt']} tokens per prompt)")  # fmt: skip
        if doc.get("why_chosen"):
            lines.append(f"why        {doc['why_chosen']}")
    else:
        lines.append("chosen     none: no point was measured with the one-device hashes")
    for p in doc["differing"]:
        ref = doc["reference"]["output_sha256"].get(str(p["tokens_per_prompt"]), [])
        got, want = ", ".join(h[:12] for h in p["output_sha256"]), ", ".join(h[:12] for h in ref)
        lines.append(f"DIFFERS    q {p['q']}, {p['placement']}: output {got} against the one-device {want}")
    for p in doc.get("excluded", ()):
        lines.append(f"excluded   {p['mode']}, q {p['q']}, {_elided(p['placement'])}: {p['excluded']}")
    for note in doc["notes"]:
        lines.append(f"note       {note}")
    if doc.get("out"):
        lines.append(f"profile    {doc['out']}")
    return "\n".join(lines) + "\n"


# ---- the chosen point as a profile ----------------------------------------------------------------------------


def profile_for(point: Point, path, target_ref, draft_ref, primary: str, prompts: list | None,
                routing: RoutingStats | None = None):  # fmt: skip
    """The profile `expertbench regress` replays for a point: its placement, its q, its mode, the prompts and tokens
    it was measured with, the output hashes and acceptance it gave; the devices the placement names. target_ref and
    draft_ref: engine.profiles.profile.ModelRef (with fingerprints)."""
    from ..checkpoints.demo import DEMO_PROMPTS
    from ..profiles.expectations import min_accept_rate
    from ..profiles.profile import DeviceSpec, Expectations, PlacementSpec, Profile, RoutingSpec, RunSettings, loads

    counts: dict[str, int] = {}
    for name in {primary, *point.candidate.placement.devices()}:
        runtime, _, index = name.partition(":")
        counts[runtime] = max(counts.get(runtime, 0), int(index) + 1)
    devices = {rt: DeviceSpec(n) for rt, n in sorted(counts.items(), key=lambda kv: (kv[0] != "cpu", kv[0]))}
    m = point.last
    use_draft = point.candidate.q is not None and draft_ref is not None
    run = RunSettings(prompts=None if prompts is None or list(prompts) == list(DEMO_PROMPTS) else list(prompts),
                      tokens=m.tokens, repeats=max(m.repeats, 1), q=point.candidate.q if use_draft else None,
                      mode=point.candidate.mode)  # fmt: skip
    accept = min_accept_rate(m.accept_rate) if use_draft and m.accept_rate is not None else None
    profile = Profile(model=target_ref, draft=draft_ref if use_draft else None,
                      description=f"expertbench tune: {point.candidate.origin}, {point.speed:.1f} decode tokens/s "
                                  f"measured", devices=devices, primary=primary,
                      placement=PlacementSpec.from_placement(point.candidate.placement), run=run,
                      expectations=Expectations(output_sha256=list(m.output_sha256), min_accept_rate=accept),
                      routing=None if routing is None else RoutingSpec.inline(routing),
                      path=Path(path).expanduser().resolve())  # fmt: skip
    loads(profile.to_yaml(), profile.path)  # what is written is what a load accepts
    return profile
