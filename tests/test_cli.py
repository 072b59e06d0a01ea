"""The expertbench command as a user runs it."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.cli import main

REF_PROMPT = "The quick brown fox jumps over the lazy dog. Mixture of experts"


def test_run_prints_text_and_speeds(capsys):
    model = str(FIXTURES / "qwen3moe-bf16")
    assert main(["run", "--model", model, "--prompt", "The quick brown fox", "-n", "8", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "output sha256" in out and "draft     none" in out
    assert "prefill" in out and "decode" in out and "tokens/s" in out
    assert "hashes    held over 2 repeats" in out
    assert "synthetic" not in out


@pytest.mark.parametrize("draft", [[], ["--draft", str(FIXTURES / "qwen3-f32"), "--q", "4"]], ids=["plain", "draft"])
def test_run_json_matches_the_reference_greedy_tokens(capsys, draft):
    ref = np.load(FIXTURES / "qwen3moe-f32" / "reference.npz")
    args = ["run", "--model", str(FIXTURES / "qwen3moe-f32"), "--prompt", REF_PROMPT, "-n", "16", "--json"]
    assert main(args + draft + ["--repeats", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    (prompt,) = report["prompts"]
    assert prompt["prompt_tokens"] == len(ref["prompt_ids"])
    assert prompt["generated_ids"] == ref["generated_ids"][:16].tolist()
    assert report["output_sha256"] == [prompt["output_sha256"]]
    assert report["decode_tokens_per_second"] > 0 and report["prefill_tokens_per_second"] > 0
    if draft:
        assert report["q"] == 4 and report["drafted_tokens"] > 0 and 0 <= report["accept_rate"] <= 1
    else:
        assert report["draft"] is None and report["accept_rate"] is None


def test_run_with_no_model_uses_the_demo_pair_with_its_draft(xdg_cache, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    assert main(["run", "-n", "16", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "synthetic: random weights" in out
    assert "demo-default-v1/target" in out and "demo-default-v1/draft  q=2" in out
    assert "accept" in out and "tokens/s" in out and "hashes    held over 2 repeats" in out
    assert main(["run", "-n", "8", "--repeats", "1", "--no-draft", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["synthetic"] is True and report["draft"] is None and len(report["prompts"]) == 4


def test_draft_on_another_cpu_device(capsys):
    args = ["run", "--model", str(FIXTURES / "qwen3moe-f32"), "--draft", str(FIXTURES / "qwen3-f32"), "-n", "12"]
    assert main(args + ["--cpu-devices", "2", "--draft-device", "cpu:1", "--repeats", "1", "--json"]) == 0
    on_two = json.loads(capsys.readouterr().out)
    assert (on_two["target_device"], on_two["draft_device"]) == ("cpu:0", "cpu:1")
    assert main(["run", "--model", str(FIXTURES / "qwen3moe-f32"), "-n", "12", "--repeats", "1", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert on_two["output_sha256"] == plain["output_sha256"]


def test_bad_model_folder_exits_2_with_one_line(tmp_path, capsys):
    assert main(["run", "--model", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("expertbench: error: model folder") and "does not exist" in err
    assert "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["-n", "0"], "-n 0: expected a positive number of tokens"),
        (["--q", "0"], "--q 0: expected a draft length of 1..8 tokens"),
        (["--q", "9"], "--q 9: expected a draft length of 1..8 tokens"),
        (["--repeats", "0"], "--repeats 0: expected a positive number"),
        (["--repeats", "10001"], "--repeats 10001: at most 10000 passes over the prompts in one run"),
        (["--prompt", ""], "--prompt '' is empty"),
        (["--demo-quant", "q8_0"], "--demo-quant q8_0: only the GGUF demo is quantized (add --demo-format gguf)"),
        (["--model", "m", "--demo-format", "gguf"], "--demo-format: choose the demo pair, which runs only without"),
        (["--model", "m", "--demo-size", "bench"], "--demo-size: choose the demo pair"),
    ],
)
def test_bad_run_options_exit_2_before_any_model_loads(args, message, refused_before_loading):
    refused_before_loading(["run", *args], message)


def test_placement_and_mode_options(capsys):
    model = str(FIXTURES / "qwen3moe-f32")
    args = ["run", "--model", model, "--draft", str(FIXTURES / "qwen3-f32"), "-n", "12", "--repeats", "1"]
    extra = [
        "--cpu-devices",
        "2",
        "--runtime",
        "hostsim",
        "--placement",
        "0=cpu:1; 2=hostsim:0",
        "--mode",
        "owner_local",
    ]
    assert main(args + extra) == 0
    out = capsys.readouterr().out
    assert "placement 0=cpu:1; 2=hostsim:0" in out and "mode      owner_local" in out
    assert "staged    cpu:0->hostsim:0" in out and "busy      cpu:0" in out
    assert main(args + ["--placement", "0=cpu:9"]) == 2
    err = capsys.readouterr().err
    assert err == "expertbench: error: no device named 'cpu:9' (1 devices loaded)\n"


def test_precision_option_is_reported_and_q8_is_not_the_reference(capsys):
    model = str(FIXTURES / "qwen3moe-gguf" / "model-q8_0.gguf")
    args = ["run", "--model", model, "--prompt", REF_PROMPT, "-n", "24", "--repeats", "2"]
    reports = {}
    for precision in ("f32", "q8"):
        assert main([*args, "--precision", precision, "--json"]) == 0
        reports[precision] = json.loads(capsys.readouterr().out)
        assert reports[precision]["precision"] == precision and reports[precision]["repeats_agree"]
        assert reports[precision]["weights"]["formats"] == ["Q8_0", "F32"]
    # (its tokens may or may not differ from f32's on a short run: tests/test_run.py shows a case where they do)
    assert main([*args, "--precision", "q8"]) == 0
    out = capsys.readouterr().out
    assert "mode      reference\nprecision q8 (activations quantized to int8 per block" in out
    assert "not the reference, its tokens and hashes may differ from f32's)" in out and "; Q8_0, F32)" in out
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "precision f32 (activations meet exactly dequantized weights in f32: the reference)" in out
    # float weights are read in f32 either way: said, not hidden
    floats = ["run", "--model", str(FIXTURES / "qwen3moe-f32"), "-n", "4", "--repeats", "1", "--precision", "q8"]
    assert main(floats) == 0
    assert "precision q8 (no quantized weights here: float weights are read in f32" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--precision", "q4"])
    assert exit_.value.code == 2 and "invalid choice: 'q4'" in capsys.readouterr().err


def test_run_on_a_device_primary_puts_every_expert_there_and_gives_the_reference_tokens(capsys):
    """--device names a primary that cannot read host memory (hostsim here, a GPU in use): with no --placement,
    every expert goes there too, and draft and target decode the fixture's greedy tokens."""
    ref = np.load(FIXTURES / "qwen3moe-f32" / "reference.npz")
    models = ["--model", str(FIXTURES / "qwen3moe-f32"), "--draft", str(FIXTURES / "qwen3-f32")]
    devices = ["--runtime", "hostsim", "--device", "hostsim:0"]
    args = ["run", *models, *devices, "--prompt", REF_PROMPT, "-n", "16", "--repeats", "1", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target_device"] == "hostsim:0" and report["draft_device"] == "hostsim:0"
    assert report["placement"] == "0-2=hostsim:0"
    assert report["prompts"][0]["generated_ids"] == ref["generated_ids"][:16].tolist()
    assert report["host_round_trips"] == 0 and report["graph_launches"] > 0
    assert main([a for a in args if a != "--json"] + ["--placement", "0=cpu:0"]) == 0
    out = capsys.readouterr().out
    assert "primary   " in out and " host round trips (MoE layer steps with experts elsewhere)" in out
    assert "primary   0 host round trips" not in out


def test_vocab_mismatch_exits_2(xdg_cache, capsys):
    draft = xdg_cache / "expertbench" / "demo-default-v1" / "draft"
    assert main(["run", "--model", str(FIXTURES / "qwen3moe-f32"), "--draft", str(draft), "-n", "4"]) == 2
    err = capsys.readouterr().err
    assert "has vocab_size 4096, the target" in err and "has 512" in err and err.count("\n") == 1


def test_draft_and_no_draft_conflict(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--draft", "x", "--no-draft"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_devices_json(capsys):
    assert main(["devices", "--json", "--cpu-devices", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    names = [d["name"] for d in report["devices"]]
    assert names[:3] == ["cpu:0", "cpu:1", "hostsim:0"]
    # every GPU runtime is either listed with devices or reported with its reason
    for runtime in ("cuda", "hip"):
        assert any(n.startswith(f"{runtime}:") for n in names) or runtime in report["unavailable"]


def test_devices_lists_every_built_runtime_with_devices_or_its_reason(capsys):
    from engine.core.native import core_location

    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "runtime cpu:" in out and "cpu:0" in out
    for runtime in ("hostsim", "cuda", "hip"):
        if not (Path(core_location()) / f"expertbench_rt_{runtime}.so").is_file():
            continue
        listed = f"runtime {runtime}: " in out
        assert listed, f"{runtime} is built but not listed"
        line = next(ln for ln in out.splitlines() if ln.startswith(f"runtime {runtime}: "))
        assert "device(s)" in line or "unavailable - runtime module" in line and "no device" in line


def test_console_script_and_module_entry_points():
    # on PATH, or beside the interpreter (a virtual environment's bin/, where pip puts it, need not be on PATH)
    script = shutil.which("expertbench") or shutil.which("expertbench", path=str(Path(sys.executable).parent))
    assert script is not None, "the expertbench console script is not installed"
    for cmd in ([script, "devices"], [sys.executable, "-m", "engine", "devices"]):
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        assert "cpu:0" in out.stdout


def test_piped_run_prints_no_progress():
    cmd = [
        sys.executable,
        "-m",
        "engine",
        "run",
        "--model",
        str(FIXTURES / "qwen3moe-f32"),
        "-n",
        "4",
        "--repeats",
        "1",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert out.stderr == "" and "tokens/s" in out.stdout


@pytest.mark.parametrize(
    "argv, window",
    [
        ([], []),
        (["gui"], []),
        (["gui", "--theme", "dark", "--model", "m.gguf"], ["--theme", "dark", "--model", "m.gguf"]),
        (["split.yaml"], ["--profile", "split.yaml"]),
        (["split.yml", "--theme", "light"], ["--profile", "split.yml", "--theme", "light"]),
        (["--profile", "x.yaml"], ["--profile", "x.yaml"]),
        (["--theme=dark"], ["--theme=dark"]),
        (["run", "--profile-like"], None),
        (["regress", "x.yaml"], None),
        (["--help"], None),
    ],
)
def test_the_window_is_opened_by_gui_a_profile_file_or_its_own_options(argv, window, monkeypatch):
    import app
    from engine import cli

    assert cli.window_arguments(argv) == window
    if window is not None:
        seen = []
        monkeypatch.setattr(app, "main", lambda a: seen.append(a) or 0)
        assert cli.main(argv) == 0 and seen == [window]


def test_help_names_the_window(capsys):
    from engine import cli

    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "gui" in out and "expertbench FILE.yaml" in out


def test_gui_help_lists_the_windows_options(capsys):
    from engine import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["gui", "--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "expertbench gui" in out and "--profile" in out and "--theme" in out


def test_run_reports_its_output_hash_and_the_windows_reference_run_of_the_same_outputs(capsys):
    """`run` hashes its outputs as the window's history does (engine.runs.history) and names the reference run of
    the same outputs key kept there, saying whether it still gives the same output; it keeps nothing there itself."""
    from engine.profiles.profile import fingerprint
    from engine.runs import history as H

    model = FIXTURES / "qwen3moe-f32"
    args = ["run", "--model", str(model), "--prompt", REF_PROMPT, "-n", "8", "--repeats", "1"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["output_hash"] == H.combined_hash(report["output_sha256"]) and report["reference"] is None
    fp = fingerprint(model)
    kept = H.History(H.history_file(fp))
    settings = H.RunSettings([REF_PROMPT], tokens=8, repeats=1)
    common = dict(started="2026-12-01T10:00:00", target="qwen3moe-f32", draft=None, placement="0-2=hostsim:0",
                  mode="reference", precision="f32", q=None, tokens=8, repeats=1, prompts=1,
                  decode_tokens_per_second=1.0, prefill_tokens_per_second=1.0, accept_rate=None, reference_hash="",
                  cancelled=False, seconds=1.0, settings=settings, target_path=str(model), primary="cpu:0",
                  fingerprint=fp)  # fmt: skip
    kept.add(H.RunRecord(index=0, output_hash="0" * 64, **common))  # a reference that gave another output
    assert main([*args, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    diagnosis = again["reference"].pop("diagnosis")
    assert again["reference"] == {"run": 1, "started": "2026-12-01T10:00:00", "output_hash": "0" * 64, "same": False}
    assert diagnosis["first"]["note"] == "reference run 1 kept no ids for this prompt"
    assert main(args) == 0
    assert f"reference {report['output_hash'][:12]}: CHANGED from 000000000000 of run 1 of the window's history " \
           "(2026-12-01 10:00:00)" in capsys.readouterr().out  # fmt: skip
    # a reference that kept its ids and gaps, which part from this run's at token 2 by a near tie: the run says where,
    # and that only the placement differs, which must not change a reference-mode output
    from engine.runs.diverge import Trail
    from engine.runs.run import output_sha256

    ids = list(report["prompts"][0]["generated_ids"])
    ids[2] = (ids[2] + 1) % 64
    kept_outputs = [Trail(ids, [1.0, 1.0, 0.004] + [1.0] * 5).compact()]
    H.History(H.history_file(fp)).add(H.RunRecord(index=0, output_hash=H.combined_hash([output_sha256(ids)]),
                                                  outputs=kept_outputs, **common))  # fmt: skip
    H.history_file(fp).write_text(H.history_file(fp).read_text().splitlines()[1] + "\n")  # that one alone
    assert main([*args, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)["reference"]["diagnosis"]["first"]
    assert (first["prompt"], first["index"], first["near_tie"], first["a"]["token"]) == (0, 2, True, ids[2])
    assert first["b"]["token"] == report["prompts"][0]["generated_ids"][2] and first["b"]["logit"] is not None
    assert main(args) == 0
    out = capsys.readouterr().out
    assert (
        "this run parts from reference run 1: a near tie (top-2 gap under 0.05); only the placement differs, which"
        in out
    )
    assert "\n            prompt 0: first differing token 2 (a near tie)" in out and "a bug to look into" in out
    assert f"\n              reference run 1: {ids[2]} (gap 0.004002 to the runner-up; logits not kept)" in out
    assert "\n            placement: reference run 1 0-2=hostsim:0, this run 0-2=cpu:0" in out
    H.history_file(fp).unlink()
    H.History(H.history_file(fp)).add(H.RunRecord(index=0, output_hash=report["output_hash"], **common))
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reference"]["same"] is True
    assert len(H.history_file(fp).read_text().splitlines()) == 1  # run keeps nothing
