"""Every demo pair the command line can make accepts between 70 % and 85 % of its drafted tokens, as the README
promises, in both precisions: the `expertbench run` defaults (the four built-in prompts, 64 tokens, q = 2) at the
default size, the smallest the command line makes (the sizes of the tests, tiny, were never tuned). The pairs are read
from the tables `demo-model` takes its choices from, so a new family, format or quantization is checked as it comes."""

import pytest

from engine.checkpoints.demo import DEMO_PROMPTS, MOE_DRAFTS, QUANTS, RECIPES, ensure_demo_pair
from engine.model import Engine
from engine.runs.run import DecodeRun

PAIRS = [(family, fmt, quant) for family, recipe in RECIPES.items() for fmt in recipe.formats
         for quant in (QUANTS if fmt == "gguf" else [None])]  # fmt: skip


def test_every_pair_the_command_line_makes_is_checked():
    assert ("qwen3", "gguf", "mxfp4") in PAIRS and ("qwen3", "safetensors", None) in PAIRS
    assert {family for family, _, _ in PAIRS} == set(RECIPES) and len(PAIRS) >= 5


@pytest.mark.parametrize("precision", ["f32", "q8"])
@pytest.mark.parametrize(("family", "fmt", "quant"), PAIRS, ids=[f"{f}-{q or fmt}" for f, fmt, q in PAIRS])
def test_acceptance_at_q2_is_in_the_band(xdg_cache, family, fmt, quant, precision):
    pair = ensure_demo_pair("default", cache_dir=xdg_cache / "expertbench", format=fmt, quant=quant, family=family)
    with Engine() as eng:
        target, draft = eng.load(pair.target), eng.load(pair.draft)
        res = DecodeRun(target, draft, prompts=DEMO_PROMPTS, tokens_per_prompt=64, q=2, precision=precision).run()
    assert res.precision == precision and res.drafted_tokens >= 150
    assert 0.70 <= res.accept_rate <= 0.85, (
        f"{family} {quant or fmt} demo acceptance at q=2 in {precision} is {res.accept_rate:.3f}, expected 0.70..0.85"
    )


def test_the_mxfp4_pairs_draft_is_a_small_moe_of_the_targets_own_experts(xdg_cache):
    """Where the experts are 4-bit, the draft carries the target's own routers and experts (as the file holds them) in
    its layers, and routes each token to fewer of them: far cheaper than the target, yet it follows the quantized
    experts that a dense draft could not (acceptance at the run defaults 0.56 / 0.51 before, f32 / q8)."""
    from engine.checkpoints.checkpoint import Checkpoint
    from engine.checkpoints.demo import SIZES, draft_layer_map

    pair = ensure_demo_pair("default", cache_dir=xdg_cache / "expertbench", format="gguf", quant="mxfp4")
    target, draft = Checkpoint.open(pair.target), Checkpoint.open(pair.draft)
    spec = SIZES["default"]
    assert draft.config.num_layers == spec.draft_layers < target.config.num_layers
    assert draft.config.top_k == MOE_DRAFTS["mxfp4"] < target.config.top_k
    assert draft.config.num_experts == target.config.num_experts
    for j, layer in enumerate(draft_layer_map(spec)):
        for name in ("mlp.gate.weight", "mlp.experts.3.up_proj.weight", "mlp.experts.15.down_proj.weight"):
            ours, theirs = draft.tensors[f"model.layers.{j}.{name}"], target.tensors[f"model.layers.{layer}.{name}"]
            assert ours.dtype == theirs.dtype and ours.nbytes == theirs.nbytes
            with open(ours.file, "rb") as a, open(theirs.file, "rb") as b:
                a.seek(ours.offset)
                b.seek(theirs.offset)
                assert a.read(ours.nbytes) == b.read(theirs.nbytes), (j, name)
