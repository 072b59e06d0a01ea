"""Headless regression: replay profiles, check what they expect, report (`expertbench regress PROFILE...`).

For every profile named (and every baseline profile they name, measured once, first):

1. Everything is read and checked before anything runs: the profile (file:line errors), the model and draft
   folders, their fingerprints against the recorded ones, layer and expert ranges. Any of that is bad input.
2. Each profile's runs (its devices, placement, draft, prompts, tokens, repeats, q, mode, precision) are decoded:
   the recorded hashes are only ever compared with runs of the profile's own mode and precision.
3. Checks: every repeat produced the same output hashes; they equal the recorded ones; the draft acceptance is
   at least the minimum; decode tokens/s over the baseline's, measured in this same invocation (never an
   absolute time), is at least the minimum ratio.

Exit code: 0 every check held, 1 a regression, 2 bad input (a profile, a model, a device this machine lacks).
`--record` runs the same way and writes the expectations into each named profile instead of checking them:
the hashes, the acceptance (rounded down to 0.001), the speed ratio less --speed-slack, the fingerprints when
missing, and the routing statistics of the run. Nothing here imports Qt.
"""

from __future__ import annotations

import math
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from ..checkpoints.checkpoint import read_config
from ..core.errors import EngineError
from ..runs.diverge import Diagnosis, Outputs, diagnose
from ..runs.history import combined_hash
from ..session import SELF_DRAFT, open_pair
from .expectations import min_accept_rate, min_speed_ratio
from .profile import Profile, ProfileError, RoutingSpec, fingerprint, load

DEFAULT_SPEED_SLACK = 0.25


@dataclass
class Measurement:
    """What one profile's runs produced."""

    decode_tokens_per_second: float
    repeat_hashes: list[list[str]]  # per complete repeat, one hash per prompt
    accept_rate: float | None = None
    routing: object | None = None  # RoutingStats of the target over the measured runs
    kernels: str = ""
    result: dict | None = None  # RunResult.to_dict()
    outputs: Outputs | None = None  # the first complete repeat's ids and top-2 logits, and the run's settings
    repeats_diagnosis: Diagnosis | None = None  # where the repeats part, when they disagree


@dataclass
class Check:
    name: str
    status: str  # "pass", "fail", "skip", "recorded"
    message: str = ""


@dataclass
class Outcome:
    path: Path
    listed: bool  # named on the command line (baselines pulled in are measured, not checked)
    profile: Profile | None = None
    measurement: Measurement | None = None
    checks: list[Check] = field(default_factory=list)
    error: str | None = None
    baseline: str | None = None
    speed_ratio: float | None = None
    recorded: bool = False
    seconds: float = 0.0
    diagnosis: Diagnosis | None = None  # why the output hashes differ from the recorded ones (or between repeats)

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def status(self) -> str:
        if self.error is not None:
            return "error"
        return "fail" if any(c.status == "fail" for c in self.checks) else "pass"


@dataclass
class Report:
    outcomes: list[Outcome]
    record: bool = False

    @property
    def exit_code(self) -> int:
        if any(o.status == "error" for o in self.outcomes):
            return 2
        return 1 if any(o.status == "fail" for o in self.outcomes) else 0

    def to_dict(self) -> dict:
        profiles = []
        for o in self.outcomes:
            m = o.measurement
            e = o.profile.expectations if o.profile is not None else None
            profiles.append({
                "profile": str(o.path), "name": o.name, "listed": o.listed, "status": o.status, "error": o.error,
                "decode_tokens_per_second": _finite(m.decode_tokens_per_second) if m else None,
                "baseline": o.baseline, "speed_ratio": _finite(o.speed_ratio),
                "min_speed_ratio": e.min_speed_ratio if e else None,
                "accept_rate": m.accept_rate if m else None, "min_accept_rate": e.min_accept_rate if e else None,
                "output_sha256": m.repeat_hashes[0] if m and m.repeat_hashes else None,
                # the one hash over a run's prompts, as the window's history shows it (engine.runs.history)
                "output_hash": combined_hash(m.repeat_hashes[0]) if m and m.repeat_hashes else None,
                "expected_output_hash": combined_hash(e.output_sha256) if e and e.output_sha256 else None,
                "repeat_output_sha256": m.repeat_hashes if m else None,
                "expected_output_sha256": e.output_sha256 if e else None,
                "kernels": m.kernels if m else None, "recorded": o.recorded, "seconds": o.seconds,
                "diagnosis": o.diagnosis.to_dict() if o.diagnosis is not None else None,
                "checks": [c.__dict__ for c in o.checks], "run": m.result if m else None,
            })  # fmt: skip
        return {"exit_code": self.exit_code, "record": self.record, "profiles": profiles}

    def to_junit(self) -> str:
        """JUnit XML: one test suite, one test case per profile and check (an error is a 'load' case)."""
        cases = []
        for o in self.outcomes:
            classname = f"expertbench.regress.{o.name}"
            if o.error is not None:
                cases.append((classname, "load", o.seconds, "error", o.error))
                continue
            for c in o.checks:
                message = c.message
                if o.diagnosis is not None and c.status == "fail" and c.name in ("repeats agree", "output hash"):
                    message += "\n" + "\n".join(o.diagnosis.lines())
                cases.append((classname, c.name, o.seconds / max(len(o.checks), 1), c.status, message))
        suites = ET.Element("testsuites", name="expertbench regress")
        counts = {k: str(sum(1 for c in cases if c[3] == k)) for k in ("fail", "error", "skip")}
        suite = ET.SubElement(suites, "testsuite", name="expertbench regress", tests=str(len(cases)),
                              failures=counts["fail"], errors=counts["error"], skipped=counts["skip"],
                              time=f"{sum(o.seconds for o in self.outcomes):.3f}")  # fmt: skip
        for classname, name, seconds, status, message in cases:
            case = ET.SubElement(suite, "testcase", classname=classname, name=name, time=f"{seconds:.3f}")
            if status in ("fail", "error", "skip"):
                tag = {"fail": "failure", "error": "error", "skip": "skipped"}[status]
                ET.SubElement(case, tag, message=message.splitlines()[0] if message else status).text = message
            elif message:
                ET.SubElement(case, "system-out").text = message
        ET.indent(suites)
        return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"

    def table(self) -> str:
        rows = [("profile", "result", "decode tok/s", "vs baseline", "accept", "output hashes")]
        for o in self.outcomes:
            m = o.measurement
            result = {"pass": "recorded" if o.recorded else "ok", "fail": "FAIL", "error": "ERROR"}[o.status]
            if not o.listed and o.status == "pass":
                result = "baseline"
            speed = f"{m.decode_tokens_per_second:.1f}" if m else "-"
            ratio = "-"
            if o.speed_ratio is not None:
                e = o.profile.expectations
                ratio = f"{o.speed_ratio:.2f}" + (f" >= {e.min_speed_ratio:.2f}" if e.min_speed_ratio and
                                                  not o.recorded else "") + f" ({Path(o.baseline).stem})"  # fmt: skip
            accept = "-"
            if m and m.accept_rate is not None:
                e = o.profile.expectations
                accept = f"{100 * m.accept_rate:.1f} %" + (
                    f" >= {100 * e.min_accept_rate:.1f}" if e.min_accept_rate is not None and not o.recorded else ""
                )
            hashes = "-"
            if m:
                held = "held" if _stable(m) else "CHANGED between repeats"
                n = len(m.repeat_hashes[0]) if m.repeat_hashes else 0
                expected = o.profile.expectations.output_sha256
                if o.recorded or not o.listed or expected is None:
                    hashes = f"{n} {held} over {len(m.repeat_hashes)} repeats"
                else:
                    same = sum(a == b for a, b in zip(m.repeat_hashes[0], expected, strict=False))
                    hashes = f"{n} {held}, {same}/{len(expected)} as recorded"
            rows.append((o.name, result, speed, ratio, accept, hashes))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) if i != 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                 .rstrip() for r in rows]  # fmt: skip
        details = []
        for o in self.outcomes:
            if o.error is not None:
                details.append(f"{o.name}: error: {o.error}")
            details += [f"{o.name}: {c.name}: {c.message}" for c in o.checks if c.status == "fail"]
            if o.diagnosis is not None:
                details += [f"{o.name}: {line}" for line in o.diagnosis.lines()]
        return "\n".join(lines + ([""] + details if details else [])) + "\n"


def _finite(v):
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def _stable(m: Measurement) -> bool:
    return bool(m.repeat_hashes) and all(h == m.repeat_hashes[0] for h in m.repeat_hashes)


# ---- measuring one profile ----------------------------------------------------------------------------------


def make_engine(profile: Profile, portable: bool = False):
    """An Engine with the devices the profile asks for (engine.devices); ProfileError at the file:line of the entry
    this machine cannot provide."""
    from .devices import engine_for_profile

    return engine_for_profile(profile, portable)


def measure_profile(profile: Profile, portable: bool = False, check_weights: bool = True) -> Measurement:
    """Decode the profile's runs once (after a short warm-up) and collect what the checks need."""
    from ..placement.routing import RoutingStats
    from ..runs.run import DecodeRun

    settings = profile.run.resolved()
    with make_engine(profile, portable) as engine:
        draft_ref = profile.draft
        draft = None if draft_ref is None else SELF_DRAFT if draft_ref.own else profile.model_folder(draft_ref, "draft")
        pair = open_pair(engine, profile.model_folder(), draft,
                         device=profile.primary_device, draft_device=None if draft_ref is None else draft_ref.device,
                         weights=settings["weights"], check_weights=check_weights)  # fmt: skip
        target, draft = pair.target, pair.draft
        placement = profile.placement_for(target.config) if target.config.num_experts > 0 else None
        common = {"q": settings["q"], "mode": settings["mode"], "precision": settings["precision"],
                  "kv": settings["kv"], "placement": placement}  # fmt: skip
        DecodeRun(
            target,
            draft,
            prompts=settings["prompts"][:1],
            tokens_per_prompt=min(8, settings["tokens_per_prompt"]),
            repeats=1,
            **common,
        ).run()  # fmt: skip  (warm-up: page cache, arenas, uploads)
        if target.config.num_experts > 0:
            target.reset_routing()
        result = DecodeRun(target, draft, prompts=settings["prompts"], tokens_per_prompt=settings["tokens_per_prompt"],
                           repeats=settings["repeats"], **common).run()  # fmt: skip
        routing = RoutingStats.from_model(target) if target.config.num_experts > 0 else None
        kernels = engine.runtimes[0].kernel_variant
    hashes = [r.output_sha256 for r in result.repeat_results if r.complete]
    return Measurement(result.decode_tokens_per_second, hashes, result.accept_rate, routing, kernels, result.to_dict(),
                       Outputs.of_result(result, "the replay"), result.repeats_diagnosis())  # fmt: skip


# ---- the whole invocation -----------------------------------------------------------------------------------


def _tell(message: str) -> None:
    if sys.stderr.isatty():
        print(f"expertbench: {message}", file=sys.stderr, flush=True)


def _check_models(profile: Profile, record: bool) -> None:
    """Folders exist, fingerprints match (or are missing and about to be recorded), ranges fit the model."""
    for role, ref in (("model", profile.model), ("draft", profile.draft)):
        if ref is None or ref.own:  # the model's own module: its files and fingerprint are the model's
            continue
        folder = profile.model_folder(ref, "target" if role == "model" else "draft")
        try:
            found = fingerprint(folder)
            config = read_config(folder)
        except EngineError as exc:
            raise ProfileError(profile.error_at((role,), f"{role}: {exc}")) from None
        if ref.fingerprint is None and not record:
            raise ProfileError(f"{profile.where(role)}: {role}: no fingerprint recorded: run 'expertbench regress "
                               f"--record {profile.path}' once on the right model")  # fmt: skip
        if ref.fingerprint is not None and ref.fingerprint != found:
            raise ProfileError(f"{profile.where(role, 'fingerprint')}: {role}.fingerprint: the profile was recorded "
                               f"on another model ({ref.fingerprint[:19]}...); '{folder}' has {found[:19]}... "
                               "(remove the fingerprint and --record again if the change is intended)")  # fmt: skip
        if role == "model":
            profile.check_model(config)


def run(paths: list[str], record: bool = False, speed_slack: float = DEFAULT_SPEED_SLACK, portable: bool = False,
        measure=None, check_weights: bool = True) -> Report:  # fmt: skip
    """Load, check, measure and judge the profiles; measure(profile, portable=..., check_weights=...) -> Measurement
    (check_weights: the models' weights checked at load, engine.model.Model)."""
    measure = measure or measure_profile
    outcomes: dict[Path, Outcome] = {}
    order: list[Path] = []

    named = {Path(p).resolve() for p in paths}

    def add(path: Path) -> Outcome:
        key = path.resolve()
        if key in outcomes:
            return outcomes[key]
        listed = key in named  # a baseline's own baseline is measured too, but only named profiles are checked
        o = outcomes[key] = Outcome(path, listed)
        order.append(key)
        try:
            o.profile = load(path)
            _check_models(o.profile, record and listed)
            if listed and not record and o.profile.expectations.output_sha256 is None:
                raise ProfileError(f"{o.profile.where('expectations')}: no recorded output hashes: run "
                                   f"'expertbench regress --record {path}' first")  # fmt: skip
        except EngineError as exc:
            o.error = str(exc)
            return o
        base = o.profile.expectations.baseline
        if base is not None:
            base_path = o.profile.resolve(base)
            o.baseline = str(base_path)
            b = add(base_path)
            if b.error is not None and not b.listed:
                o.error = f"{o.profile.where('expectations', 'speed', 'baseline')}: baseline: {b.error}"
        return o

    for p in paths:
        add(Path(p))
    report = Report([outcomes[k] for k in order], record)
    if any(o.error for o in report.outcomes):
        return report  # bad input: nothing runs

    # Baselines before the profiles that compare against them (each measured once).
    def depth(o: Outcome, seen=()) -> int:
        if o.baseline is None or o.path.resolve() in seen:
            return 0
        return 1 + depth(outcomes[Path(o.baseline).resolve()], (*seen, o.path.resolve()))

    report.outcomes.sort(key=lambda o: depth(o))
    for i, o in enumerate(report.outcomes):
        _tell(f"running {o.name} ({i + 1}/{len(report.outcomes)})...")
        t0 = time.perf_counter()
        try:
            o.measurement = measure(o.profile, portable=portable, check_weights=check_weights)
        except EngineError as exc:
            o.error = o.profile.error_at(("run",), str(exc))
        o.seconds = time.perf_counter() - t0
    for o in report.outcomes:
        if o.error is None:
            _judge(o, outcomes, record, speed_slack)
    return report


def _judge(o: Outcome, outcomes: dict[Path, Outcome], record: bool, slack: float) -> None:
    m, p = o.measurement, o.profile
    e = p.expectations
    if o.baseline is not None:
        b = outcomes[Path(o.baseline).resolve()]
        if b.measurement is None:
            o.error = f"{p.where('expectations', 'speed', 'baseline')}: baseline {b.name} was not measured: {b.error}"
            return
        base_speed = b.measurement.decode_tokens_per_second
        if math.isfinite(base_speed) and base_speed > 0:
            o.speed_ratio = m.decode_tokens_per_second / base_speed
    if not o.listed:
        return
    stable = _stable(m)
    if not stable and m.repeats_diagnosis is not None:
        o.diagnosis = m.repeats_diagnosis
    o.checks.append(
        Check(
            "repeats agree",
            "pass" if stable else "fail",
            f"{len(m.repeat_hashes)} repeats gave the same output hashes"
            if stable
            else "the output hashes changed between repeats: "
            + "; ".join(f"repeat {i}: {', '.join(h[:12] for h in hs)}" for i, hs in enumerate(m.repeat_hashes))
            + (f"\n{o.diagnosis.summary()}" if o.diagnosis is not None else ""),
        )
    )
    if record:
        if stable:
            _record(o, slack)
        return
    got = m.repeat_hashes[0] if m.repeat_hashes else []
    differ = [(i, a, b) for i, (a, b) in enumerate(zip(got, e.output_sha256, strict=False)) if a != b]
    if len(got) != len(e.output_sha256):
        o.checks.append(Check("output hash", "fail", f"{len(got)} prompts finished, {len(e.output_sha256)} recorded"))
    elif differ:
        run = p.run.resolved()
        if o.diagnosis is None:
            o.diagnosis = recorded_diagnosis(p, m, [i for i, _a, _b in differ])
        o.checks.append(Check("output hash", "fail", "; ".join(f"prompt {i} gave {a[:16]}, recorded {b[:16]}"
                                                               for i, a, b in differ)
                              + f" (mode {run['mode']}, precision {run['precision']}"
                              + ("" if run["kv"] == "f32" else f", {run['kv']} KV cache") + ")"
                              + (f"\n{o.diagnosis.summary()}" if o.diagnosis else "")))  # fmt: skip
    else:
        o.checks.append(Check("output hash", "pass", f"{len(got)} prompts as recorded"))
    if e.min_accept_rate is not None:
        ok = m.accept_rate is not None and m.accept_rate >= e.min_accept_rate - 1e-12
        got_rate = "none" if m.accept_rate is None else f"{m.accept_rate:.4f}"
        o.checks.append(Check("acceptance", "pass" if ok else "fail", f"{got_rate} (minimum {e.min_accept_rate})"))
    else:
        o.checks.append(Check("acceptance", "skip", "no minimum recorded"))
    if e.min_speed_ratio is not None and o.baseline is not None:
        ok = o.speed_ratio is not None and o.speed_ratio >= e.min_speed_ratio
        shown = "not measured" if o.speed_ratio is None else f"{o.speed_ratio:.3f}"
        o.checks.append(Check("speed", "pass" if ok else "fail",
                              f"{m.decode_tokens_per_second:.1f} tokens/s, {shown} x {Path(o.baseline).stem} "
                              f"(minimum {e.min_speed_ratio})"))  # fmt: skip
    else:
        o.checks.append(Check("speed", "skip", "no baseline and minimum ratio"))


def recorded_diagnosis(p: Profile, m: Measurement, prompts: list[int]) -> Diagnosis | None:
    """Where the replay parts from the profile's recorded outputs (expectations.outputs: ids and gaps, no logits, and
    the settings the recorded run had) on these prompts."""
    if m.outputs is None:
        return None
    e = p.expectations
    recorded = Outputs("the recorded run", list(e.outputs or []), dict(e.outputs_settings))
    return diagnose(recorded, m.outputs, prompts)


def _record(o: Outcome, slack: float) -> None:
    m, p = o.measurement, o.profile
    e = p.expectations
    e.output_sha256 = list(m.repeat_hashes[0])
    if m.outputs is not None and len(m.outputs.trails) == len(e.output_sha256):
        e.outputs = [t.stored() for t in m.outputs.trails]
        e.outputs_settings = dict(m.outputs.settings)
    if p.draft is not None and m.accept_rate is not None:
        e.min_accept_rate = min_accept_rate(m.accept_rate)
    if o.baseline is not None and o.speed_ratio is not None:
        e.min_speed_ratio = min_speed_ratio(o.speed_ratio, slack)
    for role, ref in (("model", p.model), ("draft", p.draft)):
        if ref is not None and ref.fingerprint is None and not ref.own:  # (the model's own module: the model's)
            ref.fingerprint = fingerprint(p.model_folder(ref, "target" if role == "model" else "draft"))
    if m.routing is not None and (p.routing is None or p.routing.hotness_csv is None):
        p.routing = RoutingSpec.inline(m.routing)
    p.save()
    o.recorded = True
    o.checks.append(Check("recorded", "recorded", f"wrote {len(e.output_sha256)} output hashes"
                          + (f", min_accept_rate {e.min_accept_rate}" if e.min_accept_rate is not None else "")
                          + (f", min_ratio {e.min_speed_ratio}" if o.baseline is not None else "")
                          + f" into {p.path}"))  # fmt: skip
