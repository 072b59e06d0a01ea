"""The device timeline: a traced run in the window fills a lane per device with its spans by kind and each device's
busy share, the GUI thread keeps answering while it draws, and File > Export > Trace writes the run's Chrome trace."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from app_helpers import TIMEOUT_MS  # noqa: E402
from PySide6.QtCore import QPointF, QTimer  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from app.live import TRACED_STEPS, SpanRing  # noqa: E402
from app.timeline import busy_share  # noqa: E402
from engine.core.trace import SPAN_KINDS, Span  # noqa: E402
from engine.runs.run import StepEvent  # noqa: E402

STALL_MS = 50  # the longest the GUI thread may go without answering while the timeline draws


class Heartbeat:
    """A 5 ms timer on the GUI thread: the longest gap between its ticks is the longest the GUI thread was busy, counted
    while counting() holds."""

    def __init__(self, counting=lambda: True):
        self.longest = 0.0
        self.ticks = 0
        self._last = None
        self.counting = counting
        self.timer = QTimer()
        self.timer.setInterval(5)
        self.timer.timeout.connect(self._tick)

    def _tick(self):
        now = time.perf_counter()
        if not self.counting():
            self._last = None
            return
        if self._last is not None:
            self.longest = max(self.longest, now - self._last)
        self._last = now
        self.ticks += 1

    def start(self):
        self._last = None
        self.timer.start()

    def stop(self):
        self.timer.stop()


def wide_window(qtbot, make_window):
    """A window in the wide arrangement, where the timeline is shown beside the other panels."""
    window = make_window()
    window.resize(1600, 1000)
    qtbot.waitUntil(lambda: window.width() == 1600 and not window.compact)
    qtbot.waitUntil(window.timeline.isVisible)
    return window


def split_layer_zero(qtbot, state):
    """Every expert of layer 0 on hostsim:0: its layer steps stage rows there and join (cpu:0 is the primary)."""
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.move({0: list(range(8))}, "hostsim:0")


def start_run(window, tokens, repeats=1):
    panel = window.run_panel
    panel.tokens.setValue(tokens)
    panel.repeats.setValue(repeats)
    panel.q.setValue(2)
    panel.prompts.setPlainText("The quick brown fox")
    window.act_start.trigger()


def test_a_run_fills_a_lane_per_device_with_spans_by_kind_and_the_gui_keeps_answering(qtbot, make_window):
    """The stall is measured while the timeline draws a decoding run: from its first drawn step to the run's last
    step, with the live plots' panel closed (their own redraws at 20 Hz are not the timeline's: bench/live_plots_cost.py
    measures those, 36-53 ms at most on a busy 2-core machine, untraced too). The run's start is not counted: the
    window stalls 40-60 ms there before anything is traced or drawn (the first step reaching the panels)."""
    window = wide_window(qtbot, make_window)
    state, timeline = window.state, window.timeline
    assert state.trace_runs and timeline.kinds_shown() == {} and "no trace yet" in timeline.caption.text()
    split_layer_zero(qtbot, state)
    draws = []
    redraw = timeline.redraw

    def timed(force=False):
        t0 = time.perf_counter()
        redraw(force)
        draws.append(time.perf_counter() - t0)

    timeline.timer.timeout.disconnect()
    timeline.timer.timeout.connect(timed)
    window.docks["plots"].close()
    beat = Heartbeat(lambda: len(timeline.shown or ()) > 0 and 0 < state.live.progress[0] < state.live.progress[1])
    beat.start()
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        start_run(window, tokens=160, repeats=8)  # a second or more: several timer ticks
        qtbot.waitUntil(lambda: len(timeline.shown or ()) > 0, timeout=TIMEOUT_MS)  # drawn during the run
        assert state.running
    beat.stop()
    record = finished.args[0]
    assert not record.cancelled and beat.ticks > 20 and len(draws) >= 4
    # a responsiveness bound, not a speed claim: the GUI thread never went STALL_MS without answering
    assert beat.longest * 1000 < STALL_MS, f"the GUI thread stalled {beat.longest * 1000:.1f} ms"

    shown = timeline.kinds_shown()
    assert timeline.lanes[:2] == ["cpu:0", "hostsim:0"]
    assert {"attention", "route", "stage", "join", "combine", "logits"} <= set(shown["cpu:0"])
    # layer 0's experts, all of them there, between their rows' upload and their outputs' download (hostsim:0 is
    # staged: a stage span each way, as many as its experts spans)
    assert set(shown["hostsim:0"]) == {"experts", "stage"}
    assert shown["hostsim:0"]["stage"] == 2 * shown["hostsim:0"]["experts"]
    # the drawn rectangles: the experts' item has one bar per experts span, hostsim:0's in its lane
    cols = timeline.shown
    x0, width = timeline.bars.getData("experts")
    n_experts = int((cols.kind == SPAN_KINDS.index("experts")).sum())
    assert len(x0) == len(width) == n_experts > 0 and (width >= 0).all() and (x0 >= 0).all()
    lanes = np.floor(timeline.bars.rects["experts"][1]).astype(int)
    assert set(lanes) == {0, 1}  # cpu:0's own experts (layer 2) and hostsim:0's (layer 0)
    assert len(timeline.bars.getData("attention")[0]) == shown["cpu:0"]["attention"]
    steps = len(np.unique(cols.step))
    assert steps == timeline.steps.value() and "Last 8 steps" in timeline.caption.text()
    # beside each lane its busy share of the time shown
    assert set(timeline.shares) == {"cpu:0", "hostsim:0"}
    assert 0 < timeline.shares["hostsim:0"] < timeline.shares["cpu:0"] <= 1
    ticks = dict(timeline.plot.getAxis("left")._tickLevels[0])
    assert ticks[0.5].startswith("cpu:0") and ticks[1.5].startswith("hostsim:0") and ticks[1.5].endswith("%")
    assert timeline.legend_kinds[:6] == ["attention", "route", "stage", "experts", "join", "combine"]
    assert "staging" in timeline.legend.text()
    # hover: the span under a point in words
    on_hostsim = cols.device == cols.devices.index("hostsim:0")
    i = int(np.flatnonzero(on_hostsim & (cols.kind == SPAN_KINDS.index("experts")))[-1])
    x = (cols.start[i] + cols.end[i] - 2 * timeline.origin_ns) / 2e6
    hit = timeline.span_at(x, 1.5, slack=0.001)
    assert hit is not None and cols.device[hit] == cols.device[i]
    text = timeline.describe(hit)
    assert text.startswith(f"token {cols.token[hit]}, layer 0: experts on hostsim:0") and text.endswith(" ms")
    assert timeline.span_at(x, 7.0) is None  # below the lanes
    # the ring keeps the last steps only, and counted every span of the run
    assert len(timeline.ring) <= TRACED_STEPS and timeline.ring.spans == len(state.last_trace.spans)


def test_the_ring_is_bounded_and_the_view_draws_recorded_steps(qtbot, make_window):
    """Recorded steps (made-up spans) through the state's ring: the last TRACED_STEPS steps kept, the last N drawn,
    the busy share from the union of a device's spans other than waits."""
    window = wide_window(qtbot, make_window)
    ring, timeline = window.state.live.spans, window.timeline
    ms = 1_000_000

    def step(k):
        base = 10 * ms * k
        return (Span("attention", "cpu:0", 0, k, 1, base, base + 2 * ms),
                Span("stage", "cpu:0", 0, k, 1, base + 2 * ms, base + 3 * ms),
                Span("experts", "hostsim:0", 0, k, 8, base + 3 * ms, base + 7 * ms),
                Span("experts", "cpu:0", 0, k, 8, base + 3 * ms, base + 5 * ms),
                Span("join", "cpu:0", 0, k, 1, base + 5 * ms, base + 7 * ms),
                Span("combine", "cpu:0", 0, k, 1, base + 7 * ms, base + 8 * ms),
                Span("attention", "cpu:0", 0, k, 1, base + 8 * ms, base + 10 * ms, "draft"))  # fmt: skip

    for k in range(TRACED_STEPS + 40):
        window.state.live.append(StepEvent("decode", 0, 0, 1, 0, 0, k, 0.0, 0.0, (1,), 0, step(k)))
    assert len(ring) == TRACED_STEPS and ring.spans == 7 * (TRACED_STEPS + 40)
    timeline.steps.setValue(4)  # redraws
    cols = timeline.shown
    assert len(cols) == 4 * 7 and cols.token.min() == TRACED_STEPS + 36
    assert timeline.kinds_shown() == {"cpu:0": {"attention": 8, "stage": 4, "experts": 4, "join": 4, "combine": 4},
                                      "hostsim:0": {"experts": 4}}  # fmt: skip
    # cpu:0 runs 8 ms of every 10 (its 2 ms join is a wait), hostsim:0 4 ms; the window is 4 steps' 40 ms
    assert timeline.window[1] - timeline.window[0] == pytest.approx(40.0)
    assert timeline.shares == pytest.approx({"cpu:0": 0.8, "hostsim:0": 0.4})
    # the draft's spans take the lower half of a lane
    y0 = timeline.bars.rects["attention"][1]
    assert sorted(set(np.round(y0, 2))) == [0.1, 0.5]
    x = float(timeline.bars.getData("join")[0][-1]) + 1.0
    assert "wait for peers (join) on cpu:0" in timeline.describe(timeline.span_at(x, 0.5))
    # the pointer over it: the caption says what it is, and again what is shown once the pointer leaves
    qtbot.wait(50)  # the view's new range in its transform
    box = timeline.plot.getPlotItem().getViewBox()
    timeline.plot.scene().sigMouseMoved.emit(box.mapViewToScene(QPointF(x, 0.5)))
    hovered = f"token {TRACED_STEPS + 39}, layer 0: wait for peers (join) on cpu:0 (target, 1 rows), 2.000 ms"
    assert timeline.caption.text() == hovered
    timeline.plot.scene().sigMouseMoved.emit(QPointF(-50, -50))
    assert timeline.caption.text() == timeline.summary == "Last 4 steps, positions 292-295: 40.0 ms"
    # a new run empties the ring
    window.state.live.reset(10)
    timeline.redraw(force=True)
    assert len(timeline.shown) == 0 and "no trace yet" in timeline.caption.text()


def test_busy_share_counts_overlaps_once():
    s, e = np.array([0.0, 1.0, 5.0, 6.0]), np.array([2.0, 3.0, 6.0, 7.0])
    assert busy_share(s, e, 0.0, 10.0) == pytest.approx(0.5)
    assert busy_share(s, e, 2.0, 6.0) == pytest.approx(0.5)  # clipped to the window
    assert busy_share(np.zeros(0), np.zeros(0), 0.0, 1.0) == 0.0 and busy_share(s, e, 1.0, 1.0) == 0.0
    ring = SpanRing(steps=2)
    ring.add(())  # an untraced step keeps nothing
    assert len(ring) == 0 and len(ring.last(8)) == 0


def test_export_writes_the_runs_chrome_trace(qtbot, make_window, tmp_path):
    window = wide_window(qtbot, make_window)
    state = window.state
    split_layer_zero(qtbot, state)
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        start_run(window, tokens=8)
    trace = state.last_trace
    assert trace is not None and trace.run == finished.args[0].index and trace.lost == 0
    path = tmp_path / "run.trace.json"
    window.export_trace(str(path))
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == len(trace.spans) == state.live.spans.spans > 0
    for e in spans:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e) and e["ts"] >= 0 and e["dur"] >= 0
    names = {e["args"]["name"]: e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(names) == {"cpu:0", "hostsim:0"}
    assert all(names[e["args"]["device"]] == e["tid"] for e in spans)
    assert any(e["name"] == "process_name" for e in events)
    assert {e["args"]["model"] for e in spans} == {"target", "draft"}
    meta = doc["metadata"]
    assert meta["run"] == trace.run and meta["placement"] == "0=hostsim:0; 2=cpu:0" and meta["q"] == 2
    assert "written to" in window.statusBar().currentMessage()


def test_no_traced_run_says_so_and_writes_nothing(qtbot, make_window, tmp_path, monkeypatch):
    window = wide_window(qtbot, make_window)
    shown = []
    monkeypatch.setattr(QMessageBox, "information", lambda parent, title, text, *a: shown.append((title, text)))
    path = tmp_path / "t.json"
    window.export_trace(str(path))
    assert shown[-1][0] == "No traced run" and "No run yet" in shown[-1][1] and not path.exists()
    window.docks["timeline"].close()  # runs are no longer traced
    assert window.state.trace_runs is False
    with qtbot.waitSignal(window.state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        start_run(window, tokens=4)
    assert window.state.last_trace is None and len(window.state.live.spans) == 0
    window.act_export_trace.trigger()
    assert f"Run {finished.args[0].index} was not traced" in shown[-1][1] and "View > Device timeline" in shown[-1][1]
    assert not path.exists() and not list(tmp_path.glob("*.json"))
    window.docks["timeline"].show()
    assert window.state.trace_runs is True


def test_a_bad_path_is_named_and_the_window_survives(qtbot, make_window, tmp_path, monkeypatch):
    window = wide_window(qtbot, make_window)
    with qtbot.waitSignal(window.state.sigRunFinished, timeout=TIMEOUT_MS):
        start_run(window, tokens=4)
    warned = []
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text, *a: warned.append((title, text)))
    folder = tmp_path / "a folder"
    folder.mkdir()
    window.export_trace(str(folder))
    assert warned[-1][0] == "Cannot export the trace" and str(folder) in warned[-1][1] and folder.is_dir()
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            window.export_trace(str(locked / "t.json"))
            assert len(warned) == 2 and str(locked / "t.json") in warned[-1][1]
            assert not (locked / "t.json").exists()
        finally:
            locked.chmod(0o700)
    window.export_trace(str(tmp_path / "ok.json"))  # still works
    assert window.isVisible() and json.loads((tmp_path / "ok.json").read_text())["traceEvents"]
