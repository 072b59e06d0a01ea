"""bench/pool_trace.py: the cpu runtime built with its pool trace, and the per-step account it prints."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.checkpoints.demo import ensure_demo_pair

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from pool_trace import build_traced_module  # noqa: E402

pytestmark = pytest.mark.bench  # builds the traced cpu module


def test_the_traced_module_builds_without_warnings(tmp_path):
    if shutil.which("cc") is None:
        pytest.fail("cc is needed to build the traced module (run tests/setup.sh)")
    assert build_traced_module(tmp_path, ("-Wall", "-Wextra", "-Werror")).exists()


def test_pool_trace_accounts_for_every_weight_byte_of_a_step(tmp_path, xdg_cache):
    from engine.model import Engine

    report_path = tmp_path / "trace.json"
    env = {**os.environ, "XDG_CACHE_HOME": str(xdg_cache), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "bench/pool_trace.py"), "--size", "default", "--tokens", "4"]
    proc = subprocess.run([*cmd, "--json", str(report_path)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "| pool run |" in proc.stdout and "| work items of products |" in proc.stdout
    report = json.loads(report_path.read_text())
    runs = {(r["kind"], r["rows"]): r for r in report["runs"]}
    with Engine() as eng, eng.load(ensure_demo_pair("default", cache_dir=xdg_cache / "expertbench").target) as m:
        cfg, per_token = m.config, m.info["bytes_per_token"]
    # every step runs lm_head once and each layer's products and attention once (a whole number of runs per step)
    assert runs[("product", cfg.vocab_size)]["per_step"] == 1.0
    # attention's work items: a GQA group each, or a head each where there are more threads than groups
    attention = [r for r in report["runs"] if r["kind"] == "parallel run (attention)"]
    assert len(attention) == 1 and attention[0]["rows"] in (cfg.num_kv_heads, cfg.num_heads)
    assert attention[0]["per_step"] == cfg.num_layers
    assert all(float(r["per_step"]).is_integer() for r in report["runs"])
    # the products read every weight byte of a step but the embedding row (the core reads that itself)
    traced = sum(r["weight_bytes"] * r["per_step"] for r in report["runs"])
    assert traced == per_token - cfg.hidden_size * 2  # bf16
    assert report["step_us"] == pytest.approx(report["in_runs_us"] + report["between_runs_us"])
    assert 0 < report["between_runs_us"] < report["step_us"]


def test_pool_trace_refuses_too_few_tokens():
    cmd = [sys.executable, str(ROOT / "bench/pool_trace.py"), "--tokens", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and "--tokens 1: expected at least 2" in proc.stderr
