"""Which runtimes and devices an engine opens: one way for the command line, `regress` and the window.

DeviceSettings says it (runtimes, how many CPU or simulated devices, worker threads, memory caps, module files,
kernels); .open() makes the Engine. From a profile's `devices:` section (DeviceSettings.from_profile) every runtime
named must load and provide its devices (engine.profiles.devices opens a profile's engine and names the
file:line of an entry this machine cannot provide). The window's default (DeviceSettings.window) loads cpu and
every GPU runtime that loads here, and a simulated accelerator (hostsim) when none does, so that there is a second
device to place experts on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .core.errors import EngineError
from .model import Engine

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
