"""The Tune panel: a tuning on the engine thread, its progress and front (through getData), cancel, apply and save;
owner_local points and the KL limit that excludes them."""

from app_helpers import LAYER_BYTES, TIMEOUT_MS, on_engine
from PySide6.QtGui import QValidator

from engine import tune
from engine.placement.placement import MIB, Placement
from engine.profiles.profile import load
from engine.runs.quality import QualityCost

FAST = "hostsim:0"


def settings(**more) -> tune.TuneSettings:
    values = dict(fast=FAST, qs=(1, 2), time_budget=30, calibrate=False, prompts=["Hello there", "A mixture"])
    values.update(more)
    return tune.TuneSettings(**values)


def started(qtbot, window, **more):
    panel = window.tune
    seen = []
    panel._relay.sigProgress.connect(lambda item: seen.append(item))
    assert panel.start(settings(**more))
    assert panel.running and not panel.start_button.isEnabled() and panel.cancel_button.isEnabled()
    return panel, seen


def test_the_panel_tunes_on_the_engine_thread_and_shows_progress_and_the_front(qtbot, make_window):
    window = make_window()
    assert "tune" in window.docks and window.act_tune.text() == "Tune placements…"
    panel, seen = started(qtbot, window)
    assert window.state.busy  # on the engine thread: the GUI goes on
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    phases = [p.phase for p, _point in seen]
    assert "reference" in phases and "measuring" in phases and phases[-1] == "done"
    measured = [point for _p, point in seen if point is not None]
    assert measured and all(point.same for point in measured)
    x, y = panel.front_marks.getData()
    assert len(x) == len(panel.front) >= 1 and list(y) == [p.speed for p in panel.front]
    assert list(x) == [p.fast_bytes / MIB for p in panel.front] and list(x) == sorted(x) and list(y) == sorted(y)
    mx, my = panel.measured_marks.getData()
    assert len(mx) == len(panel.measured) >= len(x) and min(my) > 0
    assert panel.front_list.count() == len(panel.front) and panel.selected() in panel.front
    assert panel.status.text().startswith("Tuning done: ") and panel.apply_button.isEnabled()
    # the engine's placement is the one it had before
    assert on_engine(qtbot, window.state, lambda side: side.target.placement) == window.state.applied


def test_cancel_stops_the_tuning_and_keeps_what_was_measured(qtbot, make_window):
    window = make_window()
    panel, seen = started(qtbot, window, qs=tuple(range(1, 9)), time_budget=600)
    qtbot.waitUntil(lambda: len(panel.measured) >= 2, timeout=TIMEOUT_MS)
    panel.cancel()
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    assert "cancelled" in panel.status.text() and panel.measured and panel.front
    assert panel.start_button.isEnabled() and not panel.cancel_button.isEnabled()
    assert on_engine(qtbot, window.state, lambda side: side.target.placement) == window.state.applied


def test_apply_is_one_undoable_edit_and_save_writes_the_point_as_a_profile(qtbot, make_window, tmp_path):
    window = make_window()
    state = window.state
    panel, _seen = started(qtbot, window)
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    before = state.placement.copy()
    others = [i for i, p in enumerate(panel.front) if p.placement != before]
    if not others:  # the front is the placement the editor has: put another point first
        panel.front.append(next(p for p in panel.measured if p.placement != before))
        panel.front_list.addItem("another")
        others = [len(panel.front) - 1]
    panel.front_list.setCurrentRow(others[0])
    point = panel.selected()
    assert panel.apply_selected()
    assert state.placement == point.placement and state.undo_text.startswith("tuned placement (")
    state.undo()
    assert state.placement == before
    state.redo()
    assert state.placement == point.placement
    path = tmp_path / "tuned.yaml"
    assert panel.save_selected(str(path))
    profile = load(path)
    assert profile.placement_for(state.model.config) == point.placement
    assert profile.run.tokens == point.tokens and profile.expectations.output_sha256 == list(point.output_sha256)
    assert profile.run.q == point.q and profile.draft is not None


def test_a_budget_that_holds_nothing_is_said_and_the_panel_stays_usable(qtbot, make_window):
    window = make_window()
    panel = window.tune
    messages = []
    window.state.sigMessage.connect(messages.append)
    assert panel.start(settings(caps={FAST: 1000}))
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    assert panel.status.text().startswith("Tuning failed: ") and "holds no expert" in panel.status.text()
    assert any("holds no expert" in m for m in messages) and panel.start_button.isEnabled()


def test_the_kl_limit_waits_for_owner_local_and_takes_no_bad_value(qtbot, make_window):
    panel = make_window().tune
    box = panel.max_kl
    assert not panel.owner_local.isChecked() and not box.isEnabled() and box.text() == "no limit"
    assert panel.tune_settings().modes == ("reference",) and panel.kl_limit() is None
    panel.owner_local.setChecked(True)
    assert box.isEnabled() and panel.tune_settings().modes == ("reference", "owner_local")
    assert panel.kl_limit() is None  # no limit until one is given
    for bad in ("-1 nats", "-0.5", "abc", "1000", "nan", "inf"):  # below 0, not a number, over the maximum
        assert box.validate(bad, 0) == QValidator.State.Invalid, bad
    box.lineEdit().selectAll()
    qtbot.keyClicks(box, "-1e-6")  # the minus sign is refused
    box.interpretText()
    assert box.value() == 1e-6 and box.text() == "1e-06 nats" and panel.kl_limit() == 1e-6
    box.setValue(box.minimum())
    box.stepUp()  # a decade at a time, from no limit through 0
    assert panel.kl_limit() == 0.0
    box.stepUp()
    assert panel.kl_limit() == 1e-9
    box.stepDown()
    box.stepDown()
    assert box.text() == "no limit" and panel.kl_limit() is None
    box.setValue(0.1)
    panel.owner_local.setChecked(False)  # only the reference mode: nothing to exclude
    assert not box.isEnabled() and panel.kl_limit() is None


class MadeUpTuning:
    """Stands in for engine.tune.Tuning: keeps what the panel asked for, and 'measures' made-up points: one device
    in the reference mode, and two split placements in owner_local whose mean KL is KL[experts on the fast device]
    (judged by the constraints the panel gave, as the search judges them)."""

    KL = {1: 0.01, 2: 0.5}
    asked: list = []

    def __init__(self, target, draft, settings, on_progress=None, constraints=()):
        self.target, self.settings, self.on_progress, self.constraints = target, settings, on_progress, constraints
        MadeUpTuning.asked.append(self)

    def cancel(self) -> None:
        pass

    def run(self) -> tune.TuneResult:
        config, primary, s = self.target.config, self.target.device, self.settings
        one = Placement.single(config, primary)
        moe = next(layer for layer in range(config.num_layers) if config.is_moe_layer(layer))
        split = {}
        for n in self.KL:
            split[n] = one.copy()
            for e in range(n):
                split[n].move_expert(moe, e, FAST)
        kl = {split[n].describe(): v for n, v in self.KL.items()}
        for c in self.constraints:  # the quality measurement, made up
            c.limit.measure = lambda mode, precision, top_k, placement: QualityCost(
                mode, precision, top_k, None, 2, 16, 32, 1.0, kl[placement], kl[placement], None, None)  # fmt: skip
        reference = ["ab" * 32, "cd" * 32]
        made = [(one, "one device", "reference", 100.0, reference)]
        made += [(split[n], f"{n} moved", "owner_local", 100.0 + 20 * n, ["ef" * 32, "01" * 32]) for n in self.KL]
        points = []
        for i, (placement, origin, mode, speed, hashes) in enumerate(made):
            candidate = tune.Candidate(placement, 2, origin, {primary: 0, FAST: 0}, None, mode)
            candidate.device_bytes[FAST] = sum(row.count(FAST) for row in placement.owners) * LAYER_BYTES // 8
            point = tune.Point(candidate, [tune.Measurement(8, 1, [speed], hashes, 0.5, 0.1, list(reference))])
            for check in self.constraints:
                point.excluded = point.excluded or check(point)
            points.append(point)
            self.on_progress(tune.Progress("measuring", 0, 1, i + 1, len(made), 0.1, s.time_budget, speed, point))
        search = tune.SearchResult(points, tune.pareto_front(points, FAST), FAST, {8: reference}, [tune.Rung(8, 1)],
                                   [len(made)], 1.0, False, "")  # fmt: skip
        return tune.TuneResult(search, primary, [primary, FAST], {}, {}, len(made), None, "given", "made up", [],
                               s.modes)  # fmt: skip


def made_up(monkeypatch) -> type[MadeUpTuning]:
    MadeUpTuning.asked = []
    monkeypatch.setattr(tune, "Tuning", MadeUpTuning)
    return MadeUpTuning


def test_the_modes_and_the_kl_limit_reach_the_tuning_as_the_command_passes_them(qtbot, make_window, monkeypatch):
    fake = made_up(monkeypatch)
    panel = make_window().tune
    panel.owner_local.setChecked(True)
    panel.max_kl.setValue(0.1)
    panel.time_budget.setValue(45)
    assert panel.start()
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    asked = fake.asked[-1]
    assert asked.settings.modes == ("reference", "owner_local") and asked.settings.time_budget == 45
    (kl,) = asked.constraints
    assert isinstance(kl, tune.KLConstraint) and kl.limit.max_kl == 0.1
    panel.owner_local.setChecked(False)  # the reference mode alone: no limit, whatever the box says
    assert panel.start()
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    assert fake.asked[-1].settings.modes == ("reference",) and list(fake.asked[-1].constraints) == []


def test_an_owner_local_point_over_the_limit_is_listed_as_excluded_with_the_reason(qtbot, make_window, monkeypatch,
                                                                                   tmp_path):  # fmt: skip
    made_up(monkeypatch)
    window = make_window()
    panel = window.tune
    assert panel.start(settings(modes=("reference", "owner_local")), max_kl=0.1)
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    assert panel.status.text().endswith("; 1 excluded by the KL limit")
    assert [(p.origin, p.mode, p.mean_kl) for p in panel.front] == [("one device", "reference", None),
                                                                     ("1 moved", "owner_local", 0.01)]  # fmt: skip
    rows = [panel.front_list.item(i).text() for i in range(panel.front_list.count())]
    assert len(rows) == 3 and "reference  same  one device" in rows[0] and "owner_local  KL 0.01  1 moved" in rows[1]
    assert rows[2] == "excluded  owner_local, q 2, 2 moved: owner_local: mean KL 0.5 nats > --max-kl 0.1"
    (excluded,) = [p for p in panel.measured if p.excluded]
    assert excluded.mean_kl == 0.5 and "EXCLUDED: owner_local: mean KL 0.5" in panel.front_list.item(2).toolTip()
    assert panel.selected() == panel.front[1]  # the tuner's choice
    x, _y = panel.front_marks.getData()
    assert len(x) == 2 and list(panel.measured_marks.data["symbol"]) == ["o", "o", "x"]  # measured, not on the front
    panel.front_list.setCurrentRow(2)  # an excluded point cannot be kept
    assert panel.selected() is None and not panel.apply_button.isEnabled() and not panel.save_button.isEnabled()
    panel.front_list.setCurrentRow(1)
    path = tmp_path / "tuned.yaml"
    assert panel.save_selected(str(path))
    profile = load(path)  # the chosen point's mode, as `tune --out` writes it
    assert profile.run.mode == "owner_local" and profile.expectations.output_sha256 == ["ef" * 32, "01" * 32]


def test_owner_local_points_are_measured_and_judged_by_their_kl(qtbot, make_window):
    window = make_window()
    panel = window.tune
    assert panel.start(settings(qs=(2,), modes=("reference", "owner_local"), time_budget=10), max_kl=1.0)
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    assert panel.status.text().startswith("Tuning done: ")
    local = [p for p in panel.measured if p.mode == "owner_local"]
    assert local and {p.mode for p in panel.measured} == {"reference", "owner_local"}
    assert all(p.mean_kl is not None and 0 <= p.mean_kl <= 1.0 and p.excluded is None for p in local)
    assert all(p.same for p in panel.measured if p.mode == "reference")
    rows = [panel.front_list.item(i).text() for i in range(panel.front_list.count())]
    assert len(rows) == len(panel.front) and all(("reference" in r) != ("owner_local" in r) for r in rows)


def test_the_panel_says_why_the_choice_is_not_the_fastest_point_listed(qtbot, make_window, monkeypatch):
    made_up(monkeypatch)
    window = make_window()
    panel = window.tune
    assert panel.start(settings(modes=("reference", "owner_local")))
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    assert not panel.why.isVisibleTo(window)  # the made-up front's fastest is the choice: nothing to say
    monkeypatch.setattr(tune.SearchResult, "why_chosen", lambda self: "the faster point ran in one short run only")
    assert panel.start(settings(modes=("reference", "owner_local")))
    qtbot.waitUntil(lambda: not panel.running, timeout=TIMEOUT_MS)
    assert panel.why.text() == "Chosen, not the fastest listed: the faster point ran in one short run only"
    assert panel.why.isVisibleTo(window)
