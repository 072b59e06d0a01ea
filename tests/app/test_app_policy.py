"""The window's state asks the engine for its policy: the run history kept per model (engine.runs.history),
predictions beside results, routing statistics of runs only, and the devices a profile names (engine.devices)."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import json  # noqa: E402

from app_helpers import TIMEOUT_MS  # noqa: E402

from app.state import RunRecord, RunSettings  # noqa: E402
from engine.placement.costmodel import Calibration, DeviceRate  # noqa: E402
from engine.runs import history as engine_history  # noqa: E402

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


def test_a_profiles_devices_are_opened_a_memory_cap_included(qtbot, make_state, tmp_path):
    from app_helpers import on_engine

    from engine.profiles import profile as engine_profile

    state = make_state(draft=False)
    assert state.save_profile(tmp_path / "plain.yaml")
    same = on_engine(qtbot, state, lambda side: id(side.engine))
    assert state.open_profile(tmp_path / "plain.yaml") is not None  # devices it has: the engine stays
    assert on_engine(qtbot, state, lambda side: id(side.engine)) == same
    capped = engine_profile.load(tmp_path / "plain.yaml")
    capped.devices["hostsim"] = engine_profile.DeviceSpec(1, memory_limit=40_000_000)
    capped.placement.layers = [(2, 2, "hostsim:0")]
    capped.save(tmp_path / "capped.yaml")
    messages = []
    state.sigMessage.connect(messages.append)
    assert state.open_profile(tmp_path / "capped.yaml") is not None
    qtbot.waitUntil(lambda: state.profile_path == tmp_path / "capped.yaml" and not state.busy, timeout=TIMEOUT_MS)
    sim = {d.name: d for d in state.devices}["hostsim:0"]
    assert sim.memory_total == 40_000_000 and state.capacity["hostsim:0"] <= 40_000_000
    assert state.placement.describe() == "0=cpu:0; 2=hostsim:0" and not state.dirty
    assert on_engine(qtbot, state, lambda side: side.target.placement.describe()) == "0=cpu:0; 2=hostsim:0"
    assert any(m.startswith("Opened the devices capped.yaml asks for (devices.hostsim.memory_limit: hostsim:0 has ")
               for m in messages), messages  # fmt: skip


def test_a_devices_entry_this_machine_cannot_provide_is_refused_at_its_line_and_the_engine_stays(
    qtbot, make_state, tmp_path
):
    from engine.profiles import profile as engine_profile

    state = make_state(draft=False)
    assert state.save_profile(tmp_path / "plain.yaml")
    gpus = engine_profile.load(tmp_path / "plain.yaml")
    gpus.devices["cuda"] = engine_profile.DeviceSpec(64)  # no machine here has 64 GPUs (most have none)
    gpus.placement.layers = [(2, 2, "cuda:63")]
    gpus.save(tmp_path / "gpus.yaml")
    line = next(i for i, text in enumerate((tmp_path / "gpus.yaml").read_text().splitlines(), 1) if "cuda:" in text)
    before = [d.name for d in state.devices]
    with qtbot.waitSignal(state.sigError, timeout=TIMEOUT_MS) as error:
        assert state.open_profile(tmp_path / "gpus.yaml") is not None
    title, text = error.args
    assert title == "The devices gpus.yaml asks for are not available"
    assert text.startswith(f"{tmp_path / 'gpus.yaml'}:{line}: devices.cuda: this machine ") and "hint: " in text
    qtbot.waitUntil(lambda: not state.busy, timeout=TIMEOUT_MS)
    assert [d.name for d in state.devices] == before and state.model is not None
    assert state.profile_path == tmp_path / "plain.yaml"  # the saved one, not the refused one
    assert run(qtbot, state).index == 1  # the open engine goes on working


def test_routing_statistics_count_runs_only_never_a_calibration(qtbot, make_state):
    """The map counts the decodes of runs (and profiling passes); measuring the devices for the cost model (a real
    calibration, as Hot first and Critical path start with) adds nothing. The state says how many tokens and which
    runs the counts come from."""
    import numpy as np

    state = make_state(draft=False)
    assert state.routing is None and state.routing_runs is None and state.routing_tokens == 0
    run(qtbot, state)
    once = state.routing_stats.hits.copy()
    assert state.routing_runs == (1, 1) and state.routing_origin == "runs"
    assert state.routing_tokens == int(state.routing_stats.tokens.max()) > 0
    with qtbot.waitSignal(state.sigCalibrationChanged, timeout=TIMEOUT_MS):
        state.calibrate()  # the engine's own measurement: a few dozen decodes on every device
    qtbot.waitUntil(lambda: state.calibration is not None and not state.busy, timeout=TIMEOUT_MS)
    assert state.routing_runs == (1, 1) and np.array_equal(state.routing_stats.hits, once)
    run(qtbot, state)  # the same run again: exactly twice the counts
    assert state.routing_runs == (1, 2) and np.array_equal(state.routing_stats.hits, 2 * once)
    with qtbot.waitSignal(state.sigRoutingChanged, timeout=TIMEOUT_MS):
        state.reset_routing()
    assert state.routing is None and state.routing_runs is None and state.routing_tokens == 0
    run(qtbot, state)
    assert state.routing_runs == (3, 3) and np.array_equal(state.routing_stats.hits, once)
    with qtbot.waitSignal(state.sigRoutingChanged, timeout=TIMEOUT_MS):
        state.profile_routing(["The quick brown fox"])
    assert state.routing_origin == "profiling" and state.routing_runs is None and state.routing_tokens > 0
    run(qtbot, state)
    assert state.routing_origin == "profiling and runs" and state.routing_runs == (4, 4)
    state.set_routing(np.ones((3, 8)))  # given by hand (a test, an import)
    assert state.routing_origin == "given" and state.routing_runs is None and state.routing_tokens == 4
    np.testing.assert_array_equal(state.expert_heat(), np.ones((3, 8)))
