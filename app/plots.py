"""Live plots: rolling decode tokens/s and acceptance of the current run, per-run speed and output hash, and a strip
of the devices (how busy each was in the last run, or its share of the experts' bytes).

The live curves are redrawn by a timer (20 Hz) from the state's LiveBuffer, one setData each, while the panel is
shown; the per-run plots are redrawn when the history changes. The live plots keep their ranges while the data stays
inside them: x from the run's start (its first second at first), y from 0, each grown to a round bound with headroom
only when the data passes it, and set anew at a run's start, as the device timeline keeps its own. A new range lays
the axes out anew (their ticks, labels and grid); done at every redraw, it held the GIL that the run's thread takes
back after every engine call, and a run decoded at half its speed with the panel shown.

Per run, a point is the median decode tokens/s over the run's passes, with the slowest and the fastest pass as
whiskers when the run record carries them; consecutive runs are joined by a line only when they share their settings
(placement, mode, precision, draft and q, tokens) and both ran to the end. Every y axis starts at 0. A plot with
nothing to show says so and shows no axes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, QTimer, Slot
from PySide6.QtGui import QColor, QFontMetrics, QPainter
from PySide6.QtWidgets import QGraphicsItem, QGridLayout, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from . import theme
from .live import ROLLING_STEPS
from .state import RunRecord, WorkbenchState, format_bytes

REFRESH_HZ = 20
LIVE_HEADROOM = 1.15  # a live plot's range, when it grows, leaves this much room above the data
LIVE_SECONDS = 1.0  # the live plots' time axis at a run's start (it grows when the run passes it)
Y_STEPS = (1, 1.5, 2, 3, 4, 5, 6, 8)  # the values' bounds: the curve fills most of the plot's height
X_STEPS = (1, 2, 5)  # the time's: fewer changes (each lays an axis out anew), the whole run still shown
ACCEPT_RANGE = (-6.0, 106.0)  # the acceptance plot's y range: 0-100 % and room for the curve and the end labels
ACCEPT_TICKS = (0, 25, 50, 75, 100)
NO_DATA = "no data yet: start a run"
RUNS_TIP = ("Each run's median decode tokens/s over its passes, with whiskers from the slowest to the fastest pass; a "
            "line joins consecutive runs of the same settings only")  # fmt: skip
BYTES_TIP = ("Each device's share of the placed experts' bytes: the share of the expert reads it serves while "
             "decoding. During a run the strip shows each device's busy time instead")  # fmt: skip


def _of(record) -> str:
    """Which runs a run's output is compared with: those of its precision (q8 gives other logits than f32)."""
    return "" if record.precision == "f32" else f" of {record.precision} precision"


def divergence_mark(r: RunRecord) -> str:
    """The short note under a changed run's mark: where its output first parts from the reference run's and whether
    it was a near tie ('p1 t17 tie'); empty without a diagnosis."""
    first = (r.diagnosis or {}).get("first")
    if not first or first.get("index") is None:
        return ""
    tie = {True: " tie", False: " gap", None: ""}[first.get("near_tie")]
    return f"p{first['prompt']} t{first['index']}{tie}"


def settings_key(r: RunRecord) -> tuple:
    """What makes two runs' speeds comparable: the same placement, mode, precision, draft and q, and lengths."""
    return (r.target, r.placement, r.mode, r.precision, r.draft, r.q, r.tokens, r.prompts)


def joined(history: list[RunRecord]) -> np.ndarray:
    """pyqtgraph's connect array for the per-run curve: run i joined to run i+1 when both finished and they share
    their settings (a stopped run, or a change of settings, breaks the line)."""
    out = np.zeros(len(history), dtype=bool)
    for i in range(len(history) - 1):
        a, b = history[i], history[i + 1]
        finished = not a.cancelled and not b.cancelled
        measured = math.isfinite(a.decode_tokens_per_second) and math.isfinite(b.decode_tokens_per_second)
        out[i] = finished and measured and settings_key(a) == settings_key(b)
    return out


def whiskers(history: list[RunRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, low, high) of the runs whose record carries the slowest and fastest pass (decode_tokens_per_second_min
    and _max); records without them get no whisker."""
    x, lo, hi = [], [], []
    for r in history:
        low = getattr(r, "decode_tokens_per_second_min", None)
        high = getattr(r, "decode_tokens_per_second_max", None)
        if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
            continue
        x.append(r.index)
        lo.append(low)
        hi.append(high)
    return (np.array(x, dtype=np.float64), np.array(lo, dtype=np.float64), np.array(hi, dtype=np.float64))


def _plot(title: str, left: str, bottom: str) -> pg.PlotWidget:
    w = pg.PlotWidget()
    w.setTitle(title, size="10pt")
    font = w.font()
    font.setPointSize(10)
    # never narrower than its title (drawn over the plot, beside the left axis' room where it has a labelled one):
    # none is cut
    title_width = QFontMetrics(font).horizontalAdvance(title) + (64 if left else 16)
    w.setLabel("left", left)
    w.setLabel("bottom", bottom)
    w.showGrid(x=True, y=True, alpha=0.15)
    w.setMenuEnabled(False)
    w.setMinimumSize(max(150, title_width), 100)
    w.getPlotItem().getViewBox().setDefaultPadding(0.04)
    w.getPlotItem().getViewBox().setLimits(yMin=0)  # speeds and shares: never below 0
    for axis in ("left", "bottom"):
        w.getAxis(axis).enableAutoSIPrefix(False)
    note = pg.TextItem(NO_DATA, color=theme.colors()["muted"], anchor=(0.5, 0.5))
    w.addItem(note, ignoreBounds=True)
    w.no_data = note
    return w


def set_empty(plot: pg.PlotWidget, empty: bool, axes: tuple[str, ...] = ("left", "bottom")) -> None:
    """An empty plot shows its note and no axes (no made-up scale); a plot with data its axes and no note."""
    item = plot.getPlotItem()
    for axis in axes:
        item.showAxis(axis, not empty)
    plot.no_data.setVisible(empty)
    if empty:  # the note in the middle of a range that no axis shows
        (_x0, _x1), (y0, y1) = item.getViewBox().viewRange()
        if "left" in axes:
            y0, y1 = 0.0, 1.0
            plot.setYRange(y0, y1, padding=0)
        plot.setXRange(0, 1, padding=0)
        plot.no_data.setPos(0.5, (y0 + y1) / 2)


def is_empty(plot: pg.PlotWidget) -> bool:
    return plot.no_data.isVisible()


def round_above(value: float, steps: tuple[float, ...] = Y_STEPS) -> float:
    """The least of `steps` times a power of ten at or above value (1 for none above 0): an axis bound whose ticks
    read well."""
    if not (value > 0 and math.isfinite(value)):
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (*steps, 10) if m * power >= value * (1 - 1e-12))


def steady_top(top: float, needed: float, steps: tuple[float, ...] = Y_STEPS) -> float:
    """An axis' upper bound that holds while the data stays under it: `top` while `needed` fits, else a round value
    (round_above) above `needed` with LIVE_HEADROOM (the next growth is then some way off)."""
    if needed <= top or not math.isfinite(needed):
        return top
    return round_above(needed * LIVE_HEADROOM, steps)


def _hold_range(plot: pg.PlotWidget, x: tuple[float, float], y: tuple[float, float]) -> None:
    """Show x and y (no padding) unless the plot already shows them: an unchanged range lays nothing out anew."""
    shown = [v for pair in plot.viewRange() for v in pair]
    if any(not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) for a, b in zip(shown, (*x, *y), strict=True)):
        plot.setRange(xRange=x, yRange=y, padding=0)


def _y_from_zero(plot: pg.PlotWidget, values: np.ndarray, fallback: float = 1.0) -> None:
    finite = values[np.isfinite(values)]
    top = float(finite.max()) if finite.size else 0.0
    plot.setYRange(0, top * 1.15 if top > 0 else fallback, padding=0)


class Readout:
    """The value under the pointer: the point of a curve nearest the pointer's x, marked, with its x and y in words
    beside it (text(x, y)); hidden when the pointer leaves the plot or the curve has no point there."""

    def __init__(self, plot: pg.PlotWidget, curve, text: Callable[[float, float], str]):
        self.plot, self.curve, self.text = plot, curve, text
        c = theme.colors()
        self.label = pg.TextItem("", color=c["text"], fill=pg.mkBrush(c["base"]), border=pg.mkPen(c["muted"]))
        self.dot = pg.ScatterPlotItem(size=9, brush=pg.mkBrush(c["highlight"]), pen=None)
        for item in (self.label, self.dot):
            item.setZValue(10)
            plot.addItem(item, ignoreBounds=True)
        self.hide()
        plot.scene().sigMouseMoved.connect(self.moved)

    def hide(self) -> None:
        self.label.hide()
        self.dot.hide()

    def moved(self, scene_pos) -> None:
        box = self.plot.getPlotItem().getViewBox()
        x, y = self.curve.getData()
        if not box.sceneBoundingRect().contains(scene_pos) or x is None or not len(x) or is_empty(self.plot):
            self.hide()
            return
        at = box.mapSceneToView(scene_pos)
        i = int(np.argmin(np.abs(np.asarray(x, dtype=np.float64) - at.x())))
        if not (math.isfinite(x[i]) and math.isfinite(y[i])):
            self.hide()
            return
        (x0, x1), _ = box.viewRange()
        self.label.setAnchor((1.0, 1.0) if x[i] > (x0 + x1) / 2 else (0.0, 1.0))  # toward the middle: never cut
        self.label.setText(self.text(float(x[i]), float(y[i])))
        self.label.setPos(x[i], y[i])
        self.dot.setData([x[i]], [y[i]])
        self.label.show()
        self.dot.show()


class DeviceBar(QWidget):
    """One device of the strip: its name, a bar of a share (0..1, more than 1 is drawn full) and the share's text."""

    def __init__(self, device: str, kind: str = "", parent=None):
        super().__init__(parent)
        self.device = device
        self.color = theme.device_color(device, kind)
        self.share: float | None = None
        self.text = ""
        # its name and the longest text it shows whole, beside each other
        metrics = self.fontMetrics()
        self.setMinimumSize(metrics.horizontalAdvance(device) + 8 + metrics.horizontalAdvance("100 % busy") + 16, 20)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def set_share(self, share: float | None, text: str, tip: str = "") -> None:
        # drawn anew only when the text or the bar's length (to a thousandth) changed: during a run it is set 20
        # times a second
        drawn = (self.text, None if self.share is None else round(self.share, 3))
        self.share, self.text = share, text
        self.setToolTip(f"{self.device}: {tip or text}")
        if drawn != (text, None if share is None else round(share, 3)):
            self.update()

    def paintEvent(self, event) -> None:
        c = theme.colors()
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        metrics = self.fontMetrics()
        name_w = metrics.horizontalAdvance(self.device) + 8
        rect = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        p.setPen(QColor(c["text"]))
        left, right, middle = Qt.AlignmentFlag.AlignLeft, Qt.AlignmentFlag.AlignRight, Qt.AlignmentFlag.AlignVCenter
        p.drawText(rect, left | middle, self.device)
        track = QRectF(rect.left() + name_w, rect.top() + 3, max(10.0, rect.width() - name_w), rect.height() - 6)
        p.setPen(QColor(c["border"]))
        p.setBrush(QColor(c["alt"]))
        p.drawRoundedRect(track, 3, 3)
        if self.share is not None:
            fill = QRectF(track)
            fill.setWidth(track.width() * min(max(self.share, 0.0), 1.0))
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(self.color)
            p.drawRoundedRect(fill, 3, 3)
        p.setPen(QColor(c["text"]))
        p.drawText(track.adjusted(6, 0, -6, 0), right | middle, self.text)
        p.end()


class DeviceStrip(QWidget):
    """A small bar per device, as nvtop shows them: during a run, the share of the last steps' time each device spent
    running kernels (LiveBuffer.busy_shares, redrawn with the live plots); after a run, the share over the whole
    run (the record's device_busy_share); with no run yet, each device's share of the placed experts' bytes."""

    def __init__(self, state: WorkbenchState, parent=None):
        super().__init__(parent)
        self.state = state
        self.bars: dict[str, DeviceBar] = {}
        self.source = "none"  # "busy" (a run's busy shares) or "bytes" (the placement's bytes shares)
        # the caption above the bars: beside them it would widen the panel by its longest text
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        self.row = QHBoxLayout()
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.setSpacing(12)
        self.caption = QLabel()
        self.caption.setObjectName("muted")
        column.addWidget(self.caption)
        column.addLayout(self.row)
        for sig in (state.sigEngineChanged, state.sigModelChanged, state.sigPlacementChanged, state.sigRunStarted,
                    state.sigHistoryChanged):  # fmt: skip
            sig.connect(self.refresh)
        self.refresh()

    def values(self) -> dict[str, float]:
        return {name: bar.share for name, bar in self.bars.items() if bar.share is not None}

    def _rebuild(self, devices: list[tuple[str, str]]) -> None:
        if list(self.bars) == [name for name, _kind in devices]:
            return
        for bar in self.bars.values():
            self.row.removeWidget(bar)
            bar.deleteLater()
        self.bars = {}
        for name, kind in devices:
            bar = DeviceBar(name, kind)
            self.bars[name] = bar
            self.row.addWidget(bar, 1)

    @Slot()
    def refresh(self) -> None:
        s = self.state
        self._rebuild([(d.name, d.kind) for d in s.devices])
        last = s.history[-1] if s.history else None
        if s.running:
            busy = s.live.busy_shares()
            what = f"the last {ROLLING_STEPS} steps' time"
            where = "decoding…"
        else:
            busy = getattr(last, "device_busy_share", None) if last is not None else None
            what = "run {}'s step time".format(last.index if last is not None else "")
            where = f"run {last.index}" if last is not None else ""
        if busy:
            self.source = "busy"
            self.caption.setText(f"Busy ({where}):")
            self.caption.setToolTip(f"The share of {what} each device spent running kernels (several threads or "
                                    "streams can make it exceed 100 %)")  # fmt: skip
            for name, bar in self.bars.items():
                share = busy.get(name)
                bar.set_share(share, "-" if share is None else f"{100 * share:.0f} % busy")
            return
        used = dict(getattr(s, "used_bytes", {}) or {})
        total = sum(used.values())
        if s.model is None or total <= 0:
            self.source = "none"
            self.caption.setText("No model loaded" if s.model is None else "No experts placed")
            self.caption.setToolTip("")
            for bar in self.bars.values():
                bar.set_share(None, "")
            return
        self.source = "bytes"
        self.caption.setText("Experts' bytes:")
        self.caption.setToolTip(BYTES_TIP)
        for name, bar in self.bars.items():
            share = used.get(name, 0) / total
            held = format_bytes(used.get(name, 0))
            bar.set_share(share, f"{100 * share:.0f} %", f"{100 * share:.0f} % of the placed experts' bytes ({held})")


class LivePlots(QWidget):
    def __init__(self, state: WorkbenchState, parent=None):
        super().__init__(parent)
        self.state = state
        c = theme.colors()
        outer = QVBoxLayout(self)
        outer.setContentsMargins(8, 4, 8, 8)
        outer.setSpacing(6)
        self.devices = DeviceStrip(state)
        outer.addWidget(self.devices)
        grid = QGridLayout()
        grid.setSpacing(8)
        outer.addLayout(grid, 1)
        # Short titles: each plot is as wide as its title (the rest in the tooltips), and four fit a 1366 screen; the
        # live plots' time axes say they are this run's.
        self.rate_plot = _plot("Decode tok/s", "tokens/s", "seconds")
        self.rate_plot.setToolTip(f"This run's decode tokens/s over the last {ROLLING_STEPS} decode steps")
        self.accept_plot = _plot("Acceptance", "%", "seconds")
        self.accept_plot.setToolTip(f"This run's accepted share of drafted tokens over the last {ROLLING_STEPS} "
                                    "decode steps")  # fmt: skip
        self.runs_plot = _plot("Tok/s per run", "tokens/s", "run")
        self.runs_plot.setToolTip(RUNS_TIP)
        self.hash_plot = _plot("Output hash per run", "", "")
        self.hash_plot.setToolTip("Each run's output hash against the reference run (the first complete run of the "
                                  "same prompts, length and precision): a diamond the reference, a dot the same "
                                  "output, a cross a CHANGED output, a triangle a stopped run. Under a cross: the "
                                  "prompt and token where the output first parts from the reference's, and whether "
                                  "that was a near tie (its tooltip says why)")  # fmt: skip
        self.hash_plot.getPlotItem().hideAxis("left")
        self.hash_plot.getPlotItem().getViewBox().setLimits(yMin=-1.0)
        self.hash_plot.setYRange(-0.6, 1.7, padding=0)  # the marks at 0, their hashes above, the legend on top
        self.hash_plot.setMouseEnabled(x=True, y=False)
        for i, w in enumerate((self.rate_plot, self.accept_plot, self.runs_plot, self.hash_plot)):
            grid.addWidget(w, i // 2, i % 2)
        accent = theme.KIND_COLORS["cpu"]
        self.rate_curve = self.rate_plot.plot(pen=pg.mkPen(accent, width=2))
        self.accept_curve = self.accept_plot.plot(pen=pg.mkPen(theme.KIND_COLORS["gpu"], width=2))
        # its range is always 0-100 %, with room below 0 and above 100 so that their labels are drawn too (an axis
        # drops the label of a tick at its very end): five fixed ticks stay readable where the plot is short
        self.accept_plot.getAxis("left").setTicks([[(v, str(v)) for v in ACCEPT_TICKS], []])
        self.accept_plot.getPlotItem().getViewBox().setLimits(yMin=ACCEPT_RANGE[0])
        for curve in (self.rate_curve, self.accept_curve):
            curve.setClipToView(True)
            curve.setDownsampling(auto=True, method="peak")
        for plot in (self.rate_plot, self.accept_plot):
            plot.getPlotItem().getViewBox().disableAutoRange()  # refresh_live sets the ranges
            for axis in ("left", "bottom"):
                # An axis draws its grid over the whole plot: each new curve would replay its drawing. Cached as a
                # pixmap, it is drawn anew only when its range or size changes.
                plot.getAxis(axis).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self._empty: dict[pg.PlotWidget, bool | None] = {self.rate_plot: None, self.accept_plot: None}
        self.x_top, self.y_top = LIVE_SECONDS, 0.0  # the live plots' upper bounds (time s, tokens/s), grown in a run
        self._stale = False  # a redraw was skipped while the panel was hidden
        self.runs_whiskers = pg.ErrorBarItem(x=np.zeros(0), y=np.zeros(0), beam=0.25, pen=pg.mkPen(accent, width=1.2))
        self.runs_plot.addItem(self.runs_whiskers)
        self.runs_curve = self.runs_plot.plot(pen=pg.mkPen(accent, width=1.5), symbol="o", symbolSize=7,
                                              symbolBrush=accent, symbolPen=None)  # fmt: skip
        # the value under the pointer: each point's time (or run) and value
        self.readouts = {
            self.rate_plot: Readout(self.rate_plot, self.rate_curve, lambda x, y: f"{x:.1f} s: {y:.1f} tok/s"),
            self.accept_plot: Readout(self.accept_plot, self.accept_curve, lambda x, y: f"{x:.1f} s: {y:.0f} %"),
            self.runs_plot: Readout(self.runs_plot, self.runs_curve, lambda x, y: f"run {x:.0f}: {y:.1f} tok/s"),
        }
        self.hash_marks = pg.ScatterPlotItem(size=13, hoverable=True, tip=lambda x, y, data: data)
        self.hash_plot.addItem(self.hash_marks)
        self.hash_legend = pg.LegendItem(labelTextColor=c["muted"], colCount=4, labelTextSize="8pt",
                                         horSpacing=4)  # fmt: skip
        # Over the top of the plot, above the marks and their hashes (in the plot's layout, its width would set the
        # plot's minimum width even when hidden)
        self.hash_legend.setParentItem(self.hash_plot.getPlotItem().getViewBox())
        self.hash_legend.anchor((0, 0), (0, 0), offset=(2, 0))
        for brush, symbol, name in self._hash_styles():
            sample = pg.ScatterPlotItem(size=10, symbol=symbol, brush=pg.mkBrush(brush), pen=None)
            self.hash_legend.addItem(sample, name)
        self._hash_labels: list[pg.TextItem] = []
        self._colors = c
        self.timer = QTimer(self)
        self.timer.setInterval(1000 // REFRESH_HZ)
        self.timer.timeout.connect(self.refresh_live)
        state.sigRunStarted.connect(self._started)
        state.sigRunFinished.connect(self._finished)
        state.sigHistoryChanged.connect(self.refresh_runs)
        state.sigModelChanged.connect(self._model_changed)
        self.refresh_live()
        self.refresh_runs()

    @staticmethod
    def _hash_styles() -> list[tuple[str, str, str]]:
        """(colour, symbol, legend text) of the hash plot's marks: reference, same, changed, stopped."""
        c = theme.colors()
        return [(c["highlight"], "d", "reference"), (c["ok"], "o", "same"), (c["bad"], "x", "changed"),
                (c["muted"], "t", "stopped")]  # fmt: skip

    def legend_names(self) -> list[str]:
        return [label.text for _sample, label in self.hash_legend.items]

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.refresh_runs()  # as many hash labels as the width has room for, the legend where it fits

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._stale:  # what came while the panel was hidden
            self.refresh_live()

    @Slot()
    def _started(self) -> None:
        self.x_top, self.y_top = LIVE_SECONDS, 0.0  # each run its own ranges
        self.refresh_live()
        self.timer.start()

    @Slot(object)
    def _finished(self, _record) -> None:
        self.timer.stop()
        self.refresh_live()

    @Slot()
    def _model_changed(self) -> None:
        """Another model: the live curves (the state emptied its buffer) and their ranges start again."""
        if not self.state.running:
            self.x_top, self.y_top = LIVE_SECONDS, 0.0
            self.refresh_live()

    def _set_empty(self, plot: pg.PlotWidget, empty: bool) -> None:
        """set_empty when the plot's empty state changes (showing or hiding its axes lays the plot out anew)."""
        if self._empty[plot] != empty:
            self._empty[plot] = empty
            set_empty(plot, empty)

    @Slot()
    def refresh_live(self) -> None:
        """Redraw the live curves and the device strip, nothing while the panel is hidden (showEvent catches up)."""
        self._stale = not self.isVisible()
        if self._stale:
            return
        if self.state.running:
            self.devices.refresh()  # the live busy shares
        t, rate, accept = self.state.live.snapshot()
        self.rate_curve.setData(t, rate, connect="finite")
        ok = np.isfinite(accept)
        self.accept_curve.setData(t[ok], accept[ok])
        self._set_empty(self.rate_plot, len(t) == 0)
        self._set_empty(self.accept_plot, not ok.any())
        if not len(t):
            return
        self.x_top = steady_top(self.x_top, float(t[-1]), X_STEPS)  # time runs forward: the last point is the latest
        finite = rate[np.isfinite(rate)]
        self.y_top = steady_top(self.y_top, float(finite.max()) if finite.size else 0.0)
        _hold_range(self.rate_plot, (0.0, self.x_top), (0.0, self.y_top or 1.0))
        if ok.any():
            _hold_range(self.accept_plot, (0.0, self.x_top), ACCEPT_RANGE)

    @Slot()
    def refresh_runs(self) -> None:
        history = self.state.history
        x = np.array([r.index for r in history], dtype=np.float64)
        y = np.array([r.decode_tokens_per_second for r in history], dtype=np.float64)
        c = theme.colors()
        brushes = [pg.mkBrush(c["muted"] if r.cancelled else theme.KIND_COLORS["cpu"]) for r in history]
        self.runs_curve.setData(x, y, connect=joined(history), symbolBrush=brushes)
        wx, lo, hi = whiskers(history)
        med = {r.index: r.decode_tokens_per_second for r in history}
        wy = np.array([med[int(i)] for i in wx], dtype=np.float64)
        self.runs_whiskers.setData(x=wx, y=wy, top=hi - wy, bottom=wy - lo)
        set_empty(self.runs_plot, len(history) == 0)
        set_empty(self.hash_plot, len(history) == 0, ("bottom",))
        # The legend in one row where it fits; a narrower plot leaves it to the tooltip
        legend = self.hash_legend.boundingRect().width()
        self.hash_legend.setVisible(bool(history) and legend + 4 <= self.hash_plot.getPlotItem().getViewBox().width())
        spots = []
        for item in self._hash_labels:
            self.hash_plot.removeItem(item)
        self._hash_labels.clear()
        styles = {name: (brush, symbol) for brush, symbol, name in self._hash_styles()}
        for r in history:
            if not r.output_hash:
                key, tip = "stopped", "no complete output (stopped)"
            elif r.is_reference:
                key, tip = "reference", f"the reference run{_of(r)}"
            elif r.stable:
                key, tip = "same", f"same output as the reference run{_of(r)}"
            else:
                key, tip = "changed", f"output CHANGED from the reference run{_of(r)}"
                if r.diagnosis:
                    tip += "\n" + "\n".join(r.diagnosis.get("lines") or [r.diagnosis.get("summary", "")])
            brush, symbol = styles[key]
            spots.append({"pos": (r.index, 0), "brush": pg.mkBrush(brush), "symbol": symbol, "pen": None,
                          "data": f"run {r.index}: {tip}; output {r.short_hash}"})  # fmt: skip
        self.hash_marks.setData(spots)
        box = self.hash_plot.getPlotItem().getViewBox()
        tall = box.height() >= 100  # room for a hash above each mark; else the hashes are in the marks' tooltips
        room = max(1, min(16, int(box.width() / 80))) if tall else 16  # a hash label takes about 80 pixels
        for r in history[-room:] if tall else []:  # labels only for the last runs: more would overlap
            label = pg.TextItem(r.short_hash[:8], color=c["muted"], anchor=(0.5, 1.0), angle=0)
            label.setPos(r.index, 0.45)
            self.hash_plot.addItem(label)
            self._hash_labels.append(label)
        for r in history[-room:]:  # under a changed run's mark, where its output parts from the reference's
            if note := divergence_mark(r):
                below = pg.TextItem(note, color=c["bad"], anchor=(0.5, 0.0), angle=0)
                below.setPos(r.index, -0.15)
                self.hash_plot.addItem(below)
                self._hash_labels.append(below)
        step = max(1, math.ceil(len(history) / 10))
        for plot in (self.runs_plot, self.hash_plot):
            plot.getAxis("bottom").setTickSpacing(step, step)
        if history:
            lo_x = max(0.5, history[-1].index - room + 0.5)
            self.hash_plot.setXRange(lo_x, history[-1].index + 0.5, padding=0)
            self.runs_plot.setXRange(0.5, history[-1].index + 0.5, padding=0.02)
            _y_from_zero(self.runs_plot, np.concatenate([y, hi]))

    def export_png(self, path: str) -> bool:
        return self.grab().save(path, "PNG")
