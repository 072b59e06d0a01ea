"""The Tune panel: a tuning on the engine thread, its progress and front (through getData), cancel, apply and save."""

from app_helpers import TIMEOUT_MS, on_engine

from engine import tune
from engine.placement import MIB
from engine.profile import load

FAST = "hostsim:0"


def settings(**more) -> tune.TuneSettings:
    values = dict(fast=FAST, qs=(1, 2), time_budget=30, calibrate=False, prompts=["Hello there", "A mixture"])
    values.update(more)
    return tune.TuneSettings(**values)


def started(qtbot, window, **more):
    panel = window.tune
    seen = []
    panel._relay.sigProgress.connect(lambda item: seen.append(item))
    assert panel.start(settings(**more))
    assert panel.running and not panel.start_button.isEnabled() and panel.cancel_button.isEnabled()
    return panel, seen


def test_the_panel_tunes_on_the_engine_thread_and_shows_progress_and_the_front(qtbot, make_window):
    window = make_window()
    assert "tune" in window.docks and window.act_tune.text() == "Tune placements…"
    panel, seen = started(qtbot, window)
    assert window.state.busy  # on the engine thread: the GUI goes on
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    phases = [p.phase for p, _point in seen]
    assert "reference" in phases and "measuring" in phases and phases[-1] == "done"
    measured = [point for _p, point in seen if point is not None]
    assert measured and all(point.same for point in measured)
    x, y = panel.front_marks.getData()
    assert len(x) == len(panel.front) >= 1 and list(y) == [p.speed for p in panel.front]
    assert list(x) == [p.fast_bytes / MIB for p in panel.front] and list(x) == sorted(x) and list(y) == sorted(y)
    mx, my = panel.measured_marks.getData()
    assert len(mx) == len(panel.measured) >= len(x) and min(my) > 0
    assert panel.front_list.count() == len(panel.front) and panel.selected() in panel.front
    assert panel.status.text().startswith("Tuning done: ") and panel.apply_button.isEnabled()
    # the engine's placement is the one it had before
    assert on_engine(qtbot, window.state, lambda side: side.target.placement) == window.state.applied


def test_cancel_stops_the_tuning_and_keeps_what_was_measured(qtbot, make_window):
    window = make_window()
    panel, seen = started(qtbot, window, qs=tuple(range(1, 9)), time_budget=600)
    qtbot.waitUntil(lambda: len(panel.measured) >= 2, timeout=TIMEOUT_MS)
    panel.cancel()
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    assert "cancelled" in panel.status.text() and panel.measured and panel.front
    assert panel.start_button.isEnabled() and not panel.cancel_button.isEnabled()
    assert on_engine(qtbot, window.state, lambda side: side.target.placement) == window.state.applied


def test_apply_is_one_undoable_edit_and_save_writes_the_point_as_a_profile(qtbot, make_window, tmp_path):
    window = make_window()
    state = window.state
    panel, _seen = started(qtbot, window)
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    before = state.placement.copy()
    others = [i for i, p in enumerate(panel.front) if p.placement != before]
    if not others:  # the front is the placement the editor has: put another point first
        panel.front.append(next(p for p in panel.measured if p.placement != before))
        panel.front_list.addItem("another")
        others = [len(panel.front) - 1]
    panel.front_list.setCurrentRow(others[0])
    point = panel.selected()
    assert panel.apply_selected()
    assert state.placement == point.placement and state.undo_text.startswith("tuned placement (")
    state.undo()
    assert state.placement == before
    state.redo()
    assert state.placement == point.placement
    path = tmp_path / "tuned.yaml"
    assert panel.save_selected(str(path))
    profile = load(path)
    assert profile.placement_for(state.model.config) == point.placement
    assert profile.run.tokens == point.tokens and profile.expectations.output_sha256 == list(point.output_sha256)
    assert profile.run.q == point.q and profile.draft is not None


def test_a_budget_that_holds_nothing_is_said_and_the_panel_stays_usable(qtbot, make_window):
    window = make_window()
    panel = window.tune
    messages = []
    window.state.sigMessage.connect(messages.append)
    assert panel.start(settings(caps={FAST: 1000}))
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    assert panel.status.text().startswith("Tuning failed: ") and "holds no expert" in panel.status.text()
    assert any("holds no expert" in m for m in messages) and panel.start_button.isEnabled()
