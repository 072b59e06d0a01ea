"""The routing heat map as a user reads it: a colour bar with its scale, the value and the layer's share under the
pointer, a caption of what it counts (tokens, over which runs), Reset; and the strategies' combos never cut."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
from app_helpers import TIMEOUT_MS  # noqa: E402
from PySide6.QtCore import QPointF  # noqa: E402
from PySide6.QtWidgets import QBoxLayout  # noqa: E402


def run(qtbot, window):
    state = window.state
    with (
        qtbot.waitSignal(state.sigRoutingChanged, timeout=TIMEOUT_MS),
        qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished,
    ):
        window.run_panel.start()
    return finished.args[0]


def test_caption_says_tokens_and_runs_and_reset_starts_again(qtbot, make_window):
    window = make_window()
    state, panel = window.state, window.routing
    window.run_panel.tokens.setValue(4)
    window.run_panel.repeats.setValue(1)
    window.run_panel.prompts.setPlainText("The quick brown fox")
    first = run(qtbot, window)
    tokens = int(max(state.routing_stats.tokens))
    assert panel.caption.text().startswith(f"Hits of {tokens} tokens per MoE layer (top-2) over run {first.index},")
    second = run(qtbot, window)
    assert f"over runs {first.index}-{second.index}," in panel.caption.text()
    with qtbot.waitSignal(state.sigRoutingChanged, timeout=TIMEOUT_MS):
        panel.reset_button.click()
    assert panel.caption.text() == "" and panel.routed_runs() is None
    qtbot.waitUntil(lambda: not state.busy, timeout=TIMEOUT_MS)
    third = run(qtbot, window)
    assert f"over run {third.index}," in panel.caption.text()  # the runs before the reset no longer count


def test_colour_bar_and_the_value_and_share_under_the_pointer(qtbot, make_window):
    window = make_window()
    state, heat = window.state, window.routing.heatmap
    cfg = state.model.config
    counts = np.zeros((cfg.num_layers, cfg.num_experts))
    counts[2, :3] = [5, 15, 20]
    state.set_routing(counts)
    assert heat.colorbar.levels() == (0, 20.0) and heat.colorbar.isVisible()
    window.docks["routing"].raise_()
    qtbot.waitUntil(heat.isVisible)
    scene = heat.getPlotItem().vb.mapViewToScene(QPointF(1.5, 2.5))  # expert 1 of layer 2
    with qtbot.waitSignal(heat.sigHover) as hovered:
        heat.scene().sigMouseMoved.emit(scene)
    assert hovered.args[0] == "layer 2, expert 1: 15 hits, 37.5 % of the layer's selections"
    assert heat.toolTip() == hovered.args[0]
    assert window.routing.caption.text() == hovered.args[0]  # the caption shows it while the pointer is there


def test_the_map_and_the_strategies_side_by_side_in_a_wide_low_panel(qtbot, make_window):
    window = make_window()
    panel = window.routing
    panel.resize(900, 260)
    assert panel.body.direction() == QBoxLayout.Direction.LeftToRight
    panel.resize(360, 700)
    assert panel.body.direction() == QBoxLayout.Direction.TopToBottom


def test_device_combos_are_never_cut(qtbot, make_window):
    window = make_window()
    panel = window.routing
    for combo in (panel.fast_combo, panel.device_combo):
        widest = max(combo.fontMetrics().horizontalAdvance(combo.itemText(i)) for i in range(combo.count()))
        assert combo.minimumSizeHint().width() > widest  # room for "hostsim:0", not "hostsim:"
