"""expertbench regress: exit codes, recording, reports. Speeds are injected where a check depends on them."""

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from fixture_paths import FIXTURES

from engine.cli import main as cli_main
from engine.profiles import profile as P
from engine.profiles import regress

ROOT = Path(__file__).resolve().parent.parent
TARGET, DRAFT = FIXTURES / "qwen3moe-f32", FIXTURES / "qwen3-f32"
RUN = "run: {prompts: [[1, 2, 3, 4], [5, 6, 7]], tokens: 6, repeats: 2, q: 2}\n"
BASE = f"expertbench_profile: 1\nmodel: {{path: {TARGET}}}\ndraft: {{path: {DRAFT}}}\n" + RUN
SPLIT = (f"expertbench_profile: 1\nmodel: {{path: {TARGET}}}\ndraft: {{path: {DRAFT}}}\n"
         "devices: {cpu: {devices: 2, threads: 1}}\n"
         "placement:\n  layers: {2: cpu:1}\n  experts: {0: {4-7: cpu:1}}\n" + RUN +
         "expectations:\n  speed: {baseline: base.yaml}\n")  # fmt: skip


@pytest.fixture
def speeds(monkeypatch):
    """Decode tokens/s per profile name, replacing the measured ones (the decoding itself still runs)."""
    table: dict[str, float] = {}
    real = regress.measure_profile

    def measure(profile, **options):
        m = real(profile, **options)
        if profile.name in table:
            m.decode_tokens_per_second = table[profile.name]
        return m

    monkeypatch.setattr(regress, "measure_profile", measure)
    return table


@pytest.fixture
def recorded(tmp_path, speeds):
    """base.yaml and split.yaml in tmp_path, recorded with split at 0.8 x base (min_ratio 0.8 * 0.75 = 0.6)."""
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "split.yaml").write_text(SPLIT)
    speeds.update({"base": 1000.0, "split": 800.0})
    assert cli_main(["regress", "--record", str(tmp_path / "split.yaml"), str(tmp_path / "base.yaml")]) == 0
    return tmp_path


def test_record_writes_expectations_then_replay_passes(recorded, speeds, capsys):
    split = P.load(recorded / "split.yaml")
    e = split.expectations
    assert len(e.output_sha256) == 2 and e.min_speed_ratio == 0.6 and e.baseline == "base.yaml"
    assert 0 <= e.min_accept_rate <= 1
    assert split.model.fingerprint == P.fingerprint(TARGET) and split.draft.fingerprint == P.fingerprint(DRAFT)
    assert split.routing_stats().hits.sum() > 0
    assert P.load(recorded / "base.yaml").expectations.output_sha256 == e.output_sha256  # placement-invariant
    capsys.readouterr()
    # 700 / 1000 = 0.7 >= 0.6
    speeds.update({"base": 1000.0, "split": 700.0})
    report, junit = recorded / "r.json", recorded / "r.xml"
    code = cli_main(["regress", str(recorded / "split.yaml"), "--report-json", str(report), "--junit", str(junit)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "split" in out and "0.70 >= 0.60 (base)" in out and "2 held, 2/2 as recorded" in out
    data = json.loads(report.read_text())
    assert data["exit_code"] == 0
    by_name = {p["name"]: p for p in data["profiles"]}
    assert by_name["base"]["listed"] is False and by_name["split"]["speed_ratio"] == pytest.approx(0.7)
    assert {c["name"]: c["status"] for c in by_name["split"]["checks"]} == {
        "repeats agree": "pass", "output hash": "pass", "acceptance": "pass", "speed": "pass"}  # fmt: skip
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "4" and suite.get("failures") == "0" and suite.get("errors") == "0"


def test_weights_setting_reaches_the_engine_and_keeps_the_hashes(recorded, speeds, monkeypatch, capsys):
    """run.weights: the profile's files held as it says; the recorded hashes hold for copied and mapped weights."""
    from engine.model import Engine

    asked, real_load = [], Engine.load

    def load(self, model, device="cpu:0", weights="auto", **options):
        asked.append(weights)
        return real_load(self, model, device, weights, **options)

    monkeypatch.setattr(Engine, "load", load)
    for weights in ("copy", "map"):
        profile = P.load(recorded / "split.yaml")
        profile.run.weights = weights
        profile.save()
        asked.clear()
        assert cli_main(["regress", str(recorded / "split.yaml")]) == 0, capsys.readouterr().out
        # split's target and draft as it says; its baseline (base.yaml, no weights key) with the default
        assert sorted(asked) == sorted([weights, weights, "auto", "auto"]), asked
        assert f"weights: {weights}" in (recorded / "split.yaml").read_text()


def test_no_check_weights_reaches_every_load(recorded, speeds, monkeypatch, capsys):
    """`regress --no-check-weights`: every model of the profiles (targets, drafts, baselines) loaded unchecked; by
    default checked."""
    from engine.model import Engine

    asked, real_load = [], Engine.load

    def load(self, model, device="cpu:0", weights="auto", check_weights=True, **options):
        asked.append(check_weights)
        return real_load(self, model, device, weights, check_weights=check_weights, **options)

    monkeypatch.setattr(Engine, "load", load)
    assert cli_main(["regress", "--no-check-weights", str(recorded / "split.yaml")]) == 0, capsys.readouterr().out
    assert asked and not any(asked)
    asked.clear()
    assert cli_main(["regress", str(recorded / "split.yaml")]) == 0, capsys.readouterr().out
    assert asked and all(asked)


def _tamper(path: Path, prompt: int, index: int, gap: float) -> tuple[str, str, int, int]:
    """Make a recorded profile say its run chose another token at `index` of `prompt`, with this top-2 gap (ids and
    hash changed together, as a recording elsewhere would give); returns (good hash, new hash, good id, new id)."""
    from engine.runs.diverge import Trail
    from engine.runs.run import output_sha256

    profile = P.load(path)
    e = profile.expectations
    ids, gaps = e.outputs[prompt].ids.copy(), e.outputs[prompt].gaps.copy()
    good_id, ids[index], gaps[index] = int(ids[index]), (int(ids[index]) + 1) % 64, gap
    e.outputs[prompt] = Trail(ids, gaps).stored()
    good, e.output_sha256[prompt] = e.output_sha256[prompt], output_sha256(ids)
    profile.save()
    return good, e.output_sha256[prompt], good_id, int(ids[index])


def test_hash_mismatch_is_a_regression_diagnosed_in_the_table_and_both_reports(recorded, capsys):
    """A recording that chose another token at token 3 of prompt 1, by a near tie: the replay fails there, and the
    table, the JSON and the JUnit report name the index, both choices (the replay's top-2 logits; the recorded gap)
    and that nothing but the recording differs."""
    good, bad, good_id, bad_id = _tamper(recorded / "split.yaml", 1, 3, 0.01)
    junit, report = recorded / "r.xml", recorded / "r.json"
    assert cli_main(["regress", str(recorded / "split.yaml"), "--junit", str(junit), "--report-json", str(report)]) == 1
    out = capsys.readouterr().out
    assert "1/2 as recorded" in out and f"output hash: prompt 1 gave {good[:16]}, recorded {bad[:16]}" in out
    assert (
        f"parts from the recorded run at prompt 1, token 3: the replay chose {good_id}, the recorded run {bad_id}"
        in out
    )
    assert "split:   prompt 1: first differing token 3 (a near tie)" in out
    assert f"split:     the recorded run: {bad_id} (gap 0.01 to the runner-up; logits not kept)" in out
    by_name = {p["name"]: p for p in json.loads(report.read_text())["profiles"]}
    diagnosis, first = by_name["split"]["diagnosis"], by_name["split"]["diagnosis"]["first"]
    assert by_name["base"]["diagnosis"] is None
    assert (first["prompt"], first["index"], first["near_tie"]) == (1, 3, True)
    assert (
        first["a"]["token"] == bad_id and first["a"]["logit"] is None and first["a"]["gap"] == pytest.approx(0.01, 1e-3)
    )
    assert first["b"]["token"] == good_id and first["b"]["logit"] - first["b"]["runner_up_logit"] == pytest.approx(
        first["b"]["gap"]
    )
    assert diagnosis["differences"] == [] and diagnosis["near_tie_gap"] == 0.05
    failure = ET.parse(junit).getroot().find("testsuite/testcase[@name='output hash']/failure")
    assert failure is not None and "prompt 1 gave" in failure.get("message")
    assert (
        "prompt 1: first differing token 3 (a near tie)" in failure.text
        and "near tie: a top-2 logit gap under 0.05" in (failure.text)
    )


def test_a_recorded_hash_edited_without_its_ids_is_bad_input(recorded, capsys):
    profile = P.load(recorded / "split.yaml")
    profile.expectations.output_sha256[1] = "0" * 64
    profile.save()
    assert cli_main(["regress", str(recorded / "split.yaml")]) == 2
    assert "expectations.outputs.prompts[1].ids: they do not hash to expectations.output_sha256[1]" in (
        capsys.readouterr().err
    )


def test_speed_regression_against_the_baseline_of_the_same_invocation(recorded, speeds, capsys):
    speeds.update({"base": 1000.0, "split": 500.0})  # 0.5 < 0.6
    assert cli_main(["regress", str(recorded / "split.yaml"), str(recorded / "base.yaml")]) == 1
    out = capsys.readouterr().out
    assert "split: speed: 500.0 tokens/s, 0.500 x base (minimum 0.6)" in out
    # the same speed is fine when the baseline measured slower in this invocation: a ratio, never a time
    speeds.update({"base": 700.0, "split": 500.0})
    assert cli_main(["regress", str(recorded / "split.yaml")]) == 0


def test_acceptance_below_the_minimum_is_a_regression(recorded, capsys):
    profile = P.load(recorded / "split.yaml")
    profile.expectations.min_accept_rate = 1.0  # this random fixture draft agrees far less often
    profile.save()
    assert cli_main(["regress", str(recorded / "split.yaml")]) == 1
    assert "split: acceptance:" in capsys.readouterr().out


def test_changing_hashes_between_repeats_fail_and_are_never_recorded(recorded, monkeypatch, capsys):
    real = regress.measure_profile

    def flaky(profile, **options):
        m = real(profile, **options)
        m.repeat_hashes[1] = ["f" * 64] * len(m.repeat_hashes[1])
        return m

    monkeypatch.setattr(regress, "measure_profile", flaky)
    assert cli_main(["regress", str(recorded / "split.yaml")]) == 1
    assert "CHANGED between repeats" in capsys.readouterr().out

    def flaky_ids(profile, **options):  # a repeat that parts at token 2 of prompt 0: diagnosed
        from engine.runs.diverge import Outputs, diagnose

        m = real(profile, **options)
        m.repeat_hashes[1] = ["f" * 64] + m.repeat_hashes[1][1:]
        other = [t.stored() for t in m.outputs.trails]
        other[0].ids[2] += 1
        m.repeats_diagnosis = diagnose(m.outputs, Outputs("repeat 1", other, m.outputs.settings))
        return m

    monkeypatch.setattr(regress, "measure_profile", flaky_ids)
    assert cli_main(["regress", "--json", str(recorded / "split.yaml")]) == 1
    data = {p["name"]: p for p in json.loads(capsys.readouterr().out)["profiles"]}["split"]
    assert data["diagnosis"]["first"]["index"] == 2 and "settings are the same" in data["diagnosis"]["verdict"]
    assert "parts from the replay at prompt 0, token 2" in data["checks"][0]["message"]
    before = (recorded / "split.yaml").read_text()
    assert cli_main(["regress", "--record", str(recorded / "split.yaml")]) == 1
    assert (recorded / "split.yaml").read_text() == before


FP = (
    f"model: {{path: {TARGET}, fingerprint: '{P.fingerprint(TARGET)}'}}\n"
    f"draft: {{path: {DRAFT}, fingerprint: '{P.fingerprint(DRAFT)}'}}\n"
)
RECORDED = BASE.split("model:")[0] + FP + RUN  # fingerprints, no expectations

BAD_INPUT = {
    "syntax": ("expertbench_profile: 1\nmodel: {path: x\n", "bad.yaml:3: not valid YAML"),
    "no expectations": (RECORDED, "bad.yaml:1: no recorded output hashes: run 'expertbench regress --record"),
    "no fingerprint": (BASE + "expectations:\n  output_sha256: ['" + "a" * 64 + "', '" + "b" * 64 + "']\n",
                       "model: no fingerprint recorded"),
    "wrong model": (BASE.replace(f"path: {TARGET}}}", f"path: {TARGET}, fingerprint: sha256:{'c' * 64}}}"),
                    "bad.yaml:2: model.fingerprint: the profile was recorded on another model"),
    "missing folder": (BASE.replace(str(TARGET), "/nonexistent/model"), "does not exist"),
    "own baseline": (RECORDED + "expectations:\n  speed: {baseline: ./bad.yaml}\n",
                     "bad.yaml:6: expectations.speed.baseline: './bad.yaml' is this profile itself"),
    "out of range": (RECORDED + "placement:\n  layers: {7: cpu:0}\n",
                     "bad.yaml:6: placement.layers: layer 7 out of range"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_exits_2_before_anything_runs(tmp_path, monkeypatch, capsys, case):
    text, message = BAD_INPUT[case]
    (tmp_path / "bad.yaml").write_text(text)
    monkeypatch.setattr(regress, "measure_profile", lambda *a, **k: pytest.fail("nothing may run on bad input"))
    assert cli_main(["regress", str(tmp_path / "bad.yaml")]) == 2
    assert message in capsys.readouterr().err


def test_missing_profile_and_unavailable_devices_exit_2(recorded, capsys):
    assert cli_main(["regress", str(recorded / "nope.yaml")]) == 2
    assert "no such profile file" in capsys.readouterr().err
    gpu = P.load(recorded / "split.yaml")
    gpu.devices["cuda"] = P.DeviceSpec(64)  # no machine here has 64 GPUs (most have none: the module says so)
    gpu.placement.layers = [(2, 2, "cuda:63")]
    gpu.save(recorded / "gpu.yaml")
    junit = recorded / "gpu.xml"
    assert cli_main(["regress", str(recorded / "gpu.yaml"), "--junit", str(junit)]) == 2
    err = capsys.readouterr().err
    # at the file:line of the cuda entry (engine.devices), with a hint
    line = next(i for i, text in enumerate((recorded / "gpu.yaml").read_text().splitlines(), 1) if "cuda:" in text)
    where = f"{recorded / 'gpu.yaml'}:{line}: devices.cuda: this machine"
    assert f"{where} cannot provide it: " in err or f"{where} has no cuda:" in err, err
    assert "hint: " in err
    assert ET.parse(junit).getroot().find("testsuite").get("errors") == "1"


def test_example_profiles_pass_here(tmp_path_factory, monkeypatch, capsys):
    """`expertbench regress profiles/*.yaml`: the recorded hashes and acceptance hold on a freshly built demo pair
    (speeds set equal, so that a busy test machine cannot fail the ratio checks)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))
    real = regress.measure_profile

    def steady(profile, **options):
        m = real(profile, **options)
        m.decode_tokens_per_second = 100.0
        return m

    monkeypatch.setattr(regress, "measure_profile", steady)
    paths = sorted(str(p) for p in (ROOT / "profiles").glob("*.yaml"))
    assert len(paths) == 6
    assert any(p.endswith("gpt-oss-split.yaml") for p in paths)
    code = cli_main(["regress", *paths])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("4 held, 4/4 as recorded") == 6


def test_no_qt_on_the_regress_path(recorded):
    """`expertbench regress` through the real command line (engine.cli, which opens the window without a command)
    imports neither Qt nor the app package."""
    code = (
        "import sys\n"
        "from engine.cli import main\n"
        f"rc = main(['regress', {str(recorded / 'base.yaml')!r}])\n"
        "qt = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'PyQt5', 'PyQt6', 'shiboken6', "
        "'pyqtgraph', 'app'))\n"
        "print(rc, qt)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip().splitlines()[-1] == "0 []"


def test_exit_codes_through_the_command_line(recorded, tmp_path, capsys):
    from engine.cli import main

    assert main(["regress", str(recorded / "split.yaml"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["exit_code"] == 0
    from engine.runs.history import combined_hash  # the one hash the window's history shows

    (split,) = (o for o in report["profiles"] if o["name"] == "split")
    assert split["output_hash"] == split["expected_output_hash"] == combined_hash(split["output_sha256"])
    (tmp_path / "bad.yaml").write_text("expertbench_profile: 1\nmodel: [oops]\n")
    assert main(["regress", str(tmp_path / "bad.yaml")]) == 2
    assert "bad.yaml:2: model: expected a mapping" in capsys.readouterr().err
    assert main(["export", str(recorded / "split.yaml"), "--format", "hotness-csv"]) == 0
    assert capsys.readouterr().out.startswith("# hotness table: n_layer=3 n_expert=8 n_expert_used=2")
    with pytest.raises(SystemExit) as usage:
        main(["regress"])  # no profile: a usage error
    assert usage.value.code == 2


def test_precision_is_replayed_and_its_hashes_are_its_own(tmp_path, capsys):
    """run.precision: q8 replays with int8 activations; its hashes hold on any placement over CPU devices and are not
    f32's, so a profile whose precision changed without a new --record is a regression, named."""
    from quantized_fixtures import q8_0_gguf

    target = q8_0_gguf(TARGET, tmp_path / "target-q8_0.gguf")
    run = "run: {prompts: [[1, 2, 3, 4], [5, 6, 7]], tokens: 6, repeats: 2, precision: q8}\n"
    one = f"expertbench_profile: 1\nmodel: {{path: {target}}}\n" + run
    split = (f"expertbench_profile: 1\nmodel: {{path: {target}}}\ndevices: {{cpu: {{devices: 2, threads: 1}}, "
             "hostsim: 1}\nplacement:\n  layers: {0: cpu:1, 2: hostsim:0}\n" + run)  # fmt: skip
    f32 = one.replace("precision: q8", "precision: f32")
    for name, text in (("one", one), ("split", split), ("f32", f32)):
        (tmp_path / f"{name}.yaml").write_text(text)
    paths = [str(tmp_path / f"{name}.yaml") for name in ("one", "split", "f32")]
    assert cli_main(["regress", "--record", *paths]) == 0, capsys.readouterr().out
    hashes = {name: P.load(tmp_path / f"{name}.yaml").expectations.output_sha256 for name in ("one", "split", "f32")}
    assert hashes["one"] == hashes["split"] != hashes["f32"]
    assert "precision: q8" in (tmp_path / "split.yaml").read_text()
    capsys.readouterr()
    assert cli_main(["regress", "--json", *paths[:2]]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["run"]["precision"] for p in report["profiles"]] == ["q8", "q8"]

    changed = P.load(tmp_path / "split.yaml")
    changed.run.precision = "f32"  # the q8 hashes kept: replayed in f32 they do not hold
    changed.save()
    assert cli_main(["regress", "--json", paths[1]]) == 1
    diagnosis = json.loads(capsys.readouterr().out)["profiles"][-1]["diagnosis"]
    assert {"setting": "precision", "a": "q8", "b": "f32"} in diagnosis["differences"] and diagnosis["expected"]
    assert diagnosis["first"]["index"] is not None and diagnosis["b"] == "the replay"
    assert cli_main(["regress", paths[1]]) == 1
    out = capsys.readouterr().out
    assert "split: output hash: prompt 1 gave" in out and "(mode reference, precision f32)" in out
    assert "split:   precision: the recorded run q8, the replay f32" in out


def test_a_profile_on_the_gguf_demo_pair_records_and_replays(tmp_path, monkeypatch, capsys):
    """`demo` with `format: gguf` and `quant`: regress builds that pair (a tiny size here), fingerprints its GGUF files,
    records and replays in the profile's precision; another quantization is another model (exit 2, named)."""
    from demo_sizes import use_tiny

    from engine.checkpoints.demo import ensure_demo_pair

    use_tiny(monkeypatch, tmp_path / "cache")
    text = ("expertbench_profile: 2\nmodel: {demo: tiny, format: gguf, quant: q8_0}\n"
            "draft: {demo: tiny, format: gguf, quant: q8_0}\n"
            "devices: {cpu: {devices: 2, threads: 1}}\nplacement:\n  layers: {1-2: cpu:1}\n"
            "run: {prompts: [[1, 2, 3, 4], [5, 6, 7]], tokens: 6, repeats: 2, q: 2, precision: q8}\n")  # fmt: skip
    path = tmp_path / "gguf.yaml"
    path.write_text(text)
    assert cli_main(["regress", "--record", str(path)]) == 0, capsys.readouterr()
    pair = ensure_demo_pair("tiny", format="gguf", quant="q8_0")
    assert pair.target.name == "target.gguf" and pair.target.is_relative_to(tmp_path / "cache")
    recorded = P.load(path)
    assert recorded.model.fingerprint == P.fingerprint(pair.target)
    assert recorded.draft.fingerprint == P.fingerprint(pair.draft)
    # format 4: the recorded outputs (ids and top-2 gaps) are in it
    assert (recorded.model.format, recorded.model.quant, recorded.version) == ("gguf", "q8_0", 4)
    assert len(recorded.expectations.output_sha256) == 2 and recorded.expectations.min_accept_rate is not None
    assert str(tmp_path / "cache") not in path.read_text()  # the demo by name, never a path into the cache
    capsys.readouterr()
    assert cli_main(["regress", str(path)]) == 0
    assert "2 held, 2/2 as recorded" in capsys.readouterr().out

    path.write_text(path.read_text().replace("quant: q8_0", "quant: mxfp4", 1))  # the target only
    assert cli_main(["regress", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:7: model.fingerprint: the profile was recorded on another model" in err
    assert "demo-tiny-gguf-mxfp4-v1/target.gguf" in err
