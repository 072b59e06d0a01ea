"""`expertbench tune`: the search on made-up measurements (no timing), its budgets, cancel and front; the command."""

import json
import math
import threading

import pytest
from fixture_paths import FIXTURES

from engine import tune
from engine.checkpoints.checkpoint import read_config
from engine.cli import main
from engine.core.errors import ArgumentError
from engine.placement.costmodel import ModelShape
from engine.placement.placement import Placement, device_bytes
from engine.profiles.profile import load

TARGET, DRAFT = FIXTURES / "qwen3moe-f32", FIXTURES / "qwen3-f32"
FAST, PRIMARY = "hostsim:0", "cpu:0"
# a made-up model: 4 MoE layers of 8 experts of 1 MiB, top-2
SHAPE = ModelShape(4, (0, 1, 2, 3), 8, 2, 1 << 20)
HASHES = ["a" * 64, "b" * 64]


def point(speed: float, nbytes: int, q=2, excluded=None, rates=None) -> tune.Point:
    placement = SHAPE.empty_placement(PRIMARY)
    c = tune.Candidate(placement, q, f"{nbytes} bytes", {PRIMARY: 0, FAST: nbytes})
    m = tune.Measurement(8, 1, rates or [speed], HASHES, reference_sha256=HASHES)
    return tune.Point(c, [m], excluded)


def test_the_front_holds_every_point_no_other_dominates_and_no_other():
    points = [point(100, 0), point(90, 1), point(150, 2), point(140, 3), point(150, 4), point(200, 8), point(199, 9),
              point(300, 5, excluded="a constraint"), point(math.nan, 0), point(120, 2, q=3)]  # fmt: skip
    front = tune.pareto_front(points, FAST)
    assert [(p.speed, p.fast_bytes(FAST)) for p in front] == [(100, 0), (150, 2), (200, 8)]
    key = lambda p: (p.speed, p.fast_bytes(FAST))  # noqa: E731
    for p in front:
        assert not any(tune.dominates(key(o), key(p)) for o in points if o.excluded is None and o is not p)
    for p in points:
        if p not in front and p.excluded is None and math.isfinite(p.speed):
            assert any(tune.dominates(key(f), key(p)) or key(f) == key(p) for f in front)
    ranks = tune.pareto_ranks([p for p in points if p.excluded is None and math.isfinite(p.speed)], FAST)
    assert sorted(set(ranks.values())) == [0, 1]  # what is left after the front is one front here
    assert point(1, 0, rates=[1.0, 3.0, 2.0]).spread == (1.0, 3.0) and point(1, 0, rates=[1.0, 3.0, 2.0]).speed == 2.0


def test_the_choice_compares_the_fastest_within_their_turns_not_one_lucky_run():
    def measured(*runs):  # (turn, tokens/s) at the last rung
        p = point(0, 0)
        p.measurements = [
            tune.Measurement(64, 1, [v], HASHES, reference_sha256=HASHES, rung=3, turn=t) for t, v in runs
        ]
        return p

    steady = measured((None, 100), (0, 100), (1, 50), (2, 50))  # the machine slowed after turn 0
    slower = measured((None, 95), (0, 90), (1, 45), (2, 45))
    lucky = measured((None, 300))  # one run during a fast spell, never measured beside the others
    short = point(500, 0)  # a short run only
    result = tune.SearchResult(
        [short, slower, lucky, steady], [], FAST, {}, list(tune.DEFAULT_RUNGS), [], 1.0, False, ""
    )
    assert lucky.speed > steady.speed and result.chosen() is steady
    alone = tune.SearchResult([short, lucky], [], FAST, {}, list(tune.DEFAULT_RUNGS), [], 1.0, False, "")
    assert alone.chosen() is lucky  # no turns: the fastest of those measured longest


def test_the_report_says_why_the_chosen_point_is_not_the_fastest_listed():
    def measured(q, *runs):  # (turn, tokens/s) at the last rung
        p = point(0, 0, q=q)
        p.measurements = [
            tune.Measurement(64, 1, [v], HASHES, reference_sha256=HASHES, rung=3, turn=t) for t, v in runs
        ]
        return p

    # a's pooled median (400, 100, 50) beats b's (110, 55), but in each turn b ran above a
    a, b = measured(2, (None, 400), (0, 100), (1, 50)), measured(1, (0, 110), (1, 55))
    result = tune.SearchResult([a, b], [a, b], FAST, {}, list(tune.DEFAULT_RUNGS), [], 1.0, False, "")
    assert a.speed > b.speed and result.chosen() is b
    why = result.why_chosen()
    assert why.startswith("measured again in 2 turns beside the other fastest points, the chosen one ran +4.8 % ")
    assert "the 100.0 tokens/s point (q 2) -4.8 %" in why
    short = point(500, 0)  # one short run, faster than anything measured longer
    longer = tune.SearchResult([short, b], [short, b], FAST, {}, list(tune.DEFAULT_RUNGS), [], 1.0, False, "")
    assert longer.chosen() is b
    assert longer.why_chosen() == ("the 500.0 tokens/s point (q 2) was measured in 1 short run(s) only; the chosen one "
                                   "in 2 runs of 64 tokens per prompt")  # fmt: skip
    alone = tune.SearchResult([b], [b], FAST, {}, list(tune.DEFAULT_RUNGS), [], 1.0, False, "")
    assert alone.why_chosen() is None  # the fastest listed is the chosen one: nothing to say
    doc = tune.report(_result(result))
    assert doc["why_chosen"] == why and f"why        {why}" in tune.text(doc)


class FakeBench:
    """Made-up measurements: tokens/s from a function of the candidate, seconds from a unit per token, on a clock
    that only moves when something is measured."""

    def __init__(self, speed, unit=0.01, differs=lambda c: False, on_measure=None):
        self.speed, self.unit, self.differs, self.on_measure = speed, unit, differs, on_measure
        self.now = 0.0
        self.measured: list[tuple] = []
        self.cancelled = False

    def clock(self):
        return self.now

    def reference(self, tokens):
        self.now += self.unit * tokens
        return [f"{tokens:064x}"], self.unit * tokens

    def measure(self, candidate, tokens, repeats):
        self.measured.append((candidate.key, tokens, repeats))
        seconds = self.unit * tokens * repeats * 1.2
        self.now += seconds
        if self.on_measure is not None:
            self.on_measure(len(self.measured))
        if self.cancelled:  # as a run cancelled under way: cut short
            return tune.Measurement(tokens, repeats, [], [], None, seconds)
        hashes = ["f" * 64] if self.differs(candidate) else [f"{tokens:064x}"]
        return tune.Measurement(tokens, repeats, [self.speed(candidate)] * repeats, hashes, 0.8, seconds)

    def cancel(self):
        self.cancelled = True


def layers_on_fast(c: tune.Candidate) -> int:
    return sum(1 for row in c.placement.owners if row and row[0] == FAST)


def make_space(qs=(1, 2, 3), budgets=None):
    budgets = {FAST: 3 * 8 << 20} if budgets is None else budgets
    return tune.search_space(SHAPE, [PRIMARY, FAST], PRIMARY, FAST, budgets, qs=qs)


def synthetic_speed(c: tune.Candidate) -> float:
    """Best with one whole layer on the fast device (the last: ties go to higher layers) and q 2; a layer split
    between the devices costs a little."""
    n = c.device_bytes[FAST] / (8 << 20)
    split = any(len(set(row)) > 1 for row in c.placement.owners)
    whole = sum(layer for layer, row in enumerate(c.placement.owners) if row[0] == FAST and len(set(row)) == 1)
    return 100 + 40 * n - 15 * n * n - 10 * abs((c.q or 2) - 2) - 3 * split + 0.01 * whole


def test_the_search_finds_the_best_of_the_space_in_a_fraction_of_a_sweep():
    candidates, notes = make_space()
    bench = FakeBench(synthetic_speed)
    sweep = sum(bench.unit * 64 * 3 * 1.2 for _ in candidates)
    result = tune.Search(candidates, bench, FAST, time_budget=sweep / 5, clock=bench.clock).run()
    best = max(candidates, key=synthetic_speed)
    chosen = result.chosen()
    assert chosen.candidate.key == best.key == ("0-2=cpu:0; 3=hostsim:0", 2, "reference")
    assert chosen.rung == len(tune.DEFAULT_RUNGS) - 1 and layers_on_fast(chosen.candidate) == 1
    assert not result.stopped and not result.cancelled and result.seconds <= 0.25 * sweep
    # every candidate had a short run; fewer went on at each rung; the long runs went to few
    by_rung = [sum(1 for k, t, r in bench.measured if t == rung.tokens) for rung in tune.DEFAULT_RUNGS]
    assert by_rung[0] == len(candidates) and by_rung[1] < by_rung[0] and by_rung[-1] < by_rung[1]
    assert result.front[-1] is chosen and all(p.same_as_reference for p in result.points)


def test_time_left_confirms_the_front_at_the_deepest_rung_and_measures_the_fastest_again():
    candidates, _ = make_space()
    bench = FakeBench(synthetic_speed)
    sweep = sum(bench.unit * 64 * 3 * 1.2 for _ in candidates)
    result = tune.Search(candidates, bench, FAST, time_budget=sweep, clock=bench.clock).run()
    chosen = result.chosen()
    assert result.planned[1] == math.ceil(result.planned[0] / 2)  # halves: the budget allows it
    assert len(result.front) > 2 and all(p.rung == chosen.rung for p in result.front)  # no short run's luck
    assert len(chosen.rates) == tune.DEFAULT_RUNGS[-1].repeats * (1 + tune.REFINE_ROUNDS)  # its runs pooled


def test_the_time_budget_trims_the_candidates_and_the_rungs_and_is_kept():
    candidates, _ = make_space()
    bench = FakeBench(synthetic_speed)
    budget = 30 * bench.unit * 8  # about thirty short runs' worth
    result = tune.Search(candidates, bench, FAST, time_budget=budget, clock=bench.clock).run()
    longest = bench.unit * 64 * 3 * 1.2
    assert result.seconds <= budget + longest
    assert result.planned[0] < len(candidates) and any("measures" in n for n in result.notes)
    assert result.points and result.chosen() is not None
    assert result.points[0].candidate.origin == "one device"  # the cheap end is always measured
    with pytest.raises(ArgumentError, match="--time-budget 0: expected a positive number of seconds"):
        tune.Search(candidates, bench, FAST, time_budget=0)
    with pytest.raises(ArgumentError, match="no candidate placement fits the budgets"):
        tune.Search([], bench, FAST)


def test_every_candidate_fits_the_budgets_and_the_space_has_layers_experts_and_q():
    budgets = {FAST: 2 * (8 << 20) + (3 << 20)}  # two layers and three experts
    candidates, notes = make_space(qs=(1, 3), budgets=budgets)
    for c in candidates:
        assert c.device_bytes == device_bytes(c.placement, SHAPE.bytes_of, [PRIMARY, FAST])
        assert c.device_bytes[FAST] <= budgets[FAST]
    assert {c.q for c in candidates} == {1, 3} and candidates[0].origin == "one device"
    assert len({c.key for c in candidates}) == len(candidates)  # no placement twice
    origins = " | ".join(c.origin for c in candidates)
    assert "2 cold layers" in origins and "hot first" in origins and "hottest expert" in origins
    whole = [c for c in candidates if all(len(set(r)) == 1 for r in c.placement.owners)]
    assert {layers_on_fast(c) for c in whole} == {0, 1, 2}
    assert any("single device" in n for n in notes)  # every expert on the fast device is over its budget
    split = [c for c in candidates if not all(len(set(r)) == 1 for r in c.placement.owners)]
    assert split, "single experts are searched too"


@pytest.mark.parametrize(
    "budgets, message",
    [
        ({PRIMARY: 4 << 20, FAST: 4 << 20}, "--budget: the budgets (cpu:0 4.0 MiB, hostsim:0 4.0 MiB) hold less than "
                                            "the 32.0 MiB of experts: no placement fits; expected budgets that hold "
                                            "every expert together"),
        ({FAST: 1000}, "--budget hostsim:0=1000: hostsim:0's budget of 0.0010 MiB holds no expert (one is 1.0 MiB): "
                       "there is nothing to tune; expected at least 1.0 MiB on the fast device"),
    ],
)  # fmt: skip
def test_an_impossible_budget_is_refused_in_numbers(budgets, message):
    with pytest.raises(ArgumentError) as exc:
        tune.check_budgets(SHAPE, [PRIMARY, FAST], FAST, budgets, budgets, {})
    assert str(exc.value) == message


def test_cancel_stops_before_the_next_measurement_and_keeps_what_was_measured():
    candidates, _ = make_space()
    box = {}
    bench = FakeBench(synthetic_speed, on_measure=lambda n: n == 5 and box["search"].cancel())
    progress = []
    search = box["search"] = tune.Search(candidates, bench, FAST, time_budget=1e6, clock=bench.clock,
                                         on_progress=progress.append)  # fmt: skip
    result = search.run()
    assert result.cancelled and result.stopped == "cancelled" and bench.cancelled
    assert len(bench.measured) == 5 and len(result.points) == 4  # the run under way when cancelled is not kept
    assert progress[-1].phase == "done" and progress[-1].done == 4
    assert [p.done for p in progress if p.phase == "measuring"] == [1, 2, 3, 4]


def test_a_point_whose_hashes_differ_is_reported_not_hidden_and_never_chosen():
    candidates, _ = make_space(qs=(2,))
    fastest = max(candidates, key=synthetic_speed)
    bench = FakeBench(synthetic_speed, differs=lambda c: c.key == fastest.key)
    search = tune.Search(candidates, bench, FAST, time_budget=1e6, clock=bench.clock)
    result = search.run()
    bad = [p for p in result.points if not p.same_as_reference]
    assert [p.candidate.key for p in bad] == [fastest.key]
    assert bad[0] in result.front  # it is the fastest: on the front, flagged
    assert result.chosen().candidate.key != fastest.key and result.chosen().same_as_reference
    doc = tune.report(_result(result))
    assert [p["placement"] for p in doc["differing"]] == [fastest.placement.describe()]
    assert any(not p["same_as_reference"] for p in doc["front"])
    shown = tune.text(doc)
    assert "DIFFERS" in shown and f"against the one-device {'0' * 12}" in shown
    assert doc["why_chosen"].endswith("gives other outputs than one device: never chosen")


def test_a_constraint_keeps_a_point_off_the_front_and_out_of_the_choice():
    candidates, _ = make_space(qs=(2,))
    fastest = max(candidates, key=synthetic_speed)
    bench = FakeBench(synthetic_speed)
    rule = lambda p: "over the limit" if p.candidate.key == fastest.key else None  # noqa: E731
    result = tune.Search(candidates, bench, FAST, time_budget=1e6, clock=bench.clock, constraints=[rule]).run()
    excluded = [p for p in result.points if p.excluded]
    assert [p.candidate.key for p in excluded] == [fastest.key] and excluded[0].excluded == "over the limit"
    assert excluded[0] not in result.front and result.chosen().candidate.key != fastest.key


def owner_local_faster(c: tune.Candidate) -> float:
    return synthetic_speed(c) * (1.2 if c.mode == "owner_local" else 1.0)


def test_owner_local_points_are_measured_beside_the_reference_and_on_the_front_when_faster():
    modes = ("reference", "owner_local")
    candidates, _ = tune.search_space(SHAPE, [PRIMARY, FAST], PRIMARY, FAST, {FAST: 3 * 8 << 20}, qs=(2,),
                                      modes=modes)  # fmt: skip
    placements = {c.placement.describe() for c in candidates}
    assert {(c.placement.describe(), c.mode) for c in candidates} == {(p, m) for p in placements for m in modes}
    assert [c.mode for c in candidates[:2]] == list(modes) and candidates[0].origin == "one device"
    # owner_local sums change the output with the placement: not flagged for it
    bench = FakeBench(owner_local_faster, differs=lambda c: c.mode == "owner_local")
    result = tune.Search(candidates, bench, FAST, time_budget=1e6, clock=bench.clock).run()
    assert result.front and all(p.candidate.mode == "owner_local" for p in result.front)
    chosen = result.chosen()
    assert chosen.candidate.mode == "owner_local" and not chosen.same_as_reference and not chosen.flagged
    assert {"reference", "owner_local"} == {p.candidate.mode for p in result.points}
    doc = tune.report(_result(result, modes))
    assert doc["differing"] == [] and doc["excluded"] == [] and doc["modes"] == list(modes)
    assert {p["mode"] for p in doc["front"]} == {"owner_local"} and doc["chosen"]["mode"] == "owner_local"
    shown = tune.text(doc)
    assert "DIFFERS" not in shown and "mode reference, owner_local" in shown and " own " in shown


def test_a_reference_point_that_differs_is_still_flagged_beside_owner_local_ones():
    candidates, _ = tune.search_space(SHAPE, [PRIMARY, FAST], PRIMARY, FAST, {FAST: 3 * 8 << 20}, qs=(2,),
                                      modes=("reference", "owner_local"))  # fmt: skip
    fastest = max((c for c in candidates if c.mode == "reference"), key=synthetic_speed)
    bench = FakeBench(synthetic_speed, differs=lambda c: c.mode == "owner_local" or c.key == fastest.key)
    result = tune.Search(candidates, bench, FAST, time_budget=1e6, clock=bench.clock).run()
    assert [p.candidate.key for p in result.points if p.flagged] == [fastest.key]
    assert result.chosen().candidate.key != fastest.key


def test_a_constraint_on_the_mode_keeps_owner_local_off_the_front_and_reports_why():
    modes = ("reference", "owner_local")
    candidates, _ = tune.search_space(SHAPE, [PRIMARY, FAST], PRIMARY, FAST, {FAST: 3 * 8 << 20}, qs=(2,),
                                      modes=modes)  # fmt: skip
    bench = FakeBench(owner_local_faster, differs=lambda c: c.mode == "owner_local")
    rule = lambda p: "owner_local: mean KL 0.5 nats > --max-kl 0.1" if p.candidate.mode == "owner_local" else None  # noqa: E731
    result = tune.Search(candidates, bench, FAST, time_budget=1e6, clock=bench.clock, constraints=[rule]).run()
    assert result.front and all(p.candidate.mode == "reference" for p in result.front)
    assert result.chosen().candidate.mode == "reference"
    doc = tune.report(_result(result, modes))
    assert doc["excluded"] and all(p["mode"] == "owner_local" and "--max-kl" in p["excluded"] for p in doc["excluded"])
    assert "excluded   owner_local, q 2, " in tune.text(doc)


def _result(search_result, modes=("reference",)) -> tune.TuneResult:
    return tune.TuneResult(search_result, PRIMARY, [PRIMARY, FAST], {PRIMARY: None, FAST: 24 << 20}, {}, 10, None,
                           "given", "the strategies", [], modes)  # fmt: skip


@pytest.mark.parametrize(
    "text, message",
    [
        ("owner_local,bogus", "--modes owner_local,bogus: unknown mode 'bogus'; expected a comma-separated list of "
                              "reference, owner_local"),
        ("reference,", "--modes reference,: an empty mode; expected a comma-separated list of reference, owner_local"),
    ],
)  # fmt: skip
def test_modes_are_known_reduction_modes(text, message):
    assert tune.parse_modes("owner_local,reference,owner_local") == ("owner_local", "reference")
    with pytest.raises(ArgumentError) as exc:
        tune.parse_modes(text)
    assert str(exc.value) == message


@pytest.mark.parametrize("text, qs", [("auto", tune.AUTO_Q), ("3", (3,)), ("8", (8,))])
def test_q_is_auto_or_one_length(text, qs):
    assert tune.parse_q(text) == qs


# ---- the command and an engine --------------------------------------------------------------------------------


def fixture_args(*more):
    return ["tune", "--model", str(TARGET), "--draft", str(DRAFT), "--runtime", "hostsim", *more]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--q", "0"], "--q 0: expected auto or a draft length of 1..8 tokens"),
        (["--q", "9"], "--q 9: expected auto or a draft length of 1..8 tokens"),
        (["--q", "many"], "--q many: expected auto or a draft length of 1..8 tokens"),
        (["--time-budget", "0"], "--time-budget 0.0: expected a positive number of seconds"),
        (["--time-budget", "-5"], "--time-budget -5.0: expected a positive number of seconds"),
        (["--time-budget", "nan"], "--time-budget nan: expected a positive number of seconds"),
        (["--no-draft", "--q", "2"], "--q 2: there is no draft to give a length (drop --no-draft or --q)"),
        (["--budget", "hostsim:0"], "--budget 'hostsim:0': expected DEVICE=SIZE, e.g."),
        (["--budget", "hostsim:0=lots"], "--budget 'hostsim:0=lots': size 'lots': expected bytes or a number"),
        (["--modes", "owner_local,bogus"], "--modes owner_local,bogus: unknown mode 'bogus'; expected a "
                                           "comma-separated list of reference, owner_local"),
        (["--max-kl", "-1"], "--max-kl -1: expected a number of nats >= 0"),
        (["--max-kl", "nan"], "--max-kl nan: expected a number of nats >= 0"),
        (["--max-kl", "small"], "--max-kl small: expected a number of nats >= 0"),
    ],
)  # fmt: skip
def test_bad_arguments_exit_2_naming_them_before_any_model_loads(args, message, refused_before_loading):
    refused_before_loading(["tune", "--runtime", "hostsim", *args], message)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--budget", "cuda:0=1GB"], "--budget cuda:0=1000000000: no device cuda:0 (devices: cpu:0, hostsim:0)"),
        (["--fast", "cuda:3"], "--fast cuda:3: no device cuda:3 (devices: cpu:0, hostsim:0)"),
        (["--budget", "hostsim:0=1KB"], "--budget hostsim:0=1000: hostsim:0's budget of 0.0010 MiB holds no expert "
                                        "(one is 0.0234 MiB): there is nothing to tune"),
        (["--budget", "cpu:0=100KB", "--budget", "hostsim:0=100KB"],
         "--budget: the budgets (cpu:0 0.0954 MiB, hostsim:0 0.0954 MiB) hold less than the 0.4 MiB of experts"),
    ],
)  # fmt: skip
def test_budgets_and_devices_the_engine_cannot_honour_exit_2_naming_them(args, message, capsys):
    assert main(fixture_args(*args)) == 2
    assert message in capsys.readouterr().err


def test_one_device_is_not_enough_to_tune(capsys):
    assert main(["tune", "--model", str(TARGET), "--no-draft"]) == 2
    assert "tune needs a second device besides cpu:0" in capsys.readouterr().err


def test_json_is_one_document_with_the_measured_front_and_out_writes_a_profile_regress_replays(tmp_path, capsys):
    out = tmp_path / "tuned.yaml"
    assert main(fixture_args("--q", "2", "--time-budget", "30", "--json", "--out", str(out))) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["front"] and doc["fast"] == FAST and doc["mode"] == "reference" and doc["out"] == str(out)
    config = read_config(TARGET)
    for p in doc["front"]:
        assert {"placement", "q", "decode_tokens_per_second", "device_bytes", "output_sha256"} <= set(p)
        assert p["q"] == 2 and p["decode_tokens_per_second"] > 0 and set(p["device_bytes"]) == {PRIMARY, FAST}
        assert p["same_as_reference"] and p["output_sha256"] == doc["reference"]["output_sha256"][
            str(p["tokens_per_prompt"])]  # fmt: skip
        Placement.parse(p["placement"], config)  # the text form the command line reads
    bytes_ = [p["fast_bytes"] for p in doc["front"]]
    speeds = [p["decode_tokens_per_second"] for p in doc["front"]]
    assert bytes_ == sorted(bytes_) and speeds == sorted(speeds)  # more bytes only where it is faster
    assert doc["differing"] == [] and doc["candidates"] >= len(doc["points"]) >= len(doc["front"])
    chosen = doc["chosen"]
    profile = load(out)
    assert profile.placement_for(config) == Placement.parse(chosen["placement"], config)
    assert profile.run.q == 2 and profile.run.tokens == chosen["tokens_per_prompt"]
    assert profile.expectations.output_sha256 == chosen["output_sha256"]
    assert profile.model.fingerprint and profile.draft.fingerprint
    from engine.profiles import regress

    assert regress.run([str(out)]).exit_code == 0  # the replay gives what the tuner measured


def test_the_table_names_the_front_and_the_chosen_point(capsys):
    args = [
        "tune",
        "--model",
        str(TARGET),
        "--no-draft",
        "--runtime",
        "hostsim",
        "--no-calibrate",
        "--time-budget",
        "20",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "decode tokens/s against experts on hostsim:0" in out and "(one device)" in out
    assert "chosen     " in out and " same " in out and "DIFFERS" not in out


def test_a_tuning_on_an_engine_can_be_cancelled_and_leaves_the_placement_as_it_was():
    from engine.model import Engine

    with Engine(runtimes=("cpu", "hostsim")) as eng:
        target, draft = eng.load(TARGET), eng.load(DRAFT)
        target.set_placement("0=hostsim:0")
        before = target.placement
        seen = []
        holder = {}

        def progress(p):
            seen.append(p.phase)
            if p.phase == "measuring" and p.done >= 3:
                holder["tuning"].cancel()

        settings = tune.TuneSettings(qs=(1, 2), time_budget=60, calibrate=False)
        tuning = holder["tuning"] = tune.Tuning(target, draft, settings, on_progress=progress)
        result = tuning.run()
        assert result.search.cancelled and result.search.stopped == "cancelled"
        assert 3 <= len(result.search.points) <= 4 and "reference" in seen
        assert target.placement == before
        # cancelled from another thread while it measures
        tuning = tune.Tuning(target, draft, settings)
        timer = threading.Timer(0.5, tuning.cancel)
        timer.start()
        result = tuning.run()
        timer.join()
        assert result.search.cancelled and target.placement == before


def test_a_kl_limit_below_zero_is_refused_by_the_quality_rule_too():
    from engine.runs.quality import KLLimit

    with pytest.raises(ArgumentError, match="--max-kl -1: expected a number of nats >= 0"):
        KLLimit(-1, lambda *a: None)


def test_owner_local_points_under_max_kl_are_excluded_exactly_where_their_measured_kl_is_over_it(tmp_path, capsys):
    out = tmp_path / "tuned.yaml"
    args = ["tune", "--model", str(TARGET), "--no-draft", "--runtime", "hostsim", "--no-calibrate", "--time-budget",
            "8", "--modes", "reference,owner_local", "--max-kl", "0", "--json", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["modes"] == ["reference", "owner_local"] and doc["max_kl"] == 0
    points = doc["points"]
    assert {p["mode"] for p in points} == {"reference", "owner_local"}
    for p in points:
        if p["mode"] == "reference":  # costs nothing, never measured; its hashes one device's
            assert p["quality"] is None and p["excluded"] is None and p["same_as_reference"]
        else:
            kl = p["quality"]["mean_kl"]
            assert kl >= 0 and p["quality"]["positions"] > 0
            assert (p["excluded"] is not None) == (kl > 0), p
            if p["excluded"]:
                assert "--max-kl 0" in p["excluded"]
    excluded = {(p["placement"], p["mode"]) for p in points if p["excluded"]}
    assert {(p["placement"], p["mode"]) for p in doc["excluded"]} == excluded
    assert not excluded & {(p["placement"], p["mode"]) for p in doc["front"]}
    chosen = doc["chosen"]
    assert chosen["excluded"] is None and not chosen["flagged"]
    profile = load(out)
    assert profile.run.mode == chosen["mode"] and profile.expectations.output_sha256 == chosen["output_sha256"]


def test_the_profile_of_an_owner_local_point_is_written_in_that_mode(tmp_path):
    from engine.profiles.profile import ModelRef, fingerprint

    config = read_config(TARGET)
    placement = Placement.parse("0=hostsim:0", config)
    c = tune.Candidate(placement, None, "test", {}, mode="owner_local")
    hashes = HASHES * 2  # one per demo prompt
    p = tune.Point(c, [tune.Measurement(8, 1, [10.0], hashes, reference_sha256=HASHES)])
    ref = ModelRef(path=str(TARGET), fingerprint=fingerprint(TARGET))
    profile = tune.profile_for(p, tmp_path / "p.yaml", ref, None, PRIMARY, None)
    assert profile.run.mode == "owner_local" and profile.run.resolved()["mode"] == "owner_local"
