"""DeepSeek-V4: the family (engine/families/deepseek_v4.py) reads and checks a V4 config.json as transformers 5.25.0
reads it and names each bad key; the core runs its forward pass (native/src/models/deepseek_v4.c, the cpu module's
"deepseek_v4" extension); llama.cpp's deepseek4 GGUF files are read, each bad key named. The fixtures
(tests/fixtures/deepseek-v4-*, recipes/deepseek_v4.py: transformers' own DeepseekV4ForCausalLM with seeded weights
and its reference logits) are in the conformance suite (fixture_registry.REGISTRY); here: what the recipe promises of
them, the compressors' state across batches and roll backs, and bad tensors named."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from fixture_paths import FIXTURES
from fixture_registry import BY_NAME

from engine.checkpoints.checkpoint import Checkpoint, parse_config, read_weights
from engine.cli import main
from engine.core.errors import CheckpointError, UnsupportedError
from engine.families import FAMILIES, deepseek_v4
from engine.families.base import ConfigKeys
from engine.families.deepseek_v4 import CSA, HASH, HCA, ROUTED, SLIDING
from engine.model import Engine

F32 = FIXTURES / "deepseek-v4-f32"
BF16 = FIXTURES / "deepseek-v4-bf16"
V4_FIXTURES = [BY_NAME["deepseek-v4-f32"], BY_NAME["deepseek-v4-bf16"]]
# transformers 5.25.0's DeepseekV4RotaryEmbedding buffers for the fixtures' config (main_inv_freq, compress_inv_freq)
MAIN_INV_FREQ = (1.0, 0.3162277638912201, 0.10000000149011612, 0.03162277862429619, 0.009999999776482582,
                 0.003162277862429619, 0.0010000000474974513, 0.0003162277862429619)  # fmt: skip
COMPRESS_INV_FREQ = (1.0, 0.1397542506456375, 0.012500000186264515, 0.0027950850781053305, 0.0006249999860301614,
                     0.00013975425099488348, 3.125000148429535e-05, 6.987712822592584e-06)  # fmt: skip


def fixture_config() -> dict:
    return json.loads((F32 / "config.json").read_text())


def read(raw: dict, path: Path = Path("config.json")) -> deepseek_v4.V4Config:
    return deepseek_v4.read_config(ConfigKeys(raw, path), raw["hidden_size"], raw["num_attention_heads"],
                                   raw["num_hidden_layers"])  # fmt: skip


# ---- the config reader -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", [F32, BF16], ids=lambda p: p.name)
def test_the_fixture_s_config_reads_as_transformers_built_the_model(folder):
    raw = json.loads((folder / "config.json").read_text())
    v4 = read(raw, folder / "config.json")
    assert v4.layer_types == (SLIDING, CSA, HCA, CSA)
    assert [v4.compress_rate(i) for i in range(4)] == [0, 4, 128, 4]
    assert (v4.csa_rate, v4.hca_rate) == (4, 128)
    assert v4.mlp_layer_types == (HASH, HASH, ROUTED, ROUTED) and v4.hash_layers == (0, 1)
    assert (v4.head_dim, v4.q_lora_rank, v4.o_groups, v4.o_lora_rank, v4.sliding_window) == (32, 24, 2, 16, 8)
    assert (v4.index_n_heads, v4.index_head_dim, v4.index_topk) == (8, 24, 4)
    assert (v4.hc_mult, v4.hc_sinkhorn_iters, v4.hc_eps) == (4, 10, 1e-6)
    assert (v4.num_experts, v4.top_k, v4.moe_intermediate_size) == (8, 2, 16)
    assert (v4.routed_scaling_factor, v4.swiglu_limit, v4.next_token_layers) == (1.5, 1.0, 0)
    main, compress = v4.main_rope, v4.compress_rope
    assert (main.theta, main.dim, main.yarn, main.attention_factor) == (10000.0, 16, False, 1.0)
    assert (compress.theta, compress.dim, compress.yarn, compress.attention_factor) == (160000.0, 16, True, 1.0)
    assert main.inv_freq == MAIN_INV_FREQ
    # base.yarn_rope in f32: transformers' frequencies to within two float32 ulps
    np.testing.assert_allclose(compress.inv_freq, COMPRESS_INV_FREQ, rtol=3e-7, atol=0)


def test_the_shared_fields_are_those_v4_has_the_meaning_of():
    raw = fixture_config()
    kw = deepseek_v4.config_keys(ConfigKeys(raw, Path("config.json")), 32, 4, 4)
    native = dict(kw.pop("native_fields"))
    np.testing.assert_allclose(native.pop("compress_inv_freq"), COMPRESS_INV_FREQ, rtol=3e-7, atol=0)
    assert kw == {"num_kv_heads": 1, "head_dim": 32, "intermediate_size": 16, "num_experts": 8, "top_k": 2,
                  "moe_intermediate_size": 16, "n_shared_experts": 1, "norm_topk_prob": True,
                  "routed_scaling_factor": 1.5, "q_lora_rank": 24, "rope_dim": 16, "rope_interleave": True,
                  "rope_inv_freq": MAIN_INV_FREQ, "attention_scale": 32**-0.5, "swiglu_limit": 1.0}  # fmt: skip
    # the core's own V4 fields: kinds 0 sliding, 1 CSA, 2 HCA (EB_V4_*), hash layers 1
    assert native == {"hc_mult": 4, "hc_sinkhorn_iters": 10, "hc_eps": 1e-6, "o_groups": 2, "o_lora_rank": 16,
                      "sliding_window": 8, "layer_kind": (0, 1, 2, 1), "layer_hash": (1, 1, 0, 0), "n_layer_kind": 4,
                      "csa_rate": 4, "hca_rate": 128, "index_n_heads": 8,
                      "index_head_dim": 24, "index_topk": 4}  # fmt: skip


def test_ropes_of_two_widths_are_refused_by_name():
    """The engine rotates one slice of a head with either RoPE: a nested rope_parameters whose two RoPEs rotate
    different widths is refused, naming both."""
    raw = fixture_config()
    raw["rope_parameters"]["compress"]["partial_rotary_factor"] = 0.25
    with pytest.raises(UnsupportedError, match=r"the main RoPE rotates 16 channels and the compress RoPE 8"):
        deepseek_v4.config_keys(ConfigKeys(raw, Path("config.json")), 32, 4, 4)


def released_form(raw: dict, **extra) -> dict:
    """The fixture's config in the released checkpoints' older keys, as DeepSeek-V4-Flash's config.json has them."""
    out = {k: v for k, v in raw.items() if k not in ("layer_types", "mlp_layer_types", "compress_rates",
                                                     "rope_parameters", "partial_rotary_factor")}  # fmt: skip
    compress = raw["rope_parameters"]["compress"]
    out |= {
        "compress_ratios": [0, 4, 128, 4],
        "num_hash_layers": 2,
        "qk_rope_head_dim": 16,
        "rope_scaling": {"type": "yarn", "factor": compress["factor"], "beta_fast": 32, "beta_slow": 1,
                         "original_max_position_embeddings": compress["original_max_position_embeddings"]},
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
    }  # fmt: skip
    return out | extra


def test_the_released_names_fold_in_as_transformers_folds_them():
    """compress_ratios (a kind per layer), num_hash_layers, qk_rope_head_dim and a flat rope_scaling (YaRN on the
    compressed branches' RoPE only, its attention factor 1.0) give the same model; compress_ratios may be longer (the
    next-token-prediction layers' entries, as V4-Flash's 44 for 43 layers)."""
    raw = fixture_config()
    assert read(released_form(raw)) == read(raw)
    longer = read(released_form(raw, compress_ratios=[0, 4, 128, 4, 0], num_nextn_predict_layers=1))
    assert longer == dataclasses.replace(read(raw), next_token_layers=1)
    rates = released_form(raw, compress_ratios=[0, 4, 128, 4], compress_rate_hca=64, compress_rate_csa=2)
    assert (read(rates).csa_rate, read(rates).hca_rate) == (2, 64)  # the values name kinds; the rates are these


def test_keys_transformers_does_not_read_for_v4_are_not_read():
    """V3's routing keys and the counts transformers fixes for V4 (one key=value head, one shared expert) change
    nothing: transformers runs such a config as the fixture's."""
    raw = fixture_config()
    other = raw | {"num_key_value_heads": 4, "n_shared_experts": 2, "norm_topk_prob": False, "attention_bias": True,
                   "n_group": 8, "topk_group": 4, "first_k_dense_replace": 1, "topk_method": "greedy"}  # fmt: skip
    assert read(other) == read(raw)


def test_transformers_defaults_fill_what_a_config_leaves_out():
    raw = {"architectures": ["DeepseekV4ForCausalLM"], "hidden_size": 64, "num_attention_heads": 8,
           "num_hidden_layers": 5, "vocab_size": 100}  # fmt: skip
    v4 = read(raw)
    assert v4.layer_types == (HCA, HCA, HCA, CSA, HCA)  # two HCA layers, then CSA and HCA alternating from HCA
    assert v4.mlp_layer_types == (HASH, HASH, HASH, ROUTED, ROUTED)
    assert (v4.csa_rate, v4.hca_rate, v4.head_dim, v4.sliding_window) == (4, 128, 512, 128)
    assert (v4.hc_mult, v4.hc_sinkhorn_iters, v4.swiglu_limit, v4.index_topk) == (4, 20, 10.0, 512)
    assert (v4.main_rope.dim, v4.compress_rope.theta, v4.compress_rope.yarn) == (64, 160000.0, False)
    assert read(raw | {"num_hidden_layers": 2}).mlp_layer_types == (HASH, HASH)  # the default 3, clamped


# ---- bad input, each named by its key ----------------------------------------------------------------------------


def without(*keys: str) -> dict:
    return {k: v for k, v in fixture_config().items() if k not in keys}


BAD = {
    # compress_ratios (the released per-layer key) and layer_types
    "compress_ratios too short": (without("layer_types") | {"compress_ratios": [0, 4, 128]}, CheckpointError,
                                  r"'compress_ratios' = 3 entries, expected at least one per layer "
                                  r"\(num_hidden_layers = 4"),
    "compress_ratios not a list": (without("layer_types") | {"compress_ratios": 4}, CheckpointError,
                                   r"'compress_ratios' = 4, expected at least one per layer"),
    "compress_ratios value": (without("layer_types") | {"compress_ratios": [0, 4, 64, 4]}, CheckpointError,
                              r"'compress_ratios'\[2\] = 64, expected 0 \(sliding window only\), 4 \(compressed sparse "
                              r"attention\) or 128 \(heavily compressed attention\)"),
    "compress_ratios value past the layers": (without("layer_types") | {"compress_ratios": [0, 4, 128, 4, 1]},
                                              CheckpointError, r"'compress_ratios'\[4\] = 1, expected 0"),
    "compress_ratios against layer_types": (fixture_config() | {"compress_ratios": [0, 4, 4, 4]}, CheckpointError,
                                            r"'layer_types'\[2\] = 'heavily_compressed_attention' but "
                                            r"'compress_ratios'\[2\] = 4 \(compressed_sparse_attention\)"),
    "layer_types too short": (fixture_config() | {"layer_types": [SLIDING, CSA]}, CheckpointError,
                              r"'layer_types' = 2 entries, expected a list of one entry per layer"),
    "layer_types value": (fixture_config() | {"layer_types": [SLIDING, CSA, "full_attention", CSA]}, CheckpointError,
                          r"'layer_types'\[2\] = 'full_attention', expected one of 'sliding_attention', "),
    # compress_rates
    "compress_rates without a kind a layer has": (fixture_config() | {"compress_rates": {CSA: 4}}, CheckpointError,
                                                  r"'compress_rates' has no rate for 'heavily_compressed_attention', "
                                                  r"which layer 2 is"),
    "compress_rates zero": (fixture_config() | {"compress_rates": {CSA: 0, HCA: 128}}, CheckpointError,
                            r"'compress_rates'\['compressed_sparse_attention'\] = 0, expected a positive integer"),
    "compress_rates of another kind": (fixture_config() | {"compress_rates": {CSA: 4, HCA: 128, "full": 2}},
                                       CheckpointError, r"'compress_rates' names 'full', expected"),
    "compress_rate_hca": (fixture_config() | {"compress_rate_hca": -8}, CheckpointError,
                          r"'compress_rate_hca' = -8, expected a positive integer below 65536"),
    # mHC
    "hc_mult zero": (fixture_config() | {"hc_mult": 0}, CheckpointError,
                     r"'hc_mult' = 0, expected an integer in 1\.\.64"),
    "hc_mult negative": (fixture_config() | {"hc_mult": -4}, CheckpointError, r"'hc_mult' = -4, expected an integer"),
    "hc_mult a float": (fixture_config() | {"hc_mult": 4.0}, CheckpointError, r"'hc_mult' = 4\.0, expected int"),
    "hc_sinkhorn_iters zero": (fixture_config() | {"hc_sinkhorn_iters": 0}, CheckpointError,
                               r"'hc_sinkhorn_iters' = 0, expected an integer in 1\.\."),
    "hc_eps": (fixture_config() | {"hc_eps": -1e-6}, CheckpointError,
               r"'hc_eps' = -1e-06, expected a number in \[0, 1\)"),
    # hash routing
    "num_hash_layers past the layers": (without("mlp_layer_types") | {"num_hash_layers": 5}, CheckpointError,
                                        r"'num_hash_layers' = 5, expected 0\.\.num_hidden_layers \(4\)"),
    "num_hash_layers negative": (without("mlp_layer_types") | {"num_hash_layers": -1}, CheckpointError,
                                 r"'num_hash_layers' = -1, expected 0\.\.num_hidden_layers"),
    "num_hash_layers against mlp_layer_types": (fixture_config() | {"num_hash_layers": 3}, CheckpointError,
                                                r"'mlp_layer_types' \(hash_moe, hash_moe, moe, moe\) is not "
                                                r"'num_hash_layers' = 3 hash-routed layers"),
    "mlp_layer_types value": (fixture_config() | {"mlp_layer_types": [HASH, "dense", ROUTED, ROUTED]},
                              CheckpointError, r"'mlp_layer_types'\[1\] = 'dense', expected one of 'hash_moe', 'moe'"),
    # attention and experts
    "o_groups": (fixture_config() | {"o_groups": 3}, CheckpointError,
                 r"'o_groups' = 3 does not divide num_attention_heads \* head_dim = 128"),
    "num_experts_per_tok": (fixture_config() | {"num_experts_per_tok": 9}, CheckpointError,
                            r"'num_experts_per_tok' = 9, expected 1\.\.n_routed_experts \(8\)"),
    "index_head_dim below the RoPE": (fixture_config() | {"index_head_dim": 8}, CheckpointError,
                                      r"'index_head_dim' = 8 is smaller than the compress RoPE's 16 rotated channels"),
    "sliding_window": (fixture_config() | {"sliding_window": 0}, CheckpointError, r"'sliding_window' = 0, expected"),
    "swiglu_limit": (fixture_config() | {"swiglu_limit": 0.0}, CheckpointError,
                     r"'swiglu_limit' = 0\.0, expected a positive number"),
    # RoPE
    "qk_rope_head_dim against partial_rotary_factor": (fixture_config() | {"qk_rope_head_dim": 8}, CheckpointError,
                                                       r"'qk_rope_head_dim' = 8 but 'partial_rotary_factor' = 0\.5 "
                                                       r"of head_dim 32 rotates 16 channels"),
    "an odd RoPE": (without("rope_parameters") | {"partial_rotary_factor": 0.25 + 1 / 32, "qk_rope_head_dim": None},
                    CheckpointError, r"'partial_rotary_factor' makes the RoPE rotate 9 channels of head_dim 32, "
                                     r"expected an even number"),
    "a nested RoPE without its theta": (fixture_config() | {"rope_parameters": {
        "main": {"rope_type": "default", "partial_rotary_factor": 0.5, "rope_theta": 10000.0},
        "compress": {"rope_type": "default", "partial_rotary_factor": 0.5}}}, CheckpointError,
        r"'rope_parameters\.compress\.rope_theta' = None, expected a number in 1\.\.1e12"),
    "a YaRN factor": (without("rope_parameters") | {"rope_scaling": {"type": "yarn", "factor": 0.5}}, CheckpointError,
                      r"'rope_scaling\.factor' = 0\.5, expected a number in 1\.\.1e6"),
    # what transformers' DeepseekV4ForCausalLM does not have
    "scoring_func": (fixture_config() | {"scoring_func": "sigmoid"}, UnsupportedError,
                     r"scoring_func 'sigmoid' is not supported \(expected 'sqrtsoftplus', DeepSeek-V4's router\)"),
    "shared-expert biases": (fixture_config() | {"mlp_bias": True}, UnsupportedError,
                             r"mlp_bias = true is not supported for deepseek_v4"),
    "num_key_value_heads of another type": (fixture_config() | {"num_key_value_heads": "1"}, CheckpointError,
                                            r"'num_key_value_heads' = '1', expected int"),
    "another RoPE": (without("rope_parameters") | {"rope_scaling": {"type": "linear", "factor": 2.0}}, UnsupportedError,
                     r"'rope_scaling' rope_type 'linear' is not supported \(expected 'default' or 'yarn'\)"),
}  # fmt: skip


@pytest.mark.parametrize("name", BAD)
def test_a_bad_config_is_refused_with_its_key_named(name, tmp_path):
    raw, cls, pattern = BAD[name]
    raw = {k: v for k, v in raw.items() if v is not None}
    path = tmp_path / "config.json"
    with pytest.raises(cls, match=pattern) as info:
        parse_config(raw, path)
    assert type(info.value) is cls and str(path) in str(info.value)
    # the folder's own reader, before any tensor is read: the same error, not the family's refusal
    linked_copy(F32, tmp_path / "m", raw)
    with pytest.raises(cls, match=pattern):
        Checkpoint.open(tmp_path / "m")


def linked_copy(src: Path, dst: Path, raw: dict) -> None:
    """A copy of the fixture folder (its files linked, not copied) with another config.json."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "config.json":
            (dst / f.name).symlink_to(f)
    (dst / "config.json").write_text(json.dumps(raw))


def test_the_shared_keys_are_checked_before_the_refusal_too(tmp_path):
    with pytest.raises(CheckpointError, match=r"'vocab_size' = 0, expected a positive integer"):
        parse_config(fixture_config() | {"vocab_size": 0}, tmp_path / "config.json")


# ---- the forward pass --------------------------------------------------------------------------------------------


def test_the_family_runs_in_the_core():
    assert deepseek_v4.DEEPSEEK_V4 in FAMILIES and deepseek_v4.DEEPSEEK_V4.native_code == 5  # EB_ARCH_DEEPSEEK_V4
    assert not deepseek_v4.DEEPSEEK_V4.awaiting


def test_the_command_line_runs_a_v4_folder(capsys):
    assert main(["run", "--model", str(F32), "--no-draft", "-n", "4", "--repeats", "1"]) == 0
    assert "Traceback" not in capsys.readouterr().err


@pytest.fixture(scope="module")
def f32_model():
    with Engine() as eng:
        yield eng.load(F32)


def whole_sequence() -> np.ndarray:
    ref = np.load(F32 / "reference.npz")
    return np.concatenate([ref["prompt_ids"], ref["generated_ids"]])


def test_transformers_logits_at_every_position(f32_model):
    """The one forward's logits of transformers at all 203 positions, the sequence in one prefill: within 1e-5
    (f32 arithmetic in another order; the conformance suite holds both folders to its 1e-4)."""
    ids = whole_sequence()
    with f32_model.context(len(ids)) as ctx:
        ours = ctx.prefill(ids)
    assert np.abs(ours - np.load(F32 / "reference.npz")["logits"]).max() < 1e-5


@pytest.mark.parametrize("n_batch", [1, 3, 4, 5, 8, 128, 512])
def test_a_sequence_in_any_batches_gives_the_bits_of_single_steps(f32_model, n_batch):
    """The compressors' windows (4 and 128 positions, CSA's overlapping halves) and the sliding window (8) cut by
    batches of every size: the bits of one position at a time."""
    ids = whole_sequence()
    with f32_model.context(len(ids), n_batch=1) as ctx:
        single = np.concatenate([ctx.decode([t]) for t in ids])
    with f32_model.context(len(ids), n_batch=n_batch) as ctx:
        assert np.array_equal(ctx.prefill(ids), single)


@pytest.mark.parametrize("back_to", [0, 3, 100, 126, 127, 128, 131, 150])
def test_a_roll_back_across_compressed_windows_gives_the_bits_of_a_new_context(f32_model, back_to):
    """A context that ran other tokens past back_to (through CSA windows and the HCA window that ends at position
    127), truncated to back_to and fed the sequence's own tokens: the logits of a context that never saw the others,
    bit for bit; so are speculative steps of q + 1 tokens rolled back and decoded again."""
    ids = whole_sequence()
    with f32_model.context(len(ids), n_batch=512) as ctx:
        expected = ctx.prefill(ids)
    other = (ids[back_to:] * 7 + 3) % 512
    with f32_model.context(len(ids), n_batch=16) as ctx:
        if back_to:
            ctx.prefill(ids[:back_to])
        ctx.prefill(other)
        ctx.truncate(back_to)
        assert np.array_equal(ctx.prefill(ids[back_to:]), expected[back_to:])
        for q in (1, 3, 5):  # verify q drafts, reject them all, decode the true token
            at = len(ids) - 20
            ctx.truncate(at)
            ctx.decode(other[: q + 1])
            ctx.truncate(at)
            assert np.array_equal(ctx.decode(ids[at : at + 1]), expected[at : at + 1])


@pytest.mark.parametrize("folder", [F32, BF16], ids=lambda p: p.name)
def test_the_q8_precision_on_float_weights_gives_the_f32_bits(folder):
    """Float formats are read in f32 in either precision (V4's own operations are f32 always): the q8 precision of a
    float folder is the f32 one, bit for bit, experts on a peer included. No quantized V4 layout is read yet."""
    ids = whole_sequence()[:150]
    with Engine() as eng:
        model = eng.load(folder)
        out = {}
        for precision in ("f32", "q8"):
            with model.context(len(ids), n_batch=8) as ctx:
                ctx.precision = precision
                out[precision] = ctx.prefill(ids)
    assert np.array_equal(out["q8"], out["f32"])


def test_the_model_info_counts_the_per_position_state(f32_model):
    """Each layer keeps per position its key=value row, its compressors' projections and a compressed entry's slot
    (6 head_dim + 5 index_head_dim floats, eb_v4_cache_row): the KV bytes a position costs."""
    assert f32_model.info["kv_bytes_per_token"] == 4 * (6 * 32 + 5 * 24) * 4 and f32_model.info["kv_window_bytes"] == 0


def test_the_cost_model_counts_the_per_position_state_as_the_core_does(f32_model):
    """The placement's memory figures (ModelShape's KV bytes a position adds) are the core's, not the 2 x head_dim
    of one key=value head that the general rule would give."""
    from engine.placement.costmodel import ModelShape

    shape = ModelShape.from_checkpoint(Checkpoint.open(F32))
    assert shape.kv_bytes_per_token == f32_model.info["kv_bytes_per_token"] == 4 * 4 * (6 * 32 + 5 * 24)
    assert shape.kv_window_bytes == f32_model.info["kv_window_bytes"] == 0


def test_the_cost_model_counts_the_state_a_step_reads_at_a_context_as_the_core_reads_it():
    """A V4 step does not read every position's state: each layer its window's key=value rows, an HCA layer its
    compressed entries (one per 128 positions), a CSA layer the indexer's key of every entry (one per 4 positions)
    and the index_topk entries it keeps. The fixture: window 8, layers sliding / CSA / HCA / CSA, head_dim 32,
    index_head_dim 24, index_topk 4."""
    from engine.placement.costmodel import ModelShape

    shape = ModelShape.from_checkpoint(Checkpoint.open(F32))
    window = 4 * 32 * 8  # floats of the four layers' windows
    assert shape.kv_read_bytes(0) == 0
    assert shape.kv_read_bytes(100) == 4 * (window + 2 * (24 * 25 + 32 * 4))  # 25 CSA entries, no HCA entry yet
    assert shape.kv_read_bytes(1000) == 4 * (window + 2 * (24 * 250 + 32 * 4) + 32 * 7)
    # the general rule (every position of every layer) would count the whole state, some 90 times more
    assert shape.kv_row_bytes * 4 * 1000 > 90 * shape.kv_read_bytes(1000)


def test_the_cost_model_counts_the_experts_and_the_shared_expert():
    """Placement sizes V4's experts (ffn.experts.M.*) and its shared expert (ffn.shared_experts.*) from the tensor
    table as it sizes the others' (mlp.*): gate, up and down of 16 x 32 f32 values each."""
    from engine.placement.costmodel import ModelShape

    shape = ModelShape.from_checkpoint(Checkpoint.open(F32))
    assert (shape.moe_layers, shape.num_experts, shape.top_k) == ((0, 1, 2, 3), 8, 2)
    assert shape.expert_bytes == shape.shared_bytes == 3 * 16 * 32 * 4


# ---- bad tensors, each named -------------------------------------------------------------------------------------


def edited_copy(tmp_path: Path, edit) -> Path:
    """The f32 fixture with its tensors edited (edit(tensors) changes the dict in place)."""
    from safetensors.numpy import load_file, save_file

    dst = tmp_path / "m"
    dst.mkdir()
    for f in F32.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).symlink_to(f)
    tensors = load_file(F32 / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors")
    return dst


def out_of_range(t):
    t["model.layers.1.ffn.gate.tid2eid"][7, 1] = 8


def repeated(t):
    t["model.layers.0.ffn.gate.tid2eid"][9] = 5


def table_shape(t):
    t["model.layers.0.ffn.gate.tid2eid"] = t["model.layers.0.ffn.gate.tid2eid"][:, :1].copy()


def no_compressor_bias(t):
    del t["model.layers.2.attn.compressor.ape"]


def indexer_shape(t):
    t["model.layers.3.attn.indexer.weights_proj.weight"] = np.zeros((4, 32), np.float32)


BAD_TENSORS = {
    "tid2eid expert out of range": (out_of_range, r"tensor 'model\.layers\.1\.ffn\.gate\.tid2eid': token id 7's "
                                                  r"expert 8 \(entry 1\) is out of range, expected 0\.\.7"),
    "tid2eid expert twice": (repeated, r"tensor 'model\.layers\.0\.ffn\.gate\.tid2eid': token id 9 chooses expert "
                                       r"5 twice, expected 2 distinct experts"),
    "tid2eid of the wrong shape": (table_shape, r"'model\.layers\.0\.ffn\.gate\.tid2eid'.*shape"),
    "a compressor's position bias missing": (no_compressor_bias, r"tensor 'model\.layers\.2\.attn\.compressor\.ape' "
                                                                r"is missing from the checkpoint"),
    "an indexer weight of the wrong shape": (indexer_shape, r"tensor 'model\.layers\.3\.attn\.indexer\."
                                                            r"weights_proj\.weight' in '.*' has shape \[4, 32\], "
                                                            r"expected \[8, 32\]"),
}  # fmt: skip


@pytest.mark.parametrize("name", BAD_TENSORS)
def test_a_bad_tensor_is_refused_at_load_with_its_name(tmp_path, name):
    edit, pattern = BAD_TENSORS[name]
    folder = edited_copy(tmp_path, edit)
    with Engine() as eng, pytest.raises(CheckpointError, match=pattern):
        eng.load(folder)


V4_GGUF = FIXTURES / "deepseek-v4-gguf" / "model-mxfp4_moe.gguf"


def edited_gguf(path: Path, keys: dict | None = None, tensors: dict | None = None) -> Path:
    """The deepseek4 fixture rewritten by the gguf package with metadata keys replaced ({key: (value, type)}, or None
    to leave the key out) and tensors replaced ({name: array}, the same type)."""
    keys, tensors = keys or {}, tensors or {}
    r = gguf.GGUFReader(V4_GGUF)
    w = gguf.GGUFWriter(path, "deepseek4")
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in keys:
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub)
    for key, edit in keys.items():
        if edit is not None:
            w.add_key_value(key, edit[0], edit[1], edit[2] if len(edit) > 2 else None)
    for t in r.tensors:
        data = tensors.get(t.name, t.data)
        w.add_tensor(t.name, np.asarray(data), raw_shape=np.asarray(t.data).shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_an_unedited_rewrite_gives_the_fixture_s_logits(tmp_path):
    """The rewriting the bad-key cases below use changes nothing by itself (their errors are the edit's)."""
    ref = np.load(V4_GGUF.parent / "reference-mxfp4_moe.npz")
    ids = np.concatenate([ref["prompt_ids"], ref["generated_ids"]]).tolist()
    with Engine() as eng:
        logits = [eng.load(p).context().decode(ids) for p in (V4_GGUF, edited_gguf(tmp_path / "same.gguf"))]
    assert np.array_equal(logits[0], logits[1])
    assert np.max(np.abs(logits[0] - ref["logits"])) < 1e-4


V = gguf.GGUFValueType
U32, FLOAT, BOOL, STR, ARR, I32 = V.UINT32, V.FLOAT32, V.BOOL, V.STRING, V.ARRAY, V.INT32
BAD_GGUF_KEYS = {
    "a key missing": ({"deepseek4.attention.output_group_count": None}, CheckpointError,
                      r"metadata key 'deepseek4\.attention\.output_group_count' is missing"),
    "another router": ({"deepseek4.expert_gating_func": (2, U32)}, UnsupportedError,
                       r"'deepseek4\.expert_gating_func' = 2, expected 4 \(sqrt-softplus"),
    "two shared experts": ({"deepseek4.expert_shared_count": (2, U32)}, UnsupportedError,
                           r"'deepseek4\.expert_shared_count' = 2, expected 1"),
    "weights not renormalised": ({"deepseek4.expert_weights_norm": (False, BOOL)}, UnsupportedError,
                                 r"'deepseek4\.expert_weights_norm' is false, expected true"),
    "a limit per layer": ({"deepseek4.swiglu_clamp_exp": ([1.0, 2.0, 1.0, 1.0], ARR, FLOAT)}, UnsupportedError,
                          r"'deepseek4\.swiglu_clamp_exp' = \[1\.0, 2\.0, 1\.0, 1\.0\], expected one SwiGLU limit"),
    "the shared expert's limit apart": ({"deepseek4.swiglu_clamp_shexp": ([7.0] * 4, ARR, FLOAT)}, UnsupportedError,
                                        r"'deepseek4\.swiglu_clamp_exp' \(1\.0\) and 'deepseek4\.swiglu_clamp_shexp' "
                                        r"\(7\.0\) differ"),
    "a compress ratio llama.cpp has not": ({"deepseek4.attention.compress_ratios": ([0, 4, 64, 4], ARR, I32)},
                                           CheckpointError, r"'deepseek4\.attention\.compress_ratios'\[2\] = 64, "
                                           r"expected 0 \(sliding window only\), 4"),
    "ratios short of the layers": ({"deepseek4.attention.compress_ratios": ([0, 4], ARR, I32)}, CheckpointError,
                                   r"'deepseek4\.attention\.compress_ratios' = 2 entries, expected at least one per "
                                   r"layer"),
    "more hash layers than layers": ({"deepseek4.hash_layer_count": (9, U32)}, CheckpointError,
                                     r"'deepseek4\.hash_layer_count' = 9, expected 0\.\.num_hidden_layers \(4\)"),
    "groups that split no heads": ({"deepseek4.attention.output_group_count": (3, U32)}, CheckpointError,
                                   r"'deepseek4\.attention\.output_group_count' = 3 does not divide"),
    "a second key/value head": ({"deepseek4.attention.head_count_kv": (2, U32)}, CheckpointError,
                                r"'deepseek4\.attention\.head_count_kv' = 2, expected 1"),
    "other residual streams": ({"deepseek4.embedding_length_out": (96, U32)}, CheckpointError,
                               r"'deepseek4\.embedding_length_out' = 96, expected embedding_length x "
                               r"hyper_connection\.count = 128"),
    "another rope scaling": ({"deepseek4.rope.scaling.type": ("linear", STR)}, UnsupportedError,
                             r"'deepseek4\.rope\.scaling\.type' = 'linear', expected 'yarn' or none"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_GGUF_KEYS)
def test_a_deepseek4_file_s_bad_key_is_named(tmp_path, case):
    keys, cls, pattern = BAD_GGUF_KEYS[case]
    path = edited_gguf(tmp_path / "bad.gguf", keys)
    with pytest.raises(cls, match=pattern) as info:
        Checkpoint.open(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "table, pattern",
    [
        (lambda t: np.where(np.arange(t.size).reshape(t.shape) == 5, 8, t),
         r"token id 2's expert 8 \(entry 1\) is out of range, expected 0\.\.7"),
        (lambda t: np.repeat(t[:, :1], 2, axis=1), r"token id 0 chooses expert \d+ twice, expected 2 distinct experts"),
    ],
    ids=["an expert past the last", "an expert twice"],
)  # fmt: skip
def test_a_bad_i32_hash_table_is_refused_at_load_with_its_name(tmp_path, table, pattern):
    name = "blk.1.ffn_gate_tid2eid.weight"
    t = next(t for t in gguf.GGUFReader(V4_GGUF).tensors if t.name == name)
    path = edited_gguf(tmp_path / "bad.gguf", tensors={name: table(np.asarray(t.data).copy())})
    with Engine() as eng, pytest.raises(CheckpointError, match=r"model\.layers\.1\.ffn\.gate\.tid2eid': " + pattern):
        eng.load(path)


# ---- the fixtures ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", V4_FIXTURES, ids=lambda f: f.name)
def test_the_fixture_holds_the_tensors_the_family_lists(fixture):
    """Every tensor of the folder, by the name transformers saves it under, with the shape the config gives it and the
    formats the registry names (tid2eid int64; in the bf16 folder the parameters transformers keeps in float32)."""
    raw = json.loads((fixture.path / "config.json").read_text())
    v4 = read(raw)
    expected = deepseek_v4.expected_tensors(v4, raw["hidden_size"], raw["num_attention_heads"], raw["vocab_size"],
                                            raw["tie_word_embeddings"])  # fmt: skip
    tensors, _files = read_weights(fixture.path)
    assert {n: t.shape for n, t in tensors.items()} == expected
    assert {t.dtype for t in tensors.values()} == fixture.dtypes
    assert {n for n, t in tensors.items() if t.dtype == "I64"} == {f"model.layers.{i}.ffn.gate.tid2eid" for i in (0, 1)}
    # llama.cpp's names cover every tensor of a layer but the experts (merged in its files)
    named = {f"model.layers.{i}.{name}" for i in range(4) for name in deepseek_v4.GGUF_LAYER_TENSORS.values()}
    assert named & set(tensors) == {n for n in tensors if n.startswith("model.layers.") and ".experts." not in n}


def test_the_references_cover_the_window_and_the_compressed_windows():
    """Prompt and greedy tokens as the other folders' references; the prompt runs past the sliding window and a
    whole window of the heavily compressed layers (128 tokens), so their entries are made in the prompt and read in
    decoding."""
    refs = [np.load(folder / "reference.npz") for folder in (F32, BF16)]
    v4 = read(fixture_config())
    for ref in refs:
        prompt, generated, logits = ref["prompt_ids"], ref["generated_ids"], ref["logits"]
        assert generated.shape == (64,) and logits.shape == (len(prompt) + 64, 512) and logits.dtype == np.float32
        assert len(prompt) > max(v4.sliding_window, v4.hca_rate) and len(prompt) // v4.csa_rate >= 8
        assert np.array_equal(np.argmax(logits[len(prompt) - 1 : -1], axis=-1), generated)
    assert np.array_equal(refs[0]["prompt_ids"], refs[1]["prompt_ids"])
    assert not np.array_equal(refs[0]["logits"], refs[1]["logits"])  # the bf16 folder's own weights
