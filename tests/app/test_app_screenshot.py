"""`expertbench gui --screenshot PNG [--size WxH]` runs on a private state: the user's run history and window settings
are neither shown in the picture nor changed; the picture has the size asked for."""

import numpy as np
from app_helpers import record
from PySide6.QtCore import QSettings
from PySide6.QtGui import QImage

import app.screenshot
import app.theme
from app.launch import main
from engine.checkpoints.demo import ensure_demo_pair
from engine.placement.costmodel import Calibration, DeviceRate
from engine.profiles.profile import fingerprint
from engine.runs.history import History, history_file


def test_a_screenshot_leaves_the_users_history_and_settings_as_they_were(qtbot, tmp_path, monkeypatch, xdg_cache):
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))  # the demo pair, built once for the session
    monkeypatch.setattr(app.theme, "apply_theme", lambda application: None)  # the test session's style stays
    # The user's data: a run of the demo pair from an earlier session, and the window's settings
    pair = ensure_demo_pair("default")
    runs = history_file(fingerprint(pair.target))
    History(runs).add(record(1, target="target", target_path=str(pair.target), started="2026-01-01T09:00:00"))
    QSettings.setPath(QSettings.Format.NativeFormat, QSettings.Scope.UserScope, str(tmp_path / "config"))
    user = QSettings("expertbench", "workbench")
    for key, value in (("window_rect", "10,20,900,600"), ("hidden_docks", "routing"), ("weights", "map"),
                       ("recent", ["model\t/somewhere/model"])):  # fmt: skip
        user.setValue(key, value)
    user.sync()
    settings_file = tmp_path / "config" / "expertbench" / "workbench.conf"
    before = runs.read_bytes(), settings_file.read_bytes()

    seen = {}
    real = app.screenshot.capture

    def quick(window, path, size):  # fewer, shorter runs, and fixed device figures: no timing here
        seen["window"] = window
        state = window.state
        state.calibration_provider = lambda model, devices: Calibration(
            devices[0], 0.001, {d: DeviceRate(bandwidth=2e9 * (i + 1)) for i, d in enumerate(devices)})  # fmt: skip
        state.routing_provider = lambda model, prompts: np.ones((model.config.num_layers, model.config.num_experts))
        return real(window, path, tokens=4, runs=2, size=size)

    monkeypatch.setattr(app.screenshot, "capture", quick)
    png = tmp_path / "shot.png"
    assert main(["--screenshot", str(png), "--size", "1366x768"]) == 0
    image = QImage(str(png))
    assert (image.width(), image.height()) == (1366, 768)  # the height asked for, not the layout's minimum
    window = seen["window"]
    assert [r.started for r in window.state.history if r.started.startswith("2026-01-01")] == []  # not the user's
    assert len(window.state.history) == 2
    assert window.docks["routing"].isVisibleTo(window)  # the user's closed panel is not the picture's
    assert (runs.read_bytes(), settings_file.read_bytes()) == before
