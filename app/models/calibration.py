"""The cost model's figures the window predicts and chooses with (engine.placement.costmodel.Calibration): those of
the loaded model on the open engine's devices, whether they are being measured, and every set measured so far, so
that a model opened again on the same devices is not measured again.

Qt-free: a listener is a plain callable (`on("changed", fn)`); a refused request is a Refusal. The measurement itself
is the caller's (on the engine thread): ensure() has it queued through `start`, measured() or failed() end it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.placement.costmodel import Calibration

from .events import Listeners, Refusal

EVENTS = ("changed",)  # a measurement started or ended; the figures changed
REFUSALS = ("no-model",)  # why figures cannot be had (Refusal.reason)

# What a set of figures holds for (the caller's key: the model, its primary device and the engine's devices)
Key = tuple


@dataclass
class Calibrations:
    """The figures for what is loaded now (None until measured), whether a measurement is under way, the figures of
    every key measured, and what waits for the figures to be there (callables run once they are)."""

    figures: Calibration | None = None
    measuring: bool = False
    kept: dict[Key, Calibration] = field(default_factory=dict)
    waiting: list[Callable[[], None]] = field(default_factory=list)
    _start: Callable[[Key], None] | None = None  # how the last measurement was queued (to measure another key)
    _listeners: Listeners = field(default_factory=lambda: Listeners(EVENTS))

    def on(self, event: str, fn: Callable[[], None]) -> None:
        self._listeners.on(event, fn)

    def select(self, key: Key | None) -> None:
        """Another model (or the same on other devices): the figures kept for its key, if any; what waited for the
        previous one's figures waits no more. No event: the caller tells once, with the rest a new model changes."""
        self.figures = self.kept.get(key)
        self.waiting.clear()

    def ensure(self, key: Key | None, then: Callable[[], None] | None, start: Callable[[Key], None]
               ) -> Refusal | None:  # fmt: skip
        """Have the figures for key (what is loaded now; None: nothing is, refused): when they are here `then` runs at
        once; else it runs when they come, measured once however often this is asked: start(key) queues the
        measurement (whose end is measured() or failed()), then "changed"."""
        if key is None:
            return Refusal("no-model", "Open a model first")
        if self.figures is not None:
            if then is not None:
                then()
            return None
        if then is not None:
            self.waiting.append(then)
        if self.measuring:
            return None
        self.measuring = True
        self._start = start
        start(key)
        self._listeners.emit("changed")
        return None

    def measured(self, key: Key, calibration: Calibration, current: Key | None) -> None:
        """A measurement of key ended with these figures, kept for it; current is what is loaded now. When that is
        still key, they are the figures: "changed", then what waited runs. When another model was loaded meanwhile,
        its figures are measured next if something waits for them (else "changed": the measurement ended)."""
        self.kept[key] = calibration
        self.measuring = False
        if key != current:
            if not (self.waiting and self._start is not None and self.ensure(current, None, self._start) is None):
                self._listeners.emit("changed")
            return
        self.figures = calibration
        waiting, self.waiting = self.waiting, []
        self._listeners.emit("changed")
        for fn in waiting:
            fn()

    def failed(self) -> None:
        """The measurement failed (the caller says why): nothing waits any more, "changed"."""
        self.measuring = False
        self.waiting.clear()
        self._listeners.emit("changed")
