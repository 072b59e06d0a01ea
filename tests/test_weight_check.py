"""Wrong numbers never pass silently: a weight that is not a number (a NaN or inf value, block scale or scale
companion, an MXFP4 exponent of 255, an FP8 NaN byte) is refused at load naming the file, the tensor and the index;
check_weights=False / --no-check-weights loads it; and logits that then go NaN are an error naming the step, never a
token (Context.greedy in the core, the greedy and speculative decoders in Python, `expertbench run`).

Each case damages a copy of a fixture where the engine's own reader says the tensor's bytes are."""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from fixture_paths import FIXTURES
from test_fp8_weights import NAME as FP8_NAME
from test_fp8_weights import folders  # noqa: F401 (the FP8 folder, a fixture)

from engine.checkpoints.checkpoint import Checkpoint
from engine.cli import main
from engine.core.errors import CheckpointError, NumericError
from engine.core.greedy import greedy_choice
from engine.model import Engine
from engine.runs import speculative

QWEN = FIXTURES / "qwen3moe-f32"
GGUF = FIXTURES / "qwen3moe-gguf"
NAN16, INF16 = b"\x00\x7e", b"\x00\x7c"  # f16 NaN and inf, little-endian
HUGE = r"\(a magnitude past 2\^64, which no weight has\)"
MXFP4_255 = rf"(-?inf|-?1\.70141e\+38 {HUGE})"  # an exponent of 255 is 2^127 times the E2M1 value: inf past 1


def damaged(tmp_path: Path, source: Path, *patches: tuple[str, int, bytes]) -> Path:
    """A copy of a model folder or GGUF file with bytes written over tensors: (tensor, byte in it, bytes)."""
    copy = tmp_path / source.name
    if source.is_dir():
        shutil.copytree(source, copy)
    else:
        shutil.copy(source, copy)
    tensors = Checkpoint.open(copy).tensors
    for name, at, new in patches:
        t = tensors[name]
        assert at + len(new) <= t.nbytes
        with open(t.file, "r+b") as f:
            f.seek(t.offset + at)
            f.write(new)
    return copy


def tensor_bytes(source: Path, name: str) -> bytes:
    t = Checkpoint.open(source).tensors[name]
    with open(t.file, "rb") as f:
        f.seek(t.offset)
        return f.read(t.nbytes)


def refused(path: Path, name: str, holds: str, at: str, hint: str = "") -> None:
    """The load refused naming the file, the tensor, the value and where it is; the opt-out loads it."""
    file = Checkpoint.open(path).tensors[name].file
    with Engine() as eng:
        with pytest.raises(CheckpointError) as info:
            eng.load(path)
        message = str(info.value)
        want = rf"^'{re.escape(str(file))}': tensor '{re.escape(name)}' holds {holds} at {re.escape(at)} \("
        assert re.search(want, message), message
        assert hint in message and message.endswith("; --no-check-weights (check_weights=False) loads it anyway")
        eng.load(path, check_weights=False).close()


def f32(value: float) -> bytes:
    return struct.pack("<f", value)


# ---- refused at load --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, shape, index, value, holds",
    [
        ("model.layers.0.mlp.experts.5.down_proj.weight", (64, 32), (12, 20), float("nan"), "NaN"),
        ("model.layers.2.post_attention_layernorm.weight", (64,), (7,), float("inf"), "inf"),
        ("model.layers.0.mlp.gate.weight", (8, 64), (3, 9), float("-inf"), "-inf"),
        ("model.embed_tokens.weight", (512, 64), (100, 3), float("nan"), "NaN"),
        ("model.layers.2.self_attn.o_proj.weight", (64, 128), (0, 127), 1e30, rf"1e\+30 {HUGE}"),
    ],
    ids=["expert", "norm", "router", "embedding", "huge"],
)
def test_a_float_weight_that_is_not_a_number(tmp_path, name, shape, index, value, holds):
    path = damaged(tmp_path, QWEN, (name, 4 * int(np.ravel_multi_index(index, shape)), f32(value)))
    at = f"index {index[0]}" if len(index) == 1 else f"row {index[0]}, column {index[1]}"
    refused(path, name, holds, at, "(a damaged file)")


@pytest.mark.parametrize(
    "name, index, at",
    [
        ("model.layers.1.self_attn.q_proj.bias", 5, "index 5"),
        ("model.layers.3.self_attn.sinks", 2, "index 2"),
        ("model.layers.1.mlp.router.bias", 4, "index 4"),
        ("model.layers.1.mlp.experts.gate_up_proj", (2 * 64 + 10) * 128 + 7, "index [2, 10, 7]"),
    ],
    ids=["bias", "sinks", "router-bias", "merged-experts"],
)
def test_gpt_oss_biases_sinks_and_merged_experts(tmp_path, name, index, at):
    path = damaged(tmp_path, FIXTURES / "gpt-oss-bf16", (name, 2 * index, b"\xc0\x7f"))  # a bf16 NaN
    refused(path, name, "NaN", at)


@pytest.mark.parametrize("scale, holds", [(NAN16, "NaN"), (INF16, "(NaN|inf|-inf)")], ids=["nan", "inf"])
@pytest.mark.parametrize(
    "file, name, block_bytes, per_row, scale_at, column",
    [
        ("model-q8_0.gguf", "model.layers.1.mlp.experts.5.down_proj.weight", 34, 8, 0, 64),
        ("model-q4_k_m.gguf", "model.layers.0.mlp.experts.5.down_proj.weight", 144, 1, 0, 0),  # Q4_K's d
        ("model-q4_k_m.gguf", "model.layers.0.mlp.experts.5.down_proj.weight", 144, 1, 2, 0),  # Q4_K's dmin
        ("model-q4_k_m.gguf", "model.layers.1.mlp.experts.5.down_proj.weight", 210, 1, 208, 0),  # Q6_K's d
    ],
    ids=["q8_0", "q4_k-d", "q4_k-dmin", "q6_k"],
)
def test_a_gguf_block_scale_of_nan_or_inf(tmp_path, file, name, block_bytes, per_row, scale_at, column, scale, holds):
    block = 12 * per_row + column // (256 // per_row)  # row 12's (of 256 values) block that holds `column`
    path = damaged(tmp_path, GGUF / file, (name, block * block_bytes + scale_at, scale))
    refused(path, name, holds, f"row 12, column {column}", "(a damaged file, or a block scale of NaN or inf)")


def first_nonzero(block: bytes) -> int:
    """The first value of an MXFP4 block (exponent, 16 bytes of nibbles: value j low, j + 16 high) that is not 0."""
    codes = [b & 0xF for b in block[1:17]] + [b >> 4 for b in block[1:17]]
    return next(j for j, c in enumerate(codes) if c & 7)


def test_an_mxfp4_exponent_of_255_in_a_gguf_file(tmp_path):
    src, name = FIXTURES / "gpt-oss-gguf" / "model-mxfp4_moe.gguf", "model.layers.2.mlp.experts.5.down_proj.weight"
    at = 12 * 34 + 17  # row 12 of 64 values (two blocks of 17 bytes), its second block
    j = first_nonzero(tensor_bytes(src, name)[at : at + 17])
    path = damaged(tmp_path, src, (name, at, b"\xff"))
    refused(path, name, MXFP4_255, f"row 12, column {32 + j}",
            "a block scale")  # fmt: skip


def test_an_mxfp4_exponent_of_255_in_a_released_layout_folder(tmp_path):
    """The Hugging Face MXFP4 layout's raw bytes are packed at load: the index is the scales tensor's."""
    src, stem = FIXTURES / "gpt-oss-mxfp4", "model.layers.1.mlp.experts.gate_up_proj"
    index = (3, 17, 1)  # [expert, row (odd: up_proj's), block]
    blocks = tensor_bytes(src, f"{stem}_blocks")
    flat = int(np.ravel_multi_index(index, (8, 128, 2)))
    assert any(b & 0x77 for b in blocks[16 * flat : 16 * flat + 16]), "an all-zero block: pick another"
    path = damaged(tmp_path, src, (f"{stem}_scales", flat, b"\xff"))
    refused(path, f"{stem}_scales", MXFP4_255, "index [3, 17, 1]")


def test_an_fp8_nan_byte_and_a_scale_companion_of_nan_or_inf(folders, tmp_path):  # noqa: F811
    fp8, _ = folders
    companion = f"(a damaged file, or a scale of NaN or inf in its scale companion '{FP8_NAME}_scale_inv')"
    refused(damaged(tmp_path / "byte", fp8, (FP8_NAME, 12 * 32 + 5, b"\x7f")), FP8_NAME, "NaN", "row 12, column 5",
            companion)  # fmt: skip
    for value in (float("nan"), float("inf")):
        path = damaged(tmp_path / str(value), fp8, (f"{FP8_NAME}_scale_inv", 0, f32(value)))
        refused(path, FP8_NAME, "(NaN|inf|-inf)", "row 0, column 0", companion)


def test_the_first_bad_weight_in_binding_order_is_named_whatever_the_threads_do(tmp_path):
    late, early = "model.layers.2.self_attn.o_proj.weight", "model.layers.0.mlp.experts.7.up_proj.weight"
    path = damaged(tmp_path, QWEN, (late, 0, f32(float("nan"))), (early, 4 * (31 * 64 + 2), f32(float("inf"))),
                   (early, 4 * (31 * 64 + 40), f32(float("nan"))))  # fmt: skip
    for _ in range(5):
        refused(path, early, "inf", "row 31, column 2")


def test_check_weights_takes_a_bool():
    with Engine() as eng, pytest.raises(Exception, match="check_weights 1: expected True or False"):
        eng.load(QWEN, check_weights=1)


# ---- a run whose logits go non-finite ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    """The fixture with one generated token's embedding row NaN: its greedy output from the prompt is fine until that
    token is fed. Returns (folder, prompt ids, the good generated ids, k: the index of that token)."""
    ref = np.load(QWEN / "reference.npz")
    prompt, good = ref["prompt_ids"].tolist(), ref["generated_ids"].tolist()
    k = next(i for i, t in enumerate(good) if i >= 3 and t not in prompt and t not in good[:i])
    row = 4 * 64 * good[k]
    path = damaged(tmp_path_factory.mktemp("poisoned"), QWEN, ("model.embed_tokens.weight", row, f32(float("nan"))))
    return path, prompt, good, k


def step_error(k: int, n_prompt: int, what: str = "the logits") -> str:
    return re.escape(f"step {k + 1} (position {n_prompt + k}): {what} hold NaN at token id 0: the model's numbers "
                     "overflowed or a weight is damaged")  # fmt: skip


def test_greedy_in_the_core_names_the_step(poisoned):
    path, prompt, good, k = poisoned
    with Engine() as eng, eng.load(path, check_weights=False) as model, model.context(64) as ctx:
        ctx.prefill(prompt, all_rows=False)
        with pytest.raises(NumericError, match=step_error(k, len(prompt))):
            ctx.greedy(good[0], 16)
        ctx.truncate(0)
        with pytest.raises(NumericError, match=step_error(k, len(prompt))):
            ctx.generate(prompt, 16)


@pytest.mark.parametrize("q", [None, 1, 3], ids=["greedy", "q1", "q3"])
def test_the_python_decoders_name_the_step(poisoned, q):
    path, prompt, _, k = poisoned
    with Engine() as eng, eng.load(path, check_weights=False) as target, eng.load(QWEN) as draft:  # noqa: SIM117
        with (
            target.context(64) as t,
            draft.context(64) as d,
            pytest.raises(NumericError, match=step_error(k, len(prompt))),
        ):
            speculative.generate(t, d if q else None, prompt, 16, q or 2)


def test_a_draft_whose_logits_go_nan_is_named(poisoned):
    path, prompt, _, _ = poisoned
    nan_draft = r"step \d+ \(position \d+\): the draft's logits hold NaN"
    with Engine() as eng, eng.load(QWEN) as target, eng.load(path, check_weights=False) as draft:  # noqa: SIM117
        with target.context(64) as t, draft.context(64) as d, pytest.raises(NumericError, match=nan_draft):
            speculative.generate(t, d, prompt, 16, 3)


def test_the_first_token_from_nan_logits(tmp_path):
    path = damaged(tmp_path, QWEN, ("model.norm.weight", 0, f32(float("nan"))))
    first = re.escape("step 0 (position 4): the logits hold NaN at token id 0")
    with Engine() as eng, eng.load(path, check_weights=False) as model, model.context(64) as ctx:  # noqa: SIM117
        with pytest.raises(NumericError, match=first):
            ctx.generate([1, 2, 3, 4, 5], 4)


def test_greedy_choice():
    assert greedy_choice(np.array([0.0, 2.0, 2.0, 1.0], np.float32), 0, 0) == 1
    assert greedy_choice(np.array([[0.0, 1.0], [3.0, 1.0]], np.float32), 0, 0) == [1, 0]
    rows = np.array([[0.0, 1.0], [3.0, -np.inf]], np.float32)
    with pytest.raises(NumericError, match=re.escape("step 5 (position 9): the logits hold -inf at token id 1")):
        greedy_choice(rows, 4, 8)


def test_expertbench_run_fails_naming_the_step_or_the_tensor(tmp_path, capsys):
    path = damaged(tmp_path, QWEN, ("model.norm.weight", 4, f32(float("inf"))))
    args = ["run", "--model", str(path), "--prompt", "The quick brown fox", "-n", "8", "--repeats", "1"]
    for draft in ([], ["--draft", str(QWEN)]):
        assert main(args + draft + ["--no-check-weights"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
        assert re.match(
            r"expertbench: error: step 0 \(position \d+\): the logits hold (NaN|-?inf) at token id \d+: ", err
        ), err
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "tensor 'model.norm.weight' holds inf at index 1 (a damaged file)" in err
