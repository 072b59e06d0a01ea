"""Every button and menu action of the window, clicked (qtbot.mouseClick) or triggered (QAction.trigger) as a user
does, never called as a method: each does its work, none hands Qt's `checked` flag to its handler, and an exception in
a handler reaches the user as a dialog with the panel left usable."""

import sys

from app_helpers import DRAFT, FIXTURES, TARGET, TIMEOUT_MS
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractButton, QFileDialog, QInputDialog, QMessageBox, QTabBar, QToolBar
from test_app_tune import MadeUpTuning, made_up

from app import actions
from engine.placement.costmodel import Calibration, DeviceRate
from engine.profiles.profile import load

CALIBRATION = Calibration("cpu:0", 0.001, {"cpu:0": DeviceRate(bandwidth=2e9), "hostsim:0": DeviceRate(bandwidth=8e9)})


def click(qtbot, button) -> None:
    assert button.isVisible() and button.isEnabled(), button.text()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def wide(qtbot, window):
    """Every panel shown (the wide arrangement): each button can be clicked where it is."""
    window.resize(1600, 1000)
    qtbot.waitUntil(lambda: window.width() == 1600 and window.compact is False)
    return window


def idle(qtbot, state) -> None:
    qtbot.waitUntil(lambda: not state.busy and not state.running, timeout=TIMEOUT_MS)


def failures(monkeypatch) -> list[tuple[str, str]]:
    """The failure dialogs shown (QMessageBox.critical, as app.actions opens them), recorded instead of shown."""
    shown = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a: shown.append((title, text)))
    return shown


def buttons_of(window) -> list[QAbstractButton]:
    """The window's own push and tool buttons (not a tool bar's, which are its actions, nor Qt's own: a dock's title
    bar, a menu bar's overflow, a tab bar's arrows)."""
    out = []
    for button in window.findChildren(QAbstractButton):
        if type(button).__name__ not in ("QPushButton", "QToolButton"):
            continue
        if button.objectName().startswith("qt_") or isinstance(button.parent(), (QToolBar, QTabBar)):
            continue
        out.append(button)
    return out


def menu_actions(window) -> list:
    """Every action of the menu bar's menus and submenus, separators left out."""
    out, menus = [], [a.menu() for a in window.menuBar().actions()]
    while menus:
        for action in menus.pop(0).actions():
            if action.menu() is not None:
                menus.append(action.menu())
            elif not action.isSeparator():
                out.append(action)
    return out


def test_tune_tunes_from_its_button_again_and_after_a_model_reload(qtbot, make_window, monkeypatch):
    made_up(monkeypatch)
    window = wide(qtbot, make_window())
    state, panel = window.state, window.tune
    assert panel.status.text() == "Not tuned yet"
    click(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    assert panel.status.text().startswith("Tuning done: ") and panel.front and panel.start_button.isEnabled()
    assert MadeUpTuning.asked[-1].settings.time_budget == panel.time_budget.value()  # the panel's own settings
    click(qtbot, panel.start_button)  # and again
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    assert len(MadeUpTuning.asked) == 2 and panel.status.text().startswith("Tuning done: ")
    state.load_models(TARGET, DRAFT)  # another model (the same files): the old points are gone, Tune works
    qtbot.waitUntil(lambda: not state.busy and panel.status.text() == "Not tuned yet", timeout=TIMEOUT_MS)
    assert not panel.front and panel.front_list.count() == 0 and panel.start_button.isEnabled()
    click(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    assert len(MadeUpTuning.asked) == 3 and panel.status.text().startswith("Tuning done: ")


def test_tunes_cancel_apply_and_save_buttons(qtbot, make_window, monkeypatch, tmp_path):
    window = wide(qtbot, make_window())
    state, panel = window.state, window.tune
    panel.time_budget.setValue(600)
    panel.q.setCurrentIndex(panel.q.count() - 1)
    click(qtbot, panel.start_button)
    assert panel.running and not panel.start_button.isEnabled()
    qtbot.waitUntil(lambda: len(panel.measured) >= 2, timeout=TIMEOUT_MS)
    click(qtbot, panel.cancel_button)
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    assert "cancelled" in panel.status.text() and panel.front and panel.start_button.isEnabled()
    row = next((i for i, p in enumerate(panel.front) if p.placement != state.placement), None)
    if row is None:  # the front is the editor's placement: put another measured point on it
        panel.front.append(next(p for p in panel.measured if p.placement != state.placement))
        panel.front_list.addItem("another")
        row = len(panel.front) - 1
    panel.front_list.setCurrentRow(row)
    point = panel.selected()
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        click(qtbot, panel.apply_button)
    assert state.placement == point.placement and state.undo_text.startswith("tuned placement (")
    path = tmp_path / "tuned.yaml"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(path), ""))
    click(qtbot, panel.save_button)
    assert load(path).placement_for(state.model.config) == point.placement


def test_an_exception_in_a_buttons_handler_is_a_dialog_and_the_panel_stays_usable(qtbot, make_window, monkeypatch):
    made_up(monkeypatch)
    shown = failures(monkeypatch)
    window = wide(qtbot, make_window())
    panel = window.tune
    real = panel.tune_settings
    monkeypatch.setattr(panel, "tune_settings", lambda: (_ for _ in ()).throw(RuntimeError("no settings today")))
    click(qtbot, panel.start_button)
    assert shown == [("Tuning failed", shown[0][1])] and shown[0][1].startswith("RuntimeError: no settings today")
    assert not panel.running and panel.start_button.isEnabled() and not panel.cancel_button.isEnabled()
    monkeypatch.setattr(panel, "tune_settings", real)
    click(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    assert panel.status.text().startswith("Tuning done: ") and len(shown) == 1
    # a failure after the panel said it was tuning: it says it could not start, and Tune works again
    monkeypatch.setattr(window.state, "submit_with_models", lambda *a, **k: 1 / 0)
    click(qtbot, panel.start_button)
    assert shown[-1][0] == "Tuning failed" and "ZeroDivisionError" in shown[-1][1]
    assert not panel.running and panel.start_button.isEnabled() and "could not start" in panel.status.text()


def test_an_exception_in_any_other_slot_is_a_dialog(qtbot, make_window, monkeypatch):
    shown = failures(monkeypatch)
    window = make_window()
    previous = actions.install_excepthook()
    try:
        window.state.sigMessage.connect(lambda text: 1 / 0)
        window.state.sigMessage.emit("hello")
    finally:
        sys.excepthook = previous
    assert shown and shown[0][0] == "Something went wrong" and "ZeroDivisionError" in shown[0][1]


def routing_counts(state):
    import numpy as np

    cfg = state.model.config
    counts = np.zeros((cfg.num_layers, cfg.num_experts))
    counts[0] = np.arange(8)
    counts[2] = 3
    return counts


def test_every_button_does_its_work_when_clicked(qtbot, make_window, monkeypatch, tmp_path):
    shown = failures(monkeypatch)
    window = wide(qtbot, make_window())
    state, routing, run, editor = window.state, window.routing, window.run_panel, window.editor
    clicked = set()
    every = buttons_of(window)
    for button in every:
        button.clicked.connect(lambda *_, b=button: clicked.add(b))
    counts = routing_counts(state)
    state.routing_provider = lambda model, prompts: counts
    state.calibration_provider = lambda model, devices: CALIBRATION  # fixed figures: no timing here
    # Routing: profile, reset, profile again
    with qtbot.waitSignal(state.sigRoutingChanged, timeout=TIMEOUT_MS):
        click(qtbot, routing.profile_button)
    assert (routing.heatmap.counts == counts).all()
    click(qtbot, routing.reset_button)
    qtbot.waitUntil(lambda: state.routing is None, timeout=TIMEOUT_MS)
    with qtbot.waitSignal(state.sigRoutingChanged, timeout=TIMEOUT_MS):
        click(qtbot, routing.profile_button)
    # The strategies: each an edit of the placement, or said to change nothing
    routing.budget.setValue(50)
    for name, button in routing.routing_buttons.items():
        before = state.undo_text
        click(qtbot, button)
        idle(qtbot, state)
        qtbot.waitUntil(lambda: not state.calibrating and not state.applying, timeout=TIMEOUT_MS)
        said = window.statusBar().currentMessage()
        assert state.undo_text != before or "already" in said, (name, said)
    routing.device_combo.setCurrentText("hostsim:0")
    click(qtbot, routing.single_button)
    assert state.placement.describe() == "0-2=hostsim:0" and state.undo_text == "all experts on hostsim:0"
    click(qtbot, routing.uniform_button)
    assert state.placement.describe() == "0=cpu:0; 2=hostsim:0" and state.undo_text == "uniform split"
    click(qtbot, editor.undo_button)
    assert state.placement.describe() == "0-2=hostsim:0" and state.redo_text == "uniform split"
    click(qtbot, editor.redo_button)
    assert state.placement.describe() == "0=cpu:0; 2=hostsim:0"
    # Prompts from a file, then a run to its end, then one stopped
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"prompt": "first of mine"}\n{"prompt": "second of mine"}\n', encoding="utf-8")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(prompts), ""))
    click(qtbot, run.load_prompts_button)
    assert run.prompts.toPlainText() == "first of mine\nsecond of mine"
    run.tokens.setValue(4)
    run.repeats.setValue(1)
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        click(qtbot, run.start_button)
    assert finished.args[0] is not None and not finished.args[0].cancelled
    run.tokens.setValue(run.tokens.maximum())
    run.repeats.setValue(1000)
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as stopped:
        click(qtbot, run.start_button)
        click(qtbot, run.stop_button)
    assert stopped.args[0].cancelled and run.start_button.isEnabled()
    # Tune, Cancel, Apply, Save as profile… (test_tunes_cancel_apply_and_save_buttons says what each does)
    tune = window.tune
    tune.time_budget.setValue(600)
    tune.q.setCurrentIndex(tune.q.count() - 1)
    click(qtbot, tune.start_button)
    qtbot.waitUntil(lambda: len(tune.measured) >= 2, timeout=TIMEOUT_MS)
    click(qtbot, tune.cancel_button)
    qtbot.waitUntil(lambda: not tune.running, timeout=TIMEOUT_MS)
    tune.front_list.setCurrentRow(0)
    click(qtbot, tune.apply_button)
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: ("", ""))  # the dialog cancelled
    click(qtbot, tune.save_button)
    idle(qtbot, state)
    assert shown == [] and set(every) == clicked, [b.text() or b.toolTip() for b in set(every) - clicked]


def test_every_menu_action_does_its_work_when_triggered(qtbot, make_window, monkeypatch, tmp_path):
    import shutil

    from gguf_models import to_gguf

    shown = failures(monkeypatch)
    window = wide(qtbot, make_window())
    state = window.state
    done = set()

    def trigger(action) -> None:
        assert action.isEnabled(), action.text()
        action.trigger()
        done.add(action)

    def opened(target=None, draft=None) -> None:
        qtbot.waitUntil(lambda: not state.busy and state.model is not None
                        and (target is None or state.model.target_path == str(target))
                        and (draft is None or state.model.draft_path == str(draft)), timeout=TIMEOUT_MS)  # fmt: skip

    def answer(name: str, value) -> None:
        monkeypatch.setattr(QFileDialog, name, lambda *a, **k: value)

    # File: the models, as GGUF files, then as folders
    target_gguf = to_gguf(TARGET, tmp_path / "target.gguf")[0]
    draft_gguf = to_gguf(DRAFT, tmp_path / "draft.gguf")[0]
    answer("getOpenFileName", (str(target_gguf), ""))
    trigger(window.act_open_gguf)
    opened(target_gguf)
    answer("getOpenFileName", (str(draft_gguf), ""))
    trigger(window.act_open_draft_gguf)
    opened(target_gguf, draft_gguf)
    folder = tmp_path / "target"
    shutil.copytree(TARGET, folder)
    answer("getExistingDirectory", str(folder))
    trigger(window.act_open_model)
    opened(folder)
    answer("getExistingDirectory", str(DRAFT))
    trigger(window.act_open_draft)
    opened(folder, DRAFT)
    # Draft with the model's own MTP layer: a DeepSeek-V3 folder holding one
    with_module = FIXTURES / "deepseek-bf16"
    state.load_models(with_module)
    opened(with_module)
    trigger(window.act_self_draft)
    opened(with_module, "self")
    # Open recent: the model folder opened above (File > Open model folder… listed it once it loaded)
    recent = window.recent_menu.actions()
    assert recent and str(folder) in recent[0].text()
    answer("getExistingDirectory", "")
    state.load_models(TARGET, DRAFT)
    opened(TARGET)
    recent[0].trigger()
    opened(folder)
    # Hold weights as
    for mode, action in window.act_weights.items():
        trigger(action)
        assert state.weights == mode and window.settings.value("weights") == mode and action.isChecked()
    # Save profile (no file yet: it asks where), Save profile as…, Open profile…
    saved = tmp_path / "saved.yaml"
    answer("getSaveFileName", (str(saved), ""))
    trigger(window.act_save)
    assert saved.is_file() and state.profile_path == saved
    other = tmp_path / "other"
    answer("getSaveFileName", (str(other), ""))
    trigger(window.act_save_as)
    assert (tmp_path / "other.yaml").is_file() and state.profile_path == tmp_path / "other.yaml"
    answer("getOpenFileName", (str(saved), ""))
    trigger(window.act_open_profile)
    assert state.profile_path == saved
    # Edit: undo and redo an edit of the placement
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.move({0: list(range(8))}, "hostsim:0")
    moved = state.placement.describe()
    trigger(window.act_undo)
    assert state.placement.describe() != moved
    trigger(window.act_redo)
    assert state.placement.describe() == moved
    # Run: a traced run (the timeline is open), a stopped one, Tune placements…, Clear run history
    info = []
    monkeypatch.setattr(QMessageBox, "information", lambda parent, title, text, *a: info.append(title))
    answer("getSaveFileName", (str(tmp_path / "trace.json"), ""))
    trigger(window.act_export_trace)  # nothing traced yet: it says so
    assert info == ["No traced run"] and not (tmp_path / "trace.json").exists()
    window.run_panel.tokens.setValue(4)
    window.run_panel.repeats.setValue(1)
    toolbar = window.findChild(QToolBar, "toolbar-main")
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS):  # Start run from the tool bar
        qtbot.mouseClick(toolbar.widgetForAction(window.act_start), Qt.MouseButton.LeftButton)
    assert state.last_trace is not None and state.last_trace.run == state.history[-1].index
    done.add(window.act_start)
    window.run_panel.tokens.setValue(window.run_panel.tokens.maximum())
    window.run_panel.repeats.setValue(1000)
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as stopped:
        trigger(window.act_start)
        trigger(window.act_stop)
    assert stopped.args[0].cancelled and len(state.history) == 2
    window.docks["tune"].hide()
    trigger(window.act_tune)
    assert window.docks["tune"].isVisible()
    # File > Export: each to the file its dialog names
    counts = routing_counts(state)
    state.routing_provider = lambda model, prompts: counts
    with qtbot.waitSignal(state.sigRoutingChanged, timeout=TIMEOUT_MS):
        click(qtbot, window.routing.profile_button)
    for action, name in ((window.act_export_hotness, "hot.csv"), (window.act_export_plots, "plots.png"),
                         (window.act_export_history, "runs.csv")):  # fmt: skip
        answer("getSaveFileName", (str(tmp_path / name), ""))
        trigger(action)
        assert (tmp_path / name).stat().st_size > 0, name
    answer("getSaveFileName", (str(tmp_path / "trace.json"), ""))
    trigger(window.act_export_trace)
    assert (tmp_path / "trace.json").stat().st_size > 0
    asked = []
    monkeypatch.setattr(QInputDialog, "getMultiLineText", lambda parent, title, label, text, *a: asked.append(text))
    trigger(window.act_export_llama)
    assert asked and asked[0].startswith("-ngl")
    for fmt, action in window.act_export_engines.items():  # each engine's arguments; SGLang's and lucebox's file
        answer("getSaveFileName", (str(tmp_path / f"{fmt}.json"), ""))
        trigger(action)
        assert asked[-1], fmt
        assert (tmp_path / f"{fmt}.json").is_file() == (fmt in ("sglang", "lucebox")), fmt
    trigger(window.act_clear_history)
    assert state.history == []
    # View: each panel closed and opened again by its action; Reset layout opens a closed one
    for key, dock in window.docks.items():
        trigger(dock.toggleViewAction())
        assert not dock.isVisible(), key
        trigger(dock.toggleViewAction())
        assert dock.isVisible(), key
    window.docks["history"].close()
    trigger(window.act_reset_layout)
    assert window.docks["history"].isVisible()
    # Help > About
    about = []
    monkeypatch.setattr(QMessageBox, "about", lambda parent, title, text: about.append(title))
    trigger(window.act_about)
    assert about == ["About expertbench"]
    # File > Open demo model pair: each opens its pair (the loading itself: test_app_gguf and the demo tests)
    state.saved_placement = state.placement  # nothing unsaved to ask about
    loads = []
    monkeypatch.setattr(state, "load_models", lambda *a, **k: loads.append(k))
    for (fmt, quant), action in window.act_open_demos.items():
        trigger(action)
        assert loads[-1]["demo_format"] == fmt and loads[-1]["demo_quant"] == quant and loads[-1]["demo"]
    for family, family_actions in window.act_open_family_demos.items():
        for (fmt, _quant), action in family_actions.items():
            trigger(action)
            assert loads[-1]["demo_format"] == fmt and family in loads[-1]["demo"]
    assert shown == [] and {a for a in menu_actions(window) if a.parent() is not window.recent_menu} - done == {
        window.act_quit
    }
    trigger(window.act_quit)
    assert not window.isVisible()


def test_prompts_from_a_file_that_cannot_be_listed_are_said_and_the_list_stays(
    qtbot, make_window, monkeypatch, tmp_path
):
    """Run > Load… with a binary file, a prompt holding a line break (the list is one a line) and a cancelled
    dialog: a warning naming the file for the first two, and the prompts as they were every time."""
    warned = []
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text, *a: warned.append(text))
    run = wide(qtbot, make_window()).run_panel
    before = run.prompts.toPlainText()
    binary, multi = tmp_path / "b.txt", tmp_path / "m.jsonl"
    binary.write_bytes(b"\x7fELF\x00\x01")
    multi.write_text('{"prompt": "one"}\n{"prompt": "two\\nlines"}\n', encoding="utf-8")
    for path, said in ((binary, "a binary file"), (multi, "prompt 2 holds a line break"), ("", None)):
        monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, p=path, **k: (str(p), ""))
        click(qtbot, run.load_prompts_button)
        assert run.prompts.toPlainText() == before
        if said is None:
            assert len(warned) == 2  # the cancelled dialog says nothing
        else:
            assert said in warned[-1] and str(path) in warned[-1]
