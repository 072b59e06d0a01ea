"""The live buffer between a decode run and the plots: filled by the run's thread, read by a GUI timer.

A decode step can take well under a millisecond on a small model, far more often than a screen can show, so
the run does not signal each step: it appends to a fixed ring of numpy arrays under a lock, and the plots
copy the ring at 10-30 Hz (one setData per tick).
"""

from __future__ import annotations

import math
import threading
from collections import deque

import numpy as np

from engine.run import StepEvent

ROLLING_STEPS = 16  # decode steps averaged for the rolling tokens/s and acceptance


class LiveBuffer:
    def __init__(self, capacity: int = 4096):
        self.capacity = capacity
        self._lock = threading.Lock()
        self._time = np.zeros(capacity, dtype=np.float64)
        self._rate = np.zeros(capacity, dtype=np.float64)
        self._accept = np.zeros(capacity, dtype=np.float64)
        self.reset(0)

    def reset(self, total_tokens: int) -> None:
        with self._lock:
            self._n = 0  # points ever appended (the ring holds the last `capacity`)
            self._window: deque[tuple[int, float, int, int]] = deque(maxlen=ROLLING_STEPS)
            self.total_tokens = total_tokens
            self.tokens_done = 0
            # (time, each device's busy seconds so far) of the last steps: the live busy shares
            self._busy: deque[tuple[float, dict[str, float]]] = deque(maxlen=ROLLING_STEPS + 1)

    def append(self, event: StepEvent) -> None:
        """Called on the run's thread after each step: a few additions and three stores."""
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
