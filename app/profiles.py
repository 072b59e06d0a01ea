"""The window's profiles: engine.profile files made from what the window holds, and read back into it.

A profile saved here names the loaded model (its folder or file, or the demo size with its files' format and
quantization) with its fingerprint, the draft when the run panel uses one, the devices the placement needs, the
placement, the run panel's settings and the routing statistics the heat map shows, so `expertbench regress`
replays it. How the engine holds the files (run.weights) is not set here: an opened profile's value is kept, and
none is written otherwise (regress then loads with auto).
Expectations come from what is known to hold:

* output hashes and acceptance from a complete run in the history with the same model, prompts, length, mode and
  precision (reference mode in f32 gives the same outputs on every placement, q8 on every placement of CPU devices;
  owner-local mode only on the same placement), or kept from the profile that was opened when its model, prompts,
  length, mode and precision are unchanged;
* a speed baseline is kept (its path made relative to the new folder); its minimum ratio only while the
  placement and devices are those it was recorded for.

Otherwise `expertbench regress --record FILE` records them. engine.profile does the writing and every check:
a profile is read back from its text before it is written, so the window never writes one regress refuses.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine.demo import DEMO_PROMPTS
from engine.placement import Placement
from engine.profile import (
    DeviceSpec,
    Expectations,
    ModelRef,
    PlacementSpec,
    Profile,
    ProfileError,
    RoutingSpec,
    loads,
)
from engine.profile import RunSettings as ProfileRun
from engine.routing import RoutingStats
from engine.run import outputs_any_placement

if TYPE_CHECKING:  # the state imports this module
    from .state import ModelSnapshot, RunRecord, RunSettings


def _ref(model: ModelSnapshot, folder: str, fingerprint: str | None) -> ModelRef:
    """The demo by its size (and, as GGUF files, their format and quantization: never a path into the cache), else
    the folder or file by its absolute path."""
    if model.demo is not None:
        if model.demo_format == "safetensors":
            return ModelRef(demo=model.demo, fingerprint=fingerprint)
        return ModelRef(demo=model.demo, format=model.demo_format, quant=model.demo_quant, fingerprint=fingerprint)
    return ModelRef(path=str(Path(folder).expanduser().resolve()), fingerprint=fingerprint)


def device_specs(placement: Placement, primary: str) -> dict[str, DeviceSpec]:
    """Per runtime, enough devices for every device the placement and the primary name (cpu first)."""
    counts: dict[str, int] = {}
    for name in {primary, *placement.devices()}:
        runtime, _, index = name.partition(":")
        counts[runtime] = max(counts.get(runtime, 0), int(index) + 1)
    return {rt: DeviceSpec(n) for rt, n in sorted(counts.items(), key=lambda kv: (kv[0] != "cpu", kv[0]))}


def _run_keys(run: ProfileRun) -> tuple:
    """What decides the output ids: prompts, length, reduction mode, precision."""
    r = run.resolved()
    prompts = [list(p) if isinstance(p, list) else p for p in r["prompts"]]
    return prompts, r["tokens_per_prompt"], r["mode"], r["precision"]


def _matching_run(
    history: list[RunRecord], model: ModelSnapshot, settings: RunSettings, placement: Placement
) -> RunRecord | None:
    """The latest complete run whose output hashes this profile can expect."""
    for record in reversed(history):
        s = record.settings
        if s is None or not record.output_sha256 or record.target_path != model.target_path:
            continue
        if (s.prompts, s.tokens, s.mode, s.precision) != (list(settings.prompts), settings.tokens, settings.mode,
                                                          settings.precision):  # fmt: skip
            continue
        if record.placement != placement.describe():
            used = [rule.rpartition("=")[2].strip() for rule in record.placement.split(";")]  # its text form
            if not outputs_any_placement(s.mode, s.precision, [model.primary, *placement.devices(), *used]):
                continue
        return record
    return None


def build(path: str | os.PathLike, model: ModelSnapshot, placement: Placement, settings: RunSettings | None,
          routing: RoutingStats | None = None, history: Sequence[RunRecord] = (), base: Profile | None = None
          ) -> Profile:  # fmt: skip
    """The profile to save at `path`: see the module docstring. Raises ProfileError if engine.profile would
    not read it back."""
    path = Path(path).expanduser().resolve()
    use_draft = model.draft_path is not None and (settings is None or settings.use_draft)
    target = _ref(model, model.target_path, model.fingerprint)
    draft = _ref(model, model.draft_path, model.draft_fingerprint) if use_draft else None
    weights = None if base is None else base.run.weights  # the window cannot set it: an opened profile's stays
    run = ProfileRun(weights=weights)
    if settings is not None:
        prompts = None if list(settings.prompts) == list(DEMO_PROMPTS) else list(settings.prompts)
        run = ProfileRun(prompts=prompts, tokens=settings.tokens, repeats=settings.repeats,
                         q=settings.q if use_draft else None, mode=settings.mode, weights=weights,
                         precision=settings.precision)  # fmt: skip
    spec = PlacementSpec.from_placement(placement)
    devices = device_specs(placement, model.primary)
    profile = Profile(model=target, draft=draft, devices=devices, primary=model.primary, placement=spec, run=run,
                      path=path)  # fmt: skip
    if base is not None:
        profile.description = base.description
    if routing is not None:
        profile.routing = RoutingSpec.inline(routing)
    profile.expectations = _expectations(profile, base, model, placement, settings, history)
    checked = loads(profile.to_yaml(), path)  # the window writes nothing regress would refuse
    checked.check_model(model.config)
    return profile


def _expectations(profile: Profile, base: Profile | None, model: ModelSnapshot, placement: Placement,
                  settings: RunSettings | None, history) -> Expectations:  # fmt: skip
    e = Expectations()
    use_draft = profile.draft is not None
    record = _matching_run(list(history), model, settings, placement) if settings is not None else None
    if record is not None:
        e.output_sha256 = list(record.output_sha256)
        same_draft = use_draft and record.draft_path == model.draft_path and record.q == profile.run.q
        if same_draft and record.accept_rate is not None:
            e.min_accept_rate = math.floor(record.accept_rate * 1000) / 1000  # as `regress --record` writes it
    elif base is not None and base.expectations.output_sha256 is not None:
        same_model = base.model.fingerprint is not None and base.model.fingerprint == profile.model.fingerprint
        same_run = _run_keys(base.run) == _run_keys(profile.run)
        run = profile.run.resolved()
        devices = [*profile.device_names(), *base.device_names()]
        any_placement = outputs_any_placement(run["mode"], run["precision"], devices)
        same_outputs = same_model and same_run and (any_placement or base.placement == profile.placement)
        if same_outputs:
            e.output_sha256 = list(base.expectations.output_sha256)
            same_draft = base.draft is not None and use_draft and base.draft.fingerprint == profile.draft.fingerprint
            if same_draft and base.run.resolved()["q"] == profile.run.resolved()["q"]:
                e.min_accept_rate = base.expectations.min_accept_rate
    if base is not None and base.expectations.baseline is not None:
        baseline = base.resolve(base.expectations.baseline).resolve()
        if baseline != profile.path:
            e.baseline = os.path.relpath(baseline, profile.path.parent)
            if base.placement == profile.placement and base.device_specs == profile.device_specs:
                e.min_speed_ratio = base.expectations.min_speed_ratio
    return e


def placement_for(profile: Profile, model: ModelSnapshot) -> Placement:
    """The profile's placement for the loaded model; ProfileError when it was made for another model (its
    fingerprint) or does not fit this one (layer and expert ranges, routing shape)."""
    ref = profile.model
    if ref.fingerprint is not None and model.fingerprint is not None and ref.fingerprint != model.fingerprint:
        raise ProfileError(f"{profile.where('model', 'fingerprint')}: model.fingerprint: the profile was recorded on "
                           f"another model ({ref.fingerprint[:19]}...); the loaded model '{model.target_path}' has "
                           f"{model.fingerprint[:19]}... (open the profile's model first)")  # fmt: skip
    return profile.placement_for(model.config)
