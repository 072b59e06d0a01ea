"""The engine thread: every engine call of the window runs here, one at a time, in the order it was asked for.

One thread (not a pool) because engine objects are not meant to be used from two threads at once: a placement
applied while a run decodes simply waits for the run to end. Results come back to the GUI thread as queued
signals; the callbacks given to submit() therefore run on the GUI thread and may touch widgets and state.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot


@dataclass(eq=False)
class Task:
    fn: Callable[[], Any]
    label: str
    on_done: Callable[[Any], None] | None = None
    on_error: Callable[[BaseException], None] | None = None


class _Runner(QObject):
    """Lives on the engine thread; runs what it is sent and reports back."""

    sigFinished = Signal(object, object, object)  # task, result, error

    @Slot(object)
    def run(self, task: Task) -> None:
        try:
            result, error = task.fn(), None
        except BaseException as exc:  # reported to the GUI thread, which shows it
            result, error = None, exc
        self.sigFinished.emit(task, result, error)


class EngineWorker(QObject):
    """submit(fn) runs fn on the engine thread; on_done(result) / on_error(exc) then run on the GUI thread."""

    sigBusyChanged = Signal(str)  # the label of the oldest unfinished task, "" when idle
    sigTaskFailed = Signal(object, object)  # task, error (when the task has no on_error of its own)
    _sigSubmit = Signal(object)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._thread = QThread()
        self._thread.setObjectName("expertbench-engine")
        self._runner = _Runner()
        self._runner.moveToThread(self._thread)
        self._sigSubmit.connect(self._runner.run)
        self._runner.sigFinished.connect(self._finished)
        self._pending: list[Task] = []
        self._closed = False
        self._thread.start()

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    @property
    def label(self) -> str:
        return self._pending[0].label if self._pending else ""

    def submit(self, fn: Callable[[], Any], on_done=None, on_error=None, label: str = "working") -> Task:
        if self._closed:
            raise RuntimeError("the engine thread has been shut down")
        task = Task(fn, label, on_done, on_error)
        self._pending.append(task)
        if len(self._pending) == 1:
            self.sigBusyChanged.emit(task.label)
        self._sigSubmit.emit(task)
        return task

    @Slot(object, object, object)
    def _finished(self, task: Task, result, error) -> None:
        if task in self._pending:
            self._pending.remove(task)
        self.sigBusyChanged.emit(self.label)
        if error is None:
            if task.on_done is not None:
                task.on_done(result)
        elif task.on_error is not None:
            task.on_error(error)
        else:
            self.sigTaskFailed.emit(task, error)

    def shutdown(self, final: Callable[[], None] | None = None, timeout: float = 30.0) -> None:
        """Run `final` last on the engine thread (after everything queued), wait for it, stop the thread."""
        if self._closed:
            return
        self._closed = True
        done = threading.Event()

        def last():
            try:
                if final is not None:
                    final()
            finally:
                done.set()

        self._sigSubmit.emit(Task(last, "closing"))
        done.wait(timeout)
        self._thread.quit()
        self._thread.wait()
