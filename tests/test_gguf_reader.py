"""GGUF input: the fixtures converted to GGUF (as llama.cpp's converter lays them out) read into the same model.

The F32 conversions load into the core and give the folder's logits bit for bit; split files read the same from any
part; the tokenizer built from tokenizer.ggml.* gives tokenizer.json's ids; quantized tensors (gguf.quants: Q8_0,
MXFP4) are described with their formats' bytes, the merged expert tensors sliced per expert.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from fixture_paths import FIXTURES
from gguf_models import gguf_tensors, to_gguf
from tokenizers import Tokenizer

from engine.checkpoints.checkpoint import Checkpoint, read_config
from engine.checkpoints.gguf_file import QWEN2_PATTERN, read_parts
from engine.cli import main
from engine.core import formats
from engine.model import Engine
from engine.profiles.profile import fingerprint
from engine.profiles.profile import load as load_profile

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing   ",
    "digits 1234567 and 3.14159, 2024-12-01",
    "line one\nline two\r\n\n\ttabbed",
    "Unicode: naïve café, Ελληνικά, 日本語, emoji 🦊🚀",
    "it's we're they've I'm you'll he'd IT'S",
    "<|endoftext|>between<|endoftext|> special tokens",
    "punctuation!!! ??? ... --- ((brackets)) [x] {y}",
    "",
    "e\u0301 composed and decomposed é",
]


@pytest.fixture(scope="module")
def engine():
    with Engine() as eng:
        yield eng


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory):
    return to_gguf(FIXTURES / "qwen3moe-f32", tmp_path_factory.mktemp("moe") / "qwen3moe-f32.gguf")[0]


def logits(engine, source, prompt) -> np.ndarray:
    with engine.load(source, weights="map") as model, model.context(64) as ctx:
        return ctx.prefill(prompt)


@pytest.mark.parametrize("name", ["qwen3moe-f32", "qwen3-f32"])
def test_an_f32_conversion_gives_the_folders_logits_bit_for_bit(engine, tmp_path, name):
    path = to_gguf(FIXTURES / name, tmp_path / f"{name}.gguf")[0]
    folder, ck = Checkpoint.open(FIXTURES / name), Checkpoint.open(path)
    assert ck.folder == path and ck.files == [path]
    assert ck.config == folder.config  # architecture, sizes, mlp_only_layers, tied embeddings, eos ...
    assert sorted(ck.tensors) == sorted(folder.tensors)
    for t in folder.tensors.values():
        g = ck.tensors[t.name]
        assert (g.dtype, g.shape, g.nbytes, g.file) == (t.dtype, t.shape, t.nbytes, path)
        assert path.read_bytes()[g.offset : g.offset + g.nbytes] == t.file.read_bytes()[t.offset : t.offset + t.nbytes]
    prompt = np.load(FIXTURES / name / "reference.npz")["prompt_ids"]
    assert np.array_equal(logits(engine, path, prompt), logits(engine, FIXTURES / name, prompt))


def test_config_from_the_header_alone(moe_gguf):
    assert read_config(moe_gguf) == Checkpoint.open(FIXTURES / "qwen3moe-f32").config
    assert read_config(FIXTURES / "qwen3moe-f32") == read_config(moe_gguf)


def test_the_moe_keys_and_layers(moe_gguf):
    cfg = Checkpoint.open(moe_gguf).config
    assert (cfg.architecture, cfg.num_experts, cfg.top_k, cfg.moe_intermediate_size) == ("qwen3_moe", 8, 2, 32)
    assert cfg.norm_topk_prob is True  # as llama.cpp's qwen3moe runs it
    assert cfg.mlp_only_layers == (1,)  # the layer without blk.1.ffn_gate_inp is dense
    assert cfg.moe_layers == [0, 2]
    assert (cfg.tie_word_embeddings, cfg.eos_token_id, cfg.bos_token_id) == (False, (0,), 0)


def test_expert_weights_norm_is_read_when_present(tmp_path):
    path = to_gguf(FIXTURES / "qwen3moe-f32", tmp_path / "m.gguf",
                   extra={"qwen3moe.expert_weights_norm": (False, gguf.GGUFValueType.BOOL)})[0]  # fmt: skip
    assert Checkpoint.open(path).config.norm_topk_prob is False


def test_split_files_read_the_same_from_any_part(engine, tmp_path, moe_gguf):
    parts = to_gguf(FIXTURES / "qwen3moe-f32", tmp_path / "split.gguf", split_max_tensors=13)
    assert len(parts) == 3 and parts[1].name == "split-00002-of-00003.gguf"
    whole = Checkpoint.open(moe_gguf)
    prompt = np.load(FIXTURES / "qwen3moe-f32" / "reference.npz")["prompt_ids"]
    want = logits(engine, moe_gguf, prompt)
    for given in parts:
        ck = Checkpoint.open(given)
        assert ck.folder == parts[0] and ck.files == parts
        assert ck.config == whole.config and sorted(ck.tensors) == sorted(whole.tensors)
        assert {t.file for t in ck.tensors.values()} == set(parts)
        assert ck.tokenizer.encode(PROMPTS[0]).ids == whole.tokenizer.encode(PROMPTS[0]).ids
    assert np.array_equal(logits(engine, parts[2], prompt), want)
    assert fingerprint(parts[1]) == fingerprint(parts[0]) == fingerprint(moe_gguf)  # a re-split keeps it


def test_the_tokenizer_gives_tokenizer_jsons_ids(moe_gguf):
    ck = Checkpoint.open(moe_gguf)
    original = Tokenizer.from_file(str(FIXTURES / "qwen3moe-f32" / "tokenizer.json"))
    for text in PROMPTS:
        want = original.encode(text, add_special_tokens=False).ids
        assert ck.tokenizer.encode(text, add_special_tokens=False).ids == want, text
        assert ck.tokenizer.decode(want) == original.decode(want), text
    assert ck.vocabulary_digest == Checkpoint.open(FIXTURES / "qwen3moe-f32").vocabulary_digest
    assert ck.tokenizer.encode("<|endoftext|>", add_special_tokens=False).ids == [0]


def split_tokenizer_json(folder: Path, pattern: str, normalizer: dict | None) -> dict:
    """The fixture's vocabulary with a Split-regex tokenizer.json pipeline (the regex, then byte level without its
    own regex), as Qwen2's and o200k's tokenizer.json files have it."""
    tj = json.loads((folder / "tokenizer.json").read_text())
    tj["normalizer"] = normalizer
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tj["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            byte_level,
        ],
    }
    tj["decoder"] = dict(byte_level)
    return tj


def qwen2_tokenizer_json(folder: Path) -> dict:
    """The fixture's vocabulary with Qwen2's tokenizer.json pipeline (NFC, the Split regex, byte level without its
    own regex), and its last merge's token turned into a user-defined (non-special) added token."""
    tj = split_tokenizer_json(folder, QWEN2_PATTERN, {"type": "NFC"})
    a, b = tj["model"]["merges"].pop()
    last = tj["model"]["vocab"].pop(a + b)
    tj["model"]["vocab"]["<think>"] = last
    tj["added_tokens"].append({"id": last, "content": "<think>", "single_word": False, "lstrip": False,
                               "rstrip": False, "normalized": False, "special": False})  # fmt: skip
    return tj


def test_a_qwen2_pre_tokenizer_and_user_defined_tokens(tmp_path):
    folder = tmp_path / "qwen2-tok"
    shutil.copytree(FIXTURES / "qwen3moe-f32", folder)
    (folder / "tokenizer.json").write_text(json.dumps(qwen2_tokenizer_json(FIXTURES / "qwen3moe-f32")))
    path = to_gguf(folder, tmp_path / "m.gguf", pre="qwen2")[0]
    ck = Checkpoint.open(path)
    original = Tokenizer.from_file(str(folder / "tokenizer.json"))
    gpt2 = Tokenizer.from_file(str(FIXTURES / "qwen3moe-f32" / "tokenizer.json"))
    differ = 0
    for text in [*PROMPTS, "think <think> twice<think>"]:
        want = original.encode(text, add_special_tokens=False).ids
        assert ck.tokenizer.encode(text, add_special_tokens=False).ids == want, text
        assert ck.tokenizer.decode(want) == original.decode(want), text
        differ += want != gpt2.encode(text, add_special_tokens=False).ids
    assert differ >= 3  # the pre-tokenizer matters (digits one by one, newlines): the test would see a wrong one
    think = ck.tokenizer.token_to_id("<think>")
    assert ck.tokenizer.encode("a<think>b", add_special_tokens=False).ids.count(think) == 1
    assert ck.tokenizer.decode([think]) == "<think>"  # user-defined: not skipped as special tokens are


# o200k's split as gpt-oss's tokenizer.json writes it (no normalizer), written out here as the reference
O200K_PATTERN = (
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)


def test_a_gpt_4o_pre_tokenizer_as_gpt_oss_files_have(tmp_path):
    """llama.cpp names o200k's split (gpt-oss's tokenizer) 'gpt-4o': the engine splits as that tokenizer.json does."""
    folder = tmp_path / "o200k-tok"
    shutil.copytree(FIXTURES / "qwen3moe-f32", folder)
    tj = split_tokenizer_json(folder, O200K_PATTERN, None)
    (folder / "tokenizer.json").write_text(json.dumps(tj))
    ck = Checkpoint.open(to_gguf(folder, tmp_path / "m.gguf", pre="gpt-4o")[0])
    original = Tokenizer.from_file(str(folder / "tokenizer.json"))
    gpt2 = Tokenizer.from_file(str(FIXTURES / "qwen3moe-f32" / "tokenizer.json"))
    differ = 0
    for text in [*PROMPTS, "In 1234567 ways, THEY'RE CamelCase's/path\n\n  x"]:
        want = original.encode(text, add_special_tokens=False).ids
        assert ck.tokenizer.encode(text, add_special_tokens=False).ids == want, text
        assert ck.tokenizer.decode(want) == original.decode(want), text
        differ += want != gpt2.encode(text, add_special_tokens=False).ids
    assert differ >= 1  # digits in threes, case runs: the split matters


def test_quantized_tensors_and_their_expert_slices(tmp_path):
    arrays = gguf_tensors(FIXTURES / "qwen3moe-f32")
    q8, mx = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.MXFP4
    qtypes = {"blk.0.ffn_gate_exps.weight": q8, "blk.0.ffn_down_exps.weight": mx, "blk.0.attn_q.weight": q8,
              "blk.2.ffn_up_exps.weight": mx, "token_embd.weight": q8}  # fmt: skip
    path = to_gguf(FIXTURES / "qwen3moe-f32", tmp_path / "q.gguf", qtypes=qtypes)[0]
    ck = Checkpoint.open(path)
    raw = path.read_bytes()
    for gname, hf, experts in [("blk.0.ffn_gate_exps.weight", "model.layers.0.mlp.experts.{}.gate_proj.weight", 8),
                               ("blk.0.ffn_down_exps.weight", "model.layers.0.mlp.experts.{}.down_proj.weight", 8),
                               ("blk.2.ffn_up_exps.weight", "model.layers.2.mlp.experts.{}.up_proj.weight", 8),
                               ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", 0),
                               ("token_embd.weight", "model.embed_tokens.weight", 0)]:  # fmt: skip
        qtype, arr = qtypes[gname], arrays[gname]
        name = gguf.GGMLQuantizationType(qtype).name
        for e in range(experts) if experts else [None]:
            t = ck.tensors[hf.format(e)]
            part = arr if e is None else arr[e]
            assert t.dtype == name and t.shape == part.shape
            assert t.nbytes == formats.tensor_bytes(name, part.shape)
            got = np.frombuffer(raw[t.offset : t.offset + t.nbytes], dtype=np.uint8)
            assert np.array_equal(got, gguf.quants.quantize(part, qtype).reshape(-1))
            assert np.abs(gguf.quants.dequantize(got.reshape(part.shape[0], -1), qtype) - part).max() < 0.2
    assert ck.tensors["model.layers.0.mlp.experts.0.up_proj.weight"].dtype == "F32"


def test_alignment_other_than_32(tmp_path, moe_gguf):
    path = to_gguf(FIXTURES / "qwen3moe-f32", tmp_path / "a.gguf",
                   extra={"general.alignment": (64, gguf.GGUFValueType.UINT32)})  # fmt: skip
    ck, ref = Checkpoint.open(path[0]), Checkpoint.open(moe_gguf)
    assert all(t.offset % 64 == 0 for n, t in ck.tensors.items() if ".experts." not in n)
    assert {n: (t.shape, t.nbytes) for n, t in ck.tensors.items()} == {
        n: (t.shape, t.nbytes) for n, t in ref.tensors.items()
    }


def test_metadata_comes_from_gguf_reader(moe_gguf):
    (part,) = read_parts(moe_gguf)
    assert part.metadata["general.architecture"].value == "qwen3moe"
    assert part.metadata["qwen3moe.attention.layer_norm_rms_epsilon"].value == 1e-06  # a float32's shortest text
    assert len(part.metadata["tokenizer.ggml.tokens"].value) == 512
    reader = gguf.GGUFReader(moe_gguf)
    assert [t.name for t in reader.tensors] == [t.name for t in part.tensors]


def test_fingerprint_of_a_gguf_follows_its_metadata_and_tensor_table(tmp_path, moe_gguf):
    fp = fingerprint(moe_gguf)
    assert fp.startswith("sha256:") and fp != fingerprint(FIXTURES / "qwen3moe-f32")
    other = to_gguf(FIXTURES / "qwen3moe-f32", tmp_path / "o.gguf",
                    extra={"qwen3moe.rope.freq_base": (20000.0, gguf.GGUFValueType.FLOAT32)})[0]  # fmt: skip
    assert fingerprint(other) != fp
    same = to_gguf(FIXTURES / "qwen3moe-f32", tmp_path / "same.gguf")[0]
    assert fingerprint(same) == fp


def test_the_command_line_runs_a_gguf_target_with_a_folder_draft(tmp_path, capsys, moe_gguf):
    ref = np.load(FIXTURES / "qwen3moe-f32" / "reference.npz")
    prompt = "The quick brown fox jumps over the lazy dog. Mixture of experts"
    draft = ["--draft", str(FIXTURES / "qwen3-f32")]
    assert (
        main(["run", "--model", str(moe_gguf), *draft, "--prompt", prompt, "-n", "16", "--repeats", "1", "--json"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["target"] == str(moe_gguf)
    assert report["prompts"][0]["generated_ids"] == ref["generated_ids"][:16].tolist()


def test_the_command_line_names_a_damaged_gguf(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 16)
    assert main(["run", "--model", str(bad), "-n", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("expertbench: error: ") and str(bad) in err and err.count("\n") == 1


def test_a_profile_of_a_gguf_model_records_replays_and_exports(tmp_path, capsys, moe_gguf):
    run = "run: {prompts: [[1, 2, 3, 4], [5, 6, 7]], tokens: 6, repeats: 1, q: 2}\n"
    draft = f"draft: {{path: {FIXTURES / 'qwen3-f32'}}}\n"
    placement = "devices: {cpu: {devices: 2, threads: 1}}\nplacement:\n  layers: {2: cpu:1}\n"
    for name, model in (("gguf", moe_gguf), ("folder", FIXTURES / "qwen3moe-f32")):
        (tmp_path / f"{name}.yaml").write_text(
            f"expertbench_profile: 1\nmodel: {{path: {model}}}\n{draft}{placement}{run}"
        )
        assert main(["regress", "--record", str(tmp_path / f"{name}.yaml")]) == 0
    recorded = load_profile(tmp_path / "gguf.yaml")
    assert recorded.model.fingerprint == fingerprint(moe_gguf)
    assert recorded.expectations.output_sha256 == load_profile(tmp_path / "folder.yaml").expectations.output_sha256
    assert main(["regress", str(tmp_path / "gguf.yaml")]) == 0
    capsys.readouterr()
    assert main(["export", str(tmp_path / "gguf.yaml"), "--format", "vllm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)


LLAMA_CPP = FIXTURES / "qwen3moe-gguf"  # files from llama.cpp's converter, with its outputs (recipes/qwen3moe_gguf.py)


def test_a_file_from_llama_cpps_converter_tokenizes_and_runs_as_llama_cpp_does(engine):
    ck = Checkpoint.open(LLAMA_CPP / "model-f32.gguf")
    cases = json.loads((LLAMA_CPP / "tokenizer-cases.json").read_text())["cases"]
    for case in cases:
        assert ck.tokenizer.encode(case["text"], add_special_tokens=False).ids == case["ids"], case["text"]
    ref = np.load(LLAMA_CPP / "reference-f32.npz")
    prompt = ref["prompt_ids"]
    with engine.load(ck, weights="map") as model, model.context(len(prompt) + 64) as ctx:
        got = ctx.prefill(prompt)
        assert np.abs(got - ref["logits"][: len(prompt)]).max() < 1e-4
        ctx.truncate(0)
        assert ctx.generate(prompt, len(ref["generated_ids"])).ids == ref["generated_ids"].tolist()


def test_quantized_experts_run_as_their_dequantized_values(engine, tmp_path):
    """The core computes a quantized matrix as its dequantized one: a Q8_0 / MXFP4 file and an F32 file of the same
    values give the same logits, which holds only if every expert's slice starts where it should."""
    arrays = gguf_tensors(FIXTURES / "qwen3moe-f32")
    q8, mx = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.MXFP4
    qtypes = {n: (mx if "down" in n else q8) for n in arrays if "_exps" in n} | {"blk.1.ffn_up.weight": q8}
    quantized = to_gguf(FIXTURES / "qwen3moe-f32", tmp_path / "q.gguf", qtypes=qtypes)[0]
    dequantized = {n: gguf.quants.dequantize(gguf.quants.quantize(a, qtypes[n]), qtypes[n]) if n in qtypes else a
                   for n, a in arrays.items()}  # fmt: skip
    plain = to_gguf(FIXTURES / "qwen3moe-f32", tmp_path / "f.gguf", tensors=dequantized)[0]
    prompt = np.load(FIXTURES / "qwen3moe-f32" / "reference.npz")["prompt_ids"]
    assert np.array_equal(logits(engine, quantized, prompt), logits(engine, plain, prompt))
