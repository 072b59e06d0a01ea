"""A profile's devices on this machine: the Engine its `devices:` section asks for, or a ProfileError at the file:line
of the entry this machine cannot provide, with a hint; and how an open engine's devices fall short of a profile's.
"""

from __future__ import annotations

from dataclasses import replace

from ..core.errors import EngineError
from ..devices import HOST_RUNTIMES, DeviceSettings
from ..model import Engine, describe_load_error
from ..placement.placement import format_bytes
from .profile import ProfileError


def engine_for_profile(profile, portable: bool = False, also: tuple[str, ...] = ()) -> Engine:
    """An Engine with the devices the profile asks for; ProfileError at the file:line of the entry this machine
    cannot provide (a runtime that does not load, a device it lacks), with a hint."""
    settings = DeviceSettings.from_profile(profile, portable, also)
    try:  # every runtime where it loads, so that a failure is named at its own entry
        engine = replace(settings, required=()).open()
    except EngineError as exc:  # bad options: the cpu runtime itself refused them
        raise ProfileError(
            profile.error_at(("devices",), f"devices: this machine cannot provide them: {exc}")
        ) from None
    failed = [r for r in settings.required if r in engine.load_errors]
    if failed:
        runtime, reason = failed[0], engine.load_errors[failed[0]]
        engine.close()
        raise ProfileError(profile.error_at(("devices", runtime), f"devices.{runtime}: this machine cannot provide "
                                            f"it: {describe_load_error(runtime, reason)} ({reason}); "
                                            f"{_hint(runtime)}"))  # fmt: skip
    have = {d.name for d in engine.devices}
    missing = [d for d in profile.device_names() if d not in have]
    if missing:
        engine.close()
        runtime = missing[0].partition(":")[0]
        raise ProfileError(f"{profile.where('devices', runtime)}: devices.{runtime}: this machine has no "
                           f"{', '.join(missing)} (it has {', '.join(sorted(have))}); {_hint(runtime)}")  # fmt: skip
    return engine


def _hint(runtime: str) -> str:
    if runtime in HOST_RUNTIMES:
        return f"hint: ask for fewer {runtime} devices, or remove the entry and the placement's rules that name them"
    return (
        f"hint: remove the '{runtime}' entry and move its experts to another device in the placement, or open "
        f"the profile where {runtime} works (`expertbench devices --runtime {runtime}` says why it does not here)"
    )


def differences(profile, devices) -> list[str]:
    """How an open engine's devices (DeviceInfo) fall short of a profile's `devices:` section, one line each: a
    device the profile names that is missing, a memory cap or a thread count that is not the profile's. Empty
    when the engine provides them (it may have more devices: the profile names those its placement needs)."""
    if profile.devices is None:
        return []
    have = {d.name: d for d in devices}
    out = []
    for runtime, spec in profile.device_specs.items():
        names = [f"{runtime}:{i}" for i in range(spec.devices)]
        missing = [n for n in names if n not in have]
        if missing:
            out.append(f"devices.{runtime}: {', '.join(missing)} not open")
            continue
        for name in names:
            d = have[name]
            if spec.memory_limit is not None and d.memory_total > spec.memory_limit:
                cap = f"{format_bytes(spec.memory_limit)} ({spec.memory_limit} bytes)"
                out.append(f"devices.{runtime}.memory_limit: {name} has {format_bytes(d.memory_total)}, not the {cap} "
                           "the profile caps it at")  # fmt: skip
            if spec.threads is not None and d.threads != spec.threads:
                have = f"{d.threads} thread{'s' if d.threads != 1 else ''}"
                out.append(f"devices.{runtime}.threads: {name} has {have}, not {spec.threads}")
    return out
