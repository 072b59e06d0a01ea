"""The per-token trace: what ran on which device, when, for every step, layer and device of a run.

The core keeps the spans per context while tracing is on (`Context.trace = N`, room for N spans between reads);
`Context.trace_spans()` moves them out as `Span`s. `chrome_trace` writes them as Chrome trace event JSON
(`{"traceEvents": [...]}`, one "X" event per span, one thread per device), which Perfetto and chrome://tracing
open.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .files import atomic_write

# the core's eb_span_kind, by value
SPAN_KINDS = (
    "embed", "attention", "route", "experts", "stage", "join", "combine", "dense", "logits", "graph", "shared",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Span:
    """One piece of a step: kind (SPAN_KINDS) on device, for layer (-1 outside the layers) of the step whose
    first row is at position token, over rows rows (positions, or (token, expert) pairs for experts); start and end
    in nanoseconds of the host's monotonic clock. model says whose step it was ("target" or "draft")."""

    kind: str
    device: str
    layer: int
    token: int
    rows: int
    start_ns: int
    end_ns: int
    model: str = "target"

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def to_dict(self) -> dict:
        return asdict(self)


def overlap_ns(a: Span, b: Span) -> int:
    """How long two spans ran at the same time (0 when they did not)."""
    return max(0, min(a.end_ns, b.end_ns) - max(a.start_ns, b.start_ns))


def chrome_trace(spans: list[Span], *, metadata: dict | None = None) -> dict:
    """Chrome trace event JSON: "X" events with ts/dur in microseconds from the first span, one tid per device
    (named by "M" thread_name events), args carrying device, layer, token, kind, rows and model."""
    devices = sorted({s.device for s in spans})
    tid = {d: i + 1 for i, d in enumerate(devices)}
    t0 = min((s.start_ns for s in spans), default=0)
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "expertbench"}}]
    events += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid[d], "args": {"name": d}} for d in devices]
    for s in spans:
        name = s.kind if s.layer < 0 else f"{s.kind} L{s.layer}"
        events.append(
            {
                "name": name,
                "cat": s.model,
                "ph": "X",
                "pid": 1,
                "tid": tid[s.device],
                "ts": (s.start_ns - t0) / 1000.0,
                "dur": s.duration_ns / 1000.0,
                "args": {"device": s.device, "layer": s.layer, "token": s.token, "kind": s.kind, "rows": s.rows,
                         "model": s.model},
            }
        )  # fmt: skip
    out = {"traceEvents": events, "displayTimeUnit": "ms"}
    if metadata:
        out["metadata"] = metadata
    return out


def write_chrome_trace(path, spans: list[Span], *, metadata: dict | None = None) -> Path:
    """Write chrome_trace(spans) to path atomically (a temporary file beside it, then renamed)."""
    path = Path(path)
    atomic_write(path, json.dumps(chrome_trace(spans, metadata=metadata)))
    return path
