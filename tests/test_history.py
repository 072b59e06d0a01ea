"""engine.runs.history: run records, which runs must give the same outputs, the reference of each, the history kept
in the user's data folder, and what a profile may expect (the rounding rules regress and the window share)."""

import json
import math
import os
import re

import pytest

from engine.core.errors import ArgumentError
from engine.core.files import new_file_mode
from engine.profiles import expectations as X
from engine.runs import history as H

FP = "sha256:" + "ab" * 32


def record(output="h1", placement="0-2=cpu:0", mode="reference", precision="f32", prompts=("a", "b"), **kw):
    settings = H.RunSettings(list(prompts), tokens=8, repeats=2, mode=mode, precision=precision)
    values = dict(index=0, started="2026-12-02T19:04:02", target="target", draft="draft", placement=placement,
                  mode=mode, precision=precision, q=2, tokens=8, repeats=2, prompts=len(prompts),
                  decode_tokens_per_second=100.0, prefill_tokens_per_second=math.nan, accept_rate=0.75,
                  output_hash=output, reference_hash="", cancelled=False, seconds=1.5, settings=settings,
                  target_path="/models/target", draft_path="/models/draft", output_sha256=["x", "y"] if output else [],
                  primary="cpu:0", fingerprint=FP)  # fmt: skip
    values.update(kw)
    return H.RunRecord(**values)


def test_a_record_round_trips_through_json_with_unknown_numbers_as_null():
    r = record(
        predicted_tokens_per_second=123.4,
        decode_tokens_per_second_min=90.0,
        device_busy_share={"cpu:0": 0.75, "cuda:0": 1.25},
    )
    data = json.loads(json.dumps(r.to_dict()))
    assert data["prefill_tokens_per_second"] is None and data["decode_tokens_per_second_max"] is None
    back = H.RunRecord.from_dict(data)
    assert math.isnan(back.prefill_tokens_per_second) and back.decode_tokens_per_second_min == 90.0
    back.prefill_tokens_per_second = r.prefill_tokens_per_second = 0.0  # NaN is not equal to itself
    back.decode_tokens_per_second_max = r.decode_tokens_per_second_max = 0.0
    back.prefill_tokens_per_second_min = r.prefill_tokens_per_second_min = 0.0
    back.prefill_tokens_per_second_max = r.prefill_tokens_per_second_max = 0.0
    assert back == r and isinstance(back.settings, H.RunSettings)
    assert H.RunRecord.from_dict({**data, "from_a_newer_version": 1}).index == r.index  # ignored


def test_a_record_keeps_its_outputs_compactly_for_a_later_diagnosis():
    from engine.runs.diverge import Trail

    trail = Trail([5, 9, 2], [0.5, 0.01, 2.0])
    r = record(outputs=[trail.compact()], kernels="avx2", top_k=2, diagnosis={"summary": "parts at token 1"})
    back = H.RunRecord.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back.trails() == [trail.stored()] and back.kernels == "avx2" and back.top_k == 2
    assert back.as_outputs().settings == {"placement": "0-2=cpu:0", "mode": "reference", "precision": "f32",
                                          "top_k": 2, "q": 2, "device": "cpu:0", "kernels": "avx2"}  # fmt: skip
    assert back.diagnosis == {"summary": "parts at token 1"}
    other = record(output="h2", outputs=[Trail([5, 3, 2], [0.5, 0.2, 2.0]).compact()], kernels="avx2", top_k=2)
    d = H.diagnose_change(back, other)
    assert (d.first.prompt, d.first.index, d.first.near_tie) == (0, 1, True) and d.differences == []
    assert H.diagnose_change(back, record(outputs=r.outputs)) is None  # the same output hash


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.pop("output_hash"), "no 'output_hash'"),
        (lambda d: d.update(index="1"), "'index' is '1', of the wrong type"),
        (lambda d: d.update(index=True), "'index' is True, of the wrong type"),
        (lambda d: d.update(seconds="long"), "'seconds' is 'long', expected a number"),
        (lambda d: d.update(settings={"tokens": 3}), "'settings' is not the run panel's settings"),
        (lambda d: d.update(output_sha256="x"), "'output_sha256' is not a list of hashes"),
        (lambda d: d.update(device_busy_share={"cpu:0": "busy"}), "'device_busy_share' is not a map of device"),
        (lambda d: d.update(device_busy_share=[0.5]), "'device_busy_share' is not a map of device"),
        (lambda d: d.update(outputs={"ids": ""}), "'outputs' is dict, expected a list (one entry per prompt)"),
        (lambda d: d.update(outputs=[{"ids": "AQAAAA==", "gaps": "AAAAAA=="}]), "outputs[0].gaps: 2 gaps, expected 1"),
        (lambda d: d.update(outputs=[{"ids": 7, "gaps": ""}]), "outputs[0].ids: expected base64 text"),
        (lambda d: d.update(diagnosis="changed"), "'diagnosis' is str, expected an object"),
    ],
)
def test_a_damaged_record_is_refused_naming_the_field(change, message):
    data = record().to_dict()
    change(data)
    with pytest.raises(ArgumentError, match=re.escape(message)):
        H.RunRecord.from_dict(data)
    with pytest.raises(ArgumentError, match="expected an object, got list"):
        H.RunRecord.from_dict([1])


def test_the_outputs_key_holds_what_makes_outputs_legitimately_differ():
    key = H.outputs_key
    base = key("t", ["a"], 8, "f32", "reference", "0=cpu:0; 2=cuda:0")
    assert base == ("t", ("a",), 8, "f32")  # the reference mode in f32: any placement, any draft, any q
    assert key("t", ["a"], 8, "f32", "reference", "0-2=cuda:0") == base
    for other in (key("u", ["a"], 8, "f32", "reference"), key("t", ["b"], 8, "f32", "reference"),
                  key("t", ["a"], 9, "f32", "reference"), key("t", ["a"], 8, "q8", "reference")):  # fmt: skip
        assert other != base
    # owner_local sums in another association: its mode and its placement enter
    owner = key("t", ["a"], 8, "f32", "owner_local", "0=cpu:0; 2=cpu:1")
    assert owner == ("t", ("a",), 8, "f32", "owner_local", "0=cpu:0; 2=cpu:1")
    assert owner != key("t", ["a"], 8, "f32", "owner_local", "0-2=cpu:0")
    # q8 is placement-independent on CPU and GPU devices alike (the GPU modules compute the CPU's q8 bits)
    assert key("t", ["a"], 8, "q8", "reference", "0=cpu:0; 2=hostsim:0") == ("t", ("a",), 8, "q8")
    assert key("t", ["a"], 8, "q8", "reference", "0=cpu:0; 2=cuda:0") == ("t", ("a",), 8, "q8")
    assert key("t", ["a"], 8, "q8", "reference", "0-2=cpu:0", ["cuda:0"]) == ("t", ("a",), 8, "q8")  # a GPU primary
    assert key("t", [[1, 2]], 8, "f32", "reference") == ("t", ((1, 2),), 8, "f32")  # token-id prompts


def test_the_first_complete_run_of_a_key_is_its_reference():
    h = H.History()
    first = h.add(record(output=""))  # incomplete: no reference
    ref = h.add(record(output="h1"))
    same = h.add(record(output="h1", placement="0-2=hostsim:0"))  # another placement, same outputs
    changed = h.add(record(output="h2"))
    q8 = h.add(record(output="h3", precision="q8"))
    owner = h.add(record(output="h4", mode="owner_local"))
    assert [r.index for r in h.records] == [1, 2, 3, 4, 5, 6]
    assert first.stable is None and not first.is_reference
    assert ref.is_reference and same.stable is True and changed.stable is False
    assert q8.is_reference and q8.reference_hash == "h3" and owner.is_reference  # compared among themselves
    assert h.reference(H.record_key(changed)) is ref


def test_the_history_is_kept_as_json_lines_with_the_users_umask_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    path = H.history_file(FP)
    assert path == tmp_path / "data" / "expertbench" / "history" / ("sha256-" + "ab" * 32 + ".jsonl")
    h = H.History(path)
    h.add(record(output="h1"))
    h.add(record(output="h2"))
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["output_hash"] == "h2"
    assert path.stat().st_mode & 0o777 == new_file_mode()
    back = H.History.load(path)
    assert not back.problems and [r.output_hash for r in back.records] == ["h1", "h2"]
    assert back.records[0].is_reference and back.records[1].stable is False and back.next_index == 3
    assert back.add(record(output="h1")).stable is True  # compared with the reference of an earlier session
    back.clear()
    assert not path.exists() and not back.records and H.History.load(path).records == []


def test_a_damaged_history_file_is_reported_and_skipped(tmp_path):
    path = tmp_path / "runs.jsonl"
    good = json.dumps(record(output="h1").to_dict())
    path.write_text("\n".join([good, "{not json", json.dumps({"index": 2}), "[1, 2]", good[: len(good) // 2], good]))
    h = H.History.load(path)
    assert [r.index for r in h.records] == [0, 0]  # the two good lines, as written
    assert len(h.problems) == 4
    assert h.problems[0].startswith(f"{path}:2: not a run record: ")
    assert h.problems[1] == f"{path}:3: not a run record: no 'started'"
    assert h.problems[2] == f"{path}:4: not a run record: expected an object, got list"
    (tmp_path / "folder.jsonl").mkdir()
    unreadable = H.History.load(tmp_path / "folder.jsonl")
    assert unreadable.records == [] and unreadable.problems[0].startswith(f"{tmp_path / 'folder.jsonl'}: cannot read")


def test_a_history_that_cannot_be_written_keeps_the_run_and_names_the_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    h = H.History(blocker / "history" / "runs.jsonl")
    with pytest.raises(ArgumentError, match=f"cannot keep the run in '{blocker}/history/runs.jsonl'"):
        h.add(record())
    assert len(h.records) == 1 and h.records[0].is_reference


def test_the_data_folder_follows_xdg_data_home_when_absolute(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert H.data_folder() == tmp_path / ".local" / "share" / "expertbench"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert H.data_folder() == tmp_path / ".local" / "share" / "expertbench"
    for bad in ("", "sha256:xyz", "md5:" + "0" * 64, None):
        with pytest.raises(ArgumentError, match="expected 'sha256:' and 64 hex digits"):
            H.history_file(bad)


def test_expectations_are_rounded_in_one_place():
    assert X.min_accept_rate(0.75149) == 0.751 and X.min_accept_rate(0.7) == 0.7
    assert X.min_speed_ratio(1.0, 0.25) == 0.75 and X.min_speed_ratio(0.011, 0.5) == 0.01
    assert X.min_speed_ratio(1.2345, 0.1) == 1.11


def test_a_profile_expects_the_hashes_of_the_latest_run_with_its_outputs_key():
    runs = [record(output="h1", output_sha256=["p1", "p2"]), record(output="h9", mode="owner_local",
                                                                   output_sha256=["o1", "o2"])]  # fmt: skip
    s = H.RunSettings(["a", "b"], tokens=8, mode="reference")
    assert H.matching_run(runs, "/models/target", s, "0-2=hostsim:0", "cpu:0") is runs[0]
    assert H.matching_run(runs, "/models/other", s, "0-2=cpu:0", "cpu:0") is None
    owner = H.RunSettings(["a", "b"], tokens=8, mode="owner_local")
    assert H.matching_run(runs, "/models/target", owner, "0-2=cpu:0", "cpu:0") is runs[1]
    assert H.matching_run(runs, "/models/target", owner, "0-2=hostsim:0", "cpu:0") is None  # another placement
    assert os.path.basename(H.history_file(FP)).endswith(".jsonl")


def test_a_profile_saved_from_the_history_keeps_the_runs_outputs_for_a_later_diagnosis(tmp_path):
    from engine.profiles.profile import ModelRef, Profile
    from engine.profiles.profile import load as load_profile
    from engine.runs.diverge import Trail
    from engine.runs.run import output_sha256

    trails = [Trail([1, 2, 3], [0.5, 0.01, 2.0]), Trail([4, 5, 6], [1.0, 1.0, 1.0])]
    hashes = [output_sha256(t.ids) for t in trails]
    run = record(output=H.combined_hash(hashes), output_sha256=hashes, outputs=[t.compact() for t in trails],
                 kernels="avx2", tokens=3)  # fmt: skip
    run.settings.tokens = 3
    profile = Profile(model=ModelRef(path="/models/target"), path=tmp_path / "p.yaml")
    profile.run.prompts, profile.run.tokens = ["a", "b"], 3
    e = X.expectations_for(profile, None, [run], "/models/target", None, run.settings, "0-2=cpu:0", "cpu:0")
    assert e.output_sha256 == hashes and e.outputs == [t.stored() for t in trails]
    assert e.outputs_settings["kernels"] == "avx2" and e.outputs_settings["placement"] == "0-2=cpu:0"
    profile.expectations = e
    profile.save()
    assert load_profile(tmp_path / "p.yaml").expectations.outputs == e.outputs
    override = record(output="h2", output_sha256=hashes, top_k=1)  # another experts-per-token count: never expected
    assert H.matching_run([override], "/models/target", run.settings, "0-2=cpu:0", "cpu:0") is None
