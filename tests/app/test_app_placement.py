"""The placement editor: drops move experts in the engine, bars follow, overflow is refused, undo, export."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


from dataclasses import replace  # noqa: E402

from app_helpers import LAYER_BYTES, TIMEOUT_MS, on_engine  # noqa: E402
from PySide6.QtCore import QModelIndex, Qt  # noqa: E402

from app.placement_editor import decode_moves  # noqa: E402

MOVE = Qt.DropAction.MoveAction


def drop(source, target, indexes):
    """The model's drop path: the source's mimeData, then the target's dropMimeData."""
    data = source.model.mimeData(indexes)
    return target.model.dropMimeData(data, MOVE, -1, -1, QModelIndex())


def engine_owners(qtbot, state):
    return on_engine(qtbot, state, lambda side: side.target.placement.owners)


def test_drop_moves_a_layer_in_the_engine_and_the_bars(qtbot, make_window):
    window = make_window()
    state = window.state
    cpu, sim = window.editor.columns["cpu:0"], window.editor.columns["hostsim:0"]
    assert (cpu.model.rowCount(), sim.model.rowCount()) == (2, 0)  # layers 0 and 2; layer 1 is dense
    assert (cpu.bar.used, sim.bar.used) == (2 * LAYER_BYTES, 0)
    layer0 = cpu.model.index(0, 0)
    assert decode_moves(cpu.model.mimeData([layer0])) == ("cpu:0", {0: list(range(8))})
    assert sim.model.canDropMimeData(cpu.model.mimeData([layer0]), MOVE, -1, -1, QModelIndex())
    assert not cpu.model.canDropMimeData(cpu.model.mimeData([layer0]), MOVE, -1, -1, QModelIndex())

    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        assert drop(cpu, sim, [layer0])
    assert engine_owners(qtbot, state)[0] == ["hostsim:0"] * 8
    assert engine_owners(qtbot, state)[2] == ["cpu:0"] * 8
    assert (cpu.bar.used, sim.bar.used) == (LAYER_BYTES, LAYER_BYTES)
    assert sim.bar.text().startswith("192.0 KiB of")
    assert (cpu.model.rowCount(), sim.model.rowCount()) == (1, 1)
    assert sim.model.index(0, 0).data() == "Layer 0"
    devices = window.devices.model
    assert devices.index(1, 0).data() == "hostsim:0" and devices.index(1, 2).data() == "192.0 KiB"
    assert state.dirty and window.windowTitle().endswith("*")

    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        window.act_undo.trigger()
    assert engine_owners(qtbot, state)[0] == ["cpu:0"] * 8
    assert sim.bar.used == 0 and not state.dirty
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        window.act_redo.trigger()
    assert engine_owners(qtbot, state)[0] == ["hostsim:0"] * 8


def test_single_experts_and_multi_selection_drag(qtbot, make_window):
    window = make_window()
    state = window.state
    cpu, sim = window.editor.columns["cpu:0"], window.editor.columns["hostsim:0"]
    layer0 = cpu.model.index(0, 0)
    experts = [cpu.model.index(3, 0, layer0), cpu.model.index(5, 0, layer0)]
    assert [e.data() for e in experts] == ["Expert 3", "Expert 5"]
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        assert drop(cpu, sim, experts)
    owners = engine_owners(qtbot, state)
    assert [e for e, d in enumerate(owners[0]) if d == "hostsim:0"] == [3, 5]
    assert sim.bar.used == 2 * LAYER_BYTES // 8
    assert cpu.model.rowCount(cpu.model.index(0, 0)) == 6
    assert sim.model.rowCount(sim.model.index(0, 0)) == 2
    assert "0.3=hostsim:0" in window.editor.text.text()
    # A chip of a split layer carries only the experts on its own device; a multi-selection carries both layers.
    both = [sim.model.index(0, 0)]
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        assert drop(sim, cpu, both)
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        assert drop(cpu, sim, [cpu.model.index(0, 0), cpu.model.index(1, 0)])
    owners = engine_owners(qtbot, state)
    assert owners[0] == owners[2] == ["hostsim:0"] * 8 and owners[1] == [None] * 8


def test_an_overflowing_drop_is_refused(qtbot, make_window):
    window = make_window(memory_limit=LAYER_BYTES + 50_000)  # one MoE layer fits on hostsim:0, two do not
    state = window.state
    cpu, sim = window.editor.columns["cpu:0"], window.editor.columns["hostsim:0"]
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        assert drop(cpu, sim, [cpu.model.index(0, 0)])
    before = [row[:] for row in state.placement.owners]
    # While the drag hovers, the bars show it would not fit.
    assert not state.preview_move({2: list(range(8))}, "hostsim:0")
    assert sim.bar.preview == 2 * LAYER_BYTES
    state.clear_preview()
    with qtbot.waitSignal(state.sigMessage) as message:
        assert not drop(cpu, sim, [cpu.model.index(0, 0)])
    assert "refused" in message.args[0] and "hostsim:0" in message.args[0]
    assert window.editor.banner.isVisibleTo(window) and "refused" in window.editor.banner.text()
    window.editor.banner_timer.timeout.emit()  # its time is up: it goes
    assert not window.editor.banner.isVisibleTo(window)
    assert not drop(cpu, sim, [cpu.model.index(0, 0)])  # refused again: said again, until a click on it
    assert window.editor.banner.isVisibleTo(window) and window.editor.banner_timer.isActive()
    qtbot.mouseClick(window.editor.banner, Qt.MouseButton.LeftButton)
    assert not window.editor.banner.isVisibleTo(window)
    assert state.placement.owners == before and not state.applying
    assert engine_owners(qtbot, state)[2] == ["cpu:0"] * 8
    assert sim.bar.used == LAYER_BYTES
    assert state.undo_text == "move layer 0 to hostsim:0"


def test_a_placement_the_engine_refuses_shows_an_error_and_rolls_back(qtbot, make_window, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    shown = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a: shown.append((title, text)))
    window = make_window(memory_limit=LAYER_BYTES + 50_000)
    state = window.state
    room = state.rooms["hostsim:0"]
    state.rooms["hostsim:0"] = replace(room, free=1 << 40)  # pretend there is room: the engine's own check refuses
    state.move({0: list(range(8)), 2: list(range(8))}, "hostsim:0")
    qtbot.waitUntil(lambda: bool(shown), timeout=TIMEOUT_MS)
    assert shown[0][0] == "The engine refused the placement"
    qtbot.waitUntil(lambda: not state.applying, timeout=TIMEOUT_MS)
    assert state.placement.owners[0] == ["cpu:0"] * 8 and not state.undo_text
    assert engine_owners(qtbot, state)[0] == ["cpu:0"] * 8
    # The window is still usable: a move that fits goes through.
    state.rooms["hostsim:0"] = room
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        assert state.move({2: list(range(8))}, "hostsim:0")
    assert engine_owners(qtbot, state)[2] == ["hostsim:0"] * 8


def test_llama_cpp_export_shows_the_engines_arguments(qtbot, make_window, monkeypatch):
    from PySide6.QtWidgets import QInputDialog, QMessageBox

    from engine.export.llama_cpp import to_llama_cpp

    shown = []
    monkeypatch.setattr(QInputDialog, "getMultiLineText", lambda parent, title, label, text, *a: shown.append(
        (title, label, text)) or (text, True))  # fmt: skip
    warned = []
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text, *a: warned.append((title, text)))
    window = make_window()
    state = window.state
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.move({2: list(range(8))}, "hostsim:0")
    window.act_export_llama.trigger()
    exported = to_llama_cpp(state.placement, "cpu:0")
    assert shown == [("llama.cpp arguments", shown[0][1], exported.command_line())]
    assert exported.notes and all(line in shown[0][1] for line in exported.notes)  # hostsim is the CPU there
    # A layer split across a GPU and the CPU goes whole to one of them: the engine's reason is in the dialog.
    # (The fixture engine has no GPU: the placement is swapped under the window, which only reads it.)
    monkeypatch.setattr(state.placement, "owners", [["cuda:0"] * 7 + ["cpu:0"], [None] * 8, ["cpu:0"] * 8])
    window.act_export_llama.trigger()
    exported = to_llama_cpp(state.placement, "cpu:0")
    assert "CUDA0" in shown[1][2] and shown[1][2] == exported.command_line()
    assert exported.not_expressible and all(line in shown[1][1] for line in exported.not_expressible)
    # A device llama.cpp has no buffer type for: the engine's error, in a warning.
    monkeypatch.setattr(state.placement, "owners", [["nosuch:0"] * 8, [None] * 8, ["cpu:0"] * 8])
    window.act_export_llama.trigger()
    assert len(shown) == 2 and warned[0][0] == "Cannot export to llama.cpp" and "nosuch:0" in warned[0][1]


def test_bytes_are_counted_once_per_edit_and_a_repeated_hover_is_not_counted_again(qtbot, make_window, monkeypatch):
    window = make_window()
    state = window.state
    sim = window.editor.columns["hostsim:0"]
    assert state.used_bytes == {"cpu:0": 2 * LAYER_BYTES, "hostsim:0": 0}
    counted = []
    real = type(state.edits).bytes_on  # where the window's placement model counts (app/models/placement.py)
    monkeypatch.setattr(
        type(state.edits), "bytes_on", lambda self, p, *names: counted.append(p) or real(self, p, *names)
    )
    sim.bar.repaint()
    sim.bar.text()
    assert counted == []  # painting reads what the last edit counted
    previews = []
    state.sigPreviewChanged.connect(lambda: previews.append(state.preview))
    for _ in range(3):  # a drag reports every mouse move over the same column
        assert state.preview_move({0: list(range(8))}, "hostsim:0")
    assert len(previews) == 1 and previews[0] == {"cpu:0": LAYER_BYTES, "hostsim:0": LAYER_BYTES}
    assert len(counted) == 1
    state.clear_preview()
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        assert state.move({0: list(range(8))}, "hostsim:0")
    assert state.used_bytes == {"cpu:0": LAYER_BYTES, "hostsim:0": LAYER_BYTES} and sim.bar.used == LAYER_BYTES
    # After an edit the same hover is a new question (the move is now a no-op: nothing to preview).
    assert not state.preview_move({0: list(range(8))}, "hostsim:0") and state.preview is None


def test_the_other_engines_exports_write_their_file_and_show_their_arguments(qtbot, make_window, monkeypatch,
                                                                           tmp_path):  # fmt: skip
    """File > Export offers every engine the CLI's `export` does: a click on SGLang's writes its expert location
    where the user says and shows its arguments with that path; vLLM's (arguments only) asks for no file; a
    cancelled save writes nothing and shows nothing; a path that cannot be written is a warning."""
    import json

    from PySide6.QtWidgets import QInputDialog, QMessageBox

    from engine.export.engines import ENGINE_EXPORTS, export_to

    shown, warned, asked = [], [], []
    monkeypatch.setattr(QInputDialog, "getMultiLineText", lambda parent, title, label, text, *a: shown.append(
        (title, label, text)) or (text, True))  # fmt: skip
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text, *a: warned.append((title, text)))
    window = make_window()
    state = window.state
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.move({2: list(range(8))}, "hostsim:0")
    assert set(window.act_export_engines) == set(ENGINE_EXPORTS)
    assert all(act.isEnabled() for act in window.act_export_engines.values())
    target = tmp_path / "location.json"
    monkeypatch.setattr(window, "_save_path", lambda *a: asked.append(a) or str(target))
    window.act_export_engines["sglang"].trigger()
    expected = export_to("sglang", state.placement, state.model.config, state.routing_stats)
    assert json.loads(target.read_text()) == expected.document
    assert shown[-1][0] == "SGLang arguments" and f"--init-expert-location {target}" in shown[-1][2]
    assert all(line in shown[-1][1] for line in expected.not_expressible)
    asked.clear()
    window.act_export_engines["vllm"].trigger()
    assert asked == [] and shown[-1][0] == "vLLM arguments" and "--enable-eplb" in shown[-1][2]
    monkeypatch.setattr(window, "_save_path", lambda *a: "")  # the save dialog cancelled
    count = len(shown)
    window.act_export_engines["lucebox"].trigger()
    assert len(shown) == count and not warned
    monkeypatch.setattr(window, "_save_path", lambda *a: str(tmp_path))  # a folder: not a file to write
    window.act_export_engines["lucebox"].trigger()
    assert len(shown) == count and warned and warned[-1][0] == "Cannot export to lucebox"
    assert str(tmp_path) in warned[-1][1]
