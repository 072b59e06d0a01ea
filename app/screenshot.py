"""The README screenshot: open the window on the demo pair, profile routing, split the experts, make short runs,
and save the window as a PNG.

    python -m app --screenshot assets/screenshot.png

Runs without a display (Qt's offscreen platform); every step waits on the state's signals, never on a clock,
except an overall time limit so that a broken engine cannot hang it.
"""

from __future__ import annotations

import sys

from PySide6.QtCore import QEventLoop, QTimer
from PySide6.QtWidgets import QApplication

from . import strategies
from .placement_editor import WholeRole
from .state import WorkbenchState
from .window import MainWindow

SIZE = (1600, 1000)
TIME_LIMIT_MS = 15 * 60 * 1000


def _wait(app: QApplication, signal, limit_ms: int = TIME_LIMIT_MS, done=None) -> bool:
    """Spin the event loop until `signal` fires (and `done()` holds, when given) or the limit passes."""
    if done is not None and done():
        return True
    loop = QEventLoop()
    fired = []

    def on_signal(*_):
        if done is None or done():
            fired.append(True)
            loop.quit()

    signal.connect(on_signal)
    QTimer.singleShot(limit_ms, loop.quit)
    loop.exec()
    signal.disconnect(on_signal)
    return bool(fired)


def _idle(state: WorkbenchState) -> bool:
    return not state.busy and not state.running


def _expand_split_layers(window: MainWindow) -> None:
    for view in (col.view for col in window.editor.columns.values()):
        m = view.model()
        for row in range(m.rowCount()):
            if not m.index(row, 0).data(WholeRole):
                view.expand(m.index(row, 0))


def capture(window: MainWindow, path: str, tokens: int = 32, runs: int = 3) -> int:
    app = QApplication.instance()
    state = window.state
    errors: list[str] = []
    state.sigError.disconnect(window.show_error)  # no modal dialog: report on stderr and fail
    state.sigError.connect(lambda title, text: errors.append(f"{title}: {text}"))
    window.resize(*SIZE)
    window.default_sizes()
    window.show()
    if not _wait(app, state.sigModelChanged, done=lambda: state.model is not None or bool(errors)):
        errors.append("the model did not load in time")
    if state.model is not None and state.profile_routing(window.run_panel.settings().prompts):
        _wait(app, state.sigRoutingChanged, done=lambda: state.routing is not None or bool(errors))
    split = state.model is not None and len(state.devices) > 1
    if split:
        state.set_placement(strategies.uniform_split(state.model.config, state.device_names), "uniform split")
    panel = window.run_panel
    panel.tokens.setValue(tokens)
    panel.repeats.setValue(1)
    for i in range(runs):
        if errors or state.model is None:
            break
        if i == 1 and split:  # split one layer's experts across devices too: the output must not change
            layer = state.model.config.moe_layers[0]
            half = list(range(state.model.config.num_experts // 2, state.model.config.num_experts))
            state.move({layer: half}, state.device_names[-1])
            _expand_split_layers(window)
        if i == 2:
            panel.q.setValue(3)
        panel.start()
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
