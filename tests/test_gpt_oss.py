"""gpt-oss beyond the conformance suite (tests/test_conformance.py holds every fixture's logits, greedy tokens,
batches and placements against transformers' own GptOssForCausalLM, tests/fixtures/recipes/gpt_oss.py): attention
with biases and sinks, sliding-window layers beside full ones (the prompt is longer than the window), YaRN, the MXFP4
experts of the released layout packed as they are, llama.cpp's gpt-oss GGUF read as the folder it came from. Then what
the family changes elsewhere: ring caches for the windows (any batch size, speculative rollback across the window's
wrap), and bad configs and checkpoints named by key or tensor."""

import json
import shutil
import struct

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.checkpoints.checkpoint import Checkpoint
from engine.core.errors import CheckpointError, EngineError
from engine.model import Engine
from engine.runs.speculative import SpeculativeDecoder, generate

TOLERANCE = 1e-4  # relative L2 error per position


def reference(folder, name="reference.npz"):
    ref = np.load(folder / name)
    return ref["prompt_ids"], ref["generated_ids"], ref["logits"]


def relative_error(ours, ref):
    return np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)


def all_logits(model, prompt, generated, n_batch=512):
    with model.context(n_batch=n_batch) as ctx:
        rows = [ctx.prefill(prompt)] + [ctx.decode([t]) for t in generated]
    return np.concatenate(rows)


def test_the_fixture_exercises_the_window_sinks_and_yarn():
    """The fixtures only test the window if the prompt is longer than it, YaRN if positions pass its original
    context, and both kinds of layer if both are there."""
    prompt, generated, _ = reference(FIXTURES / "gpt-oss-bf16")
    raw = json.loads((FIXTURES / "gpt-oss-bf16" / "config.json").read_text())
    assert len(prompt) > raw["sliding_window"]
    assert set(raw["layer_types"]) == {"sliding_attention", "full_attention"}
    assert raw["rope_scaling"]["rope_type"] == "yarn"
    assert len(prompt) + len(generated) > raw["rope_scaling"]["original_max_position_embeddings"]
    cfg = Checkpoint.open(FIXTURES / "gpt-oss-bf16").config
    assert cfg.layer_windows == tuple(raw["sliding_window"] if k == "sliding_attention" else 0
                                      for k in raw["layer_types"])  # fmt: skip
    assert cfg.swiglu_limit == raw["swiglu_limit"] and cfg.moe_layers == list(range(cfg.num_layers))


def test_mxfp4_experts_are_packed_not_dequantized():
    """The released layout's blocks and scales become MXFP4 rows: the experts take a quarter of the bf16 bytes
    (17 bytes per 32 values), and the bf16 folder's weights quantized the same way give the MXFP4 folder."""
    with Engine() as eng:
        mx = eng.load(FIXTURES / "gpt-oss-mxfp4").info
        bf = eng.load(FIXTURES / "gpt-oss-bf16").info
    cfg = Checkpoint.open(FIXTURES / "gpt-oss-mxfp4").config
    H, inter, E, L = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_layers
    biases = (2 * inter + H) * 4
    assert mx["expert_bytes"] == L * E * (3 * H * inter // 32 * 17 + biases)
    assert bf["expert_bytes"] == L * E * (3 * H * inter * 2 + biases)


@pytest.mark.parametrize("n_batch", [1, 3, 9])
def test_window_ring_caches_give_the_same_bits_for_any_batch(n_batch):
    """A sliding layer's cache is a ring of window + n_batch - 1 rows: prefill in chunks and decoding wrap it many
    times, with the bits of a context whose rings never wrap."""
    prompt, generated, _ = reference(FIXTURES / "gpt-oss-bf16")
    with Engine() as eng:
        model = eng.load(FIXTURES / "gpt-oss-bf16")
        whole = all_logits(model, prompt, generated[:24])
        out = all_logits(model, prompt, generated[:24], n_batch=n_batch)
    np.testing.assert_array_equal(out, whole)


def test_the_windows_cache_is_bounded():
    cfg = Checkpoint.open(FIXTURES / "gpt-oss-bf16").config
    with Engine() as eng:
        info = eng.load(FIXTURES / "gpt-oss-bf16").info
    row = 2 * cfg.num_kv_heads * cfg.head_dim * 4
    full = sum(1 for w in cfg.layer_windows if w == 0)
    assert info["kv_bytes_per_token"] == full * row  # only the full-attention layers grow with the context
    assert info["kv_window_bytes"] == sum(cfg.layer_windows) * row


# ---- speculative runs across the window ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def devices():
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, cpu_threads=1) as eng:
        yield eng


@pytest.mark.parametrize("n_batch", [8, 512])
def test_speculative_runs_equal_greedy_across_the_window(devices, n_batch):
    """Rejected drafts roll the target back; with a batch of 8 the window's ring wraps between and inside the
    verification steps, and every run still gives the greedy tokens."""
    prompt, generated, _ = reference(FIXTURES / "gpt-oss-bf16")
    target = devices.load(FIXTURES / "gpt-oss-bf16")
    draft = devices.load(FIXTURES / "gpt-oss-mxfp4")  # the same weights quantized: a close draft
    target.set_placement("1=cpu:1; 3=hostsim:0")
    for q in (1, 3, 7):
        with target.context(n_batch=n_batch) as t, draft.context(n_batch=n_batch) as d:
            decoder = SpeculativeDecoder(t, d, q)
            out, rejected = [decoder.start(prompt)], 0
            while len(out) < 40:
                step = decoder.step(40 - len(out))
                out += step.tokens
                rejected += step.accepted < step.drafted
            assert out == generated[:40].tolist(), q
            assert rejected > 0, "no draft was rejected: nothing rolled back"
        with target.context(n_batch=n_batch) as t, draft.context(n_batch=n_batch) as d:
            assert generate(t, d, prompt, 40, q) == generated[:40].tolist(), q


# ---- bad configs and checkpoints -------------------------------------------------------------------------------


def read_tensors(path):
    """name -> (safetensors dtype, shape, bytes): bf16 included, which numpy cannot hold."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    start = 8 + n
    return {k: (v["dtype"], v["shape"], data[start + v["data_offsets"][0] : start + v["data_offsets"][1]])
            for k, v in header.items()}  # fmt: skip


def write_tensors(path, tensors):
    header, offset = {}, 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(raw for _, _, raw in tensors.values()))


def copy_with(tmp_path, config_changes=None, drop=(), replace=None, name="gpt-oss-bf16"):
    """A copy of a fixture with config keys changed, tensors dropped, or tensors replaced (name -> numpy array)."""
    dst = tmp_path / "model"
    shutil.copytree(FIXTURES / name, dst)
    if config_changes:
        raw = json.loads((dst / "config.json").read_text())
        raw.update(config_changes)
        (dst / "config.json").write_text(json.dumps(raw))
    if drop or replace:
        tensors = read_tensors(dst / "model.safetensors")
        for key, array in (replace or {}).items():
            dtype = {np.uint8: "U8", np.float32: "F32"}[array.dtype.type]
            tensors[key] = (dtype, array.shape, np.ascontiguousarray(array).tobytes())
        write_tensors(dst / "model.safetensors", {k: v for k, v in tensors.items() if k not in drop})
    return dst


def mxfp4_tensor(name):
    dtype, shape, raw = read_tensors(FIXTURES / "gpt-oss-mxfp4" / "model.safetensors")[name]
    assert dtype == "U8"
    return np.frombuffer(raw, np.uint8).reshape(shape)


def escaped(message):
    return message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"layer_types": ["sliding_attention", "full_attention"]},
         "'layer_types' has 2 entries, expected one per layer (num_hidden_layers = 4)"),
        ({"layer_types": ["sliding_attention", "full", "sliding_attention", "full_attention"]},
         "'layer_types'[1] = 'full', expected 'sliding_attention' or 'full_attention'"),
        ({"sliding_window": 1024}, "'sliding_window' = 1024 is larger than the context ('max_position_embeddings' = "
                                   "256)"),
        ({"num_experts_per_tok": 9}, "'num_experts_per_tok' = 9, expected 1..num_local_experts (8)"),
        ({"swiglu_limit": -1.0}, "'swiglu_limit' = -1.0, expected a positive number"),
        ({"quantization_config": {"quant_method": "fp8"}}, "quant_method 'fp8' is not supported"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "type 'dynamic'"),
    ],
)  # fmt: skip
def test_bad_config_is_named_by_its_key(tmp_path, changes, message):
    folder = copy_with(tmp_path, changes)
    with pytest.raises(EngineError, match=escaped(message)):
        Checkpoint.open(folder)


def test_a_missing_sink_names_the_tensor_and_the_engine_survives(tmp_path):
    folder = copy_with(tmp_path, drop=("model.layers.2.self_attn.sinks",))
    with Engine() as eng:
        with pytest.raises(EngineError, match=r"tensor 'model\.layers\.2\.self_attn\.sinks' is missing"):
            eng.load(folder)
        prompt, generated, _ = reference(FIXTURES / "gpt-oss-bf16")
        with eng.load(FIXTURES / "gpt-oss-bf16").context() as ctx:
            assert ctx.generate(prompt, 8).ids == generated[:8].tolist()


def test_mxfp4_blocks_and_scales_that_disagree_name_the_tensor(tmp_path):
    name = "model.layers.1.mlp.experts.down_proj_scales"
    folder = copy_with(tmp_path, replace={name: mxfp4_tensor(name)[:, :, :1]}, name="gpt-oss-mxfp4")
    with Engine() as eng, pytest.raises(EngineError, match=escaped(f"tensor '{name}'") + ".*has shape .* expected"):
        eng.load(folder)


def test_mxfp4_blocks_stored_as_another_dtype_name_the_tensor(tmp_path):
    name = "model.layers.0.mlp.experts.gate_up_proj_blocks"
    folder = copy_with(tmp_path, replace={name: mxfp4_tensor(name).astype(np.float32)}, name="gpt-oss-mxfp4")
    with Engine() as eng, pytest.raises(EngineError, match=escaped(f"tensor '{name}'") + ".*expected U8"):
        eng.load(folder)


def test_expert_shapes_that_disagree_with_the_config_name_the_tensor(tmp_path):
    folder = copy_with(tmp_path, {"intermediate_size": 32})
    name = r"tensor 'model\.layers\.0\.mlp\.experts\.gate_up_proj' in .*"
    with Engine() as eng, pytest.raises(EngineError, match=name + r"has shape \[8, 64, 128\], expected \[8, 64, 64\]"):
        eng.load(folder)


def test_a_window_wider_than_the_context_still_runs(tmp_path):
    """A window at least as long as the context is full attention: the ring is the whole cache."""
    prompt, generated, ref = reference(FIXTURES / "gpt-oss-bf16")
    folder = copy_with(tmp_path, {"sliding_window": 256})
    with Engine() as eng:
        out = all_logits(eng.load(folder), prompt, generated[:4])
        full = all_logits(eng.load(copy_with(tmp_path / "b", {"layer_types": ["full_attention"] * 4})), prompt,
                          generated[:4])  # fmt: skip
    np.testing.assert_array_equal(out, full)
    assert relative_error(out, ref[: len(out)]).max() > TOLERANCE  # and the window did matter in the fixture


def test_the_config_error_type_is_a_checkpoint_error(tmp_path):
    folder = copy_with(tmp_path, {"sliding_window": 0})
    with pytest.raises(CheckpointError, match="'sliding_window' = 0"):
        Checkpoint.open(folder)


# ---- llama.cpp's gpt-oss GGUF ----------------------------------------------------------------------------------

GGUF = FIXTURES / "gpt-oss-gguf" / "model-mxfp4_moe.gguf"


def test_gguf_reads_as_the_folder_it_came_from():
    g = Checkpoint.open(GGUF).config
    f = Checkpoint.open(FIXTURES / "gpt-oss-mxfp4").config
    for key in ("num_experts", "top_k", "moe_intermediate_size", "layer_windows", "swiglu_limit", "swiglu_alpha",
                "attention_bias", "head_dim", "num_kv_heads", "moe_layers", "norm_topk_prob"):  # fmt: skip
        assert getattr(g, key) == getattr(f, key), key
    # llama.cpp keeps no `truncate`: the file is read as transformers reads gpt-oss's config (truncate: false)
    np.testing.assert_allclose(g.rope_inv_freq, f.rope_inv_freq, rtol=1e-6)
    assert g.rope_attention_factor == pytest.approx(f.rope_attention_factor, rel=1e-6)
    assert {t.dtype for n, t in Checkpoint.open(GGUF).tensors.items() if ".experts." in n and "weight" in n} == {
        "MXFP4"
    }


def test_a_gguf_whose_expert_bias_has_the_wrong_count_names_the_tensor(tmp_path):
    from engine.checkpoints import gguf_file

    data = bytearray(GGUF.read_bytes())
    part = gguf_file.read_part(GGUF)
    t = next(t for t in part.tensors if t.name == "blk.1.ffn_up_exps.bias")
    assert "blk.1.ffn_up_exps.bias" in {x.name for x in part.tensors} and t.ne == (64, 8)
    # the tensor's dimensions in the header: [64, 8] as two uint64 after its name and n_dims; make it [64, 4]
    name = b"blk.1.ffn_up_exps.bias"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4
    assert struct.unpack_from("<QQ", data, at) == (64, 8)
    struct.pack_into("<QQ", data, at, 128, 4)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(EngineError, match=r"tensor 'blk\.1\.ffn_up_exps\.bias' has dimensions \[128, 4\], expected "
                                          r"\[n, 8\]"):  # fmt: skip
        Checkpoint.open(bad)
