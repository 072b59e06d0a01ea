"""Which runtimes and devices an engine opens: one way for the command line, `regress` and the window.

DeviceSettings says it (runtimes, how many CPU or simulated devices, worker threads, memory caps, module files,
kernels); .open() makes the Engine. From a profile's `devices:` section (DeviceSettings.from_profile) every runtime
named must load and provide its devices, or a ProfileError names the file:line of the entry it cannot provide,
with a hint. The window's default (DeviceSettings.window) loads cpu and every GPU runtime that loads here, and a
simulated accelerator (hostsim) when none does, so that there is a second device to place experts on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .errors import EngineError
from .model import Engine, describe_load_error
from .placement import format_bytes

GPU_RUNTIMES = ("cuda", "hip")
HOST_RUNTIMES = ("cpu", "hostsim")  # runtimes whose devices are worker threads (a count and threads per device)


@dataclass
class DeviceSettings:
    runtimes: tuple[str, ...] = ("cpu",)
    required: tuple[str, ...] | None = None  # runtimes that must load (None: all); the others are reported
    options: dict[str, dict] = field(default_factory=dict)  # runtime -> n_devices, threads_per_device, memory_limit
    module_paths: dict[str, str] = field(default_factory=dict)
    cpu_devices: int = 0  # 0: one per NUMA node
    cpu_threads: int = 0  # 0: the cores shared out
    kernels: str | None = None
    portable: bool | None = None
    simulate_accelerator: bool = False  # load hostsim when every device loaded is a CPU one

    @classmethod
    def window(cls, cpu_devices: int = 0, runtimes: tuple[str, ...] | None = None) -> DeviceSettings:
        """The window's: cpu plus every GPU runtime that loads (or the runtimes named); hostsim when no accelerator
        loaded and none were named."""
        return cls(runtimes=runtimes or ("cpu", *GPU_RUNTIMES), required=(), cpu_devices=cpu_devices,
                   simulate_accelerator=runtimes is None)  # fmt: skip

    @classmethod
    def from_profile(cls, profile, portable: bool = False, also: tuple[str, ...] = ()) -> DeviceSettings:
        """A profile's `devices:` section (cpu: 1 without one): each runtime it names must load. also: runtimes to
        load as well when they can (the window keeps the GPUs it had)."""
        options: dict[str, dict] = {}
        for runtime, spec in profile.device_specs.items():
            opts: dict = {}
            if runtime in HOST_RUNTIMES:
                opts["n_devices"] = spec.devices
                opts["threads_per_device"] = spec.threads or (1 if runtime == "hostsim" else 0)
            if spec.memory_limit is not None:
                opts["memory_limit"] = spec.memory_limit
            options[runtime] = opts
        named = tuple(sorted(options, key=lambda r: r != "cpu"))
        extra = tuple(r for r in also if r not in named)
        return cls(runtimes=(*named, *extra), required=named, options=options, portable=portable or None)

    def open(self) -> Engine:
        """The engine: the required runtimes strictly (the first that fails raises), the others where they load
        (Engine.load_errors says why one did not)."""
        required = self.runtimes if self.required is None else self.required
        engine = Engine(runtimes=tuple(required), module_paths=self.module_paths, cpu_devices=self.cpu_devices,
                        cpu_threads=self.cpu_threads, portable=self.portable, kernels=self.kernels, strict=True,
                        runtime_options=self.options)  # fmt: skip
        try:
            for name in self.runtimes:
                if name not in required:
                    _try_load(engine, name, self.module_paths.get(name))
            if self.simulate_accelerator and all(d.kind == "cpu" for d in engine.devices):
                _try_load(engine, "hostsim", self.module_paths.get("hostsim"))
        except BaseException:
            engine.close()
            raise
        return engine


def _try_load(engine: Engine, name: str, path: str | None) -> None:
    try:
        engine.load_runtime(name, path)
    except EngineError as exc:
        engine.load_errors[name] = str(exc)


def engine_for_profile(profile, portable: bool = False, also: tuple[str, ...] = ()) -> Engine:
    """An Engine with the devices the profile asks for; ProfileError at the file:line of the entry this machine
    cannot provide (a runtime that does not load, a device it lacks), with a hint."""
    from .profile import ProfileError

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
