"""The window opens GGUF files: File > Open GGUF file… (a target) and Open draft GGUF file… (a draft)."""

from app_helpers import DRAFT, TARGET, TIMEOUT_MS
from gguf_models import to_gguf  # tests/gguf_models.py (tests/ is on the path through tests/conftest.py)

from engine.profiles.profile import fingerprint


def test_open_gguf_target_and_draft(qtbot, make_window, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    target = to_gguf(TARGET, tmp_path / "target.gguf")[0]
    draft = to_gguf(DRAFT, tmp_path / "draft.gguf")[0]
    window = make_window()
    state = window.state
    chosen = iter([str(target), str(draft)])
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (next(chosen), "GGUF model (*.gguf)"))
    window.act_open_gguf.trigger()
    qtbot.waitUntil(lambda: state.model.target_path == str(target) and not state.busy, timeout=TIMEOUT_MS)
    assert state.model.fingerprint == fingerprint(target) and state.model.draft_path is None
    assert [a.text() for a in window.recent_menu.actions()][0].startswith("target.gguf")
    window.act_open_draft_gguf.trigger()
    qtbot.waitUntil(lambda: state.model.draft_path == str(draft) and not state.busy, timeout=TIMEOUT_MS)
    assert state.model.draft_fingerprint == fingerprint(draft)


def test_open_the_gguf_demo_pair_and_save_a_profile_that_names_it(qtbot, make_window, tmp_path, monkeypatch):
    """File > Open demo model pair offers the folder pair and the GGUF pair per quantization, says they are synthetic
    and which are quantized; a profile saved on the GGUF pair names the demo with its format and quantization (not a
    path into the cache) and replays with `expertbench regress`."""
    from demo_sizes import use_tiny

    import app.window
    from engine.profiles import regress
    from engine.profiles.profile import ModelRef, load

    cache = tmp_path / "cache"
    use_tiny(monkeypatch, cache)  # a tiny demo size, built in tmp_path
    monkeypatch.setattr(app.window, "DEMO_SIZE", "tiny")
    window = make_window()
    state = window.state
    assert window.demo_menu.title() == "Open demo model pair (synthetic)"
    assert [a.text() for a in window.demo_menu.actions()] == [
        "Folders (safetensors, bf16)", "GGUF files, Q8_0 (quantized)",
        "GGUF files, MXFP4 experts, Q8_0 elsewhere (quantized)"]  # fmt: skip
    assert all("synthetic: random weights" in a.toolTip() for a in window.demo_menu.actions())
    assert "quantized as llama.cpp does (mxfp4" in window.act_open_demos["gguf", "mxfp4"].toolTip()

    window.act_open_demos["gguf", "mxfp4"].trigger()
    qtbot.waitUntil(lambda: state.model.demo == "tiny" and not state.busy, timeout=TIMEOUT_MS)
    m = state.model
    assert (m.demo_format, m.demo_quant, m.synthetic) == ("gguf", "mxfp4", True)
    assert m.target_path == str(cache / "expertbench" / "demo-tiny-gguf-mxfp4-v1" / "target.gguf")
    assert m.draft_path.endswith("demo-tiny-gguf-mxfp4-v1/draft.gguf")
    assert m.fingerprint == fingerprint(m.target_path) and m.draft_fingerprint == fingerprint(m.draft_path)
    assert "target.gguf (synthetic demo, MXFP4 experts, Q8_0 elsewhere)" in window.windowTitle()
    label = window.run_panel.target_label.text()
    assert "demo-tiny-gguf-mxfp4-v1/target.gguf" in label and "quantized: MXFP4 experts, Q8_0 elsewhere" in label

    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.move({2: [0, 1]}, "hostsim:0")
    panel = window.run_panel
    panel.prompts.setPlainText("The quick brown fox")
    panel.tokens.setValue(4)
    panel.repeats.setValue(1)
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS):
        panel.start()
    path = tmp_path / "gguf-demo.yaml"
    assert state.save_profile(path, panel.settings())
    text = path.read_text()
    assert str(cache) not in text and "path:" not in text
    written = load(path)
    # format 4: beside the hashes, the run's outputs (ids and top-2 gaps) a changed hash is diagnosed with
    assert written.version == 4 and len(written.expectations.outputs) == 1
    assert written.model == ModelRef(demo="tiny", format="gguf", quant="mxfp4", fingerprint=m.fingerprint)
    assert written.draft == ModelRef(demo="tiny", format="gguf", quant="mxfp4", fingerprint=m.draft_fingerprint)
    assert written.expectations.output_sha256 is not None
    report = regress.run([str(path)])
    assert report.exit_code == 0, report.table()

    # The folder pair again: a profile on it names the demo alone (format 1, readable by older expertbench).
    window.act_open_demo.trigger()
    qtbot.waitUntil(lambda: state.model.demo_format == "safetensors" and not state.busy, timeout=TIMEOUT_MS)
    assert state.model.demo_quant is None and state.model.target_path.endswith("demo-tiny-v1/target")
    assert state.save_profile(tmp_path / "folder-demo.yaml")
    folder = load(tmp_path / "folder-demo.yaml")
    assert folder.version == 1 and folder.model == ModelRef(demo="tiny", fingerprint=state.model.fingerprint)
