"""The window as a whole: panels, item models, errors, layout memory, unsaved changes, routing, screenshot."""

import os
import shutil

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np
import pytest
from app_helpers import LAYER_BYTES, TARGET, TIMEOUT_MS, on_engine  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QLabel, QMessageBox  # noqa: E402

from app.placement_editor import HeatRole, ShareRole  # noqa: E402
from app.state import format_bytes  # noqa: E402
from engine.placement.routing import RoutingStats  # noqa: E402


def test_every_item_model_passes_the_model_tester(qtbot, make_window, qtmodeltester):
    window = make_window(runtimes=("cpu", "hostsim", "nosuch"))
    state = window.state
    models = [c.model for c in window.editor.columns.values()] + [window.devices.model, window.history.model]
    for model in models:
        qtmodeltester.check(model)
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.move({0: [1, 2, 7]}, "hostsim:0")
    window.run_panel.tokens.setValue(4)
    window.run_panel.repeats.setValue(1)
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS):
        window.run_panel.start()
    for model in models:
        qtmodeltester.check(model)


def test_devices_panel_greys_runtimes_that_did_not_load(qtbot, make_window):
    window = make_window(runtimes=("cpu", "hostsim", "nosuch"))
    state = window.state
    model = window.devices.model
    names = [model.index(r, 0).data() for r in range(model.rowCount())]
    assert names == ["cpu:0", "hostsim:0", "nosuch"]
    assert model.flags(model.index(2, 0)) == Qt.ItemFlag.NoItemFlags
    assert model.flags(model.index(0, 0)) & Qt.ItemFlag.ItemIsEnabled
    assert model.index(2, 1).data() == "not available"
    # One table of kind names (app.theme): the short form in the devices table, the long one in the editor's columns.
    assert (model.index(0, 1).data(), model.index(1, 1).data()) == ("CPU", "simulated")
    labels = [label.text() for label in window.editor.columns["hostsim:0"].findChildren(QLabel)]
    assert any(text.startswith("simulated accelerator · ") for text in labels)
    assert "nosuch" in model.index(2, 0).data(Qt.ItemDataRole.ToolTipRole)
    assert "nosuch" in window.devices.reasons.text() and window.devices.reasons.isVisibleTo(window)
    # The model's bytes on its primary device: every weight of the target and the draft (all experts are there).
    target, draft = on_engine(qtbot, state, lambda side: (side.target.info, side.draft.info))
    shown = format_bytes(target["weight_bytes"] + draft["weight_bytes"])
    assert model.index(0, 2).data() == shown and model.index(1, 2).data() == format_bytes(0)
    # How the target's files are held, on its primary device's tooltip (the engine's choice under weights="auto")
    held = "copied into memory" if target["weights"] == "copy" else "memory-mapped"
    assert held in model.index(0, 0).data(Qt.ItemDataRole.ToolTipRole)
    assert "model's files" not in model.index(1, 0).data(Qt.ItemDataRole.ToolTipRole)


def test_a_failing_engine_call_shows_an_error_dialog_and_the_window_stays_usable(
    qtbot, make_window, monkeypatch, tmp_path
):
    shown = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a: shown.append((title, text)))
    window = make_window()
    state = window.state
    state.load_models(tmp_path / "no-such-model")
    qtbot.waitUntil(lambda: bool(shown), timeout=TIMEOUT_MS)
    assert shown[0][0] == "The model could not be loaded" and "no-such-model" in shown[0][1]
    qtbot.waitUntil(lambda: not state.busy, timeout=TIMEOUT_MS)
    # The previous pair is still loaded and the window still works.
    assert state.model is not None and state.model.target_path.endswith("qwen3moe-f32")
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.move({2: list(range(8))}, "hostsim:0")
    assert on_engine(qtbot, state, lambda side: side.target.placement.owners[2]) == ["hostsim:0"] * 8
    window.run_panel.tokens.setValue(4)
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        window.run_panel.start()
    assert finished.args[0] is not None and len(shown) == 1


def test_layout_and_recent_files_are_remembered(qtbot, make_window, tmp_path):
    window = make_window()
    window.resize(1234, 777)
    window.docks["routing"].hide()
    path = tmp_path / "p.yaml"
    assert window.state.save_profile(path)
    window._add_recent("placement", str(path))
    window.close()
    again = make_window()
    # Restored, not the first-launch default (restoreGeometry fits it to the 800 x 800 offscreen screen).
    assert (again.width(), again.height()) != (1560, 980) and again.height() <= 777
    assert not again.docks["routing"].isVisibleTo(again)
    assert [a.text() for a in again.recent_menu.actions()][0].startswith("p.yaml")
    again.act_reset_layout.trigger()
    assert again.docks["routing"].isVisibleTo(again)


def test_unsaved_changes_are_asked_about_on_close(qtbot, make_window, monkeypatch):
    window = make_window()
    state = window.state
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.move({0: list(range(8))}, "hostsim:0")
    asked = []

    def answer(button):
        def warning(parent, title, text, *args):
            asked.append(title)
            return button

        return warning

    monkeypatch.setattr(QMessageBox, "warning", answer(QMessageBox.StandardButton.Cancel))
    assert not window.close()
    assert asked == ["Unsaved placement"] and window.isVisible()
    monkeypatch.setattr(QMessageBox, "warning", answer(QMessageBox.StandardButton.Discard))
    assert window.close()


def test_routing_heat_map_from_an_injected_provider_and_the_strategies(qtbot, make_window, tmp_path):
    window = make_window()
    state = window.state
    panel = window.routing
    assert not panel.routing_buttons["hot-first"].isEnabled()
    cfg = state.model.config
    counts = np.zeros((cfg.num_layers, cfg.num_experts))
    counts[0] = np.arange(8)
    counts[2] = 3
    state.routing_provider = lambda model, prompts: counts
    column = window.editor.columns["cpu:0"]
    cpu = column.model
    column.view.expand(cpu.index(0, 0))
    resets, changed = [], []
    cpu.modelReset.connect(lambda: resets.append(1))
    cpu.dataChanged.connect(lambda first, last, roles: changed.append((first.parent().isValid(), list(roles))))
    with qtbot.waitSignal(state.sigRoutingChanged, timeout=TIMEOUT_MS):
        panel.profile_button.click()
    np.testing.assert_array_equal(panel.heatmap.counts, counts)
    # New counts repaint the heat of the rows there are: no reset, the expanded chip stays open.
    assert not resets and column.view.isExpanded(cpu.index(0, 0))
    assert changed == [(False, [HeatRole, ShareRole])] + [(True, [HeatRole, ShareRole])] * 2
    assert state.expert_heat() is state.expert_heat()  # computed once, when the routing was set
    assert cpu.index(0, 0).data(HeatRole) == pytest.approx(list(np.arange(8) / 7))
    assert cpu.index(1, 0).data(HeatRole) == [1.0] * 8
    assert cpu.index(7, 0, cpu.index(0, 0)).data(HeatRole) == pytest.approx(1.0)
    assert cpu.index(0, 0).data(ShareRole) == pytest.approx(1.0)
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.move({0: [6, 7]}, "hostsim:0")
    sim = window.editor.columns["hostsim:0"].model
    assert sim.index(0, 0).data(ShareRole) == pytest.approx(13 / 28)
    assert window.act_export_hotness.isEnabled() and panel.routing_buttons["hot-first"].isEnabled()
    state.routing_stats.write_hotness_csv(tmp_path / "hot.csv")  # what File > Export > Hotness CSV writes
    np.testing.assert_array_equal(RoutingStats.read_hotness_csv(tmp_path / "hot.csv").hits, counts)

    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        panel.uniform_button.click()
    assert state.placement.describe() == "0=cpu:0; 2=hostsim:0"
    panel.device_combo.setCurrentText("hostsim:0")
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        panel.single_button.click()
    assert state.placement.describe() == "0-2=hostsim:0"
    assert window.editor.columns["hostsim:0"].bar.used == 2 * LAYER_BYTES


def test_profile_routing_with_the_engine_fills_the_heat_map(qtbot, make_window):
    window = make_window()
    state = window.state
    window.run_panel.prompts.setPlainText("The quick brown fox\nHello world")
    assert window.routing.profile_button.isEnabled()
    with qtbot.waitSignal(state.sigRoutingChanged, timeout=TIMEOUT_MS):
        window.routing.profile_button.click()
    counts = window.routing.heatmap.counts
    assert counts.shape == (3, 8) and counts[1].sum() == 0  # layer 1 is dense
    assert counts[0].sum() == counts[2].sum() > 0  # top-2 of every routed token in each MoE layer
    assert window.editor.columns["cpu:0"].model.index(0, 0).data(HeatRole) is not None


def test_the_heat_map_follows_the_engines_counts_after_each_run(qtbot, make_window):
    window = make_window()
    state = window.state
    assert state.routing is None and window.routing.heatmap.counts is None
    window.run_panel.tokens.setValue(4)
    window.run_panel.prompts.setPlainText("The quick brown fox")
    with qtbot.waitSignal(state.sigRoutingChanged, timeout=TIMEOUT_MS):
        window.run_panel.start()
    first = on_engine(qtbot, state, lambda side: side.target.routing_counts()[0])  # read on the engine thread
    assert first.sum() > 0 and first[1].sum() == 0  # layer 1 is dense
    np.testing.assert_array_equal(window.routing.heatmap.counts, first)
    np.testing.assert_array_equal(state.routing_stats.hits, first)
    assert window.editor.columns["cpu:0"].model.index(0, 0).data(HeatRole) is not None
    with qtbot.waitSignal(state.sigRoutingChanged, timeout=TIMEOUT_MS):
        window.run_panel.start()
    second = window.routing.heatmap.counts
    assert (second >= first).all() and second.sum() > first.sum()  # the core keeps counting across runs
    np.testing.assert_array_equal(second, on_engine(qtbot, state, lambda side: side.target.routing_counts()[0]))


def test_drag_hover_previews_the_bars_and_highlights_the_column(qtbot, make_window):
    from PySide6.QtCore import QPoint, QPointF
    from PySide6.QtGui import QDragEnterEvent, QDragLeaveEvent, QDropEvent

    from app.theme import STYLE_SHEET

    assert 'QFrame#deviceColumn[dropTarget="true"]' in STYLE_SHEET  # the drop target's frame
    window = make_window()
    cpu, sim = window.editor.columns["cpu:0"], window.editor.columns["hostsim:0"]
    data = cpu.model.mimeData([cpu.model.index(0, 0)])
    event = QDragEnterEvent(QPoint(10, 10), Qt.DropAction.MoveAction, data, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)  # fmt: skip
    sim.view.dragEnterEvent(event)
    assert event.isAccepted() and sim.bar.preview == LAYER_BYTES and cpu.bar.preview == LAYER_BYTES
    assert sim.property("dropTarget") is True and not cpu.property("dropTarget")
    sim.view.dragLeaveEvent(QDragLeaveEvent())
    assert sim.bar.preview is None and sim.property("dropTarget") is False
    sim.view.dragEnterEvent(event)
    drop = QDropEvent(QPointF(10, 10), Qt.DropAction.MoveAction, data, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)  # fmt: skip
    with qtbot.waitSignal(window.state.sigPlacementApplied, timeout=TIMEOUT_MS):
        sim.view.dropEvent(drop)  # the view hands a drop anywhere in the column to its model
    assert drop.isAccepted() and sim.bar.used == LAYER_BYTES and sim.bar.preview is None
    assert sim.property("dropTarget") is False


def test_screenshot_command_writes_a_png(qtbot, make_window, tmp_path):
    from PySide6.QtGui import QImage

    from app.screenshot import capture
    from engine.placement.costmodel import Calibration, DeviceRate

    window = make_window()
    cal = Calibration("cpu:0", 0.001, {"cpu:0": DeviceRate(bandwidth=2e9), "hostsim:0": DeviceRate(bandwidth=8e9)})
    window.state.calibration_provider = lambda model, devices: cal  # fixed figures: no timing here
    path = tmp_path / "shot.png"
    assert capture(window, str(path), tokens=6, runs=2) == 0
    image = QImage(str(path))
    assert (image.width(), image.height()) == (1600, 1000)
    history = window.state.history
    assert len(history) == 2
    assert history[0].placement == "0=cpu:0; 2=hostsim:0"  # cold layers: half of the experts, whole layers
    assert "hostsim:0" in history[1].placement and history[1].placement.count(".") >= 2  # hot first: split layers
    assert history[1].stable and window.routing.predicted.text().startswith("Predicted: ")


def test_python_m_app_help():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "app", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--screenshot" in out.stdout


def test_expertbench_with_no_command_opens_the_window(monkeypatch):
    import app
    from engine import cli

    calls = []
    monkeypatch.setattr(app, "main", lambda argv=None: calls.append(argv) or 0)
    assert cli.main([]) == 0 and calls == [[]]


def test_hold_weights_as_applies_to_the_next_model_opened_and_is_remembered(qtbot, make_window, tmp_path):
    from app_helpers import DRAFT, TARGET
    from PySide6.QtCore import QSettings

    from app.window import WEIGHTS_TIPS
    from engine.model import WEIGHTS_MODES

    window = make_window()
    state = window.state
    assert list(window.act_weights) == list(WEIGHTS_MODES) == list(WEIGHTS_TIPS)
    assert window.act_weights["auto"].isChecked() and state.weights == "auto"
    held = state.model.weights
    other = "map" if held == "copy" else "copy"
    with qtbot.waitSignal(state.sigMessage, timeout=TIMEOUT_MS) as said:
        window.act_weights[other].trigger()
    assert f"Weights '{other}' from the next model opened" in said.args[0] and f"held as '{held}'" in said.args[0]
    assert state.model.weights == held  # the loaded pair is not reloaded behind the user's back
    state.load_models(TARGET, DRAFT)
    qtbot.waitUntil(lambda: state.model.weights == other and not state.busy, timeout=TIMEOUT_MS)
    assert window.act_weights[other].isChecked() and not window.act_weights["auto"].isChecked()
    again = make_window()  # the same settings file: the choice is remembered
    assert again.state.weights == other and again.act_weights[other].isChecked()
    with pytest.raises(ValueError, match="expected one of auto, map, copy"):
        state.set_weights("huge")
    bad = QSettings(str(tmp_path / "bad.ini"), QSettings.Format.IniFormat)
    bad.setValue("weights", "hugepages")
    bad.sync()
    assert "hugepages" in (tmp_path / "bad.ini").read_text()
    damaged = make_window(settings_file="bad.ini")  # a value no mode has: auto
    assert damaged.state.weights == "auto" and damaged.act_weights["auto"].isChecked()


def test_heat_map_has_a_colour_scale_a_value_on_hover_a_caption_and_a_reset(qtbot, make_window):
    window = make_window()
    state, panel = window.state, window.routing
    cfg = state.model.config
    counts = np.zeros((cfg.num_layers, cfg.num_experts))
    counts[0, :4] = [10, 30, 0, 60]
    state.set_routing(counts)
    heat = panel.heatmap
    assert heat.colorbar.levels() == (0, 60.0)  # the colour bar spans the counts
    assert heat.describe(3.5, 0.5) == "layer 0, expert 3: 60 hits, 60.0 % of the layer's selections"
    assert heat.describe(0.2, 1.5) == "layer 1: a dense layer, no experts to route"  # (a band, not zero hits)
    assert heat.describe(-1, 0) == "" and heat.describe(cfg.num_experts + 0.5, 0) == ""
    assert "Hits of 50 tokens per MoE layer (top-2)" in panel.caption.text()  # 100 selections / top-2
    assert "device measurements do not count" in panel.caption.text()
    heat.sigHover.emit(heat.describe(3.5, 0.5))
    assert panel.caption.text().startswith("layer 0, expert 3")
    heat.sigHover.emit("")  # off the map: the caption again
    assert panel.caption.text().startswith("Hits of")
    assert panel.reset_button.isEnabled()
    with qtbot.waitSignal(state.sigRoutingChanged, timeout=TIMEOUT_MS):
        panel.reset_button.click()
    assert state.routing is None and not panel.reset_button.isEnabled() and panel.caption.text() == ""
    qtbot.waitUntil(lambda: not state.busy, timeout=TIMEOUT_MS)
    assert state._side.target.routing_counts()[0].sum() == 0  # the engine's counters too


def test_devices_panel_says_why_a_gpu_runtime_is_missing_in_users_words(qtbot, make_window):
    """The loader's text ("file '.../expertbench_rt_hip.so' does not exist", "CUDA driver version is insufficient")
    becomes what it means for the user; the raw text stays in the tooltip."""
    from engine.model import describe_load_error

    raw = {
        "hip": "runtime module 'hip': file '/x/engine/expertbench_rt_hip.so' does not exist",
        "cuda": "runtime module 'cuda': no device: CUDA reports CUDA driver version is insufficient for CUDA "
        "runtime version (error 35)",
    }
    not_built = "HIP module not built (hipcc was not found when expertbench was installed)"
    assert describe_load_error("hip", raw["hip"]) == not_built
    assert describe_load_error("cuda", raw["cuda"]) == "no NVIDIA GPU or driver on this machine"
    assert describe_load_error("hip", "runtime module 'hip': no device: HIP reports hipErrorNoDevice (error 100)") == (
        "no AMD GPU or driver on this machine"
    )
    assert describe_load_error("nosuch", "runtime module 'nosuch': something else") == "something else"
    window = make_window()
    window.state.load_errors.update(raw)
    window.devices.model.refresh()
    model = window.devices.model
    rows = {model.index(r, 0).data(): r for r in range(model.rowCount())}
    for name, text in raw.items():
        assert model.index(rows[name], 0).data(Qt.ItemDataRole.ToolTipRole) == text
    assert "no NVIDIA GPU or driver on this machine" in window.devices.reasons.text()
    assert "does not exist" not in window.devices.reasons.text()


def test_open_recent_lists_a_model_only_once_it_has_loaded(qtbot, make_window, tmp_path, monkeypatch):
    """A model folder that fails to load is not added to Open recent (it was, before the load was tried); one that
    loads is."""
    from PySide6.QtWidgets import QFileDialog

    window = make_window()
    shown = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a: shown.append((title, text)))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(broken))
    window.open_model()
    qtbot.waitUntil(lambda: bool(shown) and not window.state.busy, timeout=TIMEOUT_MS)
    assert not any(str(broken) in a.text() for a in window.recent_menu.actions())
    copy = tmp_path / "good"
    shutil.copytree(TARGET, copy)
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(copy))
    window.open_model()
    qtbot.waitUntil(lambda: window.state.model is not None and window.state.model.target_path == str(copy),
                    timeout=TIMEOUT_MS)  # fmt: skip
    assert str(copy) in window.recent_menu.actions()[0].text()


def test_undo_and_redo_are_said_in_the_status_bar(qtbot, make_window):
    window = make_window()
    state = window.state
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.move({0: list(range(8))}, "hostsim:0")
    label = state.undo_text
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        window.act_undo.trigger()
    assert window.statusBar().currentMessage() == f"Undone: {label}"
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        window.act_redo.trigger()
    assert window.statusBar().currentMessage() == f"Redone: {label}"
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        window.editor.undo_button.click()  # the editor's button says it too
    assert window.statusBar().currentMessage() == f"Undone: {label}"


def test_help_about_names_the_version_and_the_readme(qtbot, make_window, monkeypatch):
    from app.window import README, version

    shown = []
    monkeypatch.setattr(QMessageBox, "about", lambda parent, title, text: shown.append((title, text)))
    window = make_window()
    assert window.act_about in window.menuBar().actions()[-1].menu().actions()
    window.act_about.trigger()
    title, text = shown[0]
    assert title == "About expertbench" and f"expertbench {version()}" in text
    assert README.as_uri() in text and "expertbench --help" in text


def test_llama_cpp_export_has_a_copy_button(qtbot, make_window):
    from PySide6.QtCore import QTimer
    from PySide6.QtGui import QGuiApplication
    from PySide6.QtWidgets import QInputDialog, QPushButton

    window = make_window()
    seen = []

    def use_the_dialog():  # inside the modal dialog's own event loop
        dialogs = [d for d in window.findChildren(QInputDialog) if d.isVisible()]
        try:
            button = dialogs[0].findChild(QPushButton, "copy")
            qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
            seen.append((dialogs[0].textValue(), QGuiApplication.clipboard().text(), button.text()))
        finally:
            for dialog in dialogs:
                dialog.reject()

    QTimer.singleShot(50, use_the_dialog)
    window.act_export_llama.trigger()
    text, clipboard, label = seen[0]
    assert text.startswith("-ngl") and clipboard == text and label == "Copied"


def test_long_tooltips_are_wrapped(qtbot, make_window):
    from PySide6.QtCore import QEvent, QPoint
    from PySide6.QtGui import QHelpEvent
    from PySide6.QtWidgets import QApplication, QToolTip

    from app.theme import TIP_WRAP, wrapped_tip

    long = "word " * 60 + "\nsecond line"
    assert wrapped_tip(long).startswith("<p style='white-space:pre-wrap'>") and "second line" in wrapped_tip(long)
    assert wrapped_tip("short") == "short" and wrapped_tip("<b>rich</b> " * 20) == "<b>rich</b> " * 20
    assert wrapped_tip("a < b " * TIP_WRAP).count("&lt;") == TIP_WRAP  # plain text stays plain when wrapped
    window = make_window()
    button = window.run_panel.start_button
    button.setToolTip(long)
    QApplication.sendEvent(button, QHelpEvent(QEvent.Type.ToolTip, QPoint(5, 5), button.mapToGlobal(QPoint(5, 5))))
    assert QToolTip.text() == wrapped_tip(long)
    QToolTip.hideText()


def test_the_dark_check_box_has_a_visible_box():
    from PySide6.QtGui import QPalette

    from app.theme import DARK, checkbox_palette

    def contrast(palette: QPalette) -> int:
        """Fusion draws a check box's outline in the window colour darkened by 140 % over its base colour."""
        outline = palette.color(QPalette.ColorRole.Window).darker(140)
        return abs(outline.lightness() - palette.color(QPalette.ColorRole.Base).lightness())

    dark = checkbox_palette(True)
    assert contrast(dark) >= 40
    assert dark.color(QPalette.ColorRole.WindowText).name() == DARK["text"]  # the label reads as every label
    assert contrast(checkbox_palette(False)) >= 40


def test_the_icons_are_package_data():
    """A non-editable install keeps assets/ as app/assets (pyproject), where app.theme looks first."""
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    from app import theme

    root = Path(__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert {"app.assets", "app.assets.icons"} <= set(config["packages"])
    assert config["package-dir"]["app.assets"] == "assets"
    shipped = {f"icons/{p.name}" for pattern in config["package-data"]["app.assets.icons"]
               for p in (root / "assets" / "icons").glob(pattern)}  # fmt: skip
    shipped |= {p.name for pattern in config["package-data"]["app.assets"] for p in (root / "assets").glob(pattern)}
    used = {"expertbench.svg"} | {f"icons/{p.name}" for p in (root / "assets" / "icons").glob("*.svg")}
    assert used <= shipped
    assert theme.ASSETS in (root / "assets", Path(theme.__file__).resolve().parent / "assets")
    assert not theme.icon("start").isNull()
