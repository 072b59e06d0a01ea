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


class OracleModule:
    """The module's context as the decoder drives it, its logits replaced: its position j proposes the greedy token at
    j + 2 (the sequence's), wrong at every `wrong`-th position, so that steps accept all, some or none of their
    proposals; each call's positions and hidden_in are recorded."""

    def __init__(self, ctx, sequence, wrong: int):
        self.ctx, self.sequence, self.wrong = ctx, sequence, wrong
        self.calls = []

    def __getattr__(self, name):
        return getattr(self.ctx, name)

    def eval_hidden(self, ids, all_rows=True, hidden_in=None, hidden_out=True):
        at = self.ctx.position
        logits, state = self.ctx.eval_hidden(ids, all_rows, hidden_in, hidden_out)
        self.calls.append((at, list(ids), None if hidden_in is None else np.array(hidden_in), all_rows))
        rows = []
        for j in range(at, at + len(ids)):
            row = np.zeros(logits.shape[-1], dtype=np.float32)
            good = self.sequence[j + 2] if j + 2 < len(self.sequence) else 0
            row[good if j % self.wrong else (good + 1) % len(row)] = 1.0
            rows.append(row)
        return (np.stack(rows) if all_rows else rows[-1]), state


@pytest.mark.parametrize("context", [0, 1, 9])
def test_accepted_proposals_and_the_states_the_module_reads(context, ref):
    """With proposals that the target accepts (all, some, none of a step's), the output is greedy's and every
    position the module reads from the target carries the target's state there (transformers' hidden states of the
    reference sequence): after a context, across acceptances and rejections, and the chained positions read again."""
    ck = Checkpoint.open(FOLDER)
    ids, hidden = ref["ids"], ref["hidden"]
    n = 40
    with Engine() as eng:
        target, module = eng.load(ck), eng.load(ck.next_token_module())
        with target.context(PROMPT_LEN + n + 4) as tc, module.context(PROMPT_LEN + n + 4) as mc:
            oracle = OracleModule(mc, ids, wrong=7)
            decoder = NextTokenDecoder(tc, oracle, 3)
            decoder.begin(ids[:context].tolist())
            out = [decoder.start(ids[context:PROMPT_LEN].tolist())]
            accepted = []
            while len(out) < n:
                step = decoder.step(n - len(out))
                accepted.append(step.accepted)
                out.extend(step.tokens)
            assert out == ids[PROMPT_LEN : PROMPT_LEN + n].tolist()
    assert 3 in accepted and 0 in accepted and ({1, 2} & set(accepted)), accepted
    read = 0  # the positions read from the target's states: each once, in order, from position 0
    for at, toks, rows, all_rows in oracle.calls:
        if all_rows:  # a chained proposal: the module's own state
            continue
        assert at == read and toks == ids[at + 1 : at + 1 + len(toks)].tolist(), at  # position j reads token j + 1
        np.testing.assert_allclose(rows, hidden[at : at + len(toks)], atol=1e-4, rtol=0)  # ... and the state at j
        read += len(toks)
    assert read >= PROMPT_LEN + n - 6  # up to the newest token of the last step


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


def test_the_module_on_a_host_staged_primary_records_its_steps(ref):
    """Target and module with hostsim:0 (a primary that records one-token steps as graphs) as the primary: the
    module's logits are the CPU primary's bits, the last-row prefill's states too, and speculative output is
    greedy's."""
    ck = Checkpoint.open(FOLDER)
    ids = ref["ids"]
    rows = {}
    with Engine(runtimes=("cpu", "hostsim"), cpu_threads=1) as eng:
        for primary in ("cpu:0", "hostsim:0"):
            target, module = eng.load(ck, device=primary), eng.load(ck.next_token_module(), device=primary)
            with target.context(len(ids), n_batch=4) as tc, module.context(len(ids)) as mc:
                _, hidden = tc.eval_hidden(ids[:3], all_rows=False)  # the norm alone, then the last row's head
                tc.truncate(0)
                _, every = tc.eval_hidden(ids, all_rows=True)
                assert np.array_equal(hidden, every[:3])
                first, _ = mc.eval_hidden(ids[1:30], hidden_in=every[:29])
                steps = [mc.eval_hidden(ids[j + 1 : j + 2], hidden_in=every[j : j + 1])[0] for j in range(29, 60)]
                rows[primary] = np.concatenate([first, *steps])
            with target.context(80) as tc, module.context(80) as mc:
                assert generate(tc, mc, ids[:PROMPT_LEN].tolist(), 30, 3) == ids[PROMPT_LEN : PROMPT_LEN + 30].tolist()
            target.close()
            module.close()
    assert np.array_equal(rows["cpu:0"], rows["hostsim:0"])


def test_the_module_reads_the_models_embeddings_and_head_on_its_primary(ref):
    """On a primary that holds copies of the weights (hostsim:0, as a GPU), the module loaded with head_of reads the
    model's embeddings and head: its copy is smaller by their bytes, its logits the same bits; the model closed
    first stays until the module goes (the module still decodes)."""
    ck = Checkpoint.open(FOLDER)
    ids = ref["ids"]
    H, V = ck.config.hidden_size, ck.config.vocab_size
    with Engine(runtimes=("cpu", "hostsim"), cpu_threads=1) as eng:
        target = eng.load(ck, device="hostsim:0")
        with target.context(len(ids)) as tc:
            _, hidden = tc.eval_hidden(ids, all_rows=True)
        alone = eng.load(ck.next_token_module(), device="hostsim:0")
        shared = eng.load(ck.next_token_module(), device="hostsim:0", head_of=target)
        rows = {}
        for name, module in (("alone", alone), ("shared", shared)):
            with module.context(len(ids)) as mc:
                rows[name], _ = mc.eval_hidden(ids[1:], hidden_in=hidden[:-1])
        assert np.array_equal(rows["alone"], rows["shared"])
        held = {n: m.counters()["devices"]["hostsim:0"]["allocated_bytes"] for n, m in (("a", alone), ("s", shared))}
        assert held["a"] - held["s"] == 2 * V * H * 2, held  # two bf16 tables of vocab x hidden
        target.close()  # the module still reads its head: kept until the module goes
        with shared.context(len(ids)) as mc:
            again, _ = mc.eval_hidden(ids[1:], hidden_in=hidden[:-1])
        assert np.array_equal(again, rows["shared"])
        shared.close()
        with pytest.raises(ArgumentError, match="expected a model of the same engine"):
            eng.load(ck.next_token_module(), head_of="not a model")
    with Engine() as other, pytest.raises(ArgumentError, match="same engine"):
        other.load(ck.next_token_module(), head_of=alone)


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
        for weights in ("map", "copy"):
            pair = open_pair(eng, FOLDER, "self", weights=weights)
            try:
                assert pair.draft.config.next_token_module and pair.draft.checkpoint.folder == FOLDER
                assert pair.draft.info["weights"] == pair.target.info["weights"] == weights
            finally:
                pair.close()
        asked = []  # auto: the module is loaded with the mode the model got, not left to choose for itself
        load = eng.load
        eng.load = lambda source, **kw: asked.append(kw["weights"]) or load(source, **kw)
        pair = open_pair(eng, FOLDER, "self")
        try:
            assert asked == ["auto", pair.target.info["weights"]] and asked[1] != "auto"
        finally:
            pair.close()
            del eng.load
    run = ["run", "--model", str(FOLDER), "-n", "12", "--repeats", "1", "--json"]
    assert main([*run, "--draft", "self"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "multi-token-prediction module" in report["draft"] and report["drafted_tokens"] > 0
    assert main([*run, "--no-draft"]) == 0
    assert report["output_sha256"] == json.loads(capsys.readouterr().out)["output_sha256"]


def test_the_modules_experts_placed_from_the_command_line(capsys):
    """run --draft-placement puts the module's experts where it says (the lucebox layout: the draft's experts on
    the second device), counted in the report; its output is greedy's; a draft without experts is refused."""
    from engine.cli import main

    run = ["run", "--model", str(FOLDER), "-n", "12", "--repeats", "1", "--json", "--cpu-devices", "2"]
    assert main([*run, "--draft", "self", "--draft-placement", "0.0-9=cpu:1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["draft_placement"] == "0.0-9=cpu:1; 0.10-15=cpu:0" and report["drafted_tokens"] > 0
    assert main([*run, "--no-draft"]) == 0
    assert report["output_sha256"] == json.loads(capsys.readouterr().out)["output_sha256"]
    dense = ["run", "--model", str(FIXTURES / "qwen3moe-f32"), "--draft", str(FIXTURES / "qwen3-f32"), "-n", "4"]
    assert main([*dense, "--draft-placement", "*=cpu:0"]) == 2
    assert "--draft-placement '*=cpu:0': the draft" in capsys.readouterr().err


# ---- what is refused, and how ------------------------------------------------------------------------------


def test_a_folder_without_a_module_is_refused_by_name():
    with pytest.raises(CheckpointError, match=r"holds no multi-token-prediction module.*give a draft model instead"):
        Checkpoint.open(FIXTURES / "deepseek-f32").next_token_module()
    with Engine() as eng, pytest.raises(CheckpointError, match="deepseek-f32' holds no multi-token-prediction"):
        open_pair(eng, FIXTURES / "deepseek-f32", "self")


def test_a_gguf_file_says_it_holds_no_module():
    with pytest.raises(CheckpointError, match=r"model-q8_0.gguf' holds no .*\(llama.cpp's converter leaves"):
        Checkpoint.open(FIXTURES / "deepseek-gguf" / "model-q8_0.gguf").next_token_module()


def test_a_folder_whose_config_names_a_module_it_does_not_hold(tmp_path):
    dst = tmp_path / "stripped"
    shutil.copytree(FIXTURES / "deepseek-f32", dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    with pytest.raises(
        CheckpointError, match=r"num_nextn_predict_layers = 1, but it holds no model.layers.4.\* tensors"
    ):
        Checkpoint.open(dst).next_token_module()


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


def test_a_decoder_tensor_missing_from_the_module_is_named_as_the_file_would_hold_it(tmp_path):
    dst = _copy_with(tmp_path, lambda t: t.pop("model.layers.4.self_attn.o_proj.weight"))
    ck = Checkpoint.open(dst)
    with Engine() as eng, pytest.raises(EngineError) as err:
        eng.load(ck.next_token_module())
    assert "'model.layers.4.self_attn.o_proj.weight' (read as 'model.layers.0.self_attn.o_proj.weight')" in str(
        err.value
    )


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
    with pytest.raises(P.ProfileError, match=r"bad.yaml:2: model: unknown key 'self'"):
        P.load(path)


def test_tune_with_the_models_own_draft_writes_a_profile_regress_replays(tmp_path, capsys):
    from engine.cli import main
    from engine.profiles import profile as P
    from engine.profiles import regress

    out = tmp_path / "tuned.yaml"
    args = ["tune", "--model", str(FOLDER), "--draft", "self", "--runtime", "hostsim", "--no-calibrate", "--q", "2",
            "--time-budget", "5", "--json", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "multi-token-prediction module" in doc["draft"] and doc["out"] == str(out)
    profile = P.load(out)
    assert profile.draft.own and profile.draft.path is None and profile.run.q == 2
    assert regress.run([str(out)]).exit_code == 0
