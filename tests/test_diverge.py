"""Hash-divergence diagnosis: the first differing token, the top-2 logits there, near ties, what differs."""

import numpy as np
import pytest
from fixture_paths import FIXTURES
from quantized_fixtures import q8_0_gguf

from engine.core.errors import ArgumentError
from engine.model import Engine
from engine.runs.diverge import (
    NEAR_TIE_GAP,
    Outputs,
    Trail,
    diagnose,
    first_difference,
    read_compact,
    replay_choice,
    replay_missing,
    top2,
)
from engine.runs.run import DecodeRun

PROMPTS = [[1, 2, 3, 4], [5, 6, 7]]


def _rows(*choices) -> np.ndarray:
    """Logits rows of a 6-token vocabulary: each (first, its logit, second, its logit), the rest far below."""
    rows = np.full((len(choices), 6), -5.0, dtype=np.float32)
    for row, (a, la, b, lb) in zip(rows, choices, strict=True):
        row[a], row[b] = la, lb
    return rows


def test_top2_takes_the_greedy_id_and_the_runner_up_with_ties_to_the_lower_id():
    first, second, l1, l2 = top2(np.array([[0.0, 3.0, 1.0, 3.0], [2.0, -1.0, 1.5, 0.0]], dtype=np.float32))
    assert first.tolist() == [1, 0] and second.tolist() == [3, 2]  # a tie: np.argmax's lower id, then the other
    assert l1.tolist() == [3.0, 2.0] and l2.tolist() == [3.0, 1.5]


def test_a_constructed_pair_parts_at_its_known_index_with_a_known_near_tie():
    """Two runs that agree on tokens 0-2 and part at 3, where the reference's choice was a near tie (gap 1/64) and
    the other's not: the index, both top-2 logits and the gaps are reported, and the settings that differ."""
    ref = Trail.of_rows(
        _rows((1, 4.0, 2, 1.0), (3, 2.0, 0, 1.0), (2, 3.0, 4, 2.5), (4, 1.015625, 5, 1.0), (0, 2, 1, 1))
    )
    fast = Trail.of_rows(_rows((1, 4.0, 2, 1.0), (3, 2.0, 0, 1.0), (2, 3.0, 4, 2.5), (5, 1.2, 4, 0.9), (0, 2, 1, 1)))
    same = Trail.of_rows(_rows((0, 1.0, 1, 0.0)))
    a = Outputs("reference", [same, ref], {"mode": "reference", "precision": "f32", "placement": "0-7=cpu:0"})
    b = Outputs("q8", [same, fast], {"mode": "reference", "precision": "q8", "placement": "0-7=cpu:0"})
    d = diagnose(a, b)
    assert [v.prompt for v in d.divergences] == [1]  # prompt 0 agrees: not listed
    first = d.first
    assert first.index == 3 and first.near_tie is True
    assert (first.a.token, first.a.runner_up, first.a.logit, first.a.runner_up_logit) == (4, 5, 1.015625, 1.0)
    assert first.a.gap == 0.015625 and first.a.near_tie
    assert (first.b.token, first.b.runner_up) == (5, 4) and first.b.gap == pytest.approx(0.3, abs=1e-6)
    assert d.differences == [("precision", "f32", "q8")] and d.expected
    text = "\n".join(d.lines())
    assert "prompt 1: first differing token 3 (a near tie)" in text
    assert "reference: 4 (logit 1.0156; runner-up 5 at 1.0000; gap 0.01562)" in text
    assert f"near tie: a top-2 logit gap under {NEAR_TIE_GAP:g}" in text and "precision: reference f32, q8 q8" in text
    data = d.to_dict()
    assert data["first"]["index"] == 3 and data["first"]["a"]["runner_up"] == 5 and data["near_tie_gap"] == NEAR_TIE_GAP
    assert d.summary().startswith("parts from reference at prompt 1, token 3: q8 chose 5, reference 4; a near tie")


def test_a_reference_mode_change_of_placement_or_q_alone_is_named_a_bug():
    a_trail = Trail.of_rows(_rows((1, 4.0, 2, 1.0), (3, 3.0, 0, 1.0)))
    b_trail = Trail.of_rows(_rows((1, 4.0, 2, 1.0), (0, 3.0, 3, 1.0)))
    settings = {"mode": "reference", "precision": "f32", "placement": "0-7=cpu:0", "q": 2}
    d = diagnose(Outputs("a", [a_trail], settings), Outputs("b", [b_trail], {**settings, "placement": "0-3=cpu:1",
                                                                            "q": 3}))  # fmt: skip
    assert d.first.index == 1 and d.first.near_tie is False and not d.expected
    assert "not a near tie" in d.verdict() and "a bug to look into" in d.verdict()
    assert [n for n, _a, _b in d.differences] == ["placement", "q"]
    # the same placement change in owner_local mode may change the sums, so the output
    local = {**settings, "mode": "owner_local"}
    assert diagnose(Outputs("a", [a_trail], local), Outputs("b", [b_trail], {**local, "placement": "x"})).expected
    # nothing differs at all: a nondeterminism
    assert (
        "settings are the same"
        in diagnose(Outputs("a", [a_trail], settings), Outputs("b", [b_trail], settings)).verdict()
    )


def test_first_difference_and_a_run_that_stops_early():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    short = Trail([1, 2], [1.0, 1.0])
    d = diagnose(Outputs("a", [short]), Outputs("b", [Trail([1, 2, 3], [1.0, 1.0, 1.0])]))
    assert d.first.index is None and "then one run stops" in d.first.note
    d = diagnose(Outputs("a", []), Outputs("b", [short]))
    assert d.first.note == "a kept no ids for this prompt" and d.first.near_tie is None


def test_the_compact_form_keeps_ids_and_float16_gaps():
    t = Trail.of_rows(_rows((1, 4.0, 2, 1.0), (3, 2.0005, 0, 2.0)))
    data = t.compact()
    assert set(data) == {"ids", "gaps"} and len(data["ids"]) == 12 and len(data["gaps"]) == 8  # 4 + 2 bytes a token
    back = read_compact(data, "x", tokens=2)
    assert back == t.stored() and back.ids.tolist() == [1, 3] and back.logits is None
    assert back.gaps[0] == 3.0 and back.gaps[1] == pytest.approx(0.0005, rel=1e-3)


@pytest.mark.parametrize(
    "data, message",
    [
        ([], "x: expected a mapping with 'ids' and 'gaps', got list"),
        ({"ids": "AQAAAA=="}, "x: 'gaps' is missing"),
        ({"ids": [1, 2], "gaps": "AAA="}, "x.ids: expected base64 text of int32 token ids, got list"),
        ({"ids": "AQAAAA==", "gaps": 5}, "x.gaps: expected base64 text of float16 logit gaps, got int"),
        ({"ids": "not base64!", "gaps": "AAA="}, "x.ids: not base64 text"),
        ({"ids": "AQAA", "gaps": "AAA="}, "x.ids: 3 bytes, not a whole number of int32 token ids (4 bytes each)"),
        ({"ids": "AQAAAAIAAAA=", "gaps": "AAA="}, "x.gaps: 1 gaps, expected 2 (one per id in x.ids)"),
        ({"ids": "AQAAAA==", "gaps": "AAA="}, "x.ids: 1 ids, expected 2 (one per generated token)"),
        ({"ids": "AQAAAAIAAAA=", "gaps": "AAAA/A=="}, "x.gaps: -inf is not a gap"),
        ({"ids": "AQAAAAIAAAA=", "gaps": "AAAAAA==", "why": 1}, "x: unknown key 'why'"),
    ],
)
def test_a_damaged_compact_record_names_the_field_and_what_was_expected(data, message):
    with pytest.raises(ArgumentError) as err:
        read_compact(data, "x", tokens=2)
    assert message in str(err.value)


@pytest.fixture
def quantized(tmp_path):
    return q8_0_gguf(FIXTURES / "qwen3moe-f32", tmp_path / "target-q8_0.gguf")


def test_q8_against_f32_parts_where_the_runs_trails_say_with_both_top2_logits(quantized):
    """A forced divergence: the same quantized model in f32 and in q8. The diagnosis's index is the first differing id,
    its logits are the runs' own at that token, and replaying the f32 ids gives the f32 run's top-2 there."""
    with Engine() as eng:
        target = eng.load(quantized)
        f32 = DecodeRun(target, prompts=PROMPTS, tokens_per_prompt=12).run()
        q8 = DecodeRun(target, prompts=PROMPTS, tokens_per_prompt=12, precision="q8").run()
        assert f32.output_sha256 != q8.output_sha256
        a, b = Outputs.of_result(f32, "f32"), Outputs.of_result(q8, "q8")
        d = diagnose(a, b)
        assert d.differences == [("precision", "f32", "q8")] and d.expected
        for div in d.divergences:
            ids_a, ids_b = f32.prompts[div.prompt].generated_ids, q8.prompts[div.prompt].generated_ids
            i = div.index
            assert ids_a[:i] == ids_b[:i] and ids_a[i] != ids_b[i]
            assert (div.a.token, div.b.token) == (ids_a[i], ids_b[i])
            ta = f32.trails[0][div.prompt]
            assert (div.a.logit, div.a.runner_up_logit) == tuple(ta.logits[i].tolist())
            assert div.near_tie == (min(div.a.gap, div.b.gap) < NEAR_TIE_GAP)
            replayed = replay_choice(target, PROMPTS[div.prompt], ids_a, i)
            assert (replayed.token, replayed.runner_up) == (div.a.token, div.a.runner_up)
            assert replayed.logit == pytest.approx(div.a.logit, abs=1e-4)


def test_the_reference_side_kept_compactly_is_replayed_only_where_its_settings_are_the_models(quantized):
    """A reference that kept only ids and gaps gets its top-2 logits re-computed by replaying its ids, when it ran with
    the settings the model has now (and the diagnosis says so); a kept id the replay does not choose stays, the
    replay's choice in the note; in another precision nothing is replayed."""
    with Engine() as eng:
        target = eng.load(quantized)
        run = DecodeRun(target, prompts=PROMPTS, tokens_per_prompt=12, precision="q8").run()
        kept = [t.stored() for t in run.trails[0]]
        b = Outputs.of_result(run, "this run")
        b.trails = [Trail(t.ids.copy(), t.gaps, t.second, t.logits) for t in b.trails]
        b.trails[1].ids[5] = (b.trails[1].ids[5] + 1) % 64  # this run chose otherwise at token 5 of prompt 1
        a = Outputs("reference run 1", kept, dict(b.settings))
        d = diagnose(a, b)
        assert [(v.prompt, v.index) for v in d.divergences] == [(1, 5)] and d.first.a.logit is None
        replay_missing(d, a, b, target, PROMPTS)
        logits = run.trails[0][1].logits[5]
        assert (d.first.a.logit, d.first.a.runner_up_logit) == pytest.approx(tuple(logits.tolist()), abs=1e-4)
        assert d.first.a.token == kept[1].ids[5] and d.first.note == ""
        assert d.rerun.startswith("reference run 1's top-2 logits re-computed here")

        tampered = [Trail(t.ids.copy(), t.gaps.copy()) for t in kept]
        tampered[1].ids[5] = (tampered[1].ids[5] + 1) % 64  # a reference that chose what this machine does not
        a = Outputs("reference run 1", tampered, dict(b.settings))
        d = diagnose(a, Outputs.of_result(run, "this run"))
        replay_missing(d, a, b, target, PROMPTS)
        assert d.first.a.token == tampered[1].ids[5] and d.first.a.logit is None
        assert d.first.note.startswith(f"replayed here, reference run 1's ids lead to {kept[1].ids[5]} (logit ")
        other = Outputs("f32 run", tampered, {**b.settings, "precision": "f32"})
        d = diagnose(other, Outputs.of_result(run, "this run"))
        replay_missing(d, other, b, target, PROMPTS)
        assert d.first.a.logit is None and d.rerun is None


def test_repeats_that_disagree_are_diagnosed_in_the_run_result(quantized):
    with Engine() as eng:
        target = eng.load(quantized)
        res = DecodeRun(target, prompts=PROMPTS, tokens_per_prompt=8, repeats=2).run()
        assert res.repeats_agree and res.repeats_diagnosis() is None and res.to_dict()["repeats_diagnosis"] is None
        res.trails[1][0].ids[4] += 1  # as a nondeterministic repeat would
        res.repeat_results[1].output_sha256[0] = "0" * 64
        d = res.repeats_diagnosis()
        assert (d.a, d.b, d.first.prompt, d.first.index) == ("repeat 0", "repeat 1", 0, 4)
        assert "settings are the same" in d.verdict()
        assert res.to_dict()["repeats_diagnosis"]["first"]["index"] == 4
