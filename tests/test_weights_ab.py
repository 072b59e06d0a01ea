"""bench/weights_ab.py: mapped against copied weights, interleaved, on the same tokens."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench  # runs bench/weights_ab.py

ROOT = Path(__file__).resolve().parent.parent


def test_weights_ab_compares_both_modes_on_the_same_tokens(tmp_path, xdg_cache):
    report_path = tmp_path / "ab.json"
    env = {**os.environ, "XDG_CACHE_HOME": str(xdg_cache), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "bench/weights_ab.py"), "--size", "default", "--dtypes", "bf16",
           "--rounds", "2", "--repeats", "1", "--tokens", "4", "--json", str(report_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "| dtype | threads | map tok/s" in proc.stdout and "transparent huge pages:" in proc.stdout
    (row,) = json.loads(report_path.read_text())["results"]
    assert row["copy_held_as"] == "copy" and row["file_bytes"] > 0
    assert len(row["rounds"]) == 2 and all(g["map"] > 0 and g["copy"] > 0 for g in row["rounds"])
    assert row["round_ratios"] == [g["copy"] / g["map"] for g in row["rounds"]]
