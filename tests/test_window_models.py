"""The window's Qt-free models (app/models): edited without a window, each refusal a reason and a text."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.models.placement import PlacementEdits, Refusal
from engine.placement.placement import ExpertRoom, Placement

LAYERS, EXPERTS, EXPERT_BYTES = 3, 4, 100  # layer 0 dense


def placement(device: str = "cpu:0") -> Placement:
    return Placement([[None] * EXPERTS] + [[device] * EXPERTS for _ in range(1, LAYERS)])


def rooms(gpu_free: int) -> dict[str, ExpertRoom]:
    return {"cpu:0": ExpertRoom("cpu:0", 1 << 40, 0, 0, unlimited=True), "gpu:0": ExpertRoom("gpu:0", gpu_free, 0, 0)}


@pytest.fixture
def edits():
    e = PlacementEdits()
    e.reset(placement(), lambda layer: EXPERT_BYTES, EXPERTS)
    e.set_rooms(["cpu:0", "gpu:0"], rooms(6 * EXPERT_BYTES))
    return e


def test_a_move_is_undone_and_redone_and_tells_its_listeners(edits):
    heard = []
    edits.on("changed", lambda: heard.append(edits.undo_text))
    assert edits.used_bytes == {"cpu:0": 8 * EXPERT_BYTES, "gpu:0": 0} and not edits.dirty
    assert edits.move({1: list(range(EXPERTS))}, "gpu:0") == "move layer 1 to gpu:0"
    assert edits.move({2: [0, 3]}, "gpu:0") == "move 2 experts to gpu:0"
    assert edits.used_bytes == {"cpu:0": 2 * EXPERT_BYTES, "gpu:0": 6 * EXPERT_BYTES} and edits.dirty
    assert heard == ["move layer 1 to gpu:0", "move 2 experts to gpu:0"]
    assert (
        edits.undo()
        and edits.placement.owners[2] == ["cpu:0"] * EXPERTS
        and edits.redo_text == "move 2 experts to gpu:0"
    )
    assert edits.undo() and edits.placement == placement() and not edits.dirty and not edits.undo()
    assert edits.redo() and edits.placement.owners[1] == ["gpu:0"] * EXPERTS
    edits.move({2: [1]}, "gpu:0")
    assert edits.redo_text == "" and not edits.redo()  # a new edit drops what undo had kept for redo


def test_a_move_past_a_devices_room_is_refused_as_overflow_and_changes_nothing(edits):
    heard = []
    edits.on("changed", lambda: heard.append(True))
    done = edits.move({1: list(range(EXPERTS)), 2: list(range(EXPERTS))}, "gpu:0")  # 8 experts, room for 6
    assert isinstance(done, Refusal) and done.reason == "overflow" and "gpu:0" in done.text
    assert edits.placement == placement() and heard == [] and edits.undo_text == ""


def test_a_move_of_a_dense_layer_or_to_an_unknown_device_is_an_invalid_move(edits):
    dense = edits.move({0: [0]}, "gpu:0")
    assert isinstance(dense, Refusal) and dense.reason == "invalid-move"
    unknown = edits.move({1: [0]}, "gpu:7")
    assert isinstance(unknown, Refusal) and unknown.reason == "invalid-move" and "gpu:7" in unknown.text


def test_a_replacement_is_refused_by_reason(edits):
    assert edits.replace(placement()) == Refusal("unchanged", "The placement is already so")
    foreign = edits.replace(placement("cuda:3"))
    assert foreign.reason == "unknown-device" and foreign.text.startswith("the placement names cuda:3, which this")
    assert edits.replace(placement("gpu:0")).reason == "overflow"  # 8 experts, room for 6
    assert PlacementEdits().replace(placement()) == Refusal("no-model", "No model is loaded")
    assert PlacementEdits().move({1: [0]}, "gpu:0") == Refusal("no-model", "no model is loaded")


def test_the_preview_counts_a_hover_once_and_says_whether_it_fits(edits):
    seen = []
    edits.on("preview", lambda: seen.append(edits.preview))
    assert edits.preview_move({1: [0, 1]}, "gpu:0") and edits.preview_device == "gpu:0"
    assert edits.preview_move({1: [0, 1]}, "gpu:0") and len(seen) == 1  # the same hover: not counted again
    assert not edits.preview_move({1: list(range(EXPERTS)), 2: list(range(EXPERTS))}, "gpu:0")
    assert not edits.preview_ok
    edits.clear_preview()
    assert edits.preview is None and edits.preview_ok and len(seen) == 3


def test_edits_the_engine_refused_are_forgotten(edits):
    edits.move({1: [0]}, "gpu:0")
    applied = edits.placement.copy()
    edits.move({1: [1]}, "gpu:0")
    edits.move({1: [2]}, "gpu:0")
    edits.refused_since(applied)
    assert edits.placement == applied and edits.undo_text == "move 1 expert to gpu:0" and len(edits.undo_stack) == 1


def test_an_unknown_event_is_named():
    with pytest.raises(ValueError, match="event 'moved': expected one of changed, preview"):
        PlacementEdits().on("moved", print)


def test_the_models_import_no_qt():
    qt = "('PySide6', 'pyqtgraph')"
    models = "app.models.placement, app.models.routing, app.models.devices, app.models.run_session, " \
             "app.models.calibration"  # fmt: skip
    code = f"import sys, {models}; print(sorted(m for m in sys.modules if m.startswith({qt})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_routing_statistics_of_another_shape_or_origin_are_refused_and_runs_are_counted():
    import numpy as np

    from app.models.routing import RoutingMap
    from engine.placement.routing import RoutingStats

    routing, heard = RoutingMap(), []
    routing.on_change(lambda: heard.append(routing.origin))
    with pytest.raises(ValueError, match=r"routing counts of shape \(2, 4\), expected \(3, 4\)"):
        routing.set(np.ones((2, 4)), (3, 4), 2)
    with pytest.raises(ValueError, match="routing origin 'guess': expected one of runs, profiling"):
        routing.set(np.ones((3, 4)), (3, 4), 2, origin="guess")
    assert heard == [] and routing.counts is None
    hits = np.array([[0, 0, 0, 0], [4, 2, 1, 1], [1, 1, 1, 1]], dtype=np.float64)
    routing.set(hits, (3, 4), 2, origin="profile")
    assert heard == ["profile"] and routing.tokens == 4 and routing.heat[1].tolist() == [1.0, 0.5, 0.25, 0.25]
    routing.counted(None, True)  # a profiling pass, then two runs: each run's statistics count it and them
    stats = RoutingStats.from_hits(hits * 2, 2)
    routing.after_run(7, stats, (3, 4))
    routing.after_run(8, stats, (3, 4))
    assert routing.origin == "profiling and runs" and routing.runs == (7, 8) and heard[-1] == "profiling and runs"
    routing.counted(None, False)
    routing.after_run(9, RoutingStats.from_hits(np.zeros((3, 4)), 2), (3, 4))  # counts nothing: the map stays
    assert routing.runs == (7, 8) and routing.counted_runs == (9, 9)
    routing.clear()
    assert routing.counts is None and routing.counted_runs is None and len(heard) == 3


# ---- the devices ----------------------------------------------------------------------------------------------


def device(index: int, name: str, kind: str, free: int):
    from engine.model import DeviceInfo

    return DeviceInfo(index, name, kind, name, 4 * free, free, 1)


def test_a_new_engine_replaces_the_devices_and_a_snapshot_gives_each_its_room():
    from app.models.devices import Devices

    devices, heard = Devices(), []
    devices.on("engine", lambda: heard.append(("engine", devices.names, dict(devices.load_errors))))
    devices.on("memory", lambda: heard.append(("memory", dict(devices.capacity))))
    cpu, sim = device(0, "cpu:0", "cpu", 1 << 30), device(1, "hostsim:0", "hostsim", 600)
    devices.opened([cpu, sim], {"cuda": "libcudart.so: cannot open"})
    assert heard == [("engine", ["cpu:0", "hostsim:0"], {"cuda": "libcudart.so: cannot open"})]
    assert devices.rooms == {} and devices.capacity == {}  # no snapshot yet
    devices.refresh([cpu, sim], {"hostsim:0": 200})  # the loaded model's experts hold 200 bytes there
    room = devices.rooms["hostsim:0"]
    assert (room.free, room.held, room.capacity) == (600, 200, 800) and devices.rooms["cpu:0"].unlimited
    assert heard[-1] == ("memory", {"cpu:0": 1 << 30, "hostsim:0": 800})
    devices.opened([cpu], {})  # another engine: its devices and errors alone
    assert devices.names == ["cpu:0"] and devices.load_errors == {} and len(heard) == 3
    with pytest.raises(ValueError, match="event 'changed': expected one of engine, memory"):
        devices.on("changed", print)


# ---- the run session ------------------------------------------------------------------------------------------


def run_record(output_hash: str = "ab" * 32, cancelled: bool = False, rate: float = 12.5, fingerprint=None):
    from engine.runs.history import RunRecord, RunSettings

    return RunRecord(index=0, started="2026-12-02T10:00:00", target="target", draft=None, placement="*=cpu:0",
                     mode="reference", precision="f32", q=None, tokens=8, repeats=1, prompts=1,
                     decode_tokens_per_second=rate, prefill_tokens_per_second=rate, accept_rate=None,
                     output_hash=output_hash, reference_hash="", cancelled=cancelled, seconds=1.0,
                     settings=RunSettings(["Hello"], tokens=8), target_path="/models/target", primary="cpu:0",
                     fingerprint=fingerprint)  # fmt: skip


@pytest.fixture
def session():
    from app.models.run_session import RunSession

    s = RunSession()
    s.heard = []
    s.on("started", lambda: s.heard.append("started"))
    s.on("finished", lambda record: s.heard.append(("finished", None if record is None else record.index)))
    s.on("history", lambda: s.heard.append("history"))
    s.on("note", lambda note: s.heard.append((note.reason, note.text)))
    return s


def test_a_run_starts_once_is_kept_in_the_history_and_tells_its_listeners(session):
    from app.models.events import Refusal
    from app.models.run_session import REFUSALS

    launched = []
    assert session.start(40, False, lambda: launched.append(1)) == Refusal("no-model", "Open a model first")
    assert session.start(40, True, lambda: launched.append(1)) is None
    assert session.running and launched == [1] and session.live.progress == (0, 40) and session.heard == ["started"]
    again = session.start(40, True, lambda: launched.append(2))  # refused while one runs: nothing queued
    assert again == Refusal("running", "A run is under way") and launched == [1] and again.reason in REFUSALS
    session.finish(run_record(), trace=None)
    assert not session.running and [r.index for r in session.history] == [1] and session.last_record.index == 1
    assert session.history[0].is_reference
    assert session.heard[1:] == ["history", ("finished", 1), ("run-ended", "Run 1: 12.5 tokens/s")]
    session.start(40, True, lambda: None)
    session.finish(run_record(cancelled=True, output_hash=""))
    assert session.history[1].stable is None and session.heard[-1] == ("run-ended", "Run 2: cancelled")
    session.start(40, True, lambda: None)
    session.failed()
    assert not session.running and session.heard[-1] == ("finished", None) and len(session.history) == 2


def test_a_history_the_file_does_not_take_keeps_the_run_with_a_note(session, tmp_path):
    from engine.runs.history import History

    (tmp_path / "history").write_text("")
    session.runs = History(tmp_path / "history" / "runs.jsonl")  # its folder is a file: not writable
    session.start(8, True, lambda: None)
    session.finish(run_record())
    reason, text = session.heard[1]
    assert reason == "not-kept" and text.startswith("The run history is not kept: cannot keep the run in")
    assert [r.index for r in session.history] == [1] and session.heard[2:4] == ["history", ("finished", 1)]


def test_another_model_opens_its_own_history_and_the_last_run_goes(session, xdg_data):
    from app.models.run_session import RunTrace
    from engine.runs.history import History, history_file

    fp = "sha256:" + "1" * 64
    History(history_file(fp)).add(run_record(fingerprint=fp))  # a run of an earlier session
    session.start(8, True, lambda: None)
    session.finish(run_record(), RunTrace(1, [], {}))
    assert session.last_trace is not None and session.last_record is not None
    session.heard.clear()
    session.open(fp)
    assert [r.index for r in session.history] == [1] and session.history[0].fingerprint == fp
    assert session.last_trace is None and session.last_record is None and session.live.progress == (0, 0)
    assert session.heard == ["history"]
    session.keep_history = False
    session.open(fp)
    assert session.history == []  # not kept across restarts: an empty history
    history_file(fp).write_text("not json\n")
    session.keep_history = True
    session.open(fp)
    reason, text = session.heard[-2]
    assert reason == "damaged" and text.startswith(f"The run history was damaged; skipped {history_file(fp)}:1")
    session.open(None)  # a model without a fingerprint: no history kept
    assert session.history == [] and session.heard[-1] == "history"


def test_a_model_opened_while_a_run_decodes_leaves_that_runs_live_curves(session):
    session.start(8, True, lambda: None)
    session.open(None)
    assert session.running and session.live.progress == (0, 8)


def test_clearing_the_history_forgets_its_runs(session, xdg_data):
    from engine.runs.history import history_file

    fp = "sha256:" + "2" * 64
    session.open(fp)
    session.start(8, True, lambda: None)
    session.finish(run_record(fingerprint=fp))
    assert history_file(fp).exists()
    session.clear_history()
    assert session.history == [] and not history_file(fp).exists() and session.heard[-1] == "history"


# ---- the calibrations -----------------------------------------------------------------------------------------


class Measurements:
    """A made-up engine thread: start(key) queues a measurement; the test ends it."""

    def __init__(self):
        self.queued = []

    def __call__(self, key):
        self.queued.append(key)


def figures(bandwidth: float):
    from engine.placement.costmodel import Calibration, DeviceRate

    return Calibration("cpu:0", 1e-3, {"cpu:0": DeviceRate(bandwidth)})


def test_figures_are_measured_once_kept_per_model_and_what_waits_runs_when_they_come():
    from app.models.calibration import Calibrations
    from app.models.events import Refusal

    cal, heard, ran, start = Calibrations(), [], [], Measurements()
    cal.on("changed", lambda: heard.append((cal.measuring, cal.figures)))
    assert cal.ensure(None, None, start) == Refusal("no-model", "Open a model first") and start.queued == []
    a, b = ("model a", "cpu:0", ("cpu:0",)), ("model b", "cpu:0", ("cpu:0",))
    cal.select(a)
    assert cal.ensure(a, lambda: ran.append("first"), start) is None
    assert cal.ensure(a, lambda: ran.append("second"), start) is None  # measured once however often asked
    assert start.queued == [a] and cal.measuring and heard == [(True, None)]
    cal.measured(a, figures(1e9), current=a)
    assert cal.figures.devices["cpu:0"].bandwidth == 1e9 and not cal.measuring and ran == ["first", "second"]
    assert heard[-1] == (False, cal.figures)
    cal.ensure(a, lambda: ran.append("at once"), start)
    assert ran[-1] == "at once" and start.queued == [a]  # kept: not measured again
    cal.select(b)  # another model: no figures yet
    assert cal.figures is None
    cal.select(a)  # the first again: its figures kept
    assert cal.figures.devices["cpu:0"].bandwidth == 1e9


def test_a_model_opened_while_measuring_is_measured_next_when_something_waits_for_it():
    from app.models.calibration import Calibrations

    cal, heard, ran, start = Calibrations(), [], [], Measurements()
    cal.on("changed", lambda: heard.append(cal.measuring))
    a, b = ("model a",), ("model b",)
    cal.select(a)
    cal.ensure(a, lambda: ran.append("a"), start)
    cal.select(b)  # what waited for a's figures waits no more
    cal.ensure(b, lambda: ran.append("b"), start)  # a's measurement is under way: b's waits for it
    assert start.queued == [a]
    cal.measured(a, figures(1e9), current=b)  # a's figures kept, b's measured next
    assert start.queued == [a, b] and cal.figures is None and cal.measuring and cal.kept[a] is not None
    cal.measured(b, figures(2e9), current=b)
    assert ran == ["b"] and cal.figures.devices["cpu:0"].bandwidth == 2e9 and heard == [True, True, False]
    c = ("model c",)
    cal.select(c)
    cal.ensure(c, None, start)
    cal.select(a)  # nothing waits for a's figures, kept: c's measurement ends with "changed" alone
    cal.measured(c, figures(3e9), current=a)
    assert start.queued == [a, b, c] and not cal.measuring and heard[-1] is False and cal.figures is cal.kept[a]


def test_a_failed_measurement_drops_what_waited_and_is_asked_again_later():
    from app.models.calibration import Calibrations

    cal, heard, ran, start = Calibrations(), [], [], Measurements()
    cal.on("changed", lambda: heard.append(cal.measuring))
    key = ("model",)
    cal.select(key)
    cal.ensure(key, lambda: ran.append(1), start)
    cal.failed()
    assert not cal.measuring and cal.waiting == [] and heard == [True, False] and ran == []
    cal.ensure(key, lambda: ran.append(2), start)
    assert start.queued == [key, key]
    cal.measured(key, figures(3e9), current=key)
    assert ran == [2]
    with pytest.raises(ValueError, match="event 'measured': expected one of changed"):
        cal.on("measured", print)
