"""The window's profiles: engine.profiles.profile files made from what the window holds, and read back into it.

A profile saved here names the loaded model (its folder or file, or the demo size with its files' format and
quantization) with its fingerprint, the draft when the run panel uses one, the devices the placement needs, the
placement, the run panel's settings and the routing statistics the heat map shows, so `expertbench regress`
replays it. How the engine holds the files (run.weights) is not set here: an opened profile's value is kept, and
none is written otherwise (regress then loads with auto).
Expectations come from what is known to hold (engine.profiles.expectations.expectations_for, the one place that
infers them):
output hashes and acceptance from a complete run in the history with the same outputs key
(engine.runs.history.outputs_key: the same model, prompts, length, precision, mode, and placement where the outputs
depend on it), or kept from the profile that was opened when its key is unchanged; a speed baseline is kept, its minimum
ratio only while the placement and devices are those it was recorded for.

Otherwise `expertbench regress --record FILE` records them. engine.profiles.profile does the writing and every check:
a profile is read back from its text before it is written, so the window never writes one regress refuses.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine.checkpoints.demo import DEMO_PROMPTS
from engine.placement.placement import Placement
from engine.placement.routing import RoutingStats
from engine.profiles.expectations import expectations_for
from engine.profiles.profile import (
    DeviceSpec,
    ModelRef,
    PlacementSpec,
    Profile,
    ProfileError,
    RoutingSpec,
    loads,
)
from engine.profiles.profile import RunSettings as ProfileRun
from engine.session import SELF_DRAFT

if TYPE_CHECKING:  # the state imports this module
    from engine.runs.history import RunRecord, RunSettings

    from .state import ModelSnapshot


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


def build(path: str | os.PathLike, model: ModelSnapshot, placement: Placement, settings: RunSettings | None,
          routing: RoutingStats | None = None, history: Sequence[RunRecord] = (), base: Profile | None = None
          ) -> Profile:  # fmt: skip
    """The profile to save at `path`: see the module docstring. Raises ProfileError if engine.profiles.profile would
    not read it back."""
    path = Path(path).expanduser().resolve()
    use_draft = model.draft_path is not None and (settings is None or settings.use_draft)
    target = _ref(model, model.target_path, model.fingerprint)
    draft = None
    if use_draft:  # the model's own MTP layer: `self: true`, its files the model's
        own = model.draft_path == SELF_DRAFT
        draft = ModelRef(own=True) if own else _ref(model, model.draft_path, model.draft_fingerprint)
    weights = None if base is None else base.run.weights  # the window cannot set it: an opened profile's stays
    run = ProfileRun(weights=weights)
    if settings is not None:
        prompts = None if list(settings.prompts) == list(DEMO_PROMPTS) else list(settings.prompts)
        run = ProfileRun(prompts=prompts, tokens=settings.tokens, repeats=settings.repeats,
                         q=settings.q if use_draft else None, mode=settings.mode, weights=weights,
                         precision=settings.precision, kv=None if settings.kv == "f32" else settings.kv)  # fmt: skip
    spec = PlacementSpec.from_placement(placement)
    devices = device_specs(placement, model.primary)
    profile = Profile(model=target, draft=draft, devices=devices, primary=model.primary, placement=spec, run=run,
                      path=path)  # fmt: skip
    if base is not None:
        profile.description = base.description
    if routing is not None:
        profile.routing = RoutingSpec.inline(routing)
    profile.expectations = expectations_for(profile, base, list(history), model.target_path,
                                            model.draft_path if use_draft else None, settings, placement.describe(),
                                            model.primary)  # fmt: skip
    checked = loads(profile.to_yaml(), path)  # the window writes nothing regress would refuse
    checked.check_model(model.config)
    return profile


def placement_for(profile: Profile, model: ModelSnapshot) -> Placement:
    """The profile's placement for the loaded model; ProfileError when it was made for another model (its
    fingerprint) or does not fit this one (layer and expert ranges, routing shape)."""
    ref = profile.model
    if ref.fingerprint is not None and model.fingerprint is not None and ref.fingerprint != model.fingerprint:
        raise ProfileError(f"{profile.where('model', 'fingerprint')}: model.fingerprint: the profile was recorded on "
                           f"another model ({ref.fingerprint[:19]}...); the loaded model '{model.target_path}' has "
                           f"{model.fingerprint[:19]}... (open the profile's model first)")  # fmt: skip
    return profile.placement_for(model.config)
