"""The live buffer between a decode run and the plots: filled by the run's thread, read by a GUI timer.

A decode step can take well under a millisecond on a small model, far more often than a screen can show, so
the run does not signal each step: it appends to a fixed ring of numpy arrays under a lock, and the plots
copy the ring at 10-30 Hz (one setData per tick). A traced run's spans go to a SpanRing the same way: the run's
thread only keeps a reference to each step's spans; the timeline turns the steps it shows into numpy columns.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

from engine.core.trace import SPAN_KINDS, Span
from engine.runs.run import StepEvent

ROLLING_STEPS = 16  # decode steps averaged for the rolling tokens/s and acceptance
TRACED_STEPS = 256  # steps of spans kept for the timeline (it shows the last few of them)
_KIND_INDEX = {kind: i for i, kind in enumerate(SPAN_KINDS)}


@dataclass(frozen=True)
class SpanColumns:
    """Spans as numpy columns, oldest step first: start and end in ns, device (an index into devices), kind (an
    index into engine.core.trace.SPAN_KINDS), layer, token, rows, draft (the draft model's pass), step (its serial)."""

    start: np.ndarray
    end: np.ndarray
    device: np.ndarray
    kind: np.ndarray
    layer: np.ndarray
    token: np.ndarray
    rows: np.ndarray
    draft: np.ndarray
    step: np.ndarray
    devices: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.start)


class SpanRing:
    """The spans of a traced run's last steps (TRACED_STEPS of them: bounded whatever the run's length). The run's
    thread adds each step's spans (a reference kept under the lock, nothing copied); the timeline's timer asks for
    the last steps as numpy columns, built on its thread once per step and kept while that step is in the ring."""

    def __init__(self, steps: int = TRACED_STEPS):
        self._lock = threading.Lock()
        self._steps: deque[tuple[int, tuple[Span, ...]]] = deque(maxlen=steps)
        self._columns: dict[int, np.ndarray] = {}  # step serial -> its spans as an int64 array (GUI thread only)
        self._devices: dict[str, int] = {}
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._steps.clear()
            self.version = 0  # steps ever added (a view redraws when it changed)
            self.spans = 0  # spans ever added

    def add(self, spans: tuple[Span, ...]) -> None:
        """Called on the run's thread with a step's spans (none when the run is not traced: nothing is kept)."""
        if not spans:
            return
        with self._lock:
            self._steps.append((self.version, spans))
            self.version += 1
            self.spans += len(spans)

    def __len__(self) -> int:
        with self._lock:
            return len(self._steps)

    def last(self, steps: int) -> SpanColumns:
        """The last `steps` steps' spans as columns (on the thread that draws: it keeps each step's array)."""
        with self._lock:
            shown = list(self._steps)[-steps:] if steps > 0 else []
        keep = {serial for serial, _spans in shown}
        self._columns = {k: v for k, v in self._columns.items() if k in keep}
        parts = []
        for serial, spans in shown:
            part = self._columns.get(serial)
            if part is None:
                part = self._columns[serial] = self._array(serial, spans)
            parts.append(part)
        a = np.concatenate(parts) if parts else np.zeros((0, 9), dtype=np.int64)
        devices = tuple(self._devices)
        return SpanColumns(*(a[:, i] for i in range(9)), devices=devices)

    def _array(self, serial: int, spans: tuple[Span, ...]) -> np.ndarray:
        index = self._devices
        for s in spans:
            if s.device not in index:
                index[s.device] = len(index)
        rows = [(s.start_ns, s.end_ns, index[s.device], _KIND_INDEX.get(s.kind, -1), s.layer, s.token, s.rows,
                 s.model == "draft", serial) for s in spans]  # fmt: skip
        return np.array(rows, dtype=np.int64).reshape(-1, 9)


class LiveBuffer:
    def __init__(self, capacity: int = 4096):
        self.capacity = capacity
        self._lock = threading.Lock()
        self._time = np.zeros(capacity, dtype=np.float64)
        self._rate = np.zeros(capacity, dtype=np.float64)
        self._accept = np.zeros(capacity, dtype=np.float64)
        self.spans = SpanRing()  # a traced run's last steps, for the timeline
        self.reset(0)

    def reset(self, total_tokens: int) -> None:
        with self._lock:
            self._n = 0  # points ever appended (the ring holds the last `capacity`)
            self._window: deque[tuple[int, float, int, int]] = deque(maxlen=ROLLING_STEPS)
            self.total_tokens = total_tokens
            self.tokens_done = 0
            # (time, each device's busy seconds so far) of the last steps: the live busy shares
            self._busy: deque[tuple[float, dict[str, float]]] = deque(maxlen=ROLLING_STEPS + 1)
        self.spans.reset()

    def append(self, event: StepEvent) -> None:
        """Called on the run's thread after each step: a few additions and three stores."""
        self.spans.add(event.spans)
        with self._lock:
            self.tokens_done += event.tokens
            if event.busy_seconds:
                self._busy.append((event.time, event.busy_seconds))
            if event.phase != "decode":
                return
            self._window.append((event.tokens, event.seconds, event.drafted, event.accepted))
            tokens = sum(w[0] for w in self._window)
            seconds = sum(w[1] for w in self._window)
            drafted = sum(w[2] for w in self._window)
            accepted = sum(w[3] for w in self._window)
            i = self._n % self.capacity
            self._time[i] = event.time
            self._rate[i] = tokens / seconds if seconds > 0 else math.nan
            self._accept[i] = 100.0 * accepted / drafted if drafted else math.nan
            self._n += 1

    def __len__(self) -> int:
        with self._lock:
            return min(self._n, self.capacity)

    def snapshot(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(time s, rolling decode tokens/s, rolling acceptance %), oldest first, as copies."""
        with self._lock:
            n = min(self._n, self.capacity)
            if self._n <= self.capacity:
                order = slice(0, n)
                return self._time[order].copy(), self._rate[order].copy(), self._accept[order].copy()
            start = self._n % self.capacity
            idx = np.r_[start : self.capacity, 0:start]
            return self._time[idx], self._rate[idx], self._accept[idx]

    def busy_shares(self) -> dict[str, float]:
        """Each device's share of the last steps' time (up to ROLLING_STEPS) spent running kernels; empty before
        two steps carried busy times. Several threads or streams can make a share exceed 1."""
        with self._lock:
            if len(self._busy) < 2:
                return {}
            (t0, b0), (t1, b1) = self._busy[0], self._busy[-1]
        if t1 <= t0:
            return {}
        return {name: max(0.0, (b1[name] - b0.get(name, 0.0)) / (t1 - t0)) for name in b1}

    @property
    def progress(self) -> tuple[int, int]:
        with self._lock:
            return self.tokens_done, self.total_tokens
