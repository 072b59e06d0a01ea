"""DeepSeek-V3's multi-token-prediction (MTP) layer as a draft inside the target's checkpoint (--draft self).

The fixture deepseek-bf16 holds one, as the released folders do (layer 4 = num_hidden_layers, its tensors in
model-mtp.safetensors); reference-mtp.npz is transformers' MtpModel on it (tests/fixtures/recipes/deepseek_mtp.py).
"""

import json
import shutil

import numpy as np
import pytest
from fixture_paths import FIXTURES
from fixture_registry import BY_NAME

from engine.checkpoints.checkpoint import Checkpoint
from engine.core.errors import ArgumentError, CheckpointError, EngineError, UnsupportedError
from engine.model import Engine
from engine.runs.run import DecodeRun
from engine.runs.speculative import NextTokenDecoder, generate
from engine.session import open_pair

FOLDER = FIXTURES / "deepseek-bf16"
N = 40
PROMPT_LEN = 27  # the reference's prompt; its ids then the reference's greedy tokens


@pytest.fixture(scope="module")
def ref():
    return np.load(BY_NAME["deepseek-bf16"].next_token_reference)


def test_module_matches_transformers(ref):
    """The target's hidden states after its final norm, and the module's logits and states on them, are
    transformers' (its MtpModel over DeepseekV3ForCausalLM, float32, on the bf16 weights)."""
    ck = Checkpoint.open(FOLDER)
    assert ck.has_next_token_module and "model.layers.4.eh_proj.weight" not in ck.tensors
    ids = ref["ids"]
    with Engine() as eng:
        target, module = eng.load(ck), eng.load(ck.next_token_module())
        assert module.config.num_layers == 1 and module.config.next_token_module
        with target.context(len(ids)) as tc, module.context(len(ids)) as mc:
            logits, hidden = tc.eval_hidden(ids, all_rows=True)
            np.testing.assert_allclose(hidden, ref["hidden"], atol=1e-5, rtol=0)
            mlogits, mhidden = mc.eval_hidden(ids[1:], all_rows=True, hidden_in=hidden[:-1])
    np.testing.assert_allclose(mlogits, ref["mtp_logits"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(mhidden, ref["mtp_hidden"], atol=1e-5, rtol=0)
    assert (np.argmax(mlogits, axis=1) == np.argmax(ref["mtp_logits"], axis=1)).all()


def test_hidden_states_of_a_last_row_prefill_are_every_row(ref):
    """A prefill that keeps the last row's logits only still gives every position's state, in chunks of n_batch."""
    ids = ref["ids"]
    with Engine() as eng:
        target = eng.load(FOLDER)
        with target.context(len(ids), n_batch=16) as tc:
            last, hidden = tc.eval_hidden(ids, all_rows=False)
    np.testing.assert_allclose(hidden, ref["hidden"], atol=1e-5, rtol=0)
    assert last.shape == (target.config.vocab_size,)


@pytest.mark.parametrize("q", [1, 2, 3, 8])
def test_self_draft_equals_greedy_and_proposes_the_modules_tokens(q, ref):
    """Speculative output is target-only greedy output; each step's first proposal is the argmax of the module's
    logits at the newest token (transformers' module on the target's states), so the states reach it right; the
    second is the module's next position read with its own state after the first proposal (a fresh context fed the
    reference's pairs, then that one)."""
    ck = Checkpoint.open(FOLDER)
    ids, hidden = ref["ids"], ref["hidden"]
    prompt = ids[:PROMPT_LEN].tolist()
    expect_first = np.argmax(ref["mtp_logits"], axis=1)
    with Engine() as eng:
        target, module = eng.load(ck), eng.load(ck.next_token_module())
        n_ctx = PROMPT_LEN + N + q
        with target.context(n_ctx) as tc, module.context(n_ctx) as mc, module.context(n_ctx) as check:
            plain = generate(tc, None, prompt, N)
            assert plain == ids[PROMPT_LEN : PROMPT_LEN + N].tolist()
            decoder = NextTokenDecoder(tc, mc, q)
            out = [decoder.start(prompt)]
            steps = chained = 0
            while len(out) < N:
                at = len(decoder.ids)
                step = decoder.step(N - len(out))
                if step.proposals:
                    assert step.proposals[0] == expect_first[at - 2], (at, step.proposals)
                    steps += 1
                if len(step.proposals) > 1 and chained < 4:
                    check.truncate(0)
                    _, state = check.eval_hidden(ids[1:at], all_rows=False, hidden_in=hidden[: at - 1])
                    second, _ = check.eval_hidden(step.proposals[:1], hidden_in=state[-1:])
                    assert step.proposals[1] == int(np.argmax(second[0])), at
                    chained += 1
                out.extend(step.tokens)
            assert out == plain and steps > 5 and chained == (4 if q > 1 else 0)


def test_self_draft_after_a_context_and_on_repeated_prompts(ref):
    """A context prefilled once (a run at a depth), then several prompts after it: each output is greedy's."""
    ck = Checkpoint.open(FOLDER)
    ids = ref["ids"][:PROMPT_LEN].tolist()
    context, prompts = ids[:9], [ids[9:], ids[15:], ids[9:20]]
    with Engine() as eng:
        target, module = eng.load(ck), eng.load(ck.next_token_module())
        with target.context(64) as tc, module.context(64) as mc:
            decoder = NextTokenDecoder(tc, mc, 3)
            decoder.begin(context)
            outs = []
            for prompt in prompts:
                out = [decoder.start(prompt)]
                while len(out) < 20:
                    out.extend(decoder.step(20 - len(out)).tokens)
                outs.append(out)
            for prompt, out in zip(prompts, outs, strict=True):
                tc.truncate(0)
                assert out == generate(tc, None, context + prompt, 20)


@pytest.mark.parametrize("placement", ["*=cpu:1", "0.0-7=hostsim:0", "0.0-5=cpu:1; 0.6-11=hostsim:0"])
def test_modules_experts_placed_like_any_experts(placement, ref):
    """The module's 16 experts anywhere (another CPU device, the hostsim runtime): its logits are the same bits (the
    reference mode's fixed order) and the run's output is greedy's."""
    ck = Checkpoint.open(FOLDER)
    ids = ref["ids"]
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, cpu_threads=1) as eng:
        target, module = eng.load(ck), eng.load(ck.next_token_module())
        with target.context(len(ids)) as tc:
            _, hidden = tc.eval_hidden(ids, all_rows=True)
        with module.context(len(ids)) as mc:
            home, _ = mc.eval_hidden(ids[1:], all_rows=True, hidden_in=hidden[:-1])
        module.set_placement(placement)
        with module.context(len(ids)) as mc:
            moved, _ = mc.eval_hidden(ids[1:], all_rows=True, hidden_in=hidden[:-1])
        assert np.array_equal(home, moved)
        run = DecodeRun(target, module, prompts=[ids[:PROMPT_LEN].tolist()], tokens_per_prompt=24, q=2)
        result = run.run()
        plain = DecodeRun(target, None, prompts=[ids[:PROMPT_LEN].tolist()], tokens_per_prompt=24).run()
        assert result.output_sha256 == plain.output_sha256
        assert result.drafted_tokens > 0 and "multi-token-prediction module" in result.draft
        counts, tokens = module.routing_counts()
        assert tokens.sum() > 0 and counts.sum() == tokens.sum() * module.config.top_k  # counted as the module's


def test_open_pair_self_draft_and_the_command_line(capsys):
    from engine.cli import main

    with Engine() as eng:
        pair = open_pair(eng, FOLDER, "self")
        try:
            assert pair.draft.config.next_token_module and pair.draft.checkpoint.folder == FOLDER
        finally:
            pair.close()
    run = ["run", "--model", str(FOLDER), "-n", "12", "--repeats", "1", "--json"]
    assert main([*run, "--draft", "self"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "multi-token-prediction module" in report["draft"] and report["drafted_tokens"] > 0
    assert main([*run, "--no-draft"]) == 0
    assert report["output_sha256"] == json.loads(capsys.readouterr().out)["output_sha256"]


# ---- what is refused, and how ------------------------------------------------------------------------------


def test_a_folder_without_a_module_is_refused_by_name():
    with pytest.raises(CheckpointError, match=r"holds no multi-token-prediction module.*give a draft model instead"):
        Checkpoint.open(FIXTURES / "deepseek-f32").next_token_module()
    with Engine() as eng, pytest.raises(CheckpointError, match="deepseek-f32' holds no multi-token-prediction"):
        open_pair(eng, FIXTURES / "deepseek-f32", "self")


def test_another_family_with_extra_layers_is_refused(tmp_path):
    ck = Checkpoint.open(FIXTURES / "qwen3moe-f32")
    with pytest.raises(CheckpointError, match="holds no multi-token-prediction module"):
        ck.next_token_module()
    fake = Checkpoint(ck.folder, ck.config, ck.tensors, ck.files, ck.tokenizer, ck.raw_config, dict(ck.tensors))
    with pytest.raises(UnsupportedError, match="module of a Qwen3-MoE model is not supported"):
        fake.next_token_module()


def _copy_with(tmp_path, edit):
    """deepseek-bf16 with its module's shard rewritten by edit(tensors): name -> (dtype, array of the values' bits)."""
    dst = tmp_path / "ds"
    shutil.copytree(FOLDER, dst)
    shard = dst / "model-mtp.safetensors"
    raw = shard.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    body = raw[8 + n :]
    bits = {"BF16": np.uint16, "F32": np.uint32}
    tensors = {}
    for name, d in header.items():
        a, b = d["data_offsets"]
        tensors[name] = (d["dtype"], np.frombuffer(body[a:b], dtype=bits[d["dtype"]]).reshape(d["shape"]))
    edit(tensors)
    out, data = {}, b""
    for name, (dtype, arr) in tensors.items():
        chunk = np.ascontiguousarray(arr).tobytes()
        out[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [len(data), len(data) + len(chunk)]}
        data += chunk
    text = json.dumps(out).encode()
    text += b" " * (-len(text) % 8)
    shard.write_bytes(len(text).to_bytes(8, "little") + text + data)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != shard.name or k in tensors}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst


def test_a_module_missing_its_projection_names_the_tensor(tmp_path):
    dst = _copy_with(tmp_path, lambda t: t.pop("model.layers.4.eh_proj.weight"))
    with pytest.raises(CheckpointError, match=r"layer 4 has no tensor 'model.layers.4.eh_proj.weight'"):
        Checkpoint.open(dst).next_token_module()


def test_a_projection_of_the_wrong_shape_names_the_tensor_in_the_file(tmp_path):
    def edit(t):
        dtype, arr = t["model.layers.4.eh_proj.weight"]
        t["model.layers.4.eh_proj.weight"] = (dtype, arr[:, :96])

    dst = _copy_with(tmp_path, edit)
    ck = Checkpoint.open(dst)
    with Engine() as eng, pytest.raises(EngineError, match=r"'model.layers.4.eh_proj.weight' \(read as 'model.mtp"):
        eng.load(ck.next_token_module())
    with Engine() as eng:  # the engine survives and the model itself still loads
        assert eng.load(ck).config.num_layers == 4


def test_hidden_states_are_checked(ref):
    ck = Checkpoint.open(FOLDER)
    ids = ref["ids"][:8]
    with Engine() as eng:
        target, module = eng.load(ck), eng.load(ck.next_token_module())
        with target.context(16) as tc, module.context(16) as mc:
            with pytest.raises(ArgumentError, match="reads the target's hidden state beside its token"):
                mc.prefill(ids)
            with pytest.raises(ArgumentError, match=r"hidden_in has shape \(7, 64\), expected \(8, 64\)"):
                mc.eval_hidden(ids, hidden_in=np.zeros((7, 64)))
            with pytest.raises(ArgumentError, match="this model reads token ids alone"):
                tc.eval_hidden(ids, hidden_in=np.zeros((8, 64)))
            assert tc.position == mc.position == 0  # nothing appended by a refused call
            with pytest.raises(ArgumentError, match="not a multi-token-prediction module"):
                NextTokenDecoder(tc, tc, 2)


def test_a_module_of_another_checkpoint_is_refused(tmp_path):
    other = tmp_path / "other"
    shutil.copytree(FOLDER, other)
    with Engine() as eng:
        target = eng.load(FOLDER)
        module = eng.load(Checkpoint.open(other).next_token_module())
        with pytest.raises(ArgumentError, match="a module drafts from its own model's hidden states"):
            DecodeRun(target, module, prompts=[[1, 2, 3]], tokens_per_prompt=4)


# ---- profiles: `draft: {self: true}` ------------------------------------------------------------------------


def _profile(tmp_path, draft: str, version: int = 5) -> str:
    path = tmp_path / "mtp.yaml"
    path.write_text(f"expertbench_profile: {version}\nmodel: {{path: {FOLDER}}}\ndraft: {draft}\n"
                    "devices: {cpu: {devices: 2, threads: 1}}\nplacement: {layers: {3: cpu:1}}\n"
                    "run: {prompts: [[1, 2, 3, 4], [5, 6, 7]], tokens: 6, repeats: 1, q: 2}\n")  # fmt: skip
    return str(path)


def test_a_profile_with_the_models_own_draft_records_and_replays(tmp_path, capsys):
    from engine.cli import main
    from engine.profiles import profile as P

    path = _profile(tmp_path, "{self: true, device: cpu:1}")
    assert main(["regress", "--record", path]) == 0
    loaded = P.load(path)
    assert loaded.draft.own and loaded.draft.device == "cpu:1" and loaded.draft.path is None
    assert loaded.expectations.output_sha256 and loaded.expectations.min_accept_rate is not None
    assert "self: true" in (tmp_path / "mtp.yaml").read_text()
    capsys.readouterr()
    assert main(["regress", path]) == 0
    assert "mtp      ok" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("draft", "version", "message"),
    [
        ("{self: false}", 5, r"mtp.yaml:3: draft.self: expected true .* leave 'draft' out for none"),
        ("{self: yes please}", 5, r"draft.self: expected true"),
        (f"{{self: true, path: {FOLDER}}}", 5, r"draft.path: a draft of the model's own \('self: true'\) is its"),
        ("{self: true}", 4, r"draft.self: the model's own draft needs format version 5"),
        ("{}", 5, r"give exactly one of 'path' .* or 'demo' .* or 'self: true'"),
    ],
)
def test_a_bad_self_draft_in_a_profile_is_refused_at_its_line(tmp_path, draft, version, message):
    from engine.profiles import profile as P

    with pytest.raises(P.ProfileError, match=message):
        P.load(_profile(tmp_path, draft, version))


def test_the_target_takes_no_self_key(tmp_path):
    from engine.profiles import profile as P

    path = tmp_path / "bad.yaml"
    path.write_text(f"expertbench_profile: 5\nmodel: {{path: {FOLDER}, self: true}}\n")
    with pytest.raises(P.ProfileError, match="self"):
        P.load(path)
