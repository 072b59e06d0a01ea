"""The quality cost of the fast modes: KL and agreement on known distributions, then q8, top-k and owner_local
against the reference mode on the fixtures, through the API and `expertbench run`."""

import json
import math

import numpy as np
import pytest
from fixture_paths import FIXTURES
from quantized_fixtures import q8_0_gguf

from engine.cli import main
from engine.core.errors import ArgumentError
from engine.model import Engine
from engine.runs.diverge import first_difference
from engine.runs.quality import agreement, is_fast, kl_divergence, quality_cost, within_max_kl
from engine.runs.run import DecodeRun

PROMPTS = [[1, 2, 3, 4], [5, 6, 7]]
TARGET = FIXTURES / "qwen3moe-f32"


def test_kl_and_agreement_on_known_distributions():
    p = np.array([[0.0, 0.0], [1.0, 2.0], [3.0, 1.0]])
    q = np.array([[math.log(3.0), 0.0], [11.0, 12.0], [1.0, 3.0]])  # (0.75, 0.25); p's row + 10; swapped
    kl = kl_divergence(p, q)
    assert kl[0] == pytest.approx(0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25))
    assert kl[1] == pytest.approx(0.0, abs=1e-12)  # a shift of every logit is the same distribution
    e = np.exp([3.0, 1.0]) / np.exp([3.0, 1.0]).sum()
    assert kl[2] == pytest.approx(e[0] * math.log(e[0] / e[1]) + e[1] * math.log(e[1] / e[0]))
    assert agreement(p, q).tolist() == [True, True, False]  # a tie goes to the lower id on both sides
    assert (kl_divergence(q, q) == 0).all() and kl_divergence(p, q).shape == (3,)


def test_fast_settings_and_the_max_kl_constraint():
    assert not is_fast("reference", "f32") and not is_fast("reference", "f32", 8, 8)
    assert is_fast("owner_local", "f32") and is_fast("reference", "q8") and is_fast("reference", "f32", 4, 8)

    class Cost:
        mean_kl = 0.002

    assert within_max_kl(Cost, 0.002) and not within_max_kl(Cost, 0.001)
    with pytest.raises(ArgumentError, match="--max-kl -1: expected a number of nats >= 0"):
        within_max_kl(Cost, -1)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    return q8_0_gguf(TARGET, tmp_path_factory.mktemp("q8") / "target-q8_0.gguf")


def test_the_reference_settings_cost_nothing():
    with Engine() as eng:
        target = eng.load(TARGET)
        cost = quality_cost(target, prompts=PROMPTS, tokens=10)
        assert (cost.agreement, cost.mean_kl, cost.max_kl, cost.first_divergence) == (1.0, 0.0, 0.0, None)
        assert cost.positions == 20 and cost.fast_mode == "reference" and cost.diagnosis is None


def test_q8_costs_what_its_own_runs_show(quantized):
    """q8 on Q8_0 weights: a KL above 0, and the first divergence is where a q8 run's ids first part from an f32
    run's (independent runs here), with the diagnosis's top-2 logits from those runs."""
    with Engine() as eng:
        target = eng.load(quantized)
        cost = quality_cost(target, prompts=PROMPTS, tokens=12, precision="q8")
        f32 = DecodeRun(target, prompts=PROMPTS, tokens_per_prompt=12).run()
        q8 = DecodeRun(target, prompts=PROMPTS, tokens_per_prompt=12, precision="q8").run()
    parts = [first_difference(a.generated_ids, b.generated_ids) for a, b in zip(f32.prompts, q8.prompts, strict=True)]
    assert cost.first_divergence == min(p for p in parts if p is not None)
    assert [(d.prompt, d.index) for d in cost.diagnosis.divergences] == [
        (i, p) for i, p in enumerate(parts) if p is not None]  # fmt: skip
    assert cost.diagnosis.differences == [("precision", "f32", "q8")]
    assert 0 < cost.mean_kl <= cost.max_kl and cost.agreement < 1.0  # it parts at a teacher-forced position too
    assert cost.fast_mode == "q8" and cost.to_dict()["summary"].startswith("q8: greedy agreement ")


def test_an_experts_per_token_override_is_another_load_and_costs_quality():
    with Engine() as eng:
        target = eng.load(TARGET)
        fewer = eng.load(TARGET, top_k=1)
        assert (fewer.config.top_k, fewer.native_top_k, target.config.top_k) == (1, 2, 2)
        run = DecodeRun(fewer, prompts=PROMPTS, tokens_per_prompt=10).run()
        assert run.top_k == 1 and DecodeRun(target, prompts=PROMPTS, tokens_per_prompt=2).run().top_k is None
        cost = quality_cost(target, fewer, prompts=PROMPTS, tokens=10, fast_result=run)
        assert cost.top_k == 1 and cost.native_top_k == 2 and cost.fast_mode == "top-1 experts (of 2)"
        assert cost.mean_kl > 0 and cost.diagnosis.differences == [("top_k", None, 1)]
        for bad, message in ((0, "expected an integer 1..8"), (9, "expected an integer 1..8"), (True, "1..8")):
            with pytest.raises(ArgumentError, match=message):
                eng.load(TARGET, top_k=bad)
        with pytest.raises(ArgumentError, match="has no experts: experts per token needs an MoE model"):
            eng.load(FIXTURES / "qwen3-f32", top_k=1)
        with pytest.raises(ArgumentError, match="the fast run ran in reference, f32: expected owner_local, f32"):
            quality_cost(target, prompts=PROMPTS, tokens=10, mode="owner_local", fast_result=run)
        short = DecodeRun(target, prompts=PROMPTS, tokens_per_prompt=4).run()
        with pytest.raises(ArgumentError, match="not a complete run of 2 prompts x 10 tokens"):
            quality_cost(target, prompts=PROMPTS, tokens=10, reference_result=short)


def test_owner_local_is_measured_on_its_placement():
    with Engine(cpu_devices=2, cpu_threads=1) as eng:
        target = eng.load(TARGET)
        cost = quality_cost(target, prompts=PROMPTS, tokens=8, mode="owner_local", placement="0=cpu:1")
        assert target.placement.describe() == "0=cpu:1; 2=cpu:0" and cost.fast_mode == "owner_local"
        assert cost.mean_kl >= 0.0 and 0.0 <= cost.agreement <= 1.0 and cost.positions == 16


def test_run_reports_the_quality_cost_of_a_fast_mode(capsys):
    args = ["run", "--model", str(TARGET), "--no-draft", "-n", "8", "--repeats", "1"]
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["quality"] is None  # the reference settings
    assert main([*args, "--top-k", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    q = report["quality"]
    assert report["top_k"] == 1 and (q["top_k"], q["native_top_k"], q["positions"]) == (
        1,
        2,
        4 * 8,
    )  # the 4 demo prompts
    assert q["mean_kl"] > 0 and 0 <= q["agreement"] <= 1
    assert main([*args, "--top-k", "1"]) == 0
    out = capsys.readouterr().out
    assert "\nquality   top-1 experts (of 2): greedy agreement " in out and "(against the reference mode, f32" in out
    assert main([*args, "--top-k", "1", "--no-quality", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["quality"] is None
    assert main([*args, "--top-k", "0"]) == 2
    assert "--top-k 0: expected a positive number of experts per token" in capsys.readouterr().err
    assert main([*args, "--top-k", "9"]) == 2
    assert "experts per token (top_k) 9: expected an integer 1..8" in capsys.readouterr().err


def test_the_max_kl_limit_measures_each_distinct_setting_once_and_says_why():
    """tune --max-kl's constraint on made-up costs: the reference settings are never measured, settings whose outputs
    do not depend on the placement are measured once whatever the placement, owner_local once per placement."""
    from engine.runs.quality import KLLimit, QualityCost, quality_key

    asked = []

    def measure(mode, precision, top_k, placement):
        asked.append((mode, precision, top_k, placement))
        kl = {"owner_local": 0.0, "q8": 0.002}.get(mode if mode != "reference" else precision, 0.01)
        return QualityCost(mode, precision, top_k, 8 if top_k else None, 4, 64, 256, 0.9, kl, kl, None, None)

    limit = KLLimit(0.005, measure)
    assert limit.why("reference", "f32") is None and asked == []
    assert limit.why("reference", "q8", None, "0-3=cpu:1") is None
    assert limit.why("reference", "q8", None, "0-7=cpu:0") is None and len(asked) == 1  # over CPU devices: one key
    assert limit.why("reference", "f32", 2) == "top-2 experts (of 8): mean KL 0.01 nats > --max-kl 0.005"
    limit.why("owner_local", "f32", None, "0-3=cpu:1")
    limit.why("owner_local", "f32", None, "0-5=cpu:1")
    limit.why("owner_local", "f32", None, "0-3=cpu:1")
    assert len(asked) == 4 and len(limit.costs) == 4
    # q8 gives the same outputs on GPU devices too (the GPU modules compute the CPU's q8 bits); owner_local never does
    assert quality_key("reference", "q8", None, "0=cuda:0") == quality_key("reference", "q8", None, "1=cuda:0")
    assert quality_key("owner_local", "q8", None, "0=cuda:0") != quality_key("owner_local", "q8", None, "1=cuda:0")
    with pytest.raises(ArgumentError, match="--max-kl -0.1"):
        KLLimit(-0.1, measure)


def test_the_max_kl_limit_on_a_model():
    from engine.runs.quality import KLLimit

    with Engine() as eng:
        target = eng.load(TARGET)
        loaded = []

        def load_top_k(k):
            loaded.append(eng.load(TARGET, top_k=k))
            return loaded[-1]

        limit = KLLimit.for_model(1e-9, target, prompts=PROMPTS, tokens=6, load_top_k=load_top_k)
        assert limit.why("reference", "f32", 1).startswith("top-1 experts (of 2): mean KL ")
        assert loaded == []  # fewer than its own: the target's contexts decode with them
        assert limit.why("reference", "f32", 3).startswith("top-3 experts (of 2): mean KL ")
        assert [m.config.top_k for m in loaded] == [3]  # more: another load
        assert limit.why("owner_local", "f32") is None  # the CPU runtime's owner_local sums: the reference's bits
