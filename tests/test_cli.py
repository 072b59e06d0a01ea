"""The expertbench command as a user runs it."""

import json
import shutil
import subprocess
import sys

import numpy as np
from conftest import FIXTURES

from engine.cli import main


def test_run_prints_text_and_speeds(capsys):
    assert main(["run", "--model", str(FIXTURES / "qwen3moe-bf16"), "--prompt", "The quick brown fox", "-n", "8"]) == 0
    out = capsys.readouterr().out
    assert "output" in out
    assert "prefill" in out and "decode" in out and "tokens/s" in out


def test_run_json_matches_the_reference_greedy_tokens(capsys):
    ref = np.load(FIXTURES / "qwen3moe-f32" / "reference.npz")
    prompt = "The quick brown fox jumps over the lazy dog. Mixture of experts"
    assert main(["run", "--model", str(FIXTURES / "qwen3moe-f32"), "--prompt", prompt, "-n", "16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["prompt_tokens"] == len(ref["prompt_ids"])
    assert report["generated_ids"] == ref["generated_ids"][:16].tolist()
    assert report["decode_tokens_per_second"] > 0 and report["prefill_tokens_per_second"] > 0


def test_run_with_no_model_uses_the_default(capsys):
    assert main(["run", "-n", "4"]) == 0
    assert "tokens/s" in capsys.readouterr().out


def test_bad_model_folder_exits_2_with_one_line(tmp_path, capsys):
    assert main(["run", "--model", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("expertbench: error: model folder") and "does not exist" in err
    assert "Traceback" not in err


def test_bad_token_count_exits_2(capsys):
    assert main(["run", "-n", "0"]) == 2
    assert "-n 0" in capsys.readouterr().err


def test_devices_json(capsys):
    assert main(["devices", "--json", "--cpu-devices", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in report["devices"]] == ["cpu:0", "cpu:1"]


def test_console_script_and_module_entry_points():
    script = shutil.which("expertbench")
    assert script is not None, "the expertbench console script is not installed"
    for cmd in ([script, "devices"], [sys.executable, "-m", "engine", "devices"]):
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        assert "cpu:0" in out.stdout
