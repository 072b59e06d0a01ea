"""The demo pair as GGUF files (`expertbench demo-model --format gguf --quant q8_0|mxfp4`): the safetensors pair's
weights quantized as llama.cpp quantizes them, one cache entry per quantization, runs in both precisions."""

import json
import shutil

import gguf
import numpy as np
import pytest
from demo_sizes import TINY
from safetensors.numpy import save_file

from engine.checkpoints import demo
from engine.checkpoints.checkpoint import Checkpoint
from engine.checkpoints.demo import DEMO_PROMPTS, SIZES, DemoSize, check_block_widths, ensure_demo_pair
from engine.cli import main
from engine.core import formats
from engine.core.errors import ArgumentError
from engine.model import Engine
from engine.runs.run import DecodeRun

QUANTS = ["q8_0", "mxfp4"]


@pytest.fixture(scope="session")
def cache(xdg_cache):
    return xdg_cache / "expertbench"  # the folder pair is built there once per session (tests/conftest.py)


@pytest.fixture(scope="session", params=QUANTS)
def gguf_pair(request, cache):
    return ensure_demo_pair("default", cache_dir=cache, format="gguf", quant=request.param)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(SIZES, "tiny", TINY)
    return TINY


def tensor_bytes(t) -> np.ndarray:
    return np.fromfile(t.file, dtype=np.uint8, count=t.nbytes, offset=t.offset)


def values(t) -> np.ndarray:
    """A tensor's float32 values: BF16 widened, a quantized one dequantized by the gguf package (ggml's to_float)."""
    raw = tensor_bytes(t)
    if t.dtype == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(t.shape)
    if t.dtype == "F32":
        return raw.view("<f4").reshape(t.shape)
    qtype = gguf.GGMLQuantizationType(formats.get(t.dtype).ggml_type)
    return gguf.quants.dequantize(raw.reshape(-1, formats.row_bytes(t.dtype, t.shape[-1])), qtype).reshape(t.shape)


def test_the_gguf_pair_is_the_same_model(gguf_pair, cache):
    folder = ensure_demo_pair("default", cache_dir=cache)
    assert gguf_pair.target.name == "target.gguf" and gguf_pair.draft.name == "draft.gguf"
    assert gguf_pair.target.parent.name == f"demo-default-gguf-{gguf_pair.quant}-v1" != folder.target.parent.name
    for role in ("target", "draft"):
        ours, theirs = Checkpoint.open(getattr(gguf_pair, role)), Checkpoint.open(getattr(folder, role))
        assert demo.is_synthetic(ours) and ours.raw_config["expertbench.synthetic"] is True
        assert ours.raw_config["general.file_type"] == demo.QUANTS[gguf_pair.quant][0]
        fields = {k: v for k, v in vars(ours.config).items() if k != "synthetic"}
        if role == "draft" and gguf_pair.quant in demo.MOE_DRAFTS:
            # a small MoE of the target's carried layers (test_demo_acceptance.py), not the folder pair's dense draft
            moe = Checkpoint.open(folder.target)
            want = {**vars(moe.config), "num_layers": SIZES["default"].draft_layers,
                    "top_k": demo.MOE_DRAFTS[gguf_pair.quant]}  # fmt: skip
            assert fields == {k: v for k, v in want.items() if k != "synthetic"}
            assert set(ours.tensors) == {n for n, _, _ in demo.moe_draft_tensors(SIZES["default"])}
        else:
            assert fields == {k: v for k, v in vars(theirs.config).items() if k != "synthetic"}
            assert set(ours.tensors) == set(theirs.tensors)
        assert ours.vocabulary_digest == theirs.vocabulary_digest
        for prompt in DEMO_PROMPTS:
            ids = ours.tokenizer.encode(prompt, add_special_tokens=False).ids
            assert ids == theirs.tokenizer.encode(prompt, add_special_tokens=False).ids
            assert ours.tokenizer.decode(ids) == prompt
        # llama.cpp's choice of formats: norms and the router F32, experts MXFP4 for mxfp4, every other matrix Q8_0
        experts = "MXFP4" if gguf_pair.quant == "mxfp4" else "Q8_0"
        for name, t in ours.tensors.items():
            want = "F32" if len(t.shape) == 1 or name.endswith("mlp.gate.weight") else (
                experts if ".mlp.experts." in name else "Q8_0")  # fmt: skip
            assert t.dtype == want, name


def test_its_weights_are_the_safetensors_pairs_quantized_with_gguf_quants(gguf_pair, cache):
    folder = ensure_demo_pair("default", cache_dir=cache)
    ours, theirs = Checkpoint.open(gguf_pair.target), Checkpoint.open(folder.target)
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                 "model.layers.3.mlp.gate.weight", "model.layers.7.mlp.experts.15.down_proj.weight",
                 "model.layers.2.post_attention_layernorm.weight", "lm_head.weight"):  # fmt: skip
        t, bf16 = ours.tensors[name], values(theirs.tensors[name])
        if t.dtype == "F32":
            assert np.array_equal(values(t), bf16), name
        else:
            qtype = gguf.GGMLQuantizationType(formats.get(t.dtype).ggml_type)
            assert np.array_equal(tensor_bytes(t), gguf.quants.quantize(bf16, qtype).reshape(-1)), name


@pytest.mark.parametrize("quant", QUANTS)
def test_f32_precision_is_the_float_model_of_the_dequantized_weights(tiny, tmp_path, quant):
    """The GGUF pair in f32 precision gives, bit for bit, the logits of an F32 folder holding its weights dequantized
    by the gguf package (the safetensors pair's weights quantized and dequantized the way llama.cpp does)."""
    pair = ensure_demo_pair("tiny", cache_dir=tmp_path, format="gguf", quant=quant)
    folders = ensure_demo_pair("tiny", cache_dir=tmp_path)
    with Engine() as eng:
        for role in ("target", "draft"):
            ck = Checkpoint.open(getattr(pair, role))
            dq = tmp_path / f"dequantized-{role}"
            dq.mkdir()
            eos = json.loads((getattr(folders, role) / "config.json").read_text())["eos_token_id"]
            config = demo.gguf_config(tiny, role, quant, eos)  # a MoE draft's is not the folder draft's
            (dq / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}))
            shutil.copy(getattr(folders, role) / "tokenizer.json", dq)
            save_file({name: np.ascontiguousarray(values(t)) for name, t in ck.tensors.items()},
                      str(dq / "model.safetensors"))  # fmt: skip
            quantized, floats = eng.load(getattr(pair, role)), eng.load(dq)
            ids = quantized.encode(DEMO_PROMPTS[1])
            with quantized.context(64) as a, floats.context(64) as b:
                assert np.array_equal(a.prefill(ids), b.prefill(ids)), role
                first = int(np.argmax(a.decode([ids[-1]])[0]))
                assert first == int(np.argmax(b.decode([ids[-1]])[0]))
                assert np.array_equal(a.decode([first, 7, 11]), b.decode([first, 7, 11])), role


def test_the_gguf_pair_decodes_deterministically_in_both_precisions(gguf_pair):
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, cpu_threads=1) as eng:
        target, draft = eng.load(gguf_pair.target), eng.load(gguf_pair.draft)
        results = {}
        for precision in ("f32", "q8"):
            res = DecodeRun(target, draft, tokens_per_prompt=16, repeats=2, precision=precision).run()
            assert res.repeats_agree and res.precision == precision and len(res.output_sha256) == 4
            assert res.drafted_tokens > 0 and res.accept_rate is not None
            spread = DecodeRun(target, tokens_per_prompt=16, precision=precision,
                               placement="0-2=cpu:1; 5=hostsim:0").run()  # fmt: skip
            assert spread.output_sha256 == res.output_sha256  # speculative = greedy, on any CPU placement
            results[precision] = res
        ids = target.encode(DEMO_PROMPTS[0])
        logits = {}
        for precision in ("f32", "q8"):
            with target.context(len(ids)) as ctx:
                ctx.precision = precision
                logits[precision] = ctx.prefill(ids)
        assert not np.array_equal(logits["f32"], logits["q8"])  # int8 activations: other logits


def test_each_format_and_quantization_is_its_own_cache_entry(tiny, tmp_path):
    folders = {q: demo.demo_folder("tiny", tmp_path, "gguf", q) for q in QUANTS}
    assert folders["q8_0"].name == "demo-tiny-gguf-q8_0-v1" and folders["mxfp4"].name == "demo-tiny-gguf-mxfp4-v1"
    assert demo.demo_folder("tiny", tmp_path) == tmp_path / "demo-tiny-v1"
    first = ensure_demo_pair("tiny", cache_dir=tmp_path, format="gguf")  # q8_0 unless told
    assert first.built and first.reason == "missing" and first.quant == "q8_0" and first.format == "gguf"
    assert not ensure_demo_pair("tiny", cache_dir=tmp_path, format="gguf", quant="q8_0", verify=True).built
    assert not (tmp_path / "demo-tiny-v1").exists() and not folders["mxfp4"].exists()
    manifest = json.loads((folders["q8_0"] / "manifest.json").read_text())
    assert set(manifest["files"]) == {"target.gguf", "draft.gguf"} and manifest["recipe"]["quant"] == "q8_0"
    with first.target.open("r+b") as f:
        f.truncate(first.target.stat().st_size - 1)
    again = ensure_demo_pair("tiny", cache_dir=tmp_path, format="gguf")
    assert again.built and again.reason.startswith("damaged (target.gguf has")
    assert demo.check_pair(folders["q8_0"], TINY, full=True, format="gguf", quant="q8_0") == ""
    # the build is deterministic: the same bytes again
    assert json.loads((folders["q8_0"] / "manifest.json").read_text())["files"] == manifest["files"]


def test_bad_quantizations_and_widths_are_named():
    with pytest.raises(ArgumentError, match=r"demo quantization 'q4_k' is unknown: expected one of q8_0, mxfp4"):
        ensure_demo_pair("default", format="gguf", quant="q4_k")
    with pytest.raises(ArgumentError, match="only the GGUF demo is quantized"):
        ensure_demo_pair("default", quant="q8_0")
    with pytest.raises(ArgumentError, match="demo model format 'onnx' is unknown: expected one of safetensors, gguf"):
        ensure_demo_pair("default", format="onnx")
    for size in SIZES.values():  # both shipped sizes have a GGUF form
        for quant in QUANTS:
            check_block_widths(size, quant)
    odd = DemoSize("odd", vocab_size=512, hidden_size=80, num_layers=2, draft_layers=1, num_experts=4, top_k=2,
                   moe_intermediate_size=48, num_heads=2, num_kv_heads=1, head_dim=32)  # fmt: skip
    with pytest.raises(ArgumentError) as err:
        check_block_widths(odd, "mxfp4")
    assert str(err.value) == ("demo size 'odd' cannot be written as GGUF mxfp4: hidden_size = 80, "
                              "moe_intermediate_size = 48 is not a multiple of 32 (MXFP4 and Q8_0 store rows in "
                              "blocks of 32 values)")  # fmt: skip


def test_demo_model_and_run_commands(gguf_pair, xdg_cache, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    quant = gguf_pair.quant
    assert main(["demo-model", "--format", "gguf", "--quant", quant, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target"] == str(gguf_pair.target) and report["draft"] == str(gguf_pair.draft)
    assert (report["format"], report["quant"], report["built"], report["synthetic"]) == ("gguf", quant, False, True)
    assert main(["demo-model", "--format", "gguf", "--quant", quant]) == 0
    out = capsys.readouterr().out
    assert f"demo model pair 'default, GGUF {quant}'" in out and "intact (sizes checked)" in out
    assert ("MXFP4 experts, Q8_0 elsewhere" if quant == "mxfp4" else "(Qwen3-MoE, Q8_0)") in out
    moe_draft = "(Qwen3-MoE of the target's layers, top-2, MXFP4 experts, Q8_0 elsewhere)"
    assert (moe_draft if quant == "mxfp4" else "(dense Qwen3, Q8_0)") in out
    args = ["run", "--demo-format", "gguf", "--demo-quant", quant, "-n", "8", "--repeats", "1", "--json"]
    assert main([*args, "--precision", "q8"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target"] == str(gguf_pair.target) and report["draft"] == str(gguf_pair.draft)
    assert report["synthetic"] is True and report["precision"] == "q8" and "Q8_0" in report["weights"]["formats"]
    if quant == "q8_0":  # the default quantization
        assert main(["run", "--demo-format", "gguf", "-n", "4", "--repeats", "1", "--no-draft", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["target"] == str(gguf_pair.target)


@pytest.mark.parametrize(
    "args, message",
    [
        (["demo-model", "--format", "gguf", "--quant", "q4_k"], "argument --quant: invalid choice: 'q4_k'"),
        (["demo-model", "--quant", "mxfp4"], "--quant mxfp4: only the GGUF demo is quantized (add --format gguf)"),
        (["run", "--demo-format", "gguf", "--demo-quant", "q2"], "argument --demo-quant: invalid choice: 'q2'"),
    ],
)
def test_bad_demo_options_exit_2(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty cache: nothing may get built
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse's own usage errors
        code = exit_.code
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "expertbench").exists()
