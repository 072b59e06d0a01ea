"""What the window's models share: their listeners by event, and the structured outcomes they answer with (a Refusal
when something did not happen, a Note for the status bar), each a reason to branch on and the text the window shows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    """Why something asked of a model did not happen: a reason (each model names its own) and the text shown."""

    reason: str
    text: str


@dataclass(frozen=True)
class Note:
    """Something a model tells while doing what it was asked (the status bar's line): a reason and the text shown."""

    reason: str
    text: str


class Listeners:
    """Plain callables by event name; an event a model does not have is refused when listened to, naming the ones
    it has. Each event passes what its model documents (often nothing)."""

    def __init__(self, events: tuple[str, ...]):
        self.events = events
        self._by_event: dict[str, list[Callable[..., None]]] = {e: [] for e in events}

    def on(self, event: str, fn: Callable[..., None]) -> None:
        if event not in self._by_event:
            raise ValueError(f"event {event!r}: expected one of {', '.join(self.events)}")
        self._by_event[event].append(fn)

    def emit(self, event: str, *args) -> None:
        for fn in self._by_event[event]:
            fn(*args)
