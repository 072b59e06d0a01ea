"""The README screenshot: open the window on the demo pair, profile routing, place the experts with the strategy
buttons (the first measures the devices for the cost model), make short runs, and save the window as a PNG.

    python -m app --screenshot assets/screenshot.png
    expertbench gui --screenshot small.png --size 1100x720

Runs without a display (Qt's offscreen platform); every step waits on the state's signals, never on a clock,
except an overall time limit so that a broken engine cannot hang it. It runs on a private state (private_window): the
user's run history is neither shown nor added to, and the window's settings (size, panels, recent files) are a
temporary file's, so neither the picture nor the user's next session depends on the other.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from PySide6.QtCore import QEventLoop, QSettings, QSize, QTimer
from PySide6.QtWidgets import QApplication

from . import actions
from .placement_editor import WholeRole
from .state import WorkbenchState
from .window import MainWindow

SIZE = (1600, 1000)
TIME_LIMIT_MS = 15 * 60 * 1000


def private_window() -> tuple[MainWindow, tempfile.TemporaryDirectory]:
    """A window on a private state: runs kept in memory only (no history file read or written) and settings in a
    temporary folder, removed when the returned folder is cleaned up (a `with` block)."""
    folder = tempfile.TemporaryDirectory(prefix="expertbench-screenshot-")
    settings = QSettings(str(Path(folder.name) / "window.ini"), QSettings.Format.IniFormat)
    state = WorkbenchState()
    state.keep_history = False
    return MainWindow(state, settings), folder


def _wait(app: QApplication, signal, limit_ms: int = TIME_LIMIT_MS, done=None) -> bool:
    """Spin the event loop until `signal` (or one of a list) fires and `done()` holds, or the limit passes."""
    signals = signal if isinstance(signal, list) else [signal]
    if done is not None and done():
        return True
    loop = QEventLoop()
    fired = []

    def on_signal(*_):
        if done is None or done():
            fired.append(True)
            loop.quit()

    for sig in signals:
        sig.connect(on_signal)
    QTimer.singleShot(limit_ms, loop.quit)
    loop.exec()
    for sig in signals:
        sig.disconnect(on_signal)
    return bool(fired)


def _idle(state: WorkbenchState) -> bool:
    return not state.busy and not state.running


def _expand_first_split_layer(window: MainWindow) -> None:
    for view in (col.view for col in window.editor.columns.values()):
        m = view.model()
        for row in range(m.rowCount()):
            if not m.index(row, 0).data(WholeRole):
                view.expand(m.index(row, 0))
                break


def _strategy(app: QApplication, window: MainWindow, name: str, errors: list[str]) -> None:
    """Click a strategy button and wait for its edit to reach the engine (after measuring the devices)."""
    state = window.state
    before = state.placement
    window.routing.routing_buttons[name].click()

    def settled() -> bool:
        return bool(errors) or (not state.calibrating and not state.applying and state.placement != before)

    if not _wait(app, [state.sigPlacementApplied, state.sigError], done=settled):
        errors.append(f"the {name} strategy did not apply in time")


def capture(
    window: MainWindow, path: str, tokens: int = 32, runs: int = 3, budget: int = 50, size: tuple[int, int] = SIZE
) -> int:
    app = QApplication.instance()
    state = window.state
    errors: list[str] = []
    state.sigError.disconnect(window.show_error)  # no modal dialog: report on stderr and fail
    state.sigError.connect(lambda title, text: errors.append(f"{title}: {text}"))
    report, actions.report = actions.report, lambda title, text, _parent: errors.append(f"{title}: {text}")
    try:
        return _capture(app, window, path, tokens, runs, budget, size, errors)
    finally:
        actions.report = report


def _capture(app: QApplication, window: MainWindow, path: str, tokens: int, runs: int, budget: int,
             size: tuple[int, int], errors: list[str]) -> int:  # fmt: skip
    state = window.state
    window.set_size(QSize(*size))
    window.show()
    app.processEvents()
    window.default_sizes()  # once the window has its size: the docks' default share of it
    if not _wait(app, state.sigModelChanged, done=lambda: state.model is not None or bool(errors)):
        errors.append("the model did not load in time")
    if state.model is not None and state.profile_routing(window.run_panel.settings().prompts):
        _wait(app, state.sigRoutingChanged, done=lambda: state.routing is not None or bool(errors))
    split = state.model is not None and len(state.devices) > 1 and state.routing is not None
    window.routing.budget.setValue(budget)
    if split and not errors:  # whole layers first: the fast device holds `budget` % of the experts
        _strategy(app, window, "cold-layers", errors)
    panel = window.run_panel
    panel.tokens.setValue(tokens)
    for i in range(runs):
        if errors or state.model is None:
            break
        if i == 1 and split:  # the hottest experts on the fast device, layers split: the output must not change
            _strategy(app, window, "hot-first", errors)
            _expand_first_split_layer(window)
        if i == 2:
            panel.q.setValue(3)
        panel.start_button.click()
        _wait(app, state.sigRunFinished)
        _wait(app, state.sigBusyChanged, done=lambda: _idle(state))
    app.processEvents()
    window.plots.refresh_live()
    app.processEvents()
    for msg in errors:
        print(f"expertbench: screenshot: {msg}", file=sys.stderr)
    ok = window.grab().save(path, "PNG")
    if not ok:
        print(f"expertbench: screenshot: cannot write '{path}'", file=sys.stderr)
    state.saved_placement = state.placement  # nothing to ask about on close
    window.close()
    return 0 if ok and not errors else 1
