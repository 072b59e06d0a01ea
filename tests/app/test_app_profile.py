"""Profiles from the window: File > Save writes an engine.profiles.profile file that reopens to the same placement and
replays with `expertbench regress`; a damaged file or another model's profile shows the engine's error."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np
import pytest
from app_helpers import DRAFT, FIXTURES, TARGET, TIMEOUT_MS, on_engine  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from engine.core.files import new_file_mode  # noqa: E402
from engine.placement.placement import Placement  # noqa: E402
from engine.profiles import profile as engine_profile  # noqa: E402
from engine.profiles import regress  # noqa: E402


@pytest.fixture
def dialogs(monkeypatch):
    shown = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a: shown.append((title, text)))
    return shown


def engine_owners(qtbot, state):
    return on_engine(qtbot, state, lambda side: side.target.placement.owners)


def small_run(window, tokens=4):
    panel = window.run_panel
    panel.prompts.setPlainText("The quick brown fox\nHello world")
    panel.tokens.setValue(tokens)
    panel.repeats.setValue(1)
    panel.q.setValue(3)
    return panel


def test_save_then_reopen_gives_the_same_placement_and_run_settings(qtbot, make_window, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    window = make_window()
    state = window.state
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.move({2: list(range(8)), 0: [1, 6]}, "hostsim:0")
    saved = Placement([row[:] for row in state.placement.owners])
    small_run(window, tokens=7)
    path = tmp_path / "split.yaml"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a: (str(tmp_path / "split"), ""))
    window.act_save.trigger()  # no file yet: File > Save asks where (".yaml" is added)
    assert not state.dirty and "split.yaml" in window.windowTitle()
    # An engine profile: the model with its fingerprint, the devices it needs, the placement, the run settings.
    written = engine_profile.load(path)
    assert written.model.path == str(TARGET) and written.model.fingerprint == engine_profile.fingerprint(TARGET)
    assert written.draft.path == str(DRAFT) and written.draft.fingerprint == engine_profile.fingerprint(DRAFT)
    assert written.device_names() == ["cpu:0", "hostsim:0"] and written.primary_device == "cpu:0"
    assert written.placement_for(state.model.config) == saved
    assert written.run.prompts == ["The quick brown fox", "Hello world"] and written.run.tokens == 7
    assert written.run.q == 3 and written.run.repeats == 1 and written.run.mode == "reference"

    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.set_placement(Placement.single(state.model.config, "cpu:0"), "all on cpu:0")
    assert state.dirty
    window.run_panel.tokens.setValue(20)
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        window.open_profile(str(path))
    assert state.placement == saved and not state.dirty
    assert engine_owners(qtbot, state) == saved.owners
    assert window.run_panel.settings().tokens == 7 and window.run_panel.settings().q == 3
    # A fresh window reads the same file to the same placement and settings.
    other = make_window(settings_file="other.ini")
    with qtbot.waitSignal(other.state.sigPlacementApplied, timeout=TIMEOUT_MS):
        other.open_profile(str(path))
    assert engine_owners(qtbot, other.state) == saved.owners
    assert other.run_panel.settings() == window.run_panel.settings()


def test_a_saved_profile_replays_with_regress(qtbot, make_window, tmp_path):
    window = make_window()
    state = window.state
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.move({0: list(range(8)), 2: [3]}, "hostsim:0")
    small_run(window)
    path = tmp_path / "p.yaml"
    # Before any run, nothing says what the outputs must be: regress asks for --record.
    assert state.save_profile(path, window.run_panel.settings())
    report = regress.run([str(path)])
    assert report.exit_code == 2 and "--record" in report.outcomes[0].error
    # After a run of these settings, the profile carries its output hashes and acceptance.
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        window.run_panel.start()
    record = finished.args[0]
    assert window.save()
    written = engine_profile.load(path)
    assert written.expectations.output_sha256 == record.output_sha256
    assert written.expectations.min_accept_rate == pytest.approx(record.accept_rate, abs=1e-3)
    assert written.routing is not None  # the heat map's counts, refreshed by the run
    report = regress.run([str(path)])
    assert report.exit_code == 0, report.table()
    assert {c.name: c.status for c in report.outcomes[0].checks}["output hash"] == "pass"


def test_another_models_profile_shows_the_engines_error_and_the_window_stays_usable(
    qtbot, make_window, tmp_path, dialogs
):
    window = make_window()
    state = window.state
    other_model = FIXTURES / "qwen3moe-bf16"  # the same shape, another model
    profile = engine_profile.Profile(model=engine_profile.ModelRef(path=str(other_model),
                                     fingerprint=engine_profile.fingerprint(other_model)),
                                     devices={"cpu": engine_profile.DeviceSpec(1),
                                              "hostsim": engine_profile.DeviceSpec(1)},
                                     placement=engine_profile.PlacementSpec(layers=[(0, 2, "hostsim:0")]))  # fmt: skip
    path = tmp_path / "other.yaml"
    profile.save(path)
    window.open_profile(str(path))
    assert len(dialogs) == 1 and dialogs[0][0] == "The profile could not be opened"
    assert f"{path}:" in dialogs[0][1] and "another model" in dialogs[0][1]
    assert state.placement.owners[0] == ["cpu:0"] * 8 and state.profile_path is None
    # A profile that does not fit the model (its ranges): the engine's file:line error too.
    profile.model.fingerprint = state.model.fingerprint
    profile.placement.layers = [(0, 5, "hostsim:0")]
    profile.save(path)
    window.open_profile(str(path))
    assert "layer 5 out of range" in dialogs[1][1] and f"{path}:" in dialogs[1][1]
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        assert state.move({2: list(range(8))}, "hostsim:0")
    assert engine_owners(qtbot, state)[2] == ["hostsim:0"] * 8


def test_a_damaged_profile_shows_the_engines_error(qtbot, make_window, tmp_path, dialogs):
    window = make_window()
    bad = tmp_path / "bad.yaml"
    bad.write_text("expertbench_profile: 1\nmodel:\n  demo: default\nplacement:\n  layers:\n    0-2: cuda:7\n")
    window.open_profile(str(bad))
    assert dialogs[-1][0] == "The profile could not be opened"
    assert dialogs[-1][1].startswith(f"{bad}:6:") and "cuda:7" in dialogs[-1][1]
    bad.write_text("expertbench_profile: 1\nmodel: [1, 2\n")
    window.open_profile(str(bad))
    assert dialogs[-1][1].startswith(f"{bad}:") and "not valid YAML" in dialogs[-1][1]
    bad.write_text('placement: "0-2=hostsim:0"\n')  # the window's earlier placement file: not a profile
    window.open_profile(str(bad))
    assert "expertbench_profile" in dialogs[-1][1]
    assert len(dialogs) == 3 and window.state.placement.owners[0] == ["cpu:0"] * 8


def test_opening_a_profile_brings_its_routing_statistics(qtbot, make_window, tmp_path):
    window = make_window()
    state = window.state
    counts = np.zeros((3, 8))
    counts[0] = np.arange(8)
    counts[2] = 5
    state.set_routing(counts)
    path = tmp_path / "routed.yaml"
    assert state.save_profile(path)
    other = make_window(settings_file="other.ini")
    assert other.state.routing is None
    other.open_profile(str(path))
    np.testing.assert_array_equal(other.routing.heatmap.counts, counts)


def test_a_profiles_weights_mode_is_kept_on_save_and_named_on_open(qtbot, make_window, tmp_path):
    window = make_window()
    state = window.state
    assert state.save_profile(tmp_path / "plain.yaml", window.run_panel.settings())
    assert engine_profile.load(tmp_path / "plain.yaml").run.weights is None  # the window writes none of its own
    held = state.model.weights
    other = "map" if held == "copy" else "copy"
    text = (tmp_path / "plain.yaml").read_text()
    assert "\nrun:\n" in text
    (tmp_path / "weights.yaml").write_text(text.replace("\nrun:\n", f"\nrun:\n  weights: {other}\n", 1))
    with qtbot.waitSignal(state.sigMessage, timeout=TIMEOUT_MS) as said:
        window.open_profile(str(tmp_path / "weights.yaml"))
    assert f"run.weights is '{other}'" in said.args[0] and f"held as '{held}'" in said.args[0]
    assert state.save_profile(tmp_path / "again.yaml", window.run_panel.settings())
    assert engine_profile.load(tmp_path / "again.yaml").run.weights == other  # an opened profile's value stays


def run_save_replay(qtbot, state, panel, path):
    """A run of the panel's settings, saved as a profile at path and replayed by regress: (its record, the profile
    read back)."""
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        panel.start()
    record = finished.args[0]
    assert state.save_profile(path, panel.settings())
    written = engine_profile.load(path)
    assert written.expectations.output_sha256 == record.output_sha256
    report = regress.run([str(path)])
    assert report.exit_code == 0, report.table()
    return record, written


def test_a_q8_run_gives_a_q8_profile_that_replays(qtbot, make_window, tmp_path):
    """The run panel's precision is saved as run.precision with the hashes of a run in that precision (never an f32
    run's), replays with regress, and comes back into the panel on open."""
    window = make_window()
    state = window.state
    quantized = FIXTURES / "qwen3moe-gguf" / "model-q8_0.gguf"
    state.load_models(quantized, None)
    qtbot.waitUntil(lambda: state.model.target_path == str(quantized) and not state.busy, timeout=TIMEOUT_MS)
    panel = small_run(window)
    panel.precision.setCurrentIndex(panel.precision.findData("q8"))
    path = tmp_path / "q8.yaml"
    _, written = run_save_replay(qtbot, state, panel, path)
    assert written.run.precision == "q8"
    # The same settings in f32: the q8 run's hashes are not what an f32 profile may expect.
    panel.precision.setCurrentIndex(panel.precision.findData("f32"))
    assert state.save_profile(tmp_path / "f32.yaml", panel.settings())
    f32 = engine_profile.load(tmp_path / "f32.yaml")
    assert f32.run.precision == "f32" and f32.expectations.output_sha256 is None
    window.open_profile(str(path))  # the same placement: no placement signal to wait for (it waited out its timeout)
    qtbot.waitUntil(lambda: panel.settings().precision == "q8", timeout=TIMEOUT_MS)


def test_a_half_cache_run_gives_a_profile_with_its_cache_that_replays(qtbot, make_window, tmp_path):
    """The run panel's KV cache: a run with an f16 cache is recorded with it and its quality cost against the
    reference, saved as run.kv with that run's hashes, replays with regress, and comes back into the panel on open."""
    window = make_window()
    state = window.state
    panel = small_run(window)
    panel.kv.setCurrentIndex(panel.kv.findData("f16"))
    path = tmp_path / "kv.yaml"
    record, written = run_save_replay(qtbot, state, panel, path)
    assert record.kv == "f16" and record.quality["fast_mode"] == "f16 KV cache", record.quality
    assert written.run.kv == "f16"
    panel.kv.setCurrentIndex(panel.kv.findData("f32"))
    window.open_profile(str(path))
    qtbot.waitUntil(lambda: panel.settings().kv == "f16", timeout=TIMEOUT_MS)


def test_which_runs_give_a_profiles_outputs_on_another_placement():
    from engine.runs.run import outputs_any_placement

    assert outputs_any_placement("reference", "f32", ["cpu:0", "cuda:0"])
    assert outputs_any_placement("reference", "q8", ["cpu:0", "cpu:1", "hostsim:0"])
    assert outputs_any_placement("reference", "q8", ["cpu:0", "cuda:0"])  # the GPU modules compute the CPU's q8 bits
    assert not outputs_any_placement("owner_local", "f32", ["cpu:0", "cpu:1"])


def test_a_history_export_that_cannot_be_written_says_which_file_and_why(qtbot, make_window, tmp_path, monkeypatch):
    """Run > Export history into a folder that does not exist: a warning naming the file, the window goes on; into
    a real one: the CSV, with the user's umask."""
    window = make_window()
    warned = []
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text, *a: warned.append((title, text)))
    bad = tmp_path / "no such folder" / "runs.csv"
    monkeypatch.setattr(window, "_save_path", lambda *a: str(bad))
    window.export_history()
    assert warned and warned[0][0] == "Cannot export the history" and str(bad) in warned[0][1], warned
    good = tmp_path / "runs.csv"
    monkeypatch.setattr(window, "_save_path", lambda *a: str(good))
    window.export_history()
    assert good.read_text().startswith("run,time,") and len(warned) == 1
    assert good.stat().st_mode & 0o777 == new_file_mode()
