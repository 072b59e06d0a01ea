"""The run history table: columns (dates, prefill and predicted tok/s), sorting, placements elided at the end with
the whole text in the tooltip, and a double-click that puts a run's placement back in the editor (undoable)."""

import math
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from app_helpers import TIMEOUT_MS, record, set_history  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402

from app import history  # noqa: E402

COL = {f.header: i for i, f in enumerate(history.COLUMNS)}


def texts(view, header):
    proxy = view.model()
    return [proxy.index(row, COL[header]).data() for row in range(proxy.rowCount())]


def test_columns_dates_prefill_and_predicted_blank_when_unknown(qtbot, make_window, qtmodeltester):
    window = make_window()
    panel = window.history
    a = record(1, predicted_tokens_per_second=120.25, prefill_tokens_per_second=55.5)
    b = record(2, prefill_tokens_per_second=math.nan)
    if hasattr(b, "predicted_tokens_per_second"):
        b.predicted_tokens_per_second = None
    set_history(window.state, [a, b])
    qtmodeltester.check(panel.model)
    qtmodeltester.check(panel.proxy)
    assert {"Started", "Prefill tok/s", "Predicted tok/s"} <= set(COL)
    assert texts(panel.view, "Started") == ["2026-12-02 10:00:01", "2026-12-02 10:00:02"]
    assert texts(panel.view, "Prefill tok/s") == ["55.5", ""]
    assert texts(panel.view, "Predicted tok/s")[1] == ""
    if hasattr(a, "predicted_tokens_per_second"):
        assert texts(panel.view, "Predicted tok/s")[0] == "120.2"
    # A record made before predictions were kept (no such attribute) reads as unknown, not as an error.
    assert history.predicted(object()) is None and history.spread(object()) is None


def test_sorting_by_a_column_sorts_numbers_as_numbers(qtbot, make_window):
    window = make_window()
    panel = window.history
    speeds = [9.5, 100.0, math.nan, 20.0]
    set_history(window.state, [record(i + 1, decode_tokens_per_second=v) for i, v in enumerate(speeds)])
    assert texts(panel.view, "#") == ["1", "2", "3", "4"]  # runs in order by default
    panel.view.sortByColumn(COL["Decode tok/s"], Qt.SortOrder.DescendingOrder)
    assert texts(panel.view, "Decode tok/s") == ["100.0", "20.0", "9.5", "-"]  # 100 > 20 > 9.5, unknown last
    panel.view.sortByColumn(COL["#"], Qt.SortOrder.DescendingOrder)
    assert texts(panel.view, "#") == ["4", "3", "2", "1"]
    assert panel.record_at(panel.proxy.index(0, 0)).index == 4  # the view's row maps to its run


def test_placement_elided_at_the_end_with_the_whole_text_in_the_tooltip(qtbot, make_window):
    window = make_window()
    long = "; ".join(f"0.{e}=hostsim:0" for e in range(8)) + "; 2=cpu:0"
    set_history(window.state, [record(1, placement=long)])
    view = window.history.view
    assert view.textElideMode() == Qt.TextElideMode.ElideRight
    tip = view.model().index(0, COL["Placement"]).data(Qt.ItemDataRole.ToolTipRole)
    assert tip.startswith(long) and "Double-click" in tip
    header = view.horizontalHeader()
    assert header.sectionResizeMode(COL["Placement"]) == header.ResizeMode.Stretch


def test_double_click_restores_a_runs_placement_as_an_undoable_edit(qtbot, make_window):
    window = make_window()
    state, panel = window.state, window.history
    before = state.placement.describe()
    set_history(state, [record(1, placement="0=hostsim:0; 2=cpu:0"), record(2, placement=before)])
    panel.view.sortByColumn(COL["#"], Qt.SortOrder.DescendingOrder)  # run 1 is the second row now
    window.docks["history"].raise_()  # its tab, in the compact arrangement of the small offscreen screen
    view = panel.view
    qtbot.waitUntil(view.isVisible)
    rect = view.visualRect(view.model().index(1, COL["Placement"]))
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())  # a press first, as a hand
        qtbot.mouseDClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert state.placement.describe() == "0=hostsim:0; 2=cpu:0"
    assert state.undo_text == "placement of run 1"
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        window.act_undo.trigger()
    assert state.placement.describe() == before
    # A run of another model, or a placement this model cannot take, is said, and nothing changes.
    said = []
    state.sigMessage.connect(said.append)
    assert not history.restore_placement(state, record(3, placement="0=cpu:0", target_path="/elsewhere/model"))
    assert not history.restore_placement(state, record(4, placement="0-9=cpu:0"))
    assert "another model" in said[0] and "cannot be restored" in said[1]
    assert state.placement.describe() == before
