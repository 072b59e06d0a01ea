"""The window's state asks the engine for its policy: the run history kept per model (engine.history), predictions
beside results, routing statistics of runs only, and the devices a profile names (engine.devices)."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import json  # noqa: E402

from app_helpers import TIMEOUT_MS  # noqa: E402

from app.state import RunRecord, RunSettings  # noqa: E402
from engine import history as engine_history  # noqa: E402
from engine.costmodel import Calibration, DeviceRate  # noqa: E402

CAL = Calibration("cpu:0", 0.001, {"cpu:0": DeviceRate(bandwidth=2e9), "hostsim:0": DeviceRate(bandwidth=8e9)})
SHORT = RunSettings(["The quick brown fox"], tokens=4, repeats=1)


def run(qtbot, state, settings=SHORT) -> RunRecord:
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        assert state.start_run(settings)
    qtbot.waitUntil(lambda: not state.busy, timeout=TIMEOUT_MS)
    return finished.args[0]


def test_the_history_is_the_engines_record_kept_per_model_across_restarts(qtbot, make_state, xdg_data):
    assert RunRecord is engine_history.RunRecord and RunSettings is engine_history.RunSettings
    state = make_state(draft=False)
    first = run(qtbot, state)
    assert first.index == 1 and first.is_reference and first.started.count("T") == 1
    assert first.predicted_tokens_per_second is None  # the devices were not measured
    path = engine_history.history_file(state.model.fingerprint)
    assert path.parent == xdg_data / "expertbench" / "history"
    assert json.loads(path.read_text().splitlines()[0])["output_hash"] == first.output_hash
    # the next session on the same model: the runs are there, the next run continues and compares with them
    again = make_state(draft=False)
    assert [r.output_hash for r in again.history] == [first.output_hash] and again.history[0].is_reference
    second = run(qtbot, again)
    assert second.index == 2 and second.stable is True and not second.is_reference
    assert len(path.read_text().splitlines()) == 2
    again.clear_history()
    assert again.history == [] and not path.exists()


def test_a_run_records_the_cost_models_prediction_when_the_devices_are_measured(qtbot, make_state):
    state = make_state(draft=False)
    state.calibration_provider = lambda model, devices: CAL
    state.calibrate()
    qtbot.waitUntil(lambda: state.calibration is not None, timeout=TIMEOUT_MS)
    predicted = state.predicted_tokens_per_second()
    record = run(qtbot, state)
    assert predicted is not None and record.predicted_tokens_per_second == predicted


def test_a_damaged_history_file_is_said_and_skipped_never_fatal(qtbot, make_state):
    state = make_state(draft=False)
    good = run(qtbot, state)
    path = engine_history.history_file(state.model.fingerprint)
    path.write_text(path.read_text() + "{half a record\n")
    messages = []
    from app.state import WorkbenchState

    again = WorkbenchState()
    again.sigMessage.connect(messages.append)
    try:
        again.open_engine(state_engine_factory())
        again.load_models(state.model.target_path)
        qtbot.waitUntil(lambda: again.model is not None and not again.busy, timeout=TIMEOUT_MS)
        assert [r.output_hash for r in again.history] == [good.output_hash]
        assert any(m.startswith(f"The run history was damaged; skipped {path}:2: not a run record") for m in messages)
        assert run(qtbot, again).index == 2  # and runs go on being kept
    finally:
        again.shutdown()


def test_a_history_that_cannot_be_kept_is_said_and_the_run_is_still_shown(qtbot, make_state, xdg_data):
    state = make_state(draft=False)
    (xdg_data / "expertbench").mkdir(parents=True, exist_ok=True)
    (xdg_data / "expertbench" / "history").write_text("a file where the folder should be")
    messages = []
    state.sigMessage.connect(messages.append)
    record = run(qtbot, state)
    assert state.history == [record]
    assert any(m.startswith("The run history is not kept: cannot keep the run in") for m in messages), messages


def state_engine_factory():
    from engine.model import Engine

    return lambda: Engine(runtimes=("cpu", "hostsim"), strict=False)
