"""What a profile may expect of a replay, inferred from the run history (engine.runs.history) or the profile it was
made from: one place, so that the window's saved profiles and `regress --record` round the same way."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from ..runs.history import RunRecord, RunSettings, matching_run, outputs_key
from .profile import Expectations, Profile


def min_accept_rate(rate: float) -> float:
    """The acceptance a replay must reach: the measured rate rounded down to 0.001."""
    return math.floor(rate * 1000) / 1000


def min_speed_ratio(ratio: float, slack: float) -> float:
    """The speed ratio over the baseline a replay must reach: the measured one less the slack, rounded down to
    0.01, at least 0.01."""
    return max(0.01, math.floor(ratio * (1 - slack) * 100) / 100)


def _profile_key(profile: Profile, devices: list[str]) -> tuple:
    """A profile's outputs key: its model's fingerprint, its run settings, its placement as rules."""
    r, spec = profile.run.resolved(), profile.placement
    rules = [f"*={spec.default}"] if spec.default else []
    rules += [f"{lo}-{hi}={device}" for lo, hi, device in spec.layers]
    rules += [f"{layer}.{lo}-{hi}={device}" for layer, lo, hi, device in spec.experts]
    return outputs_key(profile.model.fingerprint or "", r["prompts"], r["tokens_per_prompt"], r["precision"],
                       r["mode"], "; ".join(rules), [profile.primary_device, *devices], kv=r["kv"])  # fmt: skip


def expectations_for(profile: Profile, base: Profile | None, history: Sequence[RunRecord], target_path: str,
                     draft_path: str | None, settings: RunSettings | None, placement: str,
                     primary: str) -> Expectations:  # fmt: skip
    """What a profile made from the window may expect of a replay:

    * output hashes (and the outputs they were diagnosed with: ids and top-2 gaps) and acceptance from the latest
      complete run in the history with the same outputs key (matching_run), the acceptance only when it used the
      profile's draft and q;
    * else those of the profile that was opened (base) when it was recorded on the same model and its outputs key
      is the profile's (same prompts, length, mode, precision; the same placement where the outputs depend on it);
    * a speed baseline is kept (its path made relative to the new folder); its minimum ratio only while the
      placement and devices are those it was recorded for."""
    e = Expectations()
    use_draft = profile.draft is not None
    record = matching_run(history, target_path, settings, placement, primary) if settings is not None else None
    if record is not None:
        e.output_sha256 = list(record.output_sha256)
        if record.outputs and len(record.outputs) == len(e.output_sha256):  # what a changed hash is diagnosed with
            outputs = record.as_outputs()
            e.outputs, e.outputs_settings = outputs.trails, dict(outputs.settings)
        same_draft = use_draft and record.draft_path == draft_path and record.q == profile.run.q
        if same_draft and record.accept_rate is not None:
            e.min_accept_rate = min_accept_rate(record.accept_rate)
    elif base is not None and base.expectations.output_sha256 is not None:
        same_model = base.model.fingerprint is not None and base.model.fingerprint == profile.model.fingerprint
        devices = [*profile.device_names(), *base.device_names()]
        same_outputs = same_model and _profile_key(base, devices) == _profile_key(profile, devices)
        if same_outputs:
            e.output_sha256 = list(base.expectations.output_sha256)
            e.outputs, e.outputs_settings = base.expectations.outputs, dict(base.expectations.outputs_settings)
            same_draft = (base.draft is not None and use_draft and base.draft.own == profile.draft.own
                          and base.draft.fingerprint == profile.draft.fingerprint)  # fmt: skip
            if same_draft and base.run.resolved()["q"] == profile.run.resolved()["q"]:
                e.min_accept_rate = base.expectations.min_accept_rate
    if base is not None and base.expectations.baseline is not None:
        baseline = base.resolve(base.expectations.baseline).resolve()
        if baseline != profile.path:
            e.baseline = os.path.relpath(baseline, profile.path.parent)
            if base.placement == profile.placement and base.device_specs == profile.device_specs:
                e.min_speed_ratio = base.expectations.min_speed_ratio
    return e
