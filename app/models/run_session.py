"""The window's decode runs: whether one is running, the live buffer the plots read while it does, its trace, the
loaded model's run history (engine.runs.history: kept in the user's data folder) and the last run's record.

Qt-free: a listener is a plain callable (`on("finished", fn)`); a refused start is a Refusal and what the history
tells (a file it could not write, a damaged line) a Note, each with its reason, never a matched string. The decode
itself is the caller's (on the engine thread): start() has it queued through `launch`, finish() or failed() end it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.core.errors import EngineError
from engine.core.trace import Span, write_chrome_trace
from engine.runs.history import History, RunRecord, history_file

from ..live import LiveBuffer
from .events import Listeners, Note, Refusal

# started: a run began; finished: it ended (the listener gets its RunRecord, None when it failed); history: the runs
# changed (one kept, the history cleared, another model's opened); note: something to tell (the listener gets a Note)
EVENTS = ("started", "finished", "history", "note")
REFUSALS = ("running", "no-model")  # why a run does not start (Refusal.reason)
# what a Note tells (Note.reason): the history file did not take a run, a damaged history was read, the history file
# could not be removed, a run ended
NOTES = ("not-kept", "damaged", "file-stays", "run-ended")


@dataclass(frozen=True)
class RunTrace:
    """A traced run's spans (engine.core.trace) and what the Chrome trace's metadata says of the run."""

    run: int  # the run's index in the history
    spans: list[Span]
    metadata: dict
    lost: int = 0  # spans the core had no room for
    dropped: int = 0  # the oldest steps' spans, not kept (engine.runs.run.TRACE_KEPT_SPANS)

    def write(self, path) -> Path:
        """The Chrome trace event JSON (engine.core.trace.write_chrome_trace; ArgumentError naming the file)."""
        return write_chrome_trace(path, self.spans, metadata=self.metadata)


@dataclass
class RunSession:
    """The runs of the loaded model. trace_runs: whether runs record the per-token trace (the window's timeline turns
    it on while it is open); keep_history: whether runs are kept across restarts (a model with a fingerprint only)."""

    running: bool = False
    live: LiveBuffer = field(default_factory=LiveBuffer)
    trace_runs: bool = False
    last_trace: RunTrace | None = None  # the last run's, when it was traced
    runs: History = field(default_factory=History)
    keep_history: bool = True
    last_record: RunRecord | None = None  # the last run's (None: none since the model was opened)
    _listeners: Listeners = field(default_factory=lambda: Listeners(EVENTS))

    def on(self, event: str, fn: Callable[..., None]) -> None:
        self._listeners.on(event, fn)

    def _note(self, reason: str, text: str) -> None:
        self._listeners.emit("note", Note(reason, text))

    @property
    def history(self) -> list[RunRecord]:
        """The loaded model's runs, oldest first (those of earlier sessions too)."""
        return self.runs.records

    # ---- a run ------------------------------------------------------------------------------------------

    def start(self, total_tokens: int, model_loaded: bool, launch: Callable[[], None]) -> Refusal | None:
        """Start a run of total_tokens decode steps: refused while one runs or when no model is loaded; else running,
        the live buffer emptied for it, launch() queues the decode, then "started"."""
        if self.running:
            return Refusal("running", "A run is under way")
        if not model_loaded:
            return Refusal("no-model", "Open a model first")
        self.running = True
        self.live.reset(total_tokens)
        launch()
        self._listeners.emit("started")
        return None

    def finish(self, record: RunRecord, trace: RunTrace | None = None) -> None:
        """The run ended (a cancelled one too) as record, with its trace when traced: kept in the history (numbered,
        its reference hash set; a "not-kept" note when the file does not take it, the run stays in the history), then
        "history", "finished" with the record, and a "run-ended" note."""
        self.running = False
        self.last_trace = trace
        try:
            self.runs.add(record)
        except EngineError as exc:  # the run is in the history; only the file did not take it
            self._note("not-kept", f"The run history is not kept: {exc}")
        self.last_record = record
        self._listeners.emit("history")
        self._listeners.emit("finished", record)
        rate = record.decode_tokens_per_second
        said = "cancelled" if record.cancelled else (f"{rate:.1f} tokens/s" if math.isfinite(rate) else "done")
        self._note("run-ended", f"Run {record.index}: {said}")

    def failed(self) -> None:
        """The run failed (the caller says why): no more running, "finished" with None."""
        self.running = False
        self._listeners.emit("finished", None)

    # ---- the history ------------------------------------------------------------------------------------

    def open(self, fingerprint: str | None) -> None:
        """Another model (fingerprint: engine.profiles.profile.fingerprint, None when unreadable): unless a run is
        under way, the previous model's live curves, trace and last record go; its runs kept from earlier sessions are
        read when keep_history (a damaged history is skipped: a "damaged" note), then "history"."""
        if not self.running:
            self.live.reset(0)
            self.last_trace = self.last_record = None
        if not self.keep_history or fingerprint is None:
            self.runs = History()
        else:
            self.runs = History.load(history_file(fingerprint))
            problems = self.runs.problems
            if problems:
                more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
                self._note("damaged", f"The run history was damaged; skipped {problems[0]}{more}")
        self._listeners.emit("history")

    def clear_history(self) -> None:
        """Forget the loaded model's runs, in the user's data folder too (a "file-stays" note when it cannot be
        removed), then "history"."""
        try:
            self.runs.clear()
        except EngineError as exc:
            self._note("file-stays", f"The run history file stays: {exc}")
        self._listeners.emit("history")
