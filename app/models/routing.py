"""The routing statistics the window shows (the heat map, the chips, the strategies that rank experts): the counts,
where they come from, which runs they count, and each expert's heat. Qt-free: a listener is a plain callable."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.placement.routing import RoutingStats

ORIGINS = ("runs", "profiling", "profiling and runs", "profile", "given")


@dataclass
class RoutingMap:
    """The loaded model's routing statistics (None: none yet), and what the engine's counters hold now: the runs
    (first, last) counted since they were reset or profiled, and whether a profiling pass is in them."""

    counts: np.ndarray | None = None  # hits [layers, experts]
    stats: RoutingStats | None = None
    heat: np.ndarray | None = None  # hits relative to each layer's hottest expert (0..1)
    tokens: int = 0  # tokens per MoE layer the statistics count
    origin: str | None = None  # ORIGINS
    runs: tuple[int, int] | None = None  # which runs of the history they count (first, last), when they count runs
    counted_runs: tuple[int, int] | None = None
    counted_profiling: bool = False
    _listeners: list[Callable[[], None]] = field(default_factory=list)

    def on_change(self, fn: Callable[[], None]) -> None:
        self._listeners.append(fn)

    def set(self, counts: RoutingStats | np.ndarray | None, shape: tuple[int, int] | None, top_k: int = 0,
            origin: str = "given", runs: tuple[int, int] | None = None) -> None:  # fmt: skip
        """Per-layer, per-expert hit counts of the model's shape ([num_layers, num_experts]; None: no model) or its
        RoutingStats; None forgets them. A ValueError names a shape that is not the model's, or an unknown origin."""
        if origin not in ORIGINS:
            raise ValueError(f"routing origin {origin!r}: expected one of {', '.join(ORIGINS)}")
        stats = counts if isinstance(counts, RoutingStats) else None
        if stats is not None:
            counts = stats.hits
        if counts is not None:
            counts = np.asarray(counts, dtype=np.float64)
            if shape is None or counts.shape != shape:
                raise ValueError(f"routing counts of shape {counts.shape}, expected {shape}")
            if stats is None:
                stats = RoutingStats.from_hits(counts, top_k)
        self.counts, self.stats = counts, stats
        self.heat = None if stats is None else stats.heat()
        self.tokens = 0 if stats is None else stats.tokens_counted
        self.origin = None if stats is None else origin
        self.runs = runs if stats is not None else None
        for fn in self._listeners:
            fn()

    def clear(self) -> None:
        """A new model: no statistics, nothing counted; the listeners are not told (the caller tells them once, with
        the rest of what a new model changes)."""
        self.counts = self.stats = self.heat = self.origin = self.runs = self.counted_runs = None
        self.tokens, self.counted_profiling = 0, False

    def counted(self, runs: tuple[int, int] | None, profiled: bool) -> None:
        """What the engine's counters hold now (a reset or a new model: nothing; a profiling pass: it alone)."""
        self.counted_runs, self.counted_profiling = runs, profiled

    def after_run(self, index: int, stats: RoutingStats, shape: tuple[int, int]) -> None:
        """Run `index` ended with the engine's counters at `stats`: they count the runs since the last reset (and the
        profiling pass before them, if any); shown when they count any token."""
        first = self.counted_runs[0] if self.counted_runs else index
        self.counted((first, index), self.counted_profiling)
        if stats.tokens_counted > 0:
            origin = "profiling and runs" if self.counted_profiling else "runs"
            self.set(stats, shape, origin=origin, runs=self.counted_runs)
