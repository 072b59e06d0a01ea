"""The gpt-oss-shaped demo pair (`expertbench demo-model --family gpt-oss`): its config and tensors in the released
layout (MXFP4 experts as blocks and scales), that the engine loads both folders with the experts MXFP4, that
speculative decoding with its draft is target-only greedy decoding and accepts in a realistic range, determinism,
bad input, and where the pair is offered (run, profiles, the cost model, the export, the window)."""

import dataclasses
import json
import math
import os
import re

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # for the window's test, before anything imports Qt

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.checkpoints import demo
from engine.checkpoints.checkpoint import Checkpoint
from engine.checkpoints.demo import (
    DEMO_PROMPTS,
    SIZES,
    check_pair,
    demo_folder,
    draft_layer_map,
    ensure_demo_pair,
    model_tensors,
    recipe,
    split_demo,
)
from engine.cli import main
from engine.core.errors import ArgumentError
from engine.export.engines import to_ktransformers
from engine.export.llama_cpp import to_llama_cpp
from engine.families.gpt_oss import DEMO_SIZES as GPT_OSS_SIZES
from engine.families.synthetic import normal
from engine.model import Engine
from engine.placement.costmodel import ModelShape
from engine.placement.placement import Placement
from engine.profiles.profile import ModelRef, ProfileError
from engine.profiles.profile import loads as load_profile
from engine.runs.run import DecodeRun, output_sha256
from engine.runs.speculative import generate

N = 48  # tokens per prompt in the greedy comparisons
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


@pytest.fixture(scope="session")
def go_pair(xdg_cache):
    # In the session's cache folder, so that it is built once for every test here.
    return ensure_demo_pair("default", cache_dir=xdg_cache / "expertbench", family="gpt-oss")


def _raw(t) -> bytes:
    with open(t.file, "rb") as f:
        f.seek(t.offset)
        return f.read(t.nbytes)


def _u8(t) -> np.ndarray:
    return np.frombuffer(_raw(t), dtype=np.uint8).reshape(t.shape)


def _dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The released layout, read as transformers' convert_moe_packed_tensors does: byte j of a block holds values 2j
    (low nibble) and 2j + 1 (high nibble), E2M1 codes with bit 3 the sign, times 2^(scale - 127)."""
    lo, hi = blocks & 0x0F, blocks >> 4
    codes = np.empty((*blocks.shape[:-1], 32), dtype=np.uint8)
    codes[..., 0::2], codes[..., 1::2] = lo, hi
    values = np.where(codes & 8, -1.0, 1.0) * E2M1[codes & 7] * np.exp2(scales.astype(np.float64) - 127)[..., None]
    return values.reshape(*blocks.shape[:-2], -1)


def test_the_config_is_gpt_oss_shaped(go_pair):
    raw = json.loads((go_pair.target / "config.json").read_text())
    assert raw["architectures"] == ["GptOssForCausalLM"] and raw["model_type"] == "gpt_oss"
    L = raw["num_hidden_layers"]
    assert raw["layer_types"] == ["sliding_attention", "full_attention"] * (L // 2)
    assert raw["attention_bias"] is True and raw["tie_word_embeddings"] is False and raw["swiglu_limit"] == 7.0
    assert raw["rope_scaling"] == {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                   "original_max_position_embeddings": 128, "truncate": False}  # fmt: skip
    assert raw["quantization_config"]["quant_method"] == "mxfp4"
    assert (raw["num_local_experts"], raw["num_experts_per_tok"], raw["head_dim"]) == (16, 4, 64)
    assert raw["num_attention_heads"] * raw["head_dim"] != raw["hidden_size"]  # as gpt-oss: q is wider than hidden
    assert raw["sliding_window"] < 64 + len(DEMO_PROMPTS[0])  # the runs here slide the window
    assert raw["expertbench_synthetic"] is True

    target, draft = Checkpoint.open(go_pair.target), Checkpoint.open(go_pair.draft)
    cfg = target.config
    assert cfg.architecture == "gpt_oss" and cfg.synthetic and cfg.moe_layers == list(range(L))
    assert cfg.layer_windows == (raw["sliding_window"], 0) * (L // 2) and cfg.swiglu_limit == 7.0
    assert cfg.moe_intermediate_size == raw["intermediate_size"] and cfg.rope_inv_freq  # YaRN
    H, inter, E = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
    p = f"model.layers.{L - 1}."
    shapes = {
        "mlp.experts.gate_up_proj_blocks": (E, 2 * inter, H // 32, 16),
        "mlp.experts.gate_up_proj_scales": (E, 2 * inter, H // 32),
        "mlp.experts.gate_up_proj_bias": (E, 2 * inter),
        "mlp.experts.down_proj_blocks": (E, H, inter // 32, 16),
        "mlp.experts.down_proj_scales": (E, H, inter // 32),
        "mlp.experts.down_proj_bias": (E, H),
        "mlp.router.weight": (E, H),
        "mlp.router.bias": (E,),
        "self_attn.sinks": (cfg.num_heads,),
        "self_attn.q_proj.bias": (cfg.num_heads * cfg.head_dim,),
        "self_attn.o_proj.weight": (H, cfg.num_heads * cfg.head_dim),
        "self_attn.o_proj.bias": (H,),
    }
    for name, shape in shapes.items():
        assert target.tensors[p + name].shape == shape, name
    for name, t in target.tensors.items():  # the released layout: uint8 blocks and scales, bf16 elsewhere
        assert t.dtype == ("U8" if name.endswith(("_blocks", "_scales")) else "BF16"), name
    assert not any(n.endswith(("experts.gate_up_proj", "experts.down_proj")) for n in target.tensors)

    # The draft: the same architecture, fewer layers (still alternating), one expert each; the same tokenizer.
    d = draft.config
    assert draft.raw_config["architectures"] == ["GptOssForCausalLM"] and d.synthetic
    assert d.num_layers == 4 and d.num_experts == d.top_k == 1 and d.moe_layers == [0, 1, 2, 3]
    assert d.layer_windows == cfg.layer_windows[:4]
    assert draft.vocabulary == target.vocabulary and d.vocab_size == cfg.vocab_size == 4096
    assert draft.raw_config["quantization_config"]["quant_method"] == "mxfp4"


def test_the_draft_carries_its_target_layers(go_pair):
    """A draft layer holds its target layer's attention, sinks and norms bit for bit, and as its one expert the base
    MLP in MXFP4: each target expert's 4-bit codes are mostly the base's (gate rows even, up rows odd)."""
    target, draft = Checkpoint.open(go_pair.target), Checkpoint.open(go_pair.draft)
    spec = GPT_OSS_SIZES["default"]
    carried = draft_layer_map(spec)
    assert carried == [0, 1, 6, 7]  # pairs of a sliding and a full layer, the first and the last
    for j, t in enumerate(carried):
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.sinks",
                     "self_attn.q_proj.weight", "self_attn.k_proj.bias", "self_attn.o_proj.weight",
                     "self_attn.o_proj.bias"):  # fmt: skip
            assert _raw(draft.tensors[f"model.layers.{j}.{name}"]) == _raw(target.tensors[f"model.layers.{t}.{name}"])
    # layer 7's experts against the draft's expert (the base MLP)
    tb = _u8(target.tensors["model.layers.7.mlp.experts.gate_up_proj_blocks"])
    db = _u8(draft.tensors["model.layers.3.mlp.experts.gate_up_proj_blocks"])
    same = (tb == db[0]).mean(axis=(1, 2, 3))
    assert np.all((same > 0.9) & (same < 1.0)), same  # close to the base, each its own
    # the layout: dequantized, the even rows are the base gate projection, the odd rows the base up projection
    base = _dequantize(db[0], _u8(draft.tensors["model.layers.3.mlp.experts.gate_up_proj_scales"])[0])
    gate, up = normal("go.7.base.gate", (spec.intermediate_size, spec.hidden_size)), normal(
        "go.7.base.up", (spec.intermediate_size, spec.hidden_size))  # fmt: skip
    assert np.corrcoef(base[0::2].ravel(), gate.ravel())[0, 1] > 0.97
    assert np.corrcoef(base[1::2].ravel(), up.ravel())[0, 1] > 0.97
    assert abs(np.corrcoef(base[0::2].ravel(), up.ravel())[0, 1]) < 0.01
    # a skipped layer writes a small update: its down projection and o_proj scaled down
    skipped = _dequantize(_u8(target.tensors["model.layers.3.mlp.experts.down_proj_blocks"]),
                          _u8(target.tensors["model.layers.3.mlp.experts.down_proj_scales"]))  # fmt: skip
    kept = _dequantize(_u8(target.tensors["model.layers.7.mlp.experts.down_proj_blocks"]),
                       _u8(target.tensors["model.layers.7.mlp.experts.down_proj_scales"]))  # fmt: skip
    assert np.abs(skipped).mean() < 2 * spec.skipped_layer_scale * np.abs(kept).mean()


def test_both_folders_load_with_mxfp4_experts_and_greedy_output_varies(go_pair):
    cfg = Checkpoint.open(go_pair.target).config
    H, inter, E, L = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_layers
    row = 2 * cfg.num_kv_heads * cfg.head_dim * 4
    with Engine() as eng:
        target, draft = eng.load(go_pair.target), eng.load(go_pair.draft)
        assert target.config.architecture == draft.config.architecture == "gpt_oss"
        info = target.info
        # the experts as loaded: MXFP4 rows (17 bytes per 32 values) and f32 biases, not dequantized to bf16
        assert info["expert_bytes"] == L * E * (3 * H * inter // 32 * 17 + (2 * inter + H) * 4)
        assert draft.info["expert_bytes"] == 4 * (3 * H * inter // 32 * 17 + (2 * inter + H) * 4)
        assert info["kv_bytes_per_token"] == L // 2 * row  # the full-attention layers only
        assert info["kv_window_bytes"] == L // 2 * cfg.layer_windows[0] * row
        shape = ModelShape.from_model(target)
        assert shape.layer_windows == cfg.layer_windows
        assert (shape.kv_bytes_per_token, shape.kv_window_bytes) == (info["kv_bytes_per_token"],
                                                                     info["kv_window_bytes"])  # fmt: skip
        assert 0.99 < shape.total_bytes / info["expert_bytes"] <= 1.0  # (the files' biases are bf16)
        for prompt in DEMO_PROMPTS[:2]:
            ids = target.encode(prompt)
            with target.context(len(ids) + 64) as ctx:
                out = ctx.generate(ids, 64).ids
            assert len(set(out)) >= 32, f"greedy output loops instead of varying: {out}"


def test_speculative_decoding_is_greedy_and_acceptance_is_realistic(go_pair):
    """For q = 1, 2, 4, 8 the draft changes nothing in the output (its rollbacks cross the sliding window); the
    `expertbench run` defaults (the four prompts, 64 tokens, q = 2) accept between 70 % and 85 % of the drafted
    tokens, as the other families' pairs do (measured: 77.2 %)."""
    with Engine() as eng:
        target, draft = eng.load(go_pair.target), eng.load(go_pair.draft)
        for prompt in DEMO_PROMPTS[:2]:
            ids = target.encode(prompt)
            with target.context(len(ids) + N) as tc, draft.context(len(ids) + N) as dc:
                plain = generate(tc, None, ids, N)
                for q in (1, 2, 4, 8):
                    assert output_sha256(generate(tc, dc, ids, N, q)) == output_sha256(plain), (prompt, q)
        res = DecodeRun(target, draft, prompts=DEMO_PROMPTS, tokens_per_prompt=64, q=2).run()
        alone = DecodeRun(target, None, prompts=DEMO_PROMPTS, tokens_per_prompt=64).run()
    assert [p.generated_ids for p in res.prompts] == [p.generated_ids for p in alone.prompts]
    assert 0.70 <= res.accept_rate <= 0.85, f"gpt-oss demo acceptance at q=2 is {res.accept_rate:.3f}"


def test_the_build_is_deterministic(go_pair, tmp_path):
    again = ensure_demo_pair("default", cache_dir=tmp_path, family="gpt-oss")
    assert again.built and again.reason == "missing" and again.family == "gpt-oss"
    first = json.loads((go_pair.target.parent / "manifest.json").read_text())
    second = json.loads((again.target.parent / "manifest.json").read_text())
    assert first["files"] == second["files"] and first["recipe"] == second["recipe"]
    assert check_pair(again.target.parent, GPT_OSS_SIZES["default"], full=True) == ""
    assert "tokenizer_config.json" in " ".join(first["files"])  # both tokenizer files, as the other families'


def test_the_family_keeps_its_own_cache_entries_and_recipes(tmp_path):
    assert demo_folder("default", tmp_path, family="gpt-oss") == tmp_path / "demo-gpt-oss-default-v1"
    assert demo_folder("gpt-oss/bench", tmp_path) == tmp_path / "demo-gpt-oss-bench-v1"
    assert recipe(GPT_OSS_SIZES["default"])["family"] == "gpt-oss"
    assert split_demo("gpt-oss/default") == ("gpt-oss", "default")
    assert demo.demo_name("bench", "gpt-oss") == "gpt-oss/bench"
    assert demo.quant_formats(None, "draft", "gpt-oss") == "MXFP4 experts, BF16 elsewhere"


def test_bench_size_is_gpt_oss_shaped_and_a_few_hundred_mb():
    def file_bytes(spec, role):  # shapes only, nothing built
        return sum(math.prod(shape) * (1 if name.endswith(("_blocks", "_scales")) else 2)
                   for name, shape, _ in model_tensors(spec, role))  # fmt: skip

    bench = GPT_OSS_SIZES["bench"]
    assert (bench.num_experts, bench.top_k, bench.head_dim, bench.sliding_window) == (32, 4, 64, 128)
    assert bench.intermediate_size == bench.hidden_size  # as gpt-oss
    assert 300e6 < file_bytes(bench, "target") < 700e6
    assert file_bytes(bench, "draft") < file_bytes(bench, "target") / 3  # (its embeddings and lm_head the most)
    assert file_bytes(GPT_OSS_SIZES["default"], "target") < 100e6
    for spec in GPT_OSS_SIZES.values():
        assert spec.num_layers % 2 == 0 and spec.draft_layers % 2 == 0
        for name, shape, _ in model_tensors(spec, "target"):
            if name.endswith("_blocks"):
                continue
            assert len(shape) == 1 or shape[-1] % 32 == 0 or name.endswith(("_scales", "_bias")), (name, shape)
        assert spec.hidden_size % 32 == 0 and spec.intermediate_size % 32 == 0


def test_bad_input_names_what_is_accepted(capsys, tmp_path):
    with pytest.raises(ArgumentError, match="written as safetensors folders only, not as GGUF files"):
        ensure_demo_pair("default", cache_dir=tmp_path, family="gpt-oss", format="gguf")
    with pytest.raises(ArgumentError, match="the gpt-oss demo's folders take none"):
        ensure_demo_pair("default", cache_dir=tmp_path, family="gpt-oss", quant="mxfp4")
    with pytest.raises(ArgumentError, match="demo model size 'huge' is unknown: expected one of default, bench"):
        ensure_demo_pair("gpt-oss/huge", cache_dir=tmp_path)
    with pytest.raises(ArgumentError, match="expected one of qwen3, deepseek, gpt-oss"):
        ensure_demo_pair("default", cache_dir=tmp_path, family="gpt_oss")
    assert not any(tmp_path.iterdir())  # nothing was built
    assert main(["demo-model", "--family", "gpt-oss", "--format", "gguf"]) == 2
    assert "the gpt-oss demo (family 'gpt-oss') is written as safetensors folders only" in capsys.readouterr().err


def test_demo_model_and_run_commands(go_pair, xdg_cache, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    assert main(["demo-model", "--family", "gpt-oss", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["family"], report["target"], report["built"]) == ("gpt-oss", str(go_pair.target), False)
    assert main(["demo-model", "--family", "gpt-oss"]) == 0
    out = capsys.readouterr().out
    assert "demo model pair 'gpt-oss default' (synthetic" in out
    assert "(gpt-oss, MXFP4 experts, BF16 elsewhere)" in out and "(one-expert gpt-oss, MXFP4 experts" in out

    assert main(["run", "--demo-family", "gpt-oss", "-n", "8", "--repeats", "1", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert (run["target"], run["draft"]) == (str(go_pair.target), str(go_pair.draft))
    assert run["synthetic"] and run["draft_synthetic"] and run["accept_rate"] is not None
    assert run["placement"] == "0-7=cpu:0"  # every gpt-oss layer routes
    assert run["weights"]["formats"] == ["MXFP4", "BF16"]


def _profile(version=3, extra=""):
    return (f"expertbench_profile: {version}\nmodel: {{demo: default, family: gpt-oss{extra}}}\n"
            "draft: {demo: default, family: gpt-oss}\ndevices: {cpu: 2}\n"
            "placement: {layers: {0-3: cpu:0, 4-7: cpu:1}}\nrun: {tokens: 8, repeats: 1}\n")  # fmt: skip


def test_a_profile_names_the_gpt_oss_demo_and_replays(go_pair, xdg_cache, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    profile = load_profile(_profile(), tmp_path / "go.yaml")
    assert profile.model == ModelRef(demo="default", family="gpt-oss")
    assert profile.model_folder() == go_pair.target and profile.model_folder(profile.draft, "draft") == go_pair.draft
    assert ModelRef(demo="gpt-oss/default") == profile.model
    text = profile.to_yaml()
    assert "expertbench_profile: 3" in text and "family: gpt-oss" in text
    assert load_profile(text) == dataclasses.replace(profile, version=3)

    path = tmp_path / "go.yaml"
    path.write_text(_profile())
    assert main(["regress", "--record", str(path)]) == 0, capsys.readouterr().out
    assert main(["regress", str(path)]) == 0, capsys.readouterr().out
    recorded = load_profile(path.read_text(), path)
    assert recorded.model.fingerprint and len(recorded.expectations.output_sha256) == len(DEMO_PROMPTS)
    assert recorded.routing_stats().hits.shape == (8, 16)

    for text, message in (
        (_profile(version=2), "go.yaml:2: model.family: the demo's family needs format version 3"),
        (_profile(extra=", format: gguf"),
         "go.yaml:2: model.format: the gpt-oss demo (family 'gpt-oss') is written as safetensors folders only"),
    ):  # fmt: skip
        with pytest.raises(ProfileError) as err:
            load_profile(text, tmp_path / "go.yaml")
        assert message in str(err.value)


def test_the_exports_name_the_expert_tensors_and_their_biases(go_pair):
    """llama.cpp's -ot pattern for layers moved to a GPU matches their expert weights and biases (gpt-oss's GGUF
    names, from llama.cpp's own conversion of the fixture) and nothing else of those layers; ktransformers says it
    has no rules for the family."""
    cfg = Checkpoint.open(go_pair.target).config
    placement = Placement.parse("4-7=cuda:0", cfg, default="cpu:0")
    exported = to_llama_cpp(placement, "cpu:0")
    assert exported.exact and exported.args[:2] == ["-ngl", "0"]
    pattern, buffer = exported.override_tensor.split("=")
    assert buffer == "CUDA0"
    manifest = json.loads((FIXTURES / "gpt-oss-gguf" / "manifest.json").read_text())
    names = [name for f in manifest["files"].values() for name in f["tensors"]]
    expected = {f"blk.{n}.ffn_{p}_exps.{k}" for n in range(4) for p in ("gate", "up", "down")
                for k in ("weight", "bias")}  # fmt: skip
    assert expected <= set(names)  # the fixture's four layers: every expert tensor of layers 0-3
    moved = Placement.parse("1-3=cuda:0", Checkpoint.open(FIXTURES / "gpt-oss-mxfp4").config, default="cpu:0")
    fixture_pattern = to_llama_cpp(moved, "cpu:0").override_tensor.split("=")[0]
    matched = {n for n in names if re.search(fixture_pattern, n)}
    assert matched == {n for n in expected if not n.startswith("blk.0.")}
    assert not any(re.search(pattern, n) for n in names if "ffn_gate_inp" in n or "attn_sinks" in n)
    notes = to_ktransformers(placement, cfg).notes
    assert any("no gpt-oss file" in note for note in notes)


def test_the_window_offers_the_gpt_oss_pair_and_saves_a_profile_naming_it(go_pair, xdg_cache, monkeypatch, tmp_path,
                                                                           request):  # fmt: skip
    """File > Open gpt-oss demo model pair (below the DeepSeek-V3 one) opens the pair; a profile saved on it names
    the demo by size and family."""
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
        assert list(window.family_demo_menus) == ["deepseek", "gpt-oss"]
        menu = window.family_demo_menus["gpt-oss"]
        assert menu.title() == "Open gpt-oss demo model pair (synthetic)"
        assert [a.text() for a in menu.actions()] == ["Folders (safetensors, MXFP4 experts, BF16 elsewhere)"]
        assert "synthetic: random weights" in menu.actions()[0].toolTip()
        window.act_open_family_demos["gpt-oss"]["safetensors", None].trigger()
        qtbot.waitUntil(lambda: state.model is not None and not state.busy, timeout=120_000)
        m = state.model
        assert (m.demo, m.target_path, m.synthetic) == ("gpt-oss/default", str(go_pair.target), True)
        assert m.config.architecture == "gpt_oss" and m.draft_path == str(go_pair.draft)
        assert state.save_profile(tmp_path / "window.yaml")
        saved = load(tmp_path / "window.yaml")
        assert saved.model == ModelRef(demo="default", family="gpt-oss", fingerprint=m.fingerprint)
        assert saved.draft == ModelRef(demo="default", family="gpt-oss", fingerprint=m.draft_fingerprint)
    finally:
        if window is not None:
            window.state.saved_placement = window.state.placement  # no unsaved-changes question
            window.close()
        state.shutdown()


def test_the_qwen3_sizes_are_untouched():
    assert "family" not in recipe(SIZES["default"]) and demo.family_sizes("gpt-oss") is GPT_OSS_SIZES
