"""Experts per token as a context's setting (Context.top_k, DecodeRun(top_k=...), `run --top-k`): a context decoding
with k experts gives the bits of the model loaded with k, on a CPU primary and on a hostsim primary (recorded steps)
with experts split with cpu:0, for each family (DeepSeek's grouped routing too); fewer than the checkpoint's own need
no second load."""

import json

import numpy as np
import pytest
from fixture_paths import FIXTURES

import engine.model as engine_model
from engine.checkpoints.demo import DEMO_PROMPTS
from engine.cli import main
from engine.core.errors import ArgumentError, RangeError
from engine.core.native import check, lib
from engine.model import Engine
from engine.runs.quality import quality_cost
from engine.runs.run import DecodeRun

# (fixture, its own experts per token, the smaller counts checked)
FAMILIES = [("qwen3moe-f32", 2, (1,)), ("deepseek-f32", 4, (1, 3)), ("gpt-oss-bf16", 4, (2,))]
PROMPTS = [[1, 2, 3, 4], [5, 6, 7]]


@pytest.fixture(scope="module")
def engine():
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, cpu_threads=1) as eng:
        yield eng


def rows(model, name, top_k=None, n_decode=6):
    """Logits of the fixture's prompt and n_decode one-token steps (recorded and replayed on hostsim)."""
    ref = np.load(FIXTURES / name / "reference.npz")
    with model.context(64) as ctx:
        if top_k is not None:
            ctx.top_k = top_k
            assert ctx.top_k == top_k
        out = [ctx.prefill(ref["prompt_ids"])] + [ctx.decode([t]) for t in ref["generated_ids"][:n_decode]]
    return np.concatenate(out)


def load(engine, name, device, top_k=None):
    """The fixture on device, the experts split with a peer (cpu:0 for hostsim, else cpu:1): the first MoE layer's all
    on the peer, the second's in part."""
    model = engine.load(FIXTURES / name, device=device, top_k=top_k)
    first, second = model.config.moe_layers[:2]
    peer = "cpu:0" if device == "hostsim:0" else "cpu:1"
    model.set_placement(f"*={device}; {first}={peer}; {second}.0-3={peer}")
    return model


@pytest.mark.parametrize("device", ["cpu:0", "hostsim:0"])
@pytest.mark.parametrize(("name", "own", "fewer"), FAMILIES)
def test_a_context_with_fewer_experts_gives_the_bits_of_a_model_loaded_with_them(engine, name, own, fewer, device):
    model = load(engine, name, device)
    try:
        assert model.config.top_k == own
        with model.context(8) as ctx:
            assert ctx.top_k == own
        original = rows(model, name)
        for k in fewer:
            reloaded = load(engine, name, device, top_k=k)
            try:
                expected = rows(reloaded, name)
            finally:
                reloaded.close()
            got = rows(model, name, top_k=k)
            assert np.array_equal(got, expected), f"top_k {k}"
            assert not np.array_equal(got, original), f"top_k {k} changed nothing"
        assert np.array_equal(rows(model, name, top_k=own), original)
    finally:
        model.close()


def test_changing_top_k_records_the_steps_anew_and_setting_it_back_gives_the_original(engine):
    """On one context: the recorded one-token steps (hostsim's graphs) are dropped when top_k changes, so replays
    decode with the count in force; back at the loaded count the outputs are the original ones."""
    name = "qwen3moe-f32"
    model = load(engine, name, "hostsim:0")
    ids = [3, 1, 4, 1, 5]
    try:
        with model.context(16) as ctx:
            original = np.concatenate([ctx.decode([t]) for t in ids])
        fewer = load(engine, name, "hostsim:0", top_k=1)
        try:
            with fewer.context(16) as ctx:
                expected = np.concatenate([ctx.decode([t]) for t in ids])
        finally:
            fewer.close()
        recorded = []
        with model.context(16) as ctx:
            for k, want in ((2, original), (1, expected), (1, expected), (2, original)):
                ctx.truncate(0)
                ctx.top_k = k
                before = model.counters()["graph_captures"]
                got = np.concatenate([ctx.decode([t]) for t in ids])
                recorded.append(model.counters()["graph_captures"] - before)
                assert np.array_equal(got, want), f"top_k {k}"
        parts = recorded[0]  # one per split layer and one more
        assert parts == 3 and recorded == [parts, parts, 0, parts]
    finally:
        model.close()


def test_bad_counts_are_refused_and_the_context_still_works(engine):
    model = engine.load(FIXTURES / "qwen3moe-f32")
    try:
        with model.context(16) as ctx:
            ctx.top_k = 1
            for bad, error, message in (
                (0, RangeError, r"experts per token \(top_k\) 0: expected 1..2 \(at least one expert\)$"),
                (3, RangeError, r"experts per token \(top_k\) 3: expected 1..2 \(the count the model was loaded with"),
                (1.0, ArgumentError, r"experts per token \(top_k\) 1.0: expected an integer 1..2"),
                (True, ArgumentError, r"experts per token \(top_k\) True: expected an integer 1..2"),
                ("2", ArgumentError, r"experts per token \(top_k\) '2': expected an integer"),
            ):
                with pytest.raises(error, match=message):
                    ctx.top_k = bad
                assert ctx.top_k == 1
            for bad in (0, 3, -1):  # the core refuses them too, naming the value and the range
                with pytest.raises(RangeError, match=rf"experts per token \(top_k\) {bad}: expected 1..2"):
                    check(lib.eb_context_set_top_k(ctx._ptr, bad))
            assert ctx.top_k == 1
            got = ctx.prefill([1, 2, 3])
        with model.context(16) as ctx:
            ctx.top_k = 1
            assert np.array_equal(ctx.prefill([1, 2, 3]), got)
        for bad, error in ((0, RangeError), (3, RangeError), (True, ArgumentError), (1.5, ArgumentError)):
            with pytest.raises(error, match="experts per token"):  # before anything runs
                DecodeRun(model, prompts=PROMPTS, tokens_per_prompt=2, top_k=bad)
    finally:
        model.close()
    with Engine() as eng, eng.load(FIXTURES / "qwen3-f32") as dense, dense.context(8) as ctx:
        assert ctx.top_k == 0
        with pytest.raises(ArgumentError, match=r"experts per token \(top_k\) 1: the model has no experts"):
            ctx.top_k = 1
        with pytest.raises(ArgumentError, match="the model has no experts"):
            DecodeRun(dense, prompts=PROMPTS, top_k=1)


def test_a_decode_run_with_fewer_experts_equals_one_on_a_model_loaded_with_them():
    """DecodeRun(top_k=...) sets the target's context (not the draft's): the outputs, hashes and the RunResult's
    top_k of a run on a model loaded with that count; its own count is no override."""
    with Engine() as eng:
        target, fewer = eng.load(FIXTURES / "qwen3moe-f32"), eng.load(FIXTURES / "qwen3moe-f32", top_k=1)
        draft = eng.load(FIXTURES / "qwen3-f32")
        for d in (None, draft):
            got = DecodeRun(target, d, prompts=PROMPTS, tokens_per_prompt=8, top_k=1).run()
            want = DecodeRun(fewer, d, prompts=PROMPTS, tokens_per_prompt=8).run()
            assert got.output_sha256 == want.output_sha256 and got.top_k == want.top_k == 1
        own = DecodeRun(target, prompts=PROMPTS, tokens_per_prompt=8, top_k=2).run()
        assert own.top_k is None
        assert own.output_sha256 == DecodeRun(target, prompts=PROMPTS, tokens_per_prompt=8).run().output_sha256
        cost = quality_cost(target, prompts=PROMPTS, tokens=8, top_k=1)
        assert cost.to_dict() == quality_cost(target, fewer, prompts=PROMPTS, tokens=8).to_dict()
        assert cost.fast_mode == "top-1 experts (of 2)"
        with pytest.raises(ArgumentError, match="the fast run decoded with top_k None: expected 1"):
            quality_cost(target, prompts=PROMPTS, tokens=8, top_k=1, fast_result=own)


@pytest.fixture
def loads(monkeypatch):
    """The experts per token of every Model loaded from here on."""
    counts = []
    init = engine_model.Model.__init__

    def counted(self, *args, **kwargs):
        init(self, *args, **kwargs)
        counts.append(self.config.top_k)

    monkeypatch.setattr(engine_model.Model, "__init__", counted)
    return counts


def test_run_with_fewer_experts_loads_once_and_reports_as_before(loads, capsys):
    target = FIXTURES / "qwen3moe-f32"
    args = ["run", "--model", str(target), "--no-draft", "-n", "8", "--repeats", "1", "--json"]
    assert main([*args, "--top-k", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert loads == [2], "one load, at the checkpoint's own count"
    with Engine() as eng:  # what the second load reported
        own, fewer = eng.load(target), eng.load(target, top_k=1)
        run = DecodeRun(fewer, prompts=DEMO_PROMPTS, tokens_per_prompt=8).run()
        cost = quality_cost(own, fewer, prompts=DEMO_PROMPTS, tokens=8, fast_result=run)
    assert report["top_k"] == 1 and report["output_sha256"] == run.output_sha256
    assert report["quality"] == json.loads(json.dumps(cost.to_dict()))
    loads.clear()
    assert main([*args, "--top-k", "3"]) == 0  # more than its own: loaded with them, and again for the reference
    report = json.loads(capsys.readouterr().out)
    assert loads == [3, 2] and report["top_k"] == 3 and report["quality"]["native_top_k"] == 2


def test_a_divergence_replays_a_run_of_fewer_experts_with_its_own_count(engine):
    """engine.runs.diverge re-computes a side's top-2 logits by replaying its ids: for a run that decoded with fewer
    experts than loaded, with that count (a model loaded with it gives the same choice), not the loaded one."""
    from engine.runs.diverge import replay_choice

    ids = [int(t) for t in np.load(FIXTURES / "qwen3moe-f32" / "reference.npz")["generated_ids"][:6]]
    model = engine.load(FIXTURES / "qwen3moe-f32")
    one = engine.load(FIXTURES / "qwen3moe-f32", top_k=1)
    try:
        for index in (0, 3, 5):
            fewer = replay_choice(model, PROMPTS[0], ids, index, top_k=1)
            assert fewer == replay_choice(one, PROMPTS[0], ids, index, top_k=1)
            assert replay_choice(model, PROMPTS[0], ids, index) != fewer  # two experts per token: other logits
    finally:
        one.close()
        model.close()
