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
    models = "app.models.placement, app.models.routing, app.models.devices"
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
    from engine.core.model import DeviceInfo

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
