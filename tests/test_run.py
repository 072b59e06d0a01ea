"""Decode runs: events that add up to the result, hashes, cancel from another thread, bad input."""

import hashlib
import json
import struct
import threading

import pytest
from fixture_paths import FIXTURES
from quantized_fixtures import q8_0_gguf

from engine.checkpoints.demo import ensure_demo_pair
from engine.core.errors import ArgumentError, RangeError, StateError
from engine.model import Engine
from engine.runs.run import DecodeRun, StepEvent

PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Mixture of experts"]


@pytest.fixture(scope="session")
def demo_pair(tmp_path_factory):
    # The same folder as the other test files use, so the pair is built once per session.
    return ensure_demo_pair("default", cache_dir=tmp_path_factory.getbasetemp() / "xdg-cache" / "expertbench")


@pytest.fixture
def fixture_pair():
    with Engine() as eng:
        yield eng.load(FIXTURES / "qwen3moe-f32"), eng.load(FIXTURES / "qwen3-f32")


def _sums(events: list[StepEvent]) -> tuple[int, int, int]:
    return sum(e.tokens for e in events), sum(e.drafted for e in events), sum(e.accepted for e in events)


@pytest.mark.parametrize("with_draft", [True, False], ids=["draft", "no-draft"])
def test_events_add_up_to_the_result(fixture_pair, with_draft):
    target, draft = fixture_pair
    events = []
    run = DecodeRun(target, draft if with_draft else None, prompts=PROMPTS, tokens_per_prompt=20, repeats=2, q=3,
                    on_event=events.append)  # fmt: skip
    res = run.run()
    tokens, drafted, accepted = _sums(events)
    assert tokens == res.generated_tokens == 2 * 2 * 20
    assert (drafted, accepted) == (res.drafted_tokens, res.accepted_tokens)
    assert sum(r.decode_tokens for r in res.repeat_results) == sum(e.tokens for e in events if e.phase == "decode")
    assert [e.phase for e in events].count("prefill") == 4
    assert all(0 <= e.accepted <= e.drafted <= 3 for e in events)
    assert [e.time for e in events] == sorted(e.time for e in events)
    if with_draft:
        assert res.q == 3 and drafted > 0 and res.accept_rate == accepted / drafted
    else:
        assert res.q is None and drafted == 0 and res.accept_rate is None
    # Each prompt's ids, as the events streamed them, are the output the hash covers.
    for p, prompt in enumerate(res.prompts):
        streamed = [i for e in events if e.repeat == 0 and e.prompt == p for i in e.ids]
        assert streamed == prompt.generated_ids
        packed = struct.pack(f"<{len(streamed)}i", *streamed)
        assert prompt.output_sha256 == hashlib.sha256(packed).hexdigest() == res.output_sha256[p]
    assert res.repeats_agree and not res.cancelled
    assert 0 < res.decode_tokens_per_second_min <= res.decode_tokens_per_second <= res.decode_tokens_per_second_max
    assert res.prefill_tokens_per_second > 0
    assert res.device_busy_share["cpu:0"] > 0  # one device: nothing staged, nothing joined
    assert res.staging_bytes == {} and res.joins == 0 and res.waits == {}
    json.dumps(res.to_dict(), allow_nan=False)


def test_draft_and_plain_runs_hash_the_same(fixture_pair):
    target, draft = fixture_pair
    plain = DecodeRun(target, prompts=PROMPTS, tokens_per_prompt=24).run()
    for q in (1, 2, 4, 8):
        spec = DecodeRun(target, draft, prompts=PROMPTS, tokens_per_prompt=24, q=q).run()
        assert spec.output_sha256 == plain.output_sha256, q


def test_prompts_as_token_ids(fixture_pair):
    target, _ = fixture_pair
    by_text = DecodeRun(target, prompts=PROMPTS, tokens_per_prompt=8).run()
    by_ids = DecodeRun(target, prompts=[target.encode(p) for p in PROMPTS], tokens_per_prompt=8).run()
    assert by_ids.output_sha256 == by_text.output_sha256
    assert [p.prompt_tokens for p in by_ids.prompts] == [len(target.encode(p)) for p in PROMPTS]


def test_one_token_per_prompt_has_no_decode_speed(fixture_pair):
    target, draft = fixture_pair
    res = DecodeRun(target, draft, prompts=PROMPTS, tokens_per_prompt=1).run()
    assert res.generated_tokens == 2 and res.drafted_tokens == 0
    assert res.to_dict()["decode_tokens_per_second"] is None  # NaN in the object, null in JSON


def test_cancel_from_another_thread_mid_run(demo_pair):
    with Engine() as eng:
        target, draft = eng.load(demo_pair.target), eng.load(demo_pair.draft)
        events = []
        midway = threading.Event()

        def on_event(e):
            events.append(e)
            if len(events) == 10:
                midway.set()

        run = DecodeRun(target, draft, tokens_per_prompt=200, repeats=50, q=2, on_event=on_event).start()
        assert midway.wait(60)
        run.cancel()
        res = run.wait(60)
        assert res is not None and not run.running
        assert res.cancelled and run.cancelled
        tokens, drafted, accepted = _sums(events)
        assert (tokens, drafted, accepted) == (res.generated_tokens, res.drafted_tokens, res.accepted_tokens)
        assert tokens < 200 * 4 * 50
        assert not res.repeat_results[-1].complete
        json.dumps(res.to_dict(), allow_nan=False)
        # The engine and both models are still usable, and give the same output as an undisturbed run.
        again = DecodeRun(target, draft, tokens_per_prompt=16).run()
        plain = DecodeRun(target, None, tokens_per_prompt=16).run()
        assert again.output_sha256 == plain.output_sha256 and not again.cancelled


def test_cancel_before_start_runs_nothing(fixture_pair):
    target, draft = fixture_pair
    run = DecodeRun(target, draft, prompts=PROMPTS, tokens_per_prompt=8)
    run.cancel()
    res = run.run()
    assert res.cancelled and res.generated_tokens == 0 and res.prompts == []


def test_callback_errors_reach_the_caller_and_free_the_caches(fixture_pair):
    target, draft = fixture_pair

    def broken(event):
        raise RuntimeError("the callback broke")

    run = DecodeRun(target, draft, prompts=PROMPTS, tokens_per_prompt=8, on_event=broken).start()
    with pytest.raises(RuntimeError, match="the callback broke"):
        run.wait(30)
    assert target._contexts == [] and draft._contexts == []


def test_a_run_object_runs_once(fixture_pair):
    target, _ = fixture_pair
    run = DecodeRun(target, prompts=PROMPTS, tokens_per_prompt=2)
    run.run()
    with pytest.raises(StateError, match="already been started"):
        run.run()
    with pytest.raises(StateError, match="not start"):
        DecodeRun(target, prompts=PROMPTS).wait()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"tokens_per_prompt": 0}, ArgumentError, r"tokens per prompt = 0: expected a positive integer"),
        ({"repeats": 0}, ArgumentError, r"repeats = 0: expected a positive integer"),
        ({"repeats": 10_001}, RangeError, r"repeats = 10001: at most 10000 passes over the prompts in one run"),
        ({"repeats": 2**70}, RangeError, r"repeats = 1180591620717411303424: at most 10000 passes"),
        ({"q": 0}, RangeError, r"q = 0 out of range: expected an integer 1\.\.8"),
        ({"q": 9}, RangeError, r"q = 9 out of range: expected an integer 1\.\.8"),
        ({"prompts": []}, ArgumentError, "the prompt list is empty"),
        ({"prompts": "just one string"}, ArgumentError, "must be a list"),
        ({"prompts": ["fine", ""]}, ArgumentError, "prompt 1 is empty"),
        ({"prompts": [[]]}, ArgumentError, "prompt 0: token ids are empty"),
        ({"prompts": [[1, 512]]}, RangeError, r"prompt 0: token id 512 out of range: expected 0\.\.511"),
        ({"tokens_per_prompt": 250}, RangeError, "more than the target's max_position_embeddings"),
        ({"mode": "fast"}, ArgumentError, "reduction mode 'fast' is unknown: expected one of reference, owner_local"),
        ({"precision": "q4"}, ArgumentError, "precision 'q4' is unknown: expected one of f32, q8"),
        ({"placement": "0=cpu:7"}, RangeError, "no device named 'cpu:7'"),
        ({"placement": "nonsense"}, ArgumentError, "placement rule 'nonsense': expected LAYERS=DEVICE"),
        ({"placement": "1=cpu:0"}, ArgumentError, r"no MoE layer in 1 \(dense layers have no experts\)"),
    ],
)
def test_bad_input_is_refused_before_the_run(fixture_pair, kwargs, error, match):
    target, draft = fixture_pair
    with pytest.raises(error, match=match):
        DecodeRun(target, draft, **{"prompts": PROMPTS, **kwargs})
    assert target._contexts == [] and draft._contexts == []


def test_vocab_mismatch_is_refused_before_the_run(demo_pair):
    with Engine() as eng:
        target, draft = eng.load(FIXTURES / "qwen3moe-f32"), eng.load(demo_pair.draft)
        with pytest.raises(ArgumentError, match="vocab_size 4096, the target .* has 512"):
            DecodeRun(target, draft, prompts=PROMPTS)


def test_placement_and_mode_apply_and_counters_report(demo_pair):
    """Experts spread over cpu:0, cpu:1 and the host-staged hostsim:0, the draft on cpu:1: same hashes as the
    one-device run in both reduction modes, and the counters show the experts' traffic."""
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, cpu_threads=1) as eng:
        target, draft = eng.load(demo_pair.target), eng.load(demo_pair.draft, device="cpu:1")
        one = DecodeRun(target, tokens_per_prompt=24).run()
        assert one.placement == "0-7=cpu:0" and one.staging_bytes == {} and one.joins == 0
        for mode in ("reference", "owner_local"):
            res = DecodeRun(
                target, draft, tokens_per_prompt=24, q=3, mode=mode, placement="0-3=cpu:1; 4=hostsim:0"
            ).run()
            assert res.mode == mode and res.output_sha256 == one.output_sha256
            assert res.placement == target.placement.describe() == "0-3=cpu:1; 4=hostsim:0; 5-7=cpu:0"
            assert res.staging_bytes["cpu:0->hostsim:0"] > 0 and res.staging_bytes["hostsim:0->cpu:0"] > 0
            assert set(res.waits) == {"cpu:1", "hostsim:0"} and res.joins > 0
            assert set(res.device_busy_share) >= {"cpu:0", "cpu:1", "hostsim:0"}
            json.dumps(res.to_dict(), allow_nan=False)
        # owner_local pre-sums on the owner: fewer bytes come back from the peer than in reference mode
        ref = DecodeRun(target, tokens_per_prompt=8, mode="reference").run()
        local = DecodeRun(target, tokens_per_prompt=8, mode="owner_local").run()
        assert local.staging_bytes["hostsim:0->cpu:0"] < ref.staging_bytes["hostsim:0->cpu:0"]


def test_dense_target_has_no_placement(fixture_pair):
    _, dense = fixture_pair
    assert DecodeRun(dense, prompts=PROMPTS, tokens_per_prompt=2).run().placement is None
    with pytest.raises(ArgumentError, match="no experts to place"):
        DecodeRun(dense, prompts=PROMPTS, placement="0=cpu:0")


@pytest.fixture
def quantized_pair(tmp_path):
    """The fixture pair as Q8_0 GGUF files (every matrix Q8_0; norms and the router F32, as llama.cpp keeps them)."""
    return [q8_0_gguf(FIXTURES / name, tmp_path / f"{name}-q8_0.gguf") for name in ("qwen3moe-f32", "qwen3-f32")]


def _contexts_made(monkeypatch, model) -> list:
    made = []
    real = model.context

    def context(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(model, "context", context)
    return made


def test_precision_is_set_on_both_caches_and_reported(quantized_pair, monkeypatch):
    """q8 runs both the target's and the draft's caches with int8 activations: another output than f32 on quantized
    weights, deterministic, the same on every placement over CPU devices, and speculative decoding still gives the
    target's own greedy output in that precision."""
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, cpu_threads=1) as eng:
        target, draft = eng.load(quantized_pair[0]), eng.load(quantized_pair[1])
        greedy = {p: DecodeRun(target, prompts=PROMPTS, tokens_per_prompt=24, precision=p).run() for p in ("f32", "q8")}
        assert greedy["f32"].precision == "f32" and greedy["q8"].precision == "q8"
        assert greedy["q8"].output_sha256 != greedy["f32"].output_sha256  # the quantized activations really ran
        made_target = _contexts_made(monkeypatch, target)
        made_draft = _contexts_made(monkeypatch, draft)
        res = DecodeRun(target, draft, prompts=PROMPTS, tokens_per_prompt=24, repeats=2, q=3, precision="q8",
                        placement="0=cpu:1; 2=hostsim:0").run()  # fmt: skip
        assert [c.precision for c in made_target + made_draft] == ["q8", "q8"]
        assert res.precision == "q8" and res.to_dict()["precision"] == "q8" and res.repeats_agree
        assert res.output_sha256 == greedy["q8"].output_sha256
