"""The live plots during a run: their ranges hold while the data stays inside them and grow, to round bounds with
headroom, when it passes them; y from 0; every point inside the view; a new run starts from its own ranges; nothing
redrawn while the panel is hidden, caught up when it is shown. A run is simulated: steps appended to the state's
LiveBuffer as the run's thread appends them, and the plots' timer tick called by hand."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from app import plots as plots_module  # noqa: E402
from app.plots import (  # noqa: E402
    ACCEPT_RANGE,
    LIVE_HEADROOM,
    LIVE_SECONDS,
    X_STEPS,
    LivePlots,
    is_empty,
    round_above,
    steady_top,
)
from engine.runs.run import StepEvent  # noqa: E402


@pytest.fixture
def live_plots(qtbot):
    """LivePlots on a state with no engine, shown; its timer stopped (the test ticks it)."""
    from app.state import WorkbenchState

    state = WorkbenchState()
    plots = LivePlots(state)
    qtbot.addWidget(plots)
    plots.resize(900, 500)
    plots.show()
    qtbot.waitExposed(plots)
    yield plots
    plots.timer.stop()
    state.shutdown()


class Run:
    """A simulated decode run: start() as the state starts one, steps(rates) appends one decode step per rate (one
    token each, drafted 2 and accepted 1 every other step), tick() is one of the plots' timer ticks."""

    def __init__(self, plots):
        self.plots, self.state = plots, plots.state
        self.time = 0.0

    def start(self, total=10_000):
        self.state.running = True
        self.state.live.reset(total)
        self.time = 0.0
        self.state.sigRunStarted.emit()
        self.plots.timer.stop()  # ticked by hand

    def steps(self, rates):
        for i, rate in enumerate(rates):
            seconds = 1.0 / rate
            self.time += seconds
            drafted, accepted = (2, 1) if i % 2 else (0, 0)
            self.state.live.append(StepEvent("decode", 0, 0, 1, drafted, accepted, 1, self.time, seconds, (1,)))

    def tick(self):
        self.plots.refresh_live()
        return [list(r) for r in self.plots.rate_plot.viewRange()], [
            list(r) for r in self.plots.accept_plot.viewRange()
        ]

    def finish(self):
        self.state.running = False
        self.state.sigRunFinished.emit(None)


def inside(view, x, y):
    (x0, x1), (y0, y1) = view
    return x0 <= x.min() and x.max() <= x1 and y0 <= y.min() and y.max() <= y1


def test_round_bounds_and_a_top_that_holds_until_the_data_passes_it():
    assert [round_above(v) for v in (0.7, 1.0, 1.2, 2.5, 3.1, 4.5, 7.0, 9.0, 1234.0)] == pytest.approx(
        [0.8, 1.0, 1.5, 3.0, 4.0, 5.0, 8.0, 10.0, 1500.0]
    )
    assert round_above(0.0) == round_above(float("nan")) == 1.0
    assert [round_above(v, X_STEPS) for v in (1.15, 2.3, 5.75, 0.3)] == pytest.approx([2.0, 5.0, 10.0, 0.5])
    assert steady_top(10.0, 9.9) == 10.0 and steady_top(10.0, 10.0) == 10.0  # inside: held
    assert steady_top(10.0, 10.5) == round_above(10.5 * LIVE_HEADROOM) == 15.0  # passed: grown, with headroom
    assert steady_top(0.0, 0.03) == pytest.approx(0.04)  # a run's first point
    assert steady_top(5.0, float("nan")) == 5.0


def test_the_ranges_hold_while_the_data_stays_inside_and_grow_when_it_passes(live_plots, monkeypatch):
    plots = live_plots
    empties = []
    set_empty = plots_module.set_empty
    monkeypatch.setattr(
        plots_module, "set_empty", lambda plot, empty, *a: (empties.append(empty), set_empty(plot, empty, *a))
    )
    ranges = []
    for plot in (plots.rate_plot, plots.accept_plot):
        plot.getPlotItem().getViewBox().sigRangeChanged.connect(lambda *_a, p=plot: ranges.append(p))
    run = Run(plots)
    run.start()
    assert is_empty(plots.rate_plot) and is_empty(plots.accept_plot)
    empties.clear()
    # 100 tok/s, then 120, then a climb to 400 tok/s: 60 ticks of 10 steps (the buffer's rolling rate follows)
    rates = np.r_[np.full(200, 100.0), np.full(200, 120.0), np.linspace(120.0, 400.0, 200)]
    views, changes = [], 0
    for tick in range(60):
        run.steps(rates[10 * tick : 10 * (tick + 1)])
        before = len(ranges)
        rate_view, accept_view = run.tick()
        t, rate, accept = plots.state.live.snapshot()
        ok = np.isfinite(accept)
        assert inside(rate_view, t, rate) and rate_view[0][0] == 0 and rate_view[1][0] == 0  # x and y from 0
        assert inside(accept_view, t[ok], accept[ok]) and accept_view == [rate_view[0], list(ACCEPT_RANGE)]
        x, y = plots.rate_curve.getData()
        assert np.array_equal(x, t) and np.array_equal(y, rate, equal_nan=True)  # the whole run drawn
        if views:
            if inside(views[-1][0], t, rate):  # the data kept inside the last range: the range held
                assert rate_view == views[-1][0] and accept_view == views[-1][1] and len(ranges) == before
            else:  # it passed it: grown (never shrunk) with room above the data
                changes += 1
                assert rate_view != views[-1][0]
                assert rate_view[0][1] >= views[-1][0][0][1] and rate_view[1][1] >= views[-1][0][1][1]
                assert rate_view[0][1] >= t[-1] * LIVE_HEADROOM or rate_view[1][1] >= np.nanmax(rate) * LIVE_HEADROOM
        views.append((rate_view, accept_view))
        assert plots.rate_plot.getPlotItem().getViewBox().autoRangeEnabled() == [False, False]
    assert empties == [False, False]  # each plot's axes shown once, when its first point came
    assert 0 < changes <= 12  # a few growths over 60 ticks (time from 0.01 s to 4.8 s, the rate to 400 tok/s)
    assert views[-1][0][1][1] >= 400.0 and views[-1][0][0][1] >= run.time
    run.finish()
    assert run.tick()[0] == views[-1][0]  # the finished run's ranges held

    # The next run starts from its own ranges: slower, so a lower top than the last run's
    run.start()
    assert is_empty(plots.rate_plot)
    run.steps(np.full(30, 50.0))
    rate_view, _accept_view = run.tick()
    t, rate, _accept = plots.state.live.snapshot()
    assert inside(rate_view, t, rate) and rate_view == [[0, LIVE_SECONDS], [0, pytest.approx(60.0)]]
    assert not is_empty(plots.rate_plot)


def test_a_hidden_panel_draws_nothing_and_catches_up_when_shown(live_plots, qtbot):
    plots = live_plots
    run = Run(plots)
    run.start()
    run.steps(np.full(20, 100.0))
    run.tick()
    drawn = len(plots.rate_curve.getData()[0])
    plots.hide()
    run.steps(np.full(20, 100.0))
    run.tick()
    assert len(plots.rate_curve.getData()[0]) == drawn == 20  # nothing redrawn while hidden
    plots.show()
    qtbot.waitExposed(plots)
    t, rate, _accept = plots.state.live.snapshot()
    assert len(plots.rate_curve.getData()[0]) == len(t) == 40
    assert inside(plots.rate_plot.viewRange(), t, rate)


def test_the_pointer_over_a_plot_reads_the_nearest_points_value(live_plots, qtbot):
    """A mouse move over the tokens/s or acceptance plot marks the point nearest the pointer's time and says its
    time and value beside it; off the plot, or before any data, nothing is shown."""
    from PySide6.QtCore import QEvent, QPointF, Qt
    from PySide6.QtGui import QMouseEvent
    from PySide6.QtWidgets import QApplication

    plots = live_plots
    readout = plots.readouts[plots.rate_plot]
    box = plots.rate_plot.getPlotItem().getViewBox()

    def move_to(x: float, y: float) -> None:  # as the user's pointer does: a move event on the plot's viewport
        viewport = plots.rate_plot.viewport()
        at = QPointF(plots.rate_plot.mapFromScene(box.mapViewToScene(QPointF(x, y))))
        none = Qt.MouseButton.NoButton
        event = QMouseEvent(QEvent.Type.MouseMove, at, QPointF(viewport.mapToGlobal(at.toPoint())), none, none,
                            Qt.KeyboardModifier.NoModifier)  # fmt: skip
        QApplication.sendEvent(viewport, event)
        qtbot.wait(20)

    move_to(0.5, 0.5)
    assert not readout.label.isVisible()  # no data yet
    run = Run(plots)
    run.start()
    run.steps(np.r_[np.full(200, 100.0), np.full(200, 50.0)])
    run.tick()
    t, rate, _ = plots.state.live.snapshot()
    i = len(t) // 4
    move_to(float(t[i]), float(rate[i]))
    assert readout.label.isVisible() and readout.dot.isVisible()
    near = int(np.argmin(np.abs(t - readout.label.pos().x())))
    assert readout.label.textItem.toPlainText() == f"{t[near]:.1f} s: {rate[near]:.1f} tok/s"
    assert abs(near - i) <= 1  # the point under the pointer
    (x0, x1), (y0, y1) = box.viewRange()
    readout.moved(box.mapViewToScene(QPointF(x1 + (x1 - x0), y1)))  # beyond the plot's right edge
    assert not readout.label.isVisible()
    accept = plots.readouts[plots.accept_plot]
    accept_box = plots.accept_plot.getPlotItem().getViewBox()
    x, y = plots.accept_curve.getData()
    accept.moved(accept_box.mapViewToScene(QPointF(float(x[-1]), float(y[-1]))))
    assert accept.label.textItem.toPlainText() == f"{x[-1]:.1f} s: {y[-1]:.0f} %"
    run.finish()
