"""Speculative decoding gives exactly target-only greedy output, for every q and on several device layouts."""

import json
import shutil

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.checkpoints.demo import DEMO_PROMPTS, ensure_demo_pair
from engine.core.errors import ArgumentError, RangeError
from engine.model import Engine
from engine.runs.run import output_sha256
from engine.runs.speculative import GreedyDecoder, SpeculativeDecoder, check_draft_q, generate

PROMPT = "The quick brown fox jumps over the lazy dog. Mixture of experts"
N = 48


@pytest.fixture(scope="session")
def demo_pair(tmp_path_factory):
    # The same folder as the other test files use, so the pair is built once per session.
    return ensure_demo_pair("default", cache_dir=tmp_path_factory.getbasetemp() / "xdg-cache" / "expertbench")


def _greedy(model, prompt_ids, n):
    with model.context(len(prompt_ids) + n) as ctx:
        return ctx.generate(prompt_ids, n).ids


@pytest.mark.parametrize("q", [1, 2, 4, 8])
@pytest.mark.parametrize("devices", [("cpu:0", "cpu:1"), ("cpu:1", "cpu:0")], ids=["draft-on-cpu1", "draft-on-cpu0"])
def test_fixture_pair_matches_greedy(q, devices):
    with Engine(cpu_devices=2, cpu_threads=1) as eng:
        target = eng.load(FIXTURES / "qwen3moe-f32", device=devices[0])
        draft = eng.load(FIXTURES / "qwen3-f32", device=devices[1])
        ids = target.encode(PROMPT)
        plain = _greedy(target, ids, N)
        with target.context(len(ids) + N) as tc, draft.context(len(ids) + N) as dc:
            spec = generate(tc, dc, ids, N, q)
        assert output_sha256(spec) == output_sha256(plain)
        ref = np.load(FIXTURES / "qwen3moe-f32" / "reference.npz")["generated_ids"][:N].tolist()
        assert spec == ref  # and both equal transformers' own greedy tokens


@pytest.mark.parametrize("placement", ["*=cpu:1", "0=cpu:1; 2=hostsim:0", "*=cpu:0; 0.1-4=hostsim:0; 2.5=cpu:1"])
@pytest.mark.parametrize("mode", ["reference", "owner_local"])
def test_expert_placements_match_greedy(placement, mode):
    """The target's experts spread over devices (the draft on cpu:1): every q still gives the greedy output."""
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, cpu_threads=1) as eng:
        target = eng.load(FIXTURES / "qwen3moe-f32")
        draft = eng.load(FIXTURES / "qwen3moe-bf16", device="cpu:1")  # a MoE draft, its experts on cpu:1
        target.set_placement(placement)
        draft.set_placement("*=cpu:1")
        ids = target.encode(PROMPT)
        with target.context(len(ids) + N) as tc, draft.context(len(ids) + N) as dc:
            tc.mode = dc.mode = mode
            plain = generate(tc, None, ids, N)
            for q in (1, 2, 4, 8):
                assert output_sha256(generate(tc, dc, ids, N, q)) == output_sha256(plain), q


def test_moe_draft_and_bf16_pair():
    """A MoE model can draft too; and the bf16 pair (sharded target) gives its own greedy output."""
    with Engine() as eng:
        for target_dir, draft_dir in (("qwen3moe-f32", "qwen3moe-bf16"), ("qwen3moe-bf16", "qwen3-bf16")):
            target, draft = eng.load(FIXTURES / target_dir), eng.load(FIXTURES / draft_dir)
            ids = target.encode(PROMPT)
            plain = _greedy(target, ids, N)
            with target.context(len(ids) + N) as tc, draft.context(len(ids) + N) as dc:
                for q in (1, 3, 8):
                    assert generate(tc, dc, ids, N, q) == plain, (target_dir, draft_dir, q)


@pytest.mark.parametrize("devices", [("cpu:0", "cpu:1"), ("cpu:1", "cpu:0")], ids=["draft-on-cpu1", "draft-on-cpu0"])
def test_demo_pair_matches_greedy(demo_pair, devices):
    with Engine(cpu_devices=2, cpu_threads=1) as eng:
        target = eng.load(demo_pair.target, device=devices[0])
        draft = eng.load(demo_pair.draft, device=devices[1])
        for prompt in DEMO_PROMPTS[:2]:
            ids = target.encode(prompt)
            plain = _greedy(target, ids, N)
            with target.context(len(ids) + N) as tc, draft.context(len(ids) + N) as dc:
                for q in (1, 2, 4, 8):
                    assert output_sha256(generate(tc, dc, ids, N, q)) == output_sha256(plain), (prompt, q)


def test_caches_hold_exactly_the_accepted_prefix(demo_pair):
    """After every step the target holds ids[:-1] and the draft a prefix of it, with the same contents as a
    fresh prefill of those ids (checked through the next position's logits, which batching leaves bit-equal)."""
    with Engine() as eng:
        target, draft = eng.load(demo_pair.target), eng.load(demo_pair.draft)
        ids = target.encode(DEMO_PROMPTS[0])
        with target.context(256) as tc, draft.context(256) as dc, draft.context(256) as fresh:
            dec = SpeculativeDecoder(tc, dc, 3)
            dec.start(ids)
            full_acceptances = rejections = 0
            for _ in range(12):
                step = dec.step(64)
                full_acceptances += step.accepted == step.drafted
                rejections += step.accepted < step.drafted
                assert tc.position == len(dec.ids) - 1
                assert dc.position <= tc.position
                held = dec.ids[: dc.position]
                fresh.truncate(0)
                expect = fresh.prefill(held + [dec.ids[dc.position]], all_rows=False)
                base = dc.position
                got = dc.decode([dec.ids[dc.position]])[0]
                dc.truncate(base)
                np.testing.assert_array_equal(got, expect)
            assert full_acceptances and rejections  # both paths of the bookkeeping were taken


def test_greedy_decoder_is_the_plain_baseline():
    with Engine() as eng:
        target = eng.load(FIXTURES / "qwen3moe-f32")
        ids = target.encode(PROMPT)
        with target.context(128) as tc:
            dec = GreedyDecoder(tc)
            out = [dec.start(ids)]
            while len(out) < N:
                out += dec.step(N - len(out)).tokens
            assert out == _greedy(target, ids, N)
            assert generate(tc, None, ids, N) == out


@pytest.mark.parametrize("q", [0, 9, -1, 2.0, True, None])
def test_q_out_of_range(q):
    with pytest.raises(RangeError, match=r"draft length q = .* expected an integer 1\.\.8"):
        check_draft_q(q)
    with Engine() as eng:
        target, draft = eng.load(FIXTURES / "qwen3moe-f32"), eng.load(FIXTURES / "qwen3-f32")
        with target.context(64) as tc, draft.context(64) as dc, pytest.raises(RangeError, match="draft length"):
            SpeculativeDecoder(tc, dc, q)


def test_vocab_size_mismatch_is_refused(demo_pair):
    with Engine() as eng:
        target, draft = eng.load(FIXTURES / "qwen3moe-f32"), eng.load(demo_pair.draft)
        with target.context(64) as tc, draft.context(64) as dc:
            with pytest.raises(ArgumentError, match="has vocab_size 4096, the target .* has 512"):
                SpeculativeDecoder(tc, dc, 2)
            assert tc.position == 0 and dc.position == 0  # refused before anything ran


def test_tokenizer_mismatch_is_refused(tmp_path):
    """Same vocab_size, but two tokens swap ids: the ids would mean different text, so the pair is refused."""
    other = tmp_path / "qwen3-swapped-tokens"
    shutil.copytree(FIXTURES / "qwen3-f32", other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = "\u0120the", "The"  # "\u0120" is the byte-level BPE mark of a leading space
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    expect = r"different tokenizers \(2 of 512 tokens differ, e.g. 'The': id \d+ in the target, \d+ in the draft"
    with Engine() as eng:
        target, draft = eng.load(FIXTURES / "qwen3moe-f32"), eng.load(other)
        with target.context(64) as tc, draft.context(64) as dc, pytest.raises(ArgumentError, match=expect):
            SpeculativeDecoder(tc, dc, 2)


def test_generate_rejects_zero_tokens_and_empty_prompt():
    with Engine() as eng:
        target, draft = eng.load(FIXTURES / "qwen3moe-f32"), eng.load(FIXTURES / "qwen3-f32")
        with target.context(64) as tc, draft.context(64) as dc:
            with pytest.raises(ArgumentError, match="positive integer, got 0"):
                generate(tc, dc, [1, 2], 0)
            with pytest.raises(ArgumentError, match="empty"):
                generate(tc, dc, [], 4)
