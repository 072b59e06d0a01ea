"""Opening another model (File > Open model folder…) leaves nothing of the previous one on screen: the rolling plots,
the device timeline and its legend, the heat map's scale, the Tune panel's points, the run panel's progress."""

from app_helpers import FIXTURES, TARGET, TIMEOUT_MS
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog
from test_app_tune import made_up

DEEPSEEK = FIXTURES / "deepseek-f32"  # shared experts: the timeline's legend lists them


def open_model(qtbot, window, monkeypatch, folder) -> None:
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(folder))
    window.state.saved_placement = window.state.placement  # nothing unsaved to ask about
    window.act_open_model.trigger()
    qtbot.waitUntil(lambda: not window.state.busy and window.state.model.target_path == str(folder),
                    timeout=TIMEOUT_MS)  # fmt: skip


def test_opening_another_model_clears_what_the_previous_one_showed(qtbot, make_window, monkeypatch):
    made_up(monkeypatch)
    window = make_window()
    window.resize(1600, 1000)  # every panel shown: the timeline records its runs' traces
    qtbot.waitUntil(lambda: window.compact is False)
    state, plots, timeline, heatmap, tune = (
        window.state,
        window.plots,
        window.timeline,
        window.routing.heatmap,
        window.tune,
    )
    open_model(qtbot, window, monkeypatch, DEEPSEEK)
    window.run_panel.tokens.setValue(8)
    window.run_panel.repeats.setValue(1)
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS):
        qtbot.mouseClick(window.run_panel.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not state.busy, timeout=TIMEOUT_MS)
    plots.refresh_live()
    timeline.redraw(force=True)
    # what the DeepSeek run left: curves, spans with shared experts, counts on the heat map's scale, a tuned front
    assert len(plots.rate_curve.getData()[0]) > 0 and len(timeline.shown) > 0 and state.last_trace is not None
    assert "shared" in timeline.legend_kinds and "shared&nbsp;experts" in timeline.legend.text()
    assert heatmap.counts is not None and heatmap.colorbar.levels()[1] > 1
    assert window.run_panel.progress.text() == "done: 32 tokens"  # 8 tokens for each of the 4 prompts
    qtbot.mouseClick(tune.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not tune.running, timeout=TIMEOUT_MS)
    assert tune.front and tune.front_list.count()

    open_model(qtbot, window, monkeypatch, TARGET)  # no shared experts
    x, _y = plots.rate_curve.getData()
    assert x is None or len(x) == 0
    assert plots.rate_plot.no_data.isVisible() and plots.accept_plot.no_data.isVisible()
    assert len(timeline.shown) == 0 and timeline.legend_kinds == [] and "shared" not in timeline.legend.text()
    assert timeline.bars.rects == {} and state.last_trace is None
    assert heatmap.counts is None and tuple(heatmap.colorbar.levels()) == (0, 1)
    assert tune.front == [] and tune.measured == [] and tune.front_list.count() == 0
    assert tune.status.text() == "Not tuned yet" and tune.start_button.isEnabled()
    assert window.run_panel.progress.text() == "idle"  # not the previous model's "done: 32 tokens"
    # the new model's own run draws as the first did
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS):
        qtbot.mouseClick(window.run_panel.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not state.busy, timeout=TIMEOUT_MS)
    timeline.redraw(force=True)
    assert len(timeline.shown) > 0 and "shared" not in timeline.legend_kinds


def test_the_title_and_the_run_panel_name_the_models_family(qtbot, make_window, monkeypatch):
    """Two demos' targets are both called 'target': the window's title and the run panel say whose they are."""
    window = make_window()
    assert window.windowTitle().startswith("expertbench — Qwen3-MoE: ")
    assert "(Qwen3-MoE)" in window.run_panel.target_label.text()
    open_model(qtbot, window, monkeypatch, DEEPSEEK)
    qtbot.waitUntil(lambda: "DeepSeek-V3: deepseek-f32" in window.windowTitle(), timeout=TIMEOUT_MS)
    assert "(DeepSeek-V3)" in window.run_panel.target_label.text()


def test_the_heat_map_labels_a_dense_layer_instead_of_a_row_of_zero_hits(qtbot, make_window, monkeypatch):
    import numpy as np

    window = make_window()
    open_model(qtbot, window, monkeypatch, DEEPSEEK)
    cfg = window.state.model.config
    dense = [layer for layer in range(cfg.num_layers) if not cfg.is_moe_layer(layer)]
    assert dense == [0]  # the fixture's first_k_dense_replace
    window.state.set_routing(np.ones((cfg.num_layers, cfg.num_experts)), "profiling")
    heatmap = window.routing.heatmap
    qtbot.waitUntil(lambda: heatmap.dense == {0})
    assert heatmap.describe(0.5, 0.5) == "layer 0: a dense layer, no experts to route"
    assert heatmap.describe(0.5, 1.5).startswith("layer 1, expert 0: 1 hits")
    assert [item.toPlainText() for item in heatmap._dense_items if hasattr(item, "toPlainText")] == ["dense layer"]
    window.state.set_routing(None)  # no counts: no band either
    qtbot.waitUntil(lambda: heatmap.dense == set())


def test_the_models_own_mtp_layer_as_the_draft(qtbot, make_window, monkeypatch, tmp_path):
    """File > Draft with the model's own MTP layer: offered for a folder that holds one (DeepSeek-V3's released
    layout), not for one without; the run then drafts with it and its output is the target-only run's; a profile
    saved from it names the draft `self: true`."""
    window = make_window()
    state = window.state
    open_model(qtbot, window, monkeypatch, DEEPSEEK)
    assert not window.act_self_draft.isEnabled()  # deepseek-f32 holds no MTP layer
    with_module = FIXTURES / "deepseek-bf16"
    open_model(qtbot, window, monkeypatch, with_module)
    assert window.act_self_draft.isEnabled() and state.model.draft_path is None
    window.run_panel.tokens.setValue(8)
    window.run_panel.repeats.setValue(1)
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS):
        qtbot.mouseClick(window.run_panel.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not state.busy, timeout=TIMEOUT_MS)
    plain = state.history[-1].output_hash
    window.act_self_draft.trigger()
    qtbot.waitUntil(lambda: not state.busy and state.model.draft_path == "self", timeout=TIMEOUT_MS)
    assert not window.act_self_draft.isEnabled() and state.model.draft_weight_bytes > 0
    assert window.run_panel.draft_check.text() == "its own MTP layer"
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS):
        qtbot.mouseClick(window.run_panel.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not state.busy, timeout=TIMEOUT_MS)
    run = state.history[-1]
    assert run.accept_rate is not None and run.draft_path == "self" and run.output_hash == plain
    from app import profiles

    saved = profiles.build(tmp_path / "mtp.yaml", state.model, state.placement, None)
    assert saved.draft.own and saved.draft.path is None and "self: true" in saved.to_yaml()
