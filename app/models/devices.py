"""The engine's devices as the window shows them: the devices and the runtimes that did not load (a new engine), and
each device's memory with the room it has for the loaded model's experts (a snapshot, refreshed after each load and
each placement the engine applies).

Qt-free: a listener is a plain callable (`on("engine", fn)`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.placement.placement import ExpertRoom, expert_rooms

from .events import Listeners

if TYPE_CHECKING:
    from engine.model import DeviceInfo

# engine: another engine (its devices and the runtimes that did not load); memory: the memory snapshot refreshed
EVENTS = ("engine", "memory")


@dataclass
class Devices:
    """The open engine's devices (engine.model.DeviceInfo, as the engine listed them last), its runtimes that did
    not load (runtime -> why), and per device the room for the loaded model's experts (engine.placement.placement's
    ExpertRoom: free, held, reserve) and the bytes of experts a single edit may fill there (capacity: free + held)."""

    devices: list[DeviceInfo] = field(default_factory=list)
    load_errors: dict[str, str] = field(default_factory=dict)
    rooms: dict[str, ExpertRoom] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=dict)
    _listeners: Listeners = field(default_factory=lambda: Listeners(EVENTS))

    def on(self, event: str, fn: Callable[[], None]) -> None:
        self._listeners.on(event, fn)

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.devices]

    def opened(self, devices: list[DeviceInfo], load_errors: dict[str, str]) -> None:
        """Another engine: its devices and the runtimes it could not load. The rooms stay those of the last snapshot
        until the next (a model loaded on the engine refreshes them)."""
        self.devices, self.load_errors = list(devices), dict(load_errors)
        self._listeners.emit("engine")

    def refresh(self, devices: list[DeviceInfo], held: dict[str, int]) -> None:
        """A memory snapshot: the devices as the engine lists them now, with the expert bytes the loaded model holds on
        each (held; none: {}), from which each device's room follows."""
        self.devices = list(devices)
        self.rooms = expert_rooms(self.devices, held)
        self.capacity = {name: room.capacity for name, room in self.rooms.items()}
        self._listeners.emit("memory")
