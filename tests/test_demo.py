"""The built-in demo pair: what it contains, its acceptance, determinism, and rebuilding when damaged."""

import json
import math
import shutil

import numpy as np
import pytest

from engine.checkpoints import demo
from engine.checkpoints.checkpoint import Checkpoint
from engine.checkpoints.demo import DEMO_PROMPTS, SIZES, check_pair, ensure_demo_pair, model_tensors
from engine.cli import main
from engine.core.errors import ArgumentError
from engine.model import Engine
from engine.runs.run import DecodeRun


@pytest.fixture(scope="session")
def demo_pair(xdg_cache):
    # The same folder as the other test files use, so the pair is built once per session.
    return ensure_demo_pair("default", cache_dir=xdg_cache / "expertbench")


def test_configs_say_synthetic_and_load(demo_pair):
    target, draft = Checkpoint.open(demo_pair.target), Checkpoint.open(demo_pair.draft)
    for ck in (target, draft):
        assert ck.config.synthetic and ck.raw_config["expertbench_synthetic"] is True
        assert ck.tokenizer.get_vocab_size() == ck.config.vocab_size == 4096
        assert {t.dtype for t in ck.tensors.values()} == {"BF16"}
        assert ck.config.max_position_embeddings >= 4096
    assert target.raw_config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert draft.raw_config["architectures"] == ["Qwen3ForCausalLM"]
    assert target.config.moe_layers == list(range(target.config.num_layers))
    assert draft.config.num_layers < target.config.num_layers
    expected = [
        "model.layers.0.mlp.gate.weight",
        "model.layers.7.mlp.experts.15.down_proj.weight",
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.0.self_attn.k_norm.weight",
        "lm_head.weight",
    ]
    for name in expected:
        assert name in target.tensors, name
    assert "model.layers.3.mlp.down_proj.weight" in draft.tensors
    assert (demo_pair.target.parent / "manifest.json").is_file()


def test_prompts_round_trip_through_the_tokenizer(demo_pair):
    tok = Checkpoint.open(demo_pair.target).tokenizer
    for prompt in DEMO_PROMPTS:
        ids = tok.encode(prompt, add_special_tokens=False).ids
        assert tok.decode(ids) == prompt
        assert len(ids) < len(prompt) / 2  # English words are merged tokens, not single bytes


def test_acceptance_at_q2_is_realistic_and_output_varied(demo_pair):
    """The `expertbench run` defaults (built-in prompts, 64 tokens, q=2) land between 70 % and 85 %."""
    with Engine() as eng:
        target, draft = eng.load(demo_pair.target), eng.load(demo_pair.draft)
        res = DecodeRun(target, draft, prompts=DEMO_PROMPTS, tokens_per_prompt=64, q=2).run()
        if not 0.70 <= res.accept_rate <= 0.85:  # the per-prompt figures cost four more runs: only on failure
            per_prompt = [round(r, 3) for r in _per_prompt_acceptance(target, draft)]
            pytest.fail(
                f"demo acceptance at q=2 is {res.accept_rate:.3f}, expected 0.70..0.85 (per prompt {per_prompt})"
            )
    for p in res.prompts:
        assert len(set(p.generated_ids)) >= 32, "greedy output loops instead of varying"


def _per_prompt_acceptance(target, draft):
    for prompt in DEMO_PROMPTS:
        r = DecodeRun(target, draft, prompts=[prompt], tokens_per_prompt=64, q=2).run()
        yield r.accept_rate


def test_the_build_is_deterministic(demo_pair, tmp_path):
    again = ensure_demo_pair("default", cache_dir=tmp_path)
    assert again.built and again.reason == "missing"
    first = json.loads((demo_pair.target.parent / "manifest.json").read_text())["files"]
    second = json.loads((again.target.parent / "manifest.json").read_text())["files"]
    assert first == second


def test_intact_pair_is_reused_and_damage_is_rebuilt(demo_pair, tmp_path):
    folder = tmp_path / demo_pair.target.parent.name
    shutil.copytree(demo_pair.target.parent, folder)
    spec = SIZES["default"]
    assert check_pair(folder, spec) == "" and check_pair(folder, spec, full=True) == ""
    assert not ensure_demo_pair("default", cache_dir=tmp_path).built

    weights = folder / "target" / "model.safetensors"
    with weights.open("r+b") as f:  # same size, different bytes: only the full check sees it
        f.seek(4096)
        f.write(b"\xff" * 16)
    assert check_pair(folder, spec) == ""
    assert check_pair(folder, spec, full=True) == "damaged (target/model.safetensors does not match its sha256)"
    rebuilt = ensure_demo_pair("default", cache_dir=tmp_path, verify=True)
    assert rebuilt.built and "sha256" in rebuilt.reason
    assert check_pair(folder, spec, full=True) == ""

    (folder / "draft" / "config.json").write_text("{}")
    assert check_pair(folder, spec).startswith("damaged (draft/config.json has 2 bytes, expected")
    (folder / "draft" / "tokenizer.json").unlink()
    (folder / "manifest.json").write_text("not json")
    assert check_pair(folder, spec) == "damaged (manifest.json unreadable)"
    (folder / "manifest.json").unlink()
    assert check_pair(folder, spec) == "incomplete (no manifest.json)"
    assert check_pair(tmp_path / "nothing-here", spec) == "missing"


def test_a_changed_recipe_means_a_rebuild(demo_pair, tmp_path):
    folder = tmp_path / demo_pair.target.parent.name
    shutil.copytree(demo_pair.target.parent, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["recipe"]["expert_deviation"] = 0.5
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert check_pair(folder, SIZES["default"]) == "built from an older recipe"


def test_bench_size_is_about_a_billion_parameters():
    spec = SIZES["bench"]
    target = sum(math.prod(shape) for _, shape, _ in model_tensors(spec, "target"))  # shapes only, nothing built
    assert 0.9e9 < target < 1.2e9
    assert (spec.hidden_size, spec.num_layers, spec.num_experts, spec.top_k) == (1024, 16, 32, 4)
    assert (spec.moe_intermediate_size, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (512, 16, 4, 64)
    assert spec.vocab_size == 32000


def test_wide_size_has_qwen3_30b_a3b_layers():
    spec = SIZES["wide"]
    assert (spec.hidden_size, spec.num_experts, spec.top_k, spec.moe_intermediate_size) == (2048, 128, 8, 768)
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.vocab_size) == (32, 4, 128, 32000)
    target = sum(math.prod(shape) for _, shape, _ in model_tensors(spec, "target"))  # shapes only, nothing built
    assert 4.5e9 < target < 6e9  # a few GB in bf16 with 8 layers
    assert spec.num_layers >= 8


def test_experts_share_their_layers_base_bit_for_bit():
    """The cached base changes no bit: an expert is the base plus its deviation, made again from the keys."""
    from engine.families.synthetic import INIT_STD, expert, normal

    for e in (0, 1, 0):
        w = expert(3, e, "up_proj", (64, 32), 0.05, 1.0)()
        want = normal("3.base.up_proj", (64, 32))
        want += normal(f"3.expert.{e}.up_proj", (64, 32), INIT_STD * 0.05)
        assert np.array_equal(w, want)
        w[:] = 0  # a caller writing into its expert leaves the base alone


def test_unknown_size():
    with pytest.raises(ArgumentError, match="demo model size 'huge' is unknown: expected one of default, bench"):
        ensure_demo_pair("huge")


def test_cache_folder_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert demo.demo_folder("bench") == tmp_path / "expertbench" / "demo-bench-v1"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert demo.cache_root() == tmp_path / "home" / ".cache" / "expertbench"


def test_demo_model_command(demo_pair, xdg_cache, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    assert main(["demo-model", "--json", "--verify"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target"] == str(demo_pair.target) and report["draft"] == str(demo_pair.draft)
    assert report["synthetic"] is True and report["built"] is False and report["checked"] == "sha256"
    assert main(["demo-model"]) == 0
    out = capsys.readouterr().out
    assert "synthetic" in out and "intact (sizes checked)" in out
