"""Live plots: rolling decode tokens/s and acceptance of the current run, and per-run speed and output hash.

The live curves are redrawn by a timer (20 Hz) from the state's LiveBuffer, one setData each; the per-run
plots are redrawn when the history changes.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QTimer, Slot
from PySide6.QtWidgets import QGridLayout, QWidget

from . import theme
from .state import WorkbenchState

REFRESH_HZ = 20


def _of(record) -> str:
    """Which runs a run's output is compared with: those of its precision (q8 gives other logits than f32)."""
    return "" if record.precision == "f32" else f" of {record.precision} precision"


def _plot(title: str, left: str, bottom: str) -> pg.PlotWidget:
    w = pg.PlotWidget()
    w.setTitle(title, size="10pt")
    w.setLabel("left", left)
    w.setLabel("bottom", bottom)
    w.showGrid(x=True, y=True, alpha=0.15)
    w.setMenuEnabled(False)
    w.setMinimumSize(200, 100)
    w.getPlotItem().getViewBox().setDefaultPadding(0.04)
    for axis in ("left", "bottom"):
        w.getAxis(axis).enableAutoSIPrefix(False)
    return w


class LivePlots(QWidget):
    def __init__(self, state: WorkbenchState, parent=None):
        super().__init__(parent)
        self.state = state
        c = theme.colors()
        grid = QGridLayout(self)
        grid.setContentsMargins(8, 4, 8, 8)
        grid.setSpacing(8)
        self.rate_plot = _plot("Decode tokens/s (rolling, this run)", "tokens/s", "seconds")
        self.accept_plot = _plot("Draft acceptance (rolling, this run)", "%", "seconds")
        self.accept_plot.setYRange(0, 100, padding=0.05)
        self.runs_plot = _plot("Decode tokens/s per run", "tokens/s", "run")
        self.hash_plot = _plot("Output hash per run (vs. the reference run)", "", "run")
        self.hash_plot.getPlotItem().hideAxis("left")
        self.hash_plot.setYRange(-0.6, 1.2, padding=0)
        self.hash_plot.setMouseEnabled(x=True, y=False)
        for i, w in enumerate((self.rate_plot, self.accept_plot, self.runs_plot, self.hash_plot)):
            grid.addWidget(w, i // 2, i % 2)
        accent = theme.KIND_COLORS["cpu"]
        self.rate_curve = self.rate_plot.plot(pen=pg.mkPen(accent, width=2))
        self.accept_curve = self.accept_plot.plot(pen=pg.mkPen(theme.KIND_COLORS["gpu"], width=2))
        for curve in (self.rate_curve, self.accept_curve):
            curve.setClipToView(True)
            curve.setDownsampling(auto=True, method="peak")
        self.runs_curve = self.runs_plot.plot(pen=pg.mkPen(accent, width=1.5), symbol="o", symbolSize=7,
                                              symbolBrush=accent, symbolPen=None)  # fmt: skip
        self.hash_marks = pg.ScatterPlotItem(size=13)
        self.hash_plot.addItem(self.hash_marks)
        self._hash_labels: list[pg.TextItem] = []
        self._colors = c
        self.timer = QTimer(self)
        self.timer.setInterval(1000 // REFRESH_HZ)
        self.timer.timeout.connect(self.refresh_live)
        state.sigRunStarted.connect(self._started)
        state.sigRunFinished.connect(self._finished)
        state.sigHistoryChanged.connect(self.refresh_runs)
        self.refresh_runs()

    @Slot()
    def _started(self) -> None:
        self.refresh_live()
        self.timer.start()

    @Slot(object)
    def _finished(self, _record) -> None:
        self.timer.stop()
        self.refresh_live()

    @Slot()
    def refresh_live(self) -> None:
        t, rate, accept = self.state.live.snapshot()
        self.rate_curve.setData(t, rate, connect="finite")
        ok = np.isfinite(accept)
        self.accept_curve.setData(t[ok], accept[ok])

    @Slot()
    def refresh_runs(self) -> None:
        history = self.state.history
        x = np.array([r.index for r in history], dtype=np.float64)
        y = np.array([r.decode_tokens_per_second for r in history], dtype=np.float64)
        self.runs_curve.setData(x, y, connect="finite")
        c = theme.colors()
        spots = []
        for item in self._hash_labels:
            self.hash_plot.removeItem(item)
        self._hash_labels.clear()
        for r in history:
            if not r.output_hash:
                brush, symbol, tip = c["muted"], "t", "no complete output (stopped)"
            elif r.is_reference:
                brush, symbol, tip = c["highlight"], "d", f"the reference run{_of(r)}"
            elif r.stable:
                brush, symbol, tip = c["ok"], "o", f"same output as the reference run{_of(r)}"
            else:
                brush, symbol, tip = c["bad"], "x", f"output CHANGED from the reference run{_of(r)}"
            spots.append({"pos": (r.index, 0), "brush": pg.mkBrush(brush), "symbol": symbol, "pen": None,
                          "data": f"run {r.index}: {tip}"})  # fmt: skip
        self.hash_marks.setData(spots)
        for r in history[-16:]:  # labels only for the last runs: more would overlap
            label = pg.TextItem(r.short_hash[:8], color=c["muted"], anchor=(0.5, 1.0), angle=0)
            label.setPos(r.index, 0.45)
            self.hash_plot.addItem(label)
            self._hash_labels.append(label)
        step = max(1, math.ceil(len(history) / 10))
        for plot in (self.runs_plot, self.hash_plot):
            plot.getAxis("bottom").setTickSpacing(step, step)
        if history:
            lo = max(0.5, history[-1].index - 15.5)
            self.hash_plot.setXRange(lo, history[-1].index + 0.5, padding=0)
            self.runs_plot.setXRange(0.5, history[-1].index + 0.5, padding=0.02)
            finite = y[np.isfinite(y)]
            if finite.size and not math.isclose(finite.max(), 0):
                self.runs_plot.setYRange(0, finite.max() * 1.15, padding=0)

    def export_png(self, path: str) -> bool:
        return self.grab().save(path, "PNG")
