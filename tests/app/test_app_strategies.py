"""The strategy buttons: engine.placement.strategy plans under the fast device's budget, one undoable edit, the cost
model's prediction; the devices measured once per model and device set, on the engine thread. Fixed
calibration figures are injected, so nothing here depends on timing."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import threading  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from app_helpers import TARGET, TIMEOUT_MS, on_engine  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from engine.placement import strategy  # noqa: E402
from engine.placement.costmodel import Calibration, DeviceRate  # noqa: E402

# hostsim:0 reads expert weights four times as fast as cpu:0, but each layer step it joins costs 20 us
CAL = Calibration("cpu:0", 0.001, {"cpu:0": DeviceRate(bandwidth=2e9, join_seconds=0.0),
                                   "hostsim:0": DeviceRate(bandwidth=8e9, join_seconds=2e-5)})  # fmt: skip


class FixedCalibration:
    """A calibration provider that returns CAL, records where it ran, and can be held until released."""

    def __init__(self, hold=False, fail=None):
        self.calls, self.threads = [], []
        self.release = threading.Event()
        self.fail = fail
        if not hold:
            self.release.set()

    def __call__(self, model, devices):
        self.calls.append(list(devices))
        self.threads.append(threading.current_thread())
        assert self.release.wait(60)
        if self.fail:
            raise self.fail
        return CAL


def skewed_counts(state):
    cfg = state.model.config
    counts = np.zeros((cfg.num_layers, cfg.num_experts))
    counts[0] = [40, 1, 2, 30, 3, 4, 20, 5]
    counts[2] = [1, 50, 2, 3, 25, 4, 5, 15]
    return counts


def budgets(state, share):
    out = dict(state.capacity)
    out["hostsim:0"] = share * state.model.shape.total_bytes // 100
    return out


def test_ranking_strategies_wait_for_routing_statistics(make_window):
    window = make_window()
    panel = window.routing
    buttons = panel.routing_buttons
    assert window.state.routing is None
    for name in ("hot-first", "critical-path"):
        assert not buttons[name].isEnabled() and "Profile routing" in buttons[name].toolTip()
    assert buttons["cold-layers"].isEnabled() and "Profile routing" not in buttons["cold-layers"].toolTip()
    assert panel.predicted.text() == "Predicted: - tokens/s"
    assert panel.fast_combo.currentText() == "hostsim:0"  # the device that is not the primary
    panel.fast_combo.setCurrentIndex(0)
    panel.fast_combo.activated.emit(0)  # the user picks cpu:0: kept when the panel refreshes
    window.state.set_routing(skewed_counts(window.state))
    assert all(b.isEnabled() for b in buttons.values())
    assert not any("Profile routing" in b.toolTip() for b in buttons.values())
    assert panel.fast_combo.currentText() == "cpu:0"


def test_the_devices_are_measured_once_on_the_engine_thread_with_progress(qtbot, make_window):
    window = make_window()
    state, panel = window.state, window.routing
    provider = state.calibration_provider = FixedCalibration(hold=True)
    panel.budget.setValue(50)
    with qtbot.waitSignal(state.sigCalibrationChanged, timeout=TIMEOUT_MS):
        panel.routing_buttons["cold-layers"].click()
    # While the engine thread measures: a busy bar, the buttons wait, the editor is untouched.
    assert state.calibrating and panel.measuring.isVisible() and "measuring" in panel.predicted.text()
    assert not any(b.isEnabled() for b in panel.routing_buttons.values())
    assert state.placement.describe() == "0-2=cpu:0" and not state.undo_text
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        provider.release.set()
    assert provider.calls == [["cpu:0", "hostsim:0"]] and provider.threads[0] is not threading.main_thread()
    assert state.calibration == CAL and not state.calibrating and not panel.measuring.isVisible()
    plan = strategy.cold_layers(state.model.shape, "hostsim:0", "cpu:0", budgets=budgets(state, 50), calibration=CAL)
    assert state.placement == plan.placement and state.placement.describe() == "0=cpu:0; 2=hostsim:0"
    assert on_engine(qtbot, state, lambda side: side.target.placement.owners) == plan.placement.owners
    assert panel.predicted.text() == f"Predicted: {plan.predicted_tokens_per_second:.1f} tokens/s"
    # Measured once: the next strategy, and the same model loaded again, use the kept figures.
    panel.budget.setValue(100)
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        panel.routing_buttons["cold-layers"].click()
    assert state.placement.describe() == "0-2=hostsim:0"
    state.load_models(TARGET)
    qtbot.waitUntil(lambda: state.model.draft_path is None and not state.busy, timeout=TIMEOUT_MS)
    assert state.calibration == CAL and len(provider.calls) == 1


@pytest.mark.parametrize("name", ["cold-layers", "hot-first", "critical-path"])
def test_each_strategy_fills_the_editor_as_one_undoable_edit_with_its_prediction(qtbot, make_window, name):
    window = make_window()
    state, panel = window.state, window.routing
    state.calibration_provider = FixedCalibration()
    state.set_routing(skewed_counts(state))
    panel.budget.setValue(50)
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        panel.routing_buttons[name].click()
    shape, stats, b = state.model.shape, state.routing_stats, budgets(state, 50)
    common = {"budgets": b, "calibration": CAL, "stats": stats}
    plan = {
        "cold-layers": lambda: strategy.cold_layers(shape, "hostsim:0", "cpu:0", **common),
        "hot-first": lambda: strategy.hot_first(shape, ["hostsim:0", "cpu:0"], **common),
        "critical-path": lambda: strategy.critical_path(shape, "hostsim:0", "cpu:0", **common),
    }[name]()
    assert state.placement == plan.placement and state.placement.devices() == ["cpu:0", "hostsim:0"]
    assert on_engine(qtbot, state, lambda side: side.target.placement.owners) == plan.placement.owners
    assert panel.predicted.text() == f"Predicted: {plan.predicted_tokens_per_second:.1f} tokens/s"
    assert window.editor.columns["hostsim:0"].bar.used == plan.device_bytes["hostsim:0"]
    if name == "hot-first":  # the experts the router picks most, up to the budget (half of them)
        hot = {(0, 0), (0, 3), (0, 6), (2, 1), (2, 4), (2, 7)}
        on_fast = {(layer, e) for layer in (0, 2) for e in range(8) if plan.placement.owners[layer][e] == "hostsim:0"}
        assert hot <= on_fast and len(on_fast) == 8
    assert state.undo_text.startswith(plan.strategy)
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        window.act_undo.trigger()
    assert state.placement.describe() == "0-2=cpu:0"
    assert panel.predicted.text() == f"Predicted: {state.predicted_tokens_per_second():.1f} tokens/s"


def test_a_failed_measurement_shows_an_error_and_the_window_stays_usable(qtbot, make_window, monkeypatch):
    from engine.core.errors import OutOfMemoryError

    shown = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a: shown.append((title, text)))
    window = make_window()
    state, panel = window.state, window.routing
    state.calibration_provider = FixedCalibration(fail=OutOfMemoryError("hostsim:0 cannot hold every expert"))
    panel.routing_buttons["cold-layers"].click()
    qtbot.waitUntil(lambda: bool(shown), timeout=TIMEOUT_MS)
    assert shown == [("The devices could not be measured", "hostsim:0 cannot hold every expert")]
    assert state.calibration is None and not state.calibrating and panel.routing_buttons["cold-layers"].isEnabled()
    assert state.placement.describe() == "0-2=cpu:0" and panel.predicted.text() == "Predicted: - tokens/s"
    state.calibration_provider = FixedCalibration()
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        panel.routing_buttons["cold-layers"].click()
    assert state.placement.describe() == "0-2=hostsim:0"


def test_the_devices_panel_shows_the_measured_bandwidth(qtbot, make_window):
    from PySide6.QtCore import Qt

    from app.devices_panel import DevicesModel

    window = make_window()
    state, panel = window.state, window.routing
    (devices,) = window.findChildren(DevicesModel)
    column = devices.COLUMNS.index("GB/s")
    rows = {devices.index(r, 0).data(): r for r in range(devices.rowCount())}
    assert devices.index(rows["hostsim:0"], column).data() == "-"  # not calibrated yet
    state.calibration_provider = FixedCalibration()
    panel.budget.setValue(50)
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        panel.routing_buttons["cold-layers"].click()
    assert devices.index(rows["cpu:0"], column).data() == "2.0"
    assert devices.index(rows["hostsim:0"], column).data() == "8.0"
    tip = devices.index(rows["hostsim:0"], 0).data(Qt.ItemDataRole.ToolTipRole)
    assert "8.0 GB/s of expert weights (measured)" in tip


def test_a_fast_device_full_of_the_current_placement_is_measured_and_planned_on(qtbot, make_state):
    """hostsim:0 holds every expert of the placement and has almost nothing free: the real calibration and the
    strategy count those experts as room (free + this model's experts - reserve) instead of refusing a full device."""
    from app_helpers import LAYER_BYTES

    # room for two layers after the reserve, and 128 KiB for the staging arenas (less than a layer: 192 KiB)
    state = make_state(memory_limit=int(2 * LAYER_BYTES / 0.9) + (128 << 10), draft=False)
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        assert state.move({0: list(range(8)), 2: list(range(8))}, "hostsim:0")
    room = state.rooms["hostsim:0"]
    assert room.held == 2 * LAYER_BYTES and room.free < LAYER_BYTES and room.room >= 2 * LAYER_BYTES
    messages = []
    state.sigMessage.connect(messages.append)
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        assert state.apply_strategy("cold-layers", "hostsim:0", LAYER_BYTES)  # measures the devices first
    assert state.calibration is not None and state.calibration.measured["peer_layers"]["hostsim:0"] == 2
    assert state.placement.describe() == "0=cpu:0; 2=hostsim:0", messages
    assert state.undo_text == "cold layers, hostsim:0 up to 192.0 KiB"


def test_a_fast_budget_below_one_layer_is_refused_in_numbers(qtbot, make_window):
    window = make_window()
    state = window.state
    state.calibration_provider = FixedCalibration()
    with qtbot.waitSignal(state.sigCalibrationChanged, timeout=TIMEOUT_MS):
        state.calibrate()
    qtbot.waitUntil(lambda: state.calibration is not None, timeout=TIMEOUT_MS)
    with qtbot.waitSignal(state.sigMessage, timeout=TIMEOUT_MS) as said:
        assert not state.apply_strategy("cold-layers", "hostsim:0", 1000)
    assert (
        said.args[0] == "Cold layers: hostsim:0's budget of 0.0010 MiB is less than one MoE layer's experts (0.2 MiB)"
    )
    assert state.placement.describe() == "0-2=cpu:0" and not state.undo_text
