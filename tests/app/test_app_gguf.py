"""The window opens GGUF files: File > Open GGUF file… (a target) and Open draft GGUF file… (a draft)."""

from app_helpers import DRAFT, TARGET, TIMEOUT_MS
from gguf_models import to_gguf  # tests/gguf_models.py (tests/ is on the path through tests/conftest.py)

from engine.profile import fingerprint


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
