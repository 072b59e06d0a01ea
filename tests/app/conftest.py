"""Fixtures for the window's tests: Qt offscreen, a state on the fixture models, a window on that state."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before anything imports Qt

import pytest
from app_helpers import DRAFT, TARGET, TIMEOUT_MS


@pytest.fixture(autouse=True)
def no_modal_dialogs(monkeypatch):
    """A modal dialog would wait forever offscreen: any a test does not expect (and patch itself) fails it."""
    from PySide6.QtWidgets import QMessageBox

    def unexpected(parent, title, text, *args, **kwargs):
        raise AssertionError(f"unexpected dialog {title!r}: {text}")

    for name in ("critical", "warning", "question", "information"):
        monkeypatch.setattr(QMessageBox, name, unexpected)


@pytest.fixture
def make_state(qtbot):
    """make_state(memory_limit=None, draft=True, runtimes=("cpu", "hostsim")) -> a loaded WorkbenchState."""
    from app.state import WorkbenchState
    from engine.model import Engine

    made = []

    def make(memory_limit=None, draft=True, runtimes=("cpu", "hostsim")):
        options = {"hostsim": {"memory_limit": memory_limit}} if memory_limit else None
        state = WorkbenchState()
        made.append(state)
        state.open_engine(lambda: Engine(runtimes=runtimes, strict=False, runtime_options=options))
        state.load_models(TARGET, DRAFT if draft else None)
        qtbot.waitUntil(lambda: state.model is not None and not state.busy, timeout=TIMEOUT_MS)
        return state

    yield make
    for state in made:
        state.shutdown()


@pytest.fixture
def make_window(qtbot, tmp_path, make_state):
    """make_window(**make_state_args) -> a MainWindow on a loaded state, its settings in tmp_path."""
    from PySide6.QtCore import QSettings

    from app.window import MainWindow

    windows = []

    def make(settings_file="settings.ini", **kwargs):
        state = make_state(**kwargs)
        settings = QSettings(str(tmp_path / settings_file), QSettings.Format.IniFormat)
        window = MainWindow(state=state, settings=settings)  # closed below, not by qtbot (which would ask)
        window.show()
        windows.append(window)
        return window

    yield make
    for window in windows:
        window.state.saved_placement = window.state.placement  # no unsaved-changes question at teardown
        window.close()
