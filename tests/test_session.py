"""Opening a model pair once for every front end (engine/session.py): the draft's checks and placement, the experts
per token, and nothing left loaded when the pair is refused."""

from __future__ import annotations

import json
import shutil

import pytest
from fixture_paths import FIXTURES

from engine.core.errors import ArgumentError, EngineError
from engine.model import Engine
from engine.session import open_pair

TARGET, DRAFT = FIXTURES / "qwen3moe-f32", FIXTURES / "qwen3-f32"


def test_a_pair_opens_with_the_draft_on_its_own_device():
    with Engine(runtime_options={"cpu": {"n_devices": 2}}) as eng:
        pair = open_pair(eng, TARGET, DRAFT, device="cpu:0", draft_device="cpu:1")
        assert (pair.target.device, pair.draft.device) == ("cpu:0", "cpu:1")
        assert pair.run_top_k is None
        pair.close()
        assert eng._models == []


def test_a_routed_draft_runs_its_experts_on_its_device():
    with Engine(runtime_options={"cpu": {"n_devices": 2}}) as eng:
        pair = open_pair(eng, TARGET, TARGET, device="cpu:0", draft_device="cpu:1")
        owners = pair.draft.placement.owners
        assert {d for layer in pair.draft.config.moe_layers for d in owners[layer]} == {"cpu:1"}


def test_experts_per_token_above_the_checkpoints_are_the_loads():
    with Engine() as eng:
        native = open_pair(eng, TARGET).target.config.top_k
        fewer = open_pair(eng, TARGET, top_k=native - 1)
        assert (fewer.target.config.top_k, fewer.run_top_k) == (native, native - 1)  # the run's contexts ask
        more = open_pair(eng, TARGET, top_k=native + 1)
        assert (more.target.config.top_k, more.run_top_k) == (native + 1, None)  # loaded with them


def test_a_dense_target_is_refused_where_experts_are_needed_and_nothing_stays_loaded():
    with Engine() as eng:
        with pytest.raises(EngineError, match=r"qwen3-f32' is a dense model: it has no experts to place"):
            open_pair(eng, DRAFT, DRAFT, experts_needed=True)
        assert eng._models == []
        assert open_pair(eng, DRAFT).target.config.num_experts == 0  # the CLI runs dense models


def test_a_draft_of_another_vocabulary_is_refused_and_nothing_stays_loaded(tmp_path):
    other = tmp_path / "qwen3-swapped-tokens"
    shutil.copytree(DRAFT, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["\u0120the"], vocab["The"] = vocab["The"], vocab["\u0120the"]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    with Engine() as eng:
        with pytest.raises(ArgumentError, match=r"different tokenizers \(2 of 512 tokens differ"):
            open_pair(eng, TARGET, other)
        assert eng._models == []


def test_a_missing_draft_is_named_and_the_target_closed(tmp_path):
    with Engine() as eng:
        with pytest.raises(EngineError, match=f"model folder or GGUF file '{tmp_path / 'nope'}' does not exist"):
            open_pair(eng, TARGET, tmp_path / "nope")
        assert eng._models == []


# ---- judging a run (engine.session.judge_run: `expertbench run`'s reference and the window's history marks) --------


def test_a_run_is_judged_against_the_reference_run_of_its_outputs_key():
    from engine.profiles.profile import fingerprint
    from engine.runs.history import History, RunRecord, RunSettings, combined_hash
    from engine.runs.run import DecodeRun
    from engine.session import judge_run

    prompts, fp = ["Hello"], fingerprint(TARGET)
    with Engine() as eng:
        target = eng.load(TARGET)
        run = DecodeRun(target, None, prompts=prompts, tokens_per_prompt=6, repeats=1)
        result = run.run()
        history = History()
        first = judge_run(history, result, prompts, fp, target, run.prompt_ids)
        assert first.output_hash == combined_hash(result.output_sha256) and first.reference is None
        assert first.same is None and first.to_dict() == {"output_hash": first.output_hash, "reference": None}
        # the window keeps the run: the first of its outputs key is the reference, and the same run agrees with it
        kept = history.add(RunRecord.of_run(result, RunSettings(prompts, tokens=6), str(TARGET), fingerprint=fp))
        same = judge_run(history, result, prompts, fp, target, run.prompt_ids)
        assert same.reference is kept and same.same and same.diagnosis is None
        assert same.to_dict()["reference"] == {"run": 1, "started": kept.started, "output_hash": first.output_hash,
                                               "same": True, "diagnosis": None}  # fmt: skip
        # another outputs key (more tokens per prompt) has no reference yet; a path names the target without a
        # fingerprint, as the window's history does then
        longer = DecodeRun(target, None, prompts=prompts, tokens_per_prompt=7, repeats=1).run()
        assert judge_run(history, longer, prompts, fp).reference is None
        assert judge_run(history, result, prompts, str(TARGET)).reference is None
        # a reference that gave another output: changed, and why (it kept no ids to say where)
        other = History()
        other.add(RunRecord.of_run(result, RunSettings(prompts, tokens=6), str(TARGET), fingerprint=fp))
        other.records[0].output_hash, other.records[0].outputs = "0" * 64, None
        changed = judge_run(other, result, prompts, fp, target, run.prompt_ids)
        assert changed.same is False and changed.diagnosis is not None
        assert changed.to_dict()["reference"]["diagnosis"]["first"]["note"] == "reference run 1 kept no ids for " \
            "this prompt"  # fmt: skip
        # a run with no complete output is not judged
        stopped = DecodeRun(target, None, prompts=prompts, tokens_per_prompt=6, repeats=1)
        stopped.cancel()
        cancelled = stopped.run()
        assert judge_run(history, cancelled, prompts, fp, target) == judge_run(History(), cancelled, prompts, fp)
        assert judge_run(history, cancelled, prompts, fp).to_dict() == {"output_hash": None, "reference": None}


def test_the_cli_and_the_window_judge_runs_with_the_sessions_function():
    """`expertbench run`'s report and the window's history marks come from one judgement (a change to one is a change
    to both): each module calls engine.session.judge_run and neither looks a reference up itself."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for path in (root / "engine" / "cli" / "run.py", root / "app" / "state.py"):
        calls = {
            node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call)
        }
        assert "judge_run" in calls and not calls & {"diagnose_change", "reference", "record_key"}, path


# ---- calibrating (engine.session.calibrate_devices: `plan`, `tune` and the window) -----------------------------


def test_plan_and_tune_calibrate_quickly_and_the_window_fully():
    from engine.session import QUICK_CALIBRATION_REPEATS, QUICK_CALIBRATION_TOKENS, calibrate_devices
    from engine.tune.plan import make_plan

    asked = []

    def made_up(model, devices, **measure):
        asked.append((devices, measure))
        raise ArgumentError("calibration: made up")

    quick = {"tokens": QUICK_CALIBRATION_TOKENS, "repeats": QUICK_CALIBRATION_REPEATS, "warmup_seconds": 0.0}
    for kind in (True, False):
        with pytest.raises(ArgumentError, match="made up"):
            calibrate_devices(None, ["cpu:0"], quick=kind, calibrate_fn=made_up)
    assert asked == [(["cpu:0"], quick), (["cpu:0"], {})]  # the window's: costmodel.calibrate's own lengths
    with Engine(runtimes=("cpu", "hostsim")) as eng:
        report = make_plan(eng.load(TARGET), "cold-layers", calibrate_fn=made_up)
    assert asked[-1] == (["cpu:0", "hostsim:0"], quick) and report["prediction"].endswith("(calibration: made up)")
