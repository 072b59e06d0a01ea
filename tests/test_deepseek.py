"""DeepSeek-V3 beyond the conformance suite (tests/test_conformance.py holds every fixture's logits, greedy tokens,
batches and placements against transformers' own DeepseekV3ForCausalLM, tests/fixtures/recipes/deepseek.py): what
the family changes elsewhere. MLA's latent cache, YaRN's reach, the leading dense layer with nothing to place, the
shared experts on the primary beside the peers, speculative runs, llama.cpp's deepseek2 GGUF read as the folder it
came from and its export, the cost model, and bad configs named by key."""

import json
import shutil

import numpy as np
import pytest
from fixture_paths import FIXTURES
from safetensors.numpy import load_file, save_file

from engine.checkpoints.checkpoint import Checkpoint
from engine.core.errors import CheckpointError, EngineError, UnsupportedError
from engine.export.llama_cpp import to_llama_cpp
from engine.model import Engine
from engine.placement.costmodel import Calibration, DeviceRate, ModelShape, predict_tokens_per_second
from engine.placement.placement import Placement
from engine.runs.speculative import generate

GGUF = FIXTURES / "deepseek-gguf"


def reference(folder, name="reference.npz"):
    ref = np.load(folder / name)
    return ref["prompt_ids"], ref["generated_ids"], ref["logits"]


def test_prompt_and_generation_pass_yarn_s_original_context():
    """The fixtures only test YaRN if positions go past original_max_position_embeddings."""
    prompt, generated, _ = reference(FIXTURES / "deepseek-f32")
    raw = json.loads((FIXTURES / "deepseek-f32" / "config.json").read_text())
    assert raw["rope_scaling"]["rope_type"] == "yarn"
    assert len(prompt) + len(generated) > raw["rope_scaling"]["original_max_position_embeddings"]


def test_the_cache_holds_the_latent_not_the_heads():
    cfg = Checkpoint.open(FIXTURES / "deepseek-f32").config
    with Engine() as eng:
        info = eng.load(FIXTURES / "deepseek-f32").info
    assert info["kv_bytes_per_token"] == cfg.num_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 4
    per_head_kv = cfg.num_layers * cfg.num_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim) * 4
    assert info["kv_bytes_per_token"] < per_head_kv
    assert info["shared_expert_bytes"] > 0


# ---- the dense layer, the shared experts, speculative runs -----------------------------------------------------


@pytest.fixture(scope="module")
def devices():
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, cpu_threads=1) as eng:
        yield eng


def test_the_dense_layer_has_nothing_to_place(devices):
    model = devices.load(FIXTURES / "deepseek-f32")
    cfg = model.config
    assert cfg.first_k_dense_replace >= 1 and not cfg.is_moe_layer(0) and cfg.is_moe_layer(cfg.first_k_dense_replace)
    assert model.placement.owners[0] == [None] * cfg.num_experts
    with pytest.raises(EngineError, match="dense layers have no experts"):
        model.set_placement("0=cpu:1")


def test_shared_experts_run_on_the_primary_beside_the_peers(devices):
    """Every MoE layer's shared experts run on the primary, while the layer's routed experts run on the peer."""
    prompt, generated, _ = reference(FIXTURES / "deepseek-f32")
    model = devices.load(FIXTURES / "deepseek-f32")
    model.set_placement("*=cpu:1")
    with model.context() as ctx:
        ctx.prefill(prompt)
        ctx.trace = 10_000
        for t in generated[:4]:
            ctx.decode([t])
        spans = ctx.trace_spans()
    shared = [s for s in spans if s.kind == "shared"]
    moe_layers = set(model.config.moe_layers)
    assert {s.device for s in shared} == {"cpu:0"}
    assert {s.layer for s in shared} == moe_layers
    assert len(shared) == 4 * len(moe_layers)
    peer = {(s.layer, s.token) for s in spans if s.kind == "experts" and s.device == "cpu:1"}
    assert {(s.layer, s.token) for s in shared} == peer  # every layer step had both branches
    for s in shared:  # queued after the peer's branch was dispatched, done before the join returned
        join = next(j for j in spans if j.kind == "join" and (j.layer, j.token) == (s.layer, s.token))
        stage = next(j for j in spans if j.kind == "stage" and (j.layer, j.token) == (s.layer, s.token))
        assert stage.end_ns <= s.start_ns and s.end_ns <= join.end_ns


def test_speculative_runs_equal_greedy(devices):
    prompt, generated, _ = reference(FIXTURES / "deepseek-f32")
    target = devices.load(FIXTURES / "deepseek-f32")
    draft = devices.load(FIXTURES / "deepseek-noqlora-f32")  # same tokenizer, another model: a poor draft
    target.set_placement("1=cpu:1; 3=hostsim:0")
    for q in (1, 3, 6):
        with target.context() as t, draft.context() as d:
            assert generate(t, d, prompt, 40, q) == generated[:40].tolist(), q


# ---- llama.cpp's deepseek2 GGUF --------------------------------------------------------------------------------


def test_gguf_reads_as_the_folder_it_came_from():
    g = Checkpoint.open(GGUF / "model-q8_0.gguf").config
    f = Checkpoint.open(FIXTURES / "deepseek-f32").config
    for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_experts",
                "top_k", "n_group", "topk_group", "n_shared_experts", "first_k_dense_replace", "norm_topk_prob",
                "routed_scaling_factor", "rope_interleave", "moe_layers"):  # fmt: skip
        assert getattr(g, key) == getattr(f, key), key
    np.testing.assert_allclose(g.rope_inv_freq, f.rope_inv_freq, rtol=1e-6)
    assert g.attention_scale == pytest.approx(f.attention_scale, rel=1e-6)
    assert g.rope_attention_factor == pytest.approx(f.rope_attention_factor, rel=1e-6)


def test_llama_cpp_export_names_deepseek2_expert_tensors():
    cfg = Checkpoint.open(GGUF / "model-q8_0.gguf").config
    out = to_llama_cpp(Placement.parse("*=cuda:0; 2-3=cpu:0", cfg), primary="cuda:0")
    assert out.exact
    assert r"blk\.(2|3)\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU" in out.command_line()
    assert "shexp" not in out.command_line()  # the shared experts stay on the main GPU, as here on the primary


# ---- the cost model --------------------------------------------------------------------------------------------


def test_cost_model_counts_the_shared_experts_on_the_primary():
    shape = ModelShape.from_checkpoint(Checkpoint.open(FIXTURES / "deepseek-f32"))
    assert shape.shared_bytes > 0 and shape.moe_layers == (1, 2, 3)
    cal = Calibration("cpu:0", 1e-4, {"cpu:0": DeviceRate(1e9), "cpu:1": DeviceRate(1e9)})
    no_shared = ModelShape(shape.num_layers, shape.moe_layers, shape.num_experts, shape.top_k, shape.expert_bytes)
    on_primary = shape.empty_placement("cpu:0")
    per_layer = shape.shared_bytes / 1e9
    slower = 1 / predict_tokens_per_second(shape, on_primary, cal) - 1 / predict_tokens_per_second(
        no_shared, on_primary, cal
    )
    assert slower == pytest.approx(per_layer * len(shape.moe_layers), rel=1e-9)
    # with every routed expert on the peer, the shared ones overlap it: the layer costs the slower of the two
    on_peer = shape.empty_placement("cpu:1")
    peer_layer = shape.top_k * shape.expert_bytes / 1e9
    step = 1 / predict_tokens_per_second(shape, on_peer, cal)
    assert step == pytest.approx(1e-4 + len(shape.moe_layers) * max(per_layer, peer_layer), rel=1e-9)


# ---- bad configs and checkpoints -------------------------------------------------------------------------------


def copy_with(tmp_path, config_changes=None, drop=(), name="deepseek-f32"):
    dst = tmp_path / "model"
    shutil.copytree(FIXTURES / name, dst)
    if config_changes:
        raw = json.loads((dst / "config.json").read_text())
        raw.update(config_changes)
        (dst / "config.json").write_text(json.dumps(raw))
    if drop:
        tensors = load_file(str(dst / "model.safetensors"))
        save_file({k: v for k, v in tensors.items() if k not in drop}, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize(
    "changes, error, message",
    [
        ({"topk_group": 5, "n_group": 4}, CheckpointError, "'topk_group' = 5 is larger than 'n_group' = 4"),
        ({"n_group": 3}, CheckpointError, "'n_routed_experts' = 16 is not divisible by 'n_group' = 3"),
        ({"n_group": 16, "topk_group": 4}, CheckpointError, "leaves 1 expert per group"),
        ({"num_experts_per_tok": 9}, CheckpointError, "'num_experts_per_tok' = 9, expected 1..8"),
        ({"scoring_func": "softmax"}, UnsupportedError, "scoring_func 'softmax' is not supported"),
        ({"qk_rope_head_dim": 7}, CheckpointError, "'qk_rope_head_dim' = 7, expected an even number"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, UnsupportedError, "type 'dynamic'"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 0.5}}, CheckpointError, "'factor' = 0.5"),
    ],
)
def test_bad_config_is_named_by_its_key(tmp_path, changes, error, message):
    folder = copy_with(tmp_path, changes)
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        Checkpoint.open(folder)


@pytest.mark.parametrize(
    "changes, tensor",
    [
        ({"kv_lora_rank": 16}, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"),
        ({"qk_nope_head_dim": 16}, "model.layers.0.self_attn.q_b_proj.weight"),
        ({"v_head_dim": 16}, "model.layers.0.self_attn.o_proj.weight"),
        ({"q_lora_rank": 32}, "model.layers.0.self_attn.q_a_proj.weight"),
        ({"n_shared_experts": 2}, "model.layers.1.mlp.shared_experts.gate_proj.weight"),
    ],
)
def test_ranks_and_head_dims_that_disagree_with_the_tensors_name_the_tensor(tmp_path, changes, tensor):
    folder = copy_with(tmp_path, changes)
    with Engine() as eng, pytest.raises(EngineError, match=f"tensor '{tensor}'.*has shape"):
        eng.load(folder)


def test_a_missing_correction_bias_names_the_tensor(tmp_path):
    folder = copy_with(tmp_path, drop=("model.layers.2.mlp.gate.e_score_correction_bias",))
    with Engine() as eng:
        with pytest.raises(EngineError, match=r"tensor 'model\.layers\.2\.mlp\.gate\.e_score_correction_bias' is "
                                              "missing"):  # fmt: skip
            eng.load(folder)
        # and the engine is fine after it
        prompt, generated, _ = reference(FIXTURES / "deepseek-f32")
        with eng.load(FIXTURES / "deepseek-f32").context() as ctx:
            assert ctx.generate(prompt, 8).ids == generated[:8].tolist()


def test_the_released_checkpoints_next_token_layer_is_left_out(tmp_path):
    """DeepSeek-V3's own folders hold the multi-token-prediction layer after the last one (num_nextn_predict_layers);
    transformers does not load it, nor does the engine; without the key such a layer is refused as before."""
    folder = copy_with(tmp_path, {"num_nextn_predict_layers": 1})
    tensors = load_file(str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    last = cfg["num_hidden_layers"]
    extra = {k.replace("model.layers.0.", f"model.layers.{last}."): v for k, v in tensors.items() if ".layers.0." in k}
    save_file({**tensors, **extra}, str(folder / "model.safetensors"))
    ckpt = Checkpoint.open(folder)
    assert not any(f"layers.{last}." in name for name in ckpt.tensors)
    prompt, generated, _ = reference(FIXTURES / "deepseek-f32")
    with Engine() as eng, eng.load(folder).context() as ctx:
        assert ctx.generate(prompt, 8).ids == generated[:8].tolist()
    cfg.pop("num_nextn_predict_layers")
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=f"holds tensors of layer {last}"):
        Checkpoint.open(folder)
