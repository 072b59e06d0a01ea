"""The DeepSeek-V3-shaped demo pair (`expertbench demo-model --family deepseek`): its config and tensors, that the
engine loads both folders, that speculative decoding with its draft is target-only greedy decoding and accepts in a
realistic range, determinism, the flag's bad input, and where the pair is offered (run, profiles, the window)."""

import dataclasses
import json
import math
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # for the window's test, before anything imports Qt

import pytest

from engine.checkpoints import demo
from engine.checkpoints.checkpoint import Checkpoint
from engine.checkpoints.demo import (
    DEMO_PROMPTS,
    SIZES,
    check_pair,
    demo_folder,
    ensure_demo_pair,
    model_tensors,
    recipe,
    split_demo,
)
from engine.cli import main
from engine.core.errors import ArgumentError
from engine.families.deepseek_v3 import DEMO_SIZES as DEEPSEEK_SIZES
from engine.model import Engine
from engine.profiles.profile import ModelRef, ProfileError
from engine.profiles.profile import loads as load_profile
from engine.runs.run import DecodeRun, output_sha256
from engine.runs.speculative import generate

N = 48  # tokens per prompt in the greedy comparisons


@pytest.fixture(scope="session")
def ds_pair(xdg_cache):
    # In the session's cache folder, so that it is built once for every test here.
    return ensure_demo_pair("default", cache_dir=xdg_cache / "expertbench", family="deepseek")


def test_the_config_is_deepseek_v3_shaped(ds_pair):
    raw = json.loads((ds_pair.target / "config.json").read_text())
    assert raw["architectures"] == ["DeepseekV3ForCausalLM"] and raw["model_type"] == "deepseek_v3"
    assert (raw["scoring_func"], raw["topk_method"]) == ("sigmoid", "noaux_tc")
    assert (raw["n_shared_experts"], raw["first_k_dense_replace"]) == (1, 1)
    assert raw["norm_topk_prob"] is True and raw["rope_interleave"] is True
    assert raw["routed_scaling_factor"] == 2.5 and raw["rope_scaling"]["type"] == "yarn"
    assert raw["expertbench_synthetic"] is True
    for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                "n_routed_experts", "n_group", "topk_group", "num_experts_per_tok"):  # fmt: skip
        assert isinstance(raw[key], int) and raw[key] > 0, key
    assert raw["n_group"] > raw["topk_group"] > 1  # the group choice matters: some groups are dropped

    target, draft = Checkpoint.open(ds_pair.target), Checkpoint.open(ds_pair.draft)
    cfg = target.config
    assert cfg.architecture == "deepseek_v3" and cfg.synthetic
    assert cfg.moe_layers == list(range(1, cfg.num_layers))  # the first layer is dense
    assert cfg.n_shared_experts == 1 and cfg.shared_expert_intermediate == cfg.moe_intermediate_size
    assert (cfg.num_experts, cfg.n_group, cfg.topk_group, cfg.top_k) == (16, 4, 2, 4)
    assert cfg.rope_inv_freq and cfg.attention_scale > (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5  # YaRN
    last = cfg.num_layers - 1
    names = [
        "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        *(f"model.layers.1.self_attn.{n}.weight" for n in ("q_a_proj", "q_a_layernorm", "q_b_proj",
                                                            "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj",
                                                            "o_proj")),
        "model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
        "model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
        f"model.layers.{last}.mlp.experts.15.gate_proj.weight", f"model.layers.{last}.mlp.experts.15.up_proj.weight",
        f"model.layers.{last}.mlp.experts.15.down_proj.weight",
        *(f"model.layers.{last}.mlp.shared_experts.{p}_proj.weight" for p in ("gate", "up", "down")),
    ]  # fmt: skip
    for name in names:
        assert name in target.tensors, name
    assert "model.layers.0.mlp.gate.weight" not in target.tensors  # dense: no router, no experts
    assert not any(".q_proj." in n or ".k_proj." in n for n in target.tensors)  # MLA, with q_lora_rank
    assert {t.dtype for t in target.tensors.values()} == {"BF16"}
    assert target.tensors["model.layers.1.self_attn.kv_a_proj_with_mqa.weight"].shape == (
        cfg.kv_lora_rank + cfg.qk_rope_head_dim, cfg.hidden_size)  # fmt: skip
    assert target.tensors["model.layers.1.mlp.gate.e_score_correction_bias"].shape == (cfg.num_experts,)

    # The draft: the same architecture, fewer layers, every one dense; the same tokenizer.
    d = draft.config
    assert draft.raw_config["architectures"] == ["DeepseekV3ForCausalLM"] and d.synthetic
    assert d.num_layers < cfg.num_layers and d.moe_layers == []
    assert not any(".experts." in n or ".gate.weight" in n for n in draft.tensors)
    assert draft.vocabulary == target.vocabulary and d.vocab_size == cfg.vocab_size == 4096
    assert (d.q_lora_rank, d.kv_lora_rank, d.num_heads) == (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.num_heads)


def test_both_folders_load_and_greedy_output_varies(ds_pair):
    with Engine() as eng:
        target, draft = eng.load(ds_pair.target), eng.load(ds_pair.draft)
        assert target.config.architecture == draft.config.architecture == "deepseek_v3"
        for prompt in DEMO_PROMPTS[:2]:
            ids = target.encode(prompt)
            with target.context(len(ids) + 64) as ctx:
                out = ctx.generate(ids, 64).ids
            assert len(set(out)) >= 32, f"greedy output loops instead of varying: {out}"


def test_speculative_decoding_is_greedy_and_acceptance_is_realistic(ds_pair):
    """For q = 1, 2, 4, 8 the draft changes nothing in the output; the `expertbench run` defaults (the four prompts, 64
    tokens, q = 2) accept between 70 % and 85 % of the drafted tokens, as the Qwen3-MoE pair does."""
    with Engine() as eng:
        target, draft = eng.load(ds_pair.target), eng.load(ds_pair.draft)
        for prompt in DEMO_PROMPTS[:2]:
            ids = target.encode(prompt)
            with target.context(len(ids) + N) as tc, draft.context(len(ids) + N) as dc:
                plain = generate(tc, None, ids, N)
                for q in (1, 2, 4, 8):
                    assert output_sha256(generate(tc, dc, ids, N, q)) == output_sha256(plain), (prompt, q)
        res = DecodeRun(target, draft, prompts=DEMO_PROMPTS, tokens_per_prompt=64, q=2).run()
        alone = DecodeRun(target, None, prompts=DEMO_PROMPTS, tokens_per_prompt=64).run()
    assert [p.generated_ids for p in res.prompts] == [p.generated_ids for p in alone.prompts]
    assert 0.70 <= res.accept_rate <= 0.85, f"DeepSeek demo acceptance at q=2 is {res.accept_rate:.3f}"


def test_the_build_is_deterministic(ds_pair, tmp_path):
    again = ensure_demo_pair("default", cache_dir=tmp_path, family="deepseek")
    assert again.built and again.reason == "missing" and again.family == "deepseek"
    first = json.loads((ds_pair.target.parent / "manifest.json").read_text())
    second = json.loads((again.target.parent / "manifest.json").read_text())
    assert first["files"] == second["files"] and first["recipe"] == second["recipe"]
    assert check_pair(again.target.parent, DEEPSEEK_SIZES["default"], full=True) == ""


def test_families_keep_their_own_cache_entries_and_recipes(tmp_path):
    """The Qwen3-MoE demo's folder and recipe are what they were; the DeepSeek pair has its own, and a manifest of
    one family never passes for the other."""
    assert demo_folder("default", tmp_path) == tmp_path / "demo-default-v1"
    assert demo_folder("bench", tmp_path, family="qwen3") == tmp_path / "demo-bench-v1"
    assert demo_folder("default", tmp_path, family="deepseek") == tmp_path / "demo-deepseek-default-v1"
    assert demo_folder("deepseek/bench", tmp_path) == tmp_path / "demo-deepseek-bench-v1"
    assert "family" not in recipe(SIZES["default"])
    assert recipe(DEEPSEEK_SIZES["default"])["family"] == "deepseek"
    assert split_demo("bench") == ("qwen3", "bench") and split_demo("deepseek/default") == ("deepseek", "default")
    assert demo.demo_name("bench", "deepseek") == "deepseek/bench" and demo.demo_name("bench") == "bench"


def test_bench_size_is_comparable_to_the_qwen3_bench_size():
    def params(spec, role):
        return sum(math.prod(shape) for _, shape, _ in model_tensors(spec, role))  # shapes only, nothing built

    ds, qwen = DEEPSEEK_SIZES["bench"], SIZES["bench"]
    target = params(ds, "target")
    assert 0.9 < target / params(qwen, "target") < 1.1  # bf16: the same weight bytes within 10 %
    assert 0.85e9 < target < 1.2e9
    assert params(ds, "draft") < target / 8
    # every matrix width a multiple of 32 (the blocks of Q8_0 and MXFP4, should the pair get a GGUF form)
    for spec in DEEPSEEK_SIZES.values():
        for name, shape, _ in model_tensors(spec, "target"):
            assert len(shape) == 1 or shape[-1] % 32 == 0, (spec.name, name, shape)


def test_bad_input_names_what_is_accepted(capsys, tmp_path):
    with pytest.raises(ArgumentError, match="demo model family 'llama' is unknown: expected one of qwen3, deepseek"):
        ensure_demo_pair("default", cache_dir=tmp_path, family="llama")
    with pytest.raises(ArgumentError, match="demo model family 'llama' is unknown: expected one of qwen3, deepseek"):
        ensure_demo_pair("llama/default", cache_dir=tmp_path)
    with pytest.raises(ArgumentError, match="demo model size 'huge' is unknown: expected one of default, bench"):
        ensure_demo_pair("huge", cache_dir=tmp_path, family="deepseek")
    with pytest.raises(ArgumentError, match="demo 'deepseek/default' is of family 'deepseek', not 'qwen3'"):
        ensure_demo_pair("deepseek/default", cache_dir=tmp_path, family="qwen3")
    with pytest.raises(ArgumentError, match="written as safetensors folders only, not as GGUF files"):
        ensure_demo_pair("default", cache_dir=tmp_path, family="deepseek", format="gguf")
    assert not any(tmp_path.iterdir())  # nothing was built

    with pytest.raises(SystemExit) as usage:
        main(["demo-model", "--family", "llama"])
    assert usage.value.code == 2
    assert "argument --family: invalid choice: 'llama' (choose from 'qwen3', 'deepseek', 'gpt-oss')" in (
        capsys.readouterr().err
    )
    assert main(["demo-model", "--family", "deepseek", "--format", "gguf"]) == 2
    assert "the DeepSeek-V3 demo (family 'deepseek') is written as safetensors folders only" in capsys.readouterr().err
    assert main(["run", "--model", "x", "--demo-family", "deepseek"]) == 2
    assert "--demo-family: choose the demo pair, which runs only without --model" in capsys.readouterr().err


def test_demo_model_and_run_commands(ds_pair, xdg_cache, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    assert main(["demo-model", "--family", "deepseek", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["family"], report["target"], report["built"]) == ("deepseek", str(ds_pair.target), False)
    assert main(["demo-model", "--family", "deepseek"]) == 0
    out = capsys.readouterr().out
    assert "demo model pair 'DeepSeek-V3 default' (synthetic" in out and "(DeepSeek-V3, BF16)" in out
    assert "(dense DeepSeek-V3, BF16)" in out

    assert main(["run", "--demo-family", "deepseek", "-n", "8", "--repeats", "1", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert (run["target"], run["draft"]) == (str(ds_pair.target), str(ds_pair.draft))
    assert run["synthetic"] and run["draft_synthetic"] and run["accept_rate"] is not None
    assert run["placement"] == "1-7=cpu:0"  # the dense first layer has no experts to place


def _profile(ds_pair, version=3, extra=""):
    return (f"expertbench_profile: {version}\nmodel: {{demo: default, family: deepseek{extra}}}\n"
            "draft: {demo: default, family: deepseek}\nrun: {tokens: 8, repeats: 1}\n")  # fmt: skip


def test_a_profile_names_the_deepseek_demo(ds_pair, xdg_cache, monkeypatch, tmp_path, capsys):
    """`family: deepseek` beside `demo` (format 3): the profile replays on the DeepSeek pair; the window's one-string
    name of the pair ('deepseek/default') is saved as the two keys; older formats and unknown families are refused,
    named by file and line."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    profile = load_profile(_profile(ds_pair), tmp_path / "ds.yaml")
    assert profile.model == ModelRef(demo="default", family="deepseek")
    assert profile.model_folder() == ds_pair.target and profile.model_folder(profile.draft, "draft") == ds_pair.draft
    assert ModelRef(demo="deepseek/default") == profile.model
    text = profile.to_yaml()
    assert "expertbench_profile: 3" in text and "family: deepseek" in text
    assert load_profile(text) == dataclasses.replace(profile, version=3)

    path = tmp_path / "ds.yaml"
    path.write_text(_profile(ds_pair))
    assert main(["regress", "--record", str(path)]) == 0, capsys.readouterr().out
    assert main(["regress", str(path)]) == 0, capsys.readouterr().out
    recorded = load_profile(path.read_text(), path)
    assert recorded.model.fingerprint and len(recorded.expectations.output_sha256) == len(DEMO_PROMPTS)

    for text, message in (
        (_profile(ds_pair, version=2), "ds.yaml:2: model.family: the demo's family needs format version 3"),
        (_profile(ds_pair).replace("family: deepseek}\ndraft", "family: llama}\ndraft"),
         "ds.yaml:2: model.family: demo model family 'llama' is unknown: expected one of qwen3, deepseek"),
        (_profile(ds_pair, extra=", format: gguf"),
         "ds.yaml:2: model.format: the DeepSeek-V3 demo (family 'deepseek') is written as safetensors folders only"),
        ("expertbench_profile: 3\nmodel: {path: x, family: deepseek}\n",
         "ds.yaml:2: model.family: only a demo model takes a family"),
        ("expertbench_profile: 3\nmodel: {demo: huge, family: deepseek}\n",
         "ds.yaml:2: model.demo: unknown demo size 'huge' (expected one of default, bench)"),
    ):  # fmt: skip
        with pytest.raises(ProfileError) as err:
            load_profile(text, tmp_path / "ds.yaml")
        assert message in str(err.value)


def test_the_window_offers_the_deepseek_pair_and_saves_a_profile_naming_it(ds_pair, xdg_cache, monkeypatch, tmp_path,
                                                                            request):  # fmt: skip
    """File > Open DeepSeek-V3 demo model pair (below the Qwen3-MoE one) opens the pair; a profile saved on it names
    the demo by size and family, not by a path into the cache."""
    pytest.importorskip("pytestqt")
    qtbot = request.getfixturevalue("qtbot")
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QMessageBox

    from app.state import WorkbenchState
    from app.window import MainWindow
    from engine.profiles.profile import load

    def unexpected(parent, title, text, *args, **kwargs):
        raise AssertionError(f"unexpected dialog {title!r}: {text}")

    for name in ("critical", "warning", "question", "information"):
        monkeypatch.setattr(QMessageBox, name, unexpected)
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    state = WorkbenchState()
    window = None
    try:
        state.open_engine(lambda: Engine())
        window = MainWindow(state=state, settings=QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
        menu = window.family_demo_menus["deepseek"]
        assert menu.title() == "Open DeepSeek-V3 demo model pair (synthetic)"
        assert [a.text() for a in menu.actions()] == ["Folders (safetensors, bf16)"]
        assert "synthetic: random weights" in menu.actions()[0].toolTip()
        assert len(window.demo_menu.actions()) == 3  # the Qwen3-MoE pair's menu as it was
        window.act_open_family_demos["deepseek"]["safetensors", None].trigger()
        qtbot.waitUntil(lambda: state.model is not None and not state.busy, timeout=120_000)
        m = state.model
        assert (m.demo, m.target_path, m.synthetic) == ("deepseek/default", str(ds_pair.target), True)
        assert m.config.architecture == "deepseek_v3" and m.draft_path == str(ds_pair.draft)
        assert state.save_profile(tmp_path / "window.yaml")
        saved = load(tmp_path / "window.yaml")
        assert saved.version == 3
        assert saved.model == ModelRef(demo="default", family="deepseek", fingerprint=m.fingerprint)
        assert saved.draft == ModelRef(demo="default", family="deepseek", fingerprint=m.draft_fingerprint)
    finally:
        if window is not None:
            window.state.saved_placement = window.state.placement  # no unsaved-changes question
            window.close()
        state.shutdown()
