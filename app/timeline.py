"""The device timeline: what each device ran, when, in a traced run's last steps (engine.core.trace's spans).

One lane per device, one rectangle per span coloured by its kind (attention, routing, staging to the peers and back,
experts, the primary's wait for the peers, ...), x the time in milliseconds since the first step shown; the draft's
passes take the lower half of a lane. Beside each lane, the device's busy share of the time shown: the union of its
spans other than waits, over the shown time.

The run's thread only hands each step's spans to the state's SpanRing (app.live); a timer redraws from it while a run
decodes (TIMELINE_HZ, only when a step came and the panel is shown) into one graphics item (SpanBars: a drawRects call
per kind whatever the number of spans), so a redraw stays a few milliseconds long. Time runs from the first step
shown, and the time axis keeps its range until the steps no longer fit it or fill less than a third of it: the axes
are not redrawn at every step. That matters beyond the redraw itself: the GUI thread's Python holds the GIL that the
run's thread takes back after every engine call.
"""

from __future__ import annotations

import html
import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, QTimer, Slot
from PySide6.QtGui import QColor, QCursor, QPen
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QSpinBox, QToolTip, QVBoxLayout, QWidget

from engine.core.trace import SPAN_KINDS

from .live import TRACED_STEPS, SpanColumns
from .plots import _plot
from .state import WorkbenchState

# per kind of span: its colour and what the legend and the hover say it is, in the legend's order (a narrow panel
# cuts the legend's end: the kinds of a MoE layer come first)
KIND_STYLE = {
    "attention": ("#2f6fdf", "attention"),
    "route": ("#e0a93a", "routing"),
    "stage": ("#d2463c", "staging"),
    "experts": ("#2e9d5b", "experts"),
    "join": ("#c3c8d0", "wait for peers (join)"),
    "combine": ("#8e5bd6", "stage back, sum"),
    "shared": ("#8cc63f", "shared experts"),
    "dense": ("#17a2b8", "dense FFN"),
    "embed": ("#9aa3ae", "embedding"),
    "logits": ("#5c6470", "logits"),
    "graph": ("#7aa5f0", "graph replay"),
}
KIND_TIPS = {
    "stage": "on the primary, the routing and rows read back; on a staged peer, its rows' upload and its outputs' "
    "download",
    "combine": "the peers' outputs sent back to the primary and summed in canonical order",
    "join": "the primary waiting for the peers' completion events",
    "graph": "a recorded part of a step, replayed",
}
WAITS = frozenset({"join"})  # spans that are waits: not busy time
STEPS_SHOWN = 8  # the last steps shown by default
TIMELINE_HZ = 10  # redraws a second while a run decodes
SHARES_EVERY = 0.5  # seconds between rewrites of the busy shares beside the lanes while a run decodes (each is an axis'
# whole redraw)
EMPTY = "no trace yet: runs are traced while this panel is open"


def axis_length(needed: float, current: float) -> float:
    """The time axis' length for steps that take `needed` ms: the current one while they fit it and fill a third of it
    or more, else the next 1, 2 or 5 times a power of ten above `needed`."""
    if needed <= 0:
        return current if current > 0 else 1.0
    if current > 0 and current / 3 <= needed <= current:
        return current
    power = 10.0 ** np.floor(np.log10(needed))
    return float(next(m * power for m in (1, 2, 5, 10) if m * power >= needed))


def busy_share(start: np.ndarray, end: np.ndarray, lo: float, hi: float) -> float:
    """The share of [lo, hi] covered by the union of the intervals [start, end] (overlaps counted once)."""
    if hi <= lo or len(start) == 0:
        return 0.0
    s, e = np.clip(start, lo, hi), np.clip(end, lo, hi)
    order = np.argsort(s, kind="stable")
    s, e = s[order], np.maximum.accumulate(e[order])
    # a new run of overlapping intervals starts where an interval starts after all before it ended
    first = np.r_[True, s[1:] > e[:-1]]
    last = np.r_[first[1:], True]
    return float(np.sum(e[last] - s[first])) / (hi - lo)


class SpanBars(pg.GraphicsObject):
    """Every span drawn as a rectangle, one drawRects call per kind from numpy-backed arrays (as pg.BarGraphItem draws
    one colour); its bounds kept, so that a paint asks Python for little (the run's thread holds the GIL in between)."""

    def __init__(self):
        super().__init__()
        self.rects: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}  # kind -> x0, y0, w, h
        self._arrays: list[tuple[QPen, QColor, object]] = []
        self._bounds = QRectF()

    def set_rects(self, rects: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> None:
        self.prepareGeometryChange()
        self.rects = rects
        self._arrays = []
        lo_x = lo_y = np.inf
        hi_x = hi_y = -np.inf
        for kind, (x0, y0, w, h) in rects.items():
            color = QColor(KIND_STYLE.get(kind, ("#888888", kind))[0])
            array = pg.Qt.internals.PrimitiveArray(QRectF, 4)
            array.resize(len(x0))
            memory = array.ndarray()
            memory[:, 0], memory[:, 1], memory[:, 2], memory[:, 3] = x0, y0, w, h
            pen = pg.mkPen(color, width=1)  # cosmetic: a span narrower than a pixel still shows
            self._arrays.append((pen, color, array))
            lo_x, lo_y = min(lo_x, float(x0.min())), min(lo_y, float(y0.min()))
            hi_x, hi_y = max(hi_x, float((x0 + w).max())), max(hi_y, float((y0 + h).max()))
        self._bounds = QRectF(lo_x, lo_y, hi_x - lo_x, hi_y - lo_y) if rects else QRectF()
        self.informViewBoundsChanged()
        self.update()

    def getData(self, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """(start, width) of the kind's rectangles, ms."""
        x0, _y0, w, _h = self.rects.get(kind, (np.zeros(0),) * 4)
        return x0, w

    def paint(self, p, *args) -> None:
        for pen, color, array in self._arrays:
            p.setPen(pen)
            p.setBrush(color)
            p.drawRects(*array.drawargs())

    def boundingRect(self) -> QRectF:
        return self._bounds


class Timeline(QWidget):
    def __init__(self, state: WorkbenchState, parent=None):
        super().__init__(parent)
        self.state = state
        self.ring = state.live.spans
        outer = QVBoxLayout(self)
        outer.setContentsMargins(8, 4, 8, 4)
        outer.setSpacing(4)
        top = QHBoxLayout()
        self.caption = QLabel(EMPTY)
        self.caption.setObjectName("muted")
        self.caption.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        top.addWidget(self.caption, 2)
        self.legend = QLabel()
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.legend.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.legend.setText("&nbsp;")  # one line from the start: its first kinds do not lay the panel out anew
        self._seen: set[str] = set()
        self.legend_kinds: list[str] = []
        top.addWidget(self.legend, 3)
        top.addSpacing(8)
        top.addWidget(QLabel("Steps"))
        self.steps = QSpinBox()
        self.steps.setRange(1, 64)
        self.steps.setValue(STEPS_SHOWN)
        self.steps.setToolTip("How many of the run's last steps the timeline shows (a step: one pass of the target, "
                              "with its draft's passes, giving one token or more)")  # fmt: skip
        self.steps.valueChanged.connect(lambda _v: self.redraw(force=True))
        top.addWidget(self.steps)
        outer.addLayout(top)
        self.plot = _plot("", "", "ms since the first step shown")
        self.plot.setToolTip("What each device ran in the run's last steps; hover a span for its token, layer, kind "
                             "and duration. Beside each device: its busy share of the time shown (its spans other than "
                             "waits). The draft's passes take the lower half of a lane")  # fmt: skip
        item = self.plot.getPlotItem()
        item.setTitle(None)
        item.showGrid(x=True, y=False, alpha=0.15)
        item.invertY(True)
        item.setMouseEnabled(x=True, y=False)
        item.getAxis("left").setWidth(118)
        item.getAxis("left").setStyle(tickLength=0)
        self.plot.setMinimumSize(240, 80)
        outer.addWidget(self.plot, 1)
        self.bars = SpanBars()
        self.plot.addItem(self.bars)
        self.summary = EMPTY  # what the caption says when no span is hovered
        self.hovered = ""  # the hovered span in words, shown in the caption instead
        self.lanes: list[str] = []
        self.shares: dict[str, float] = {}
        self.shown: SpanColumns | None = None  # what the last redraw drew
        self.window: tuple[float, float] = (0.0, 0.0)  # its time range, ms from origin_ns
        self.origin_ns = 0  # time 0 of the view: the start of the first step shown
        self._length = 0.0  # the time axis' length, ms
        self._lanes_drawn = -1
        self._drawn = (-1, -1)  # (ring version, steps) drawn
        self._empty: bool | None = None
        self._ticked = 0.0  # when the lanes' busy shares were last written
        self._ticks: list = []
        self.timer = QTimer(self)
        self.timer.setInterval(1000 // TIMELINE_HZ)
        self.timer.timeout.connect(self.redraw)
        state.sigRunStarted.connect(self._started)
        state.sigRunFinished.connect(self._finished)
        state.sigEngineChanged.connect(lambda: self.redraw(force=True))
        state.sigModelChanged.connect(self._model_changed)
        self.plot.scene().sigMouseMoved.connect(self._hovered)
        self.redraw(force=True)

    @Slot()
    def _started(self) -> None:
        self._seen.clear()
        self.redraw(force=True)
        self.timer.start()

    @Slot(object)
    def _finished(self, _record) -> None:
        self.timer.stop()
        self.redraw(force=True)

    @Slot()
    def _model_changed(self) -> None:
        """Another model: the previous one's spans are gone (the state emptied the ring), and so are its kinds from the
        legend (a model without shared experts lists none)."""
        if not self.state.running:
            self._seen.clear()
            self.hovered = ""
            self.redraw(force=True)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.redraw()  # what came while the panel was hidden

    @Slot()
    def redraw(self, force: bool = False) -> None:
        """Draw the ring's last steps: nothing to do when no step came since the last draw, or while hidden."""
        key = (self.ring.version, self.steps.value())
        if not force and (key == self._drawn or not self.isVisible()):
            return
        self._drawn = key
        cols = self.ring.last(self.steps.value())
        self.shown = cols
        lanes = list(self.state.device_names)
        lanes += [d for d in cols.devices if d not in lanes]
        self.lanes = lanes
        empty = len(cols) == 0
        # The axes stay shown, empty or not: showing them again would lay the plot out anew while a run draws
        if empty != self._empty or force:
            self._empty = empty
            self.plot.no_data.setVisible(empty)
            self._length = 0.0
        if empty:
            self.plot.no_data.setText(EMPTY if not self.state.running else "this run is not traced")
            self.plot.no_data.setPos(0.5, max(1, len(lanes)) / 2)
            self.plot.setXRange(0, 1, padding=0)
        t0 = self.origin_ns = int(cols.start.min()) if len(cols) else 0
        start = (cols.start - t0) / 1e6
        end = (cols.end - t0) / 1e6
        lane_of = np.array([lanes.index(d) for d in cols.devices], dtype=np.float64)
        y = lane_of[cols.device] if len(cols) else np.zeros(0)
        draft = cols.draft.astype(bool)
        y0 = np.where(draft, y + 0.5, y + 0.1)
        height = np.where(draft, 0.4, 0.8)
        rects = {}
        for i, kind in enumerate(SPAN_KINDS):
            mask = cols.kind == i
            if mask.any():
                rects[kind] = (start[mask], y0[mask], end[mask] - start[mask], height[mask])
        self.bars.set_rects(rects)
        seen = list(rects)
        lo, hi = (float(start.min()), float(end.max())) if len(cols) else (0.0, 0.0)
        self.window = (lo, hi)
        busy = cols.kind != -1
        for kind in WAITS:
            busy &= cols.kind != SPAN_KINDS.index(kind)
        self.shares = {}
        for name in lanes:
            if name in cols.devices:
                on = busy & (cols.device == cols.devices.index(name))
                self.shares[name] = busy_share(start[on], end[on], lo, hi)
        ticks = [(lane + 0.5, f"{name}  {100 * self.shares[name]:.0f} %" if name in self.shares else name)
                 for lane, name in enumerate(lanes)]  # fmt: skip
        now = time.monotonic()
        if ticks != self._ticks and (force or now - self._ticked >= SHARES_EVERY or len(ticks) != len(self._ticks)):
            self._ticks, self._ticked = ticks, now
            self.plot.getAxis("left").setTicks([ticks, []])
        if len(lanes) != self._lanes_drawn:
            self._lanes_drawn = len(lanes)
            self.plot.setYRange(0, max(1, len(lanes)), padding=0.02)
        # while a run decodes, a length that stays; after it, the steps' own
        length = axis_length(hi, self._length) if self.state.running else max(hi, 1e-3)
        if not empty and (length != self._length or force):
            self._length = length
            self.plot.setXRange(0, length, padding=0.01)
        self._caption(cols, hi - lo)
        self._legend(seen)

    def _caption(self, cols: SpanColumns, ms: float) -> None:
        if len(cols) == 0:
            self.summary = EMPTY
            self.caption.setText(self.hovered or self.summary)
            return
        # (the steps come in order; np.unique would import numpy.ma on the first draw: tens of milliseconds)
        steps = int(np.count_nonzero(np.diff(cols.step))) + 1
        tokens = cols.token[cols.draft == 0]
        where = f", positions {tokens.min()}-{tokens.max()}" if len(tokens) else ""
        share = "; ".join(f"{d} {100 * s:.0f} % busy" for d, s in self.shares.items())
        self.summary = f"Last {steps} step{'s' if steps != 1 else ''}{where}: {ms:.1f} ms"
        self.caption.setText(self.hovered or self.summary)
        self.caption.setToolTip(f"{len(cols)} spans shown. Busy share of the time shown: {share} (waits for the peers "
                                f"not counted). The timeline keeps the run's last {TRACED_STEPS} steps; "
                                f"{self.ring.spans} spans were traced so far")  # fmt: skip

    def _legend(self, seen: list[str]) -> None:
        """The kinds drawn so far in this run, on one line beside the caption (a change of its text never lays the
        panel out anew; a narrow panel cuts its end, its tooltip has them all)."""
        self._seen |= set(seen)
        kinds = self.legend_kinds = [k for k in KIND_STYLE if k in self._seen]
        parts = []
        for kind in kinds:
            color, text = KIND_STYLE.get(kind, ("#888888", kind))
            parts.append(f'<span style="color:{color}">&#9632;</span>&nbsp;{html.escape(text).replace(" ", "&nbsp;")}')
        text = " &nbsp; ".join(parts)
        if text != self.legend.text():
            self.legend.setText(text)
            tips = (f"{KIND_STYLE[k][1]}: {KIND_TIPS[k]}" if k in KIND_TIPS else KIND_STYLE[k][1] for k in kinds)
            self.legend.setToolTip("\n".join(tips))

    def kinds_shown(self) -> dict[str, dict[str, int]]:
        """Per device, how many spans of each kind the timeline draws."""
        cols, out = self.shown, {}
        if cols is None:
            return out
        for d, name in enumerate(cols.devices):
            on = cols.device == d
            counts = np.bincount(cols.kind[on & (cols.kind >= 0)], minlength=len(SPAN_KINDS))
            if counts.any():
                out[name] = {SPAN_KINDS[k]: int(n) for k, n in enumerate(counts) if n}
        return out

    def span_at(self, x: float, y: float, slack: float = 0.0) -> int | None:
        """The shown span under the point (x in ms, y in lanes), within slack ms: the shortest of those there."""
        cols = self.shown
        lane = int(np.floor(y))
        if cols is None or len(cols) == 0 or not 0 <= lane < len(self.lanes) or self.lanes[lane] not in cols.devices:
            return None
        start, end = (cols.start - self.origin_ns) / 1e6, (cols.end - self.origin_ns) / 1e6
        draft = cols.draft.astype(bool)
        inside = np.where(draft, (y >= lane + 0.5), (y >= lane + 0.1) & (y <= lane + 0.9))
        hit = (cols.device == cols.devices.index(self.lanes[lane])) & (start - slack <= x) & (end + slack >= x)
        hit &= inside
        if not hit.any():
            return None
        idx = np.flatnonzero(hit)
        return int(idx[np.argmin(end[idx] - start[idx])])

    def describe(self, i: int) -> str:
        """A shown span in words: its token, layer, kind, device, model and duration."""
        c = self.shown
        kind = SPAN_KINDS[c.kind[i]] if c.kind[i] >= 0 else "?"
        layer = f"layer {c.layer[i]}" if c.layer[i] >= 0 else "outside the layers"
        model = "draft" if c.draft[i] else "target"
        ms = (c.end[i] - c.start[i]) / 1e6
        return (f"token {c.token[i]}, {layer}: {KIND_STYLE.get(kind, ('', kind))[1]} on {c.devices[c.device[i]]} "
                f"({model}, {c.rows[i]} rows), {ms:.3f} ms")  # fmt: skip

    @Slot(object)
    def _hovered(self, pos: QPointF) -> None:
        box = self.plot.getPlotItem().getViewBox()
        i = None
        if box.sceneBoundingRect().contains(pos):
            p = box.mapSceneToView(pos)
            slack = 3 * box.viewPixelSize()[0]  # a few pixels' room around a span narrower than one
            i = self.span_at(p.x(), p.y(), slack)
        self.hovered = "" if i is None else self.describe(i)
        self.caption.setText(self.hovered or self.summary)
        if i is not None:
            QToolTip.showText(QCursor.pos(), self.hovered, self.plot)
