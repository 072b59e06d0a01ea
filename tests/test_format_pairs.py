"""Every pair of weight formats across an expert's gate, up and down projections, in both precisions.

llama.cpp's quantizer writes experts whose gate and up differ in format (a K-quant's fallback Q5_0 / Q5_1 beside Q8_0
or MXFP4), and the q8 precision quantizes the activations once per block size for both products: each must still take
the kernel its own format has (integer products, or f32 activations where it has none) and write every output.

The fixtures are one-layer Qwen3-MoE GGUF files whose attention output is zero, so each position's logits are the
embedding plus the experts, through the final norm and lm_head: a float64 numpy reference on the gguf package's
dequantized weights gives them exactly. The (gate, up, down) formats are the N^2 rows (a, b, a + b mod N) of an
orthogonal array over the N formats of GGUF files: every ordered pair of formats meets in every pair of projections.
Each file runs in the f32 and q8 precisions on cpu:0, cpu:1 and hostsim:0 (experts split between them), in the best
kernels this CPU runs and in the portable ones, against the reference, and gives the same bits on every run and
placement.
"""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from fixture_paths import FIXTURES
from gguf_models import tokenizer_keys  # tests/gguf_models.py

from engine.core import formats
from engine.model import Engine

FOLDER = FIXTURES / "qwen3moe-f32"  # its tokenizer
HIDDEN = INTER = 256  # the K formats' rows are whole 256-value blocks
E = TOP_K = 2  # every expert on every position: no routing choice for the q8 precision's rounding to flip
HEADS, KV_HEADS, HEAD_DIM = 2, 1, 32
NAMES = [name for name, f in formats.FORMATS.items() if f.ggml_type >= 0]  # the formats a GGUF file holds
N = len(NAMES)  # the order of the orthogonal array below: (a, b, a + b mod N) meets every pair in every two columns
TRIPLES = [(NAMES[a], NAMES[b], NAMES[(a + b) % N]) for a in range(N) for b in range(N)]
PROMPT = [5, 17, 42, 99, 300, 7, 511]
F32_TOLERANCE = 1e-4  # relative L2 per position: the f32 precision is the dequantized weights' float model
# q8: activations rounded to 8 bits per block move a position by 1-3 % here; an output left unwritten moves it by
# tens of percent (the experts carry most of each logit)
Q8_TOLERANCE = 0.05
PLACEMENTS = ["*=cpu:0", "*=cpu:1", "*=hostsim:0", "0.0=cpu:1; 0.1=hostsim:0"]


def _qtype(name: str) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType(formats.get(name).ggml_type)


def _dequantized(name: str, data: np.ndarray) -> np.ndarray:
    if name in ("F32", "F16"):
        return data.astype(np.float64)
    return gguf.quants.dequantize(data, _qtype(name)).astype(np.float64)


F16_MINIMUM = ("Q4_K", "Q5_K", "Q5_1", "Q4_1", "Q2_K")  # the formats whose blocks hold an f16 minimum (dmin, m)


def f16_fields(name: str) -> list[int]:
    """Where a block's f16 scale lies, then its f16 minimum where it has one: byte offsets (IQ1_M's d lies in the top
    nibbles of its four scale words at 48: f16_get and f16_put read and write it there)."""
    return {"Q6_K": [208], "Q2_K": [80, 82], "Q3_K": [108], "IQ1_M": [48]}.get(
        name, [0, 2] if name in F16_MINIMUM else [0]
    )


def f16_get(name: str, raw: np.ndarray, at: int) -> np.ndarray:
    """The f16 field at byte `at` (f16_fields) of each block of raw (n x block_bytes), as uint16 bits."""
    if name == "IQ1_M":  # nibble k of d: the high nibble of byte 49 + 2k
        return sum((raw[:, 49 + 2 * k].astype(np.uint16) >> 4) << (4 * k) for k in range(4)).astype(np.uint16)
    return np.ascontiguousarray(raw[:, at : at + 2]).view(np.uint16).reshape(-1)


def f16_put(name: str, raw: np.ndarray, at: int, bits) -> None:
    """Set the f16 field at byte `at` of each block of raw to bits (uint16, one or one per block)."""
    bits = np.broadcast_to(np.asarray(bits, dtype=np.uint16), (raw.shape[0],))
    if name == "IQ1_M":
        for k in range(4):
            nibble = ((bits >> (4 * k)) & 0xF).astype(np.uint8)
            raw[:, 49 + 2 * k] = (raw[:, 49 + 2 * k] & 0x0F) | (nibble << 4)
        return
    raw[:, at : at + 2] = np.ascontiguousarray(bits).view(np.uint8).reshape(-1, 2)


def _unit_scales(name: str, raw: np.ndarray) -> None:
    """Scale fields of blocks set to one (and the minima to centre the values): the values are then the quants'."""
    one = np.float16(1.0).view(np.uint16)
    half = {"Q4_K": 7.5, "Q5_K": 15.5, "Q2_K": 1.5}
    if name == "MXFP4":
        raw[:, 0] = 127
    else:
        fields = f16_fields(name)
        f16_put(name, raw, fields[0], one)
        if name in half:  # dmin: the minima scaled to about the mean of the quants times the scales
            raw[:, fields[1] : fields[1] + 2] = np.array([np.float16(half[name])], dtype=np.float16).view(np.uint8)
        elif name in ("Q5_1", "Q4_1"):  # m = -15.5 d (-7.5 d): quants 0..31 (0..15) about zero
            m = -15.5 if name == "Q5_1" else -7.5
            raw[:, 2:4] = np.array([np.float16(m)], dtype=np.float16).view(np.uint8)


def _rescale(name: str, raw: np.ndarray, factor: float) -> None:
    """Every block's scales times factor (MXFP4: the nearest power of two)."""
    if name == "MXFP4":
        raw[:, 0] = np.clip(raw[:, 0].astype(int) + int(round(np.log2(factor))), 1, 254)
        return
    for at in f16_fields(name):
        v = f16_get(name, raw, at).view(np.float16).astype(np.float32) * factor
        f16_put(name, raw, at, v.astype(np.float16).view(np.uint16))


def make_weights(name: str, shape: tuple[int, ...], std: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """(what the file stores, its values in float64) for a tensor of `shape` in format `name`: floats from a normal
    distribution, quantized formats as random blocks whose scales give about `std`."""
    fmt = formats.get(name)
    if not fmt.quantized:
        values = (rng.standard_normal(shape) * std).astype(np.float32)
        data = {"F32": values, "F16": values.astype(np.float16)}.get(name)
        if data is None:
            data = gguf.quants.quantize(values, _qtype(name))
        return data, _dequantized(name, data)
    n_blocks = int(np.prod(shape)) // fmt.block
    raw = rng.integers(0, 256, (n_blocks, fmt.block_bytes), dtype=np.uint8)
    _unit_scales(name, raw)
    measured = gguf.quants.dequantize(raw, _qtype(name)).std()
    _rescale(name, raw, std / measured)
    data = raw.reshape(*shape[:-1], shape[-1] // fmt.block * fmt.block_bytes)
    return data, _dequantized(name, data).reshape(shape)


def write_model(path, gate: str, up: str, down: str, seed: int) -> dict[str, np.ndarray]:
    """A one-layer Qwen3-MoE GGUF at path with these expert formats; the reference's float64 weights returned."""
    rng = np.random.default_rng(seed)
    config = json.loads((FOLDER / "config.json").read_text())
    vocab = config["vocab_size"]
    f32 = {
        "token_embd.weight": rng.standard_normal((vocab, HIDDEN)),
        "output_norm.weight": 1.0 + 0.1 * rng.standard_normal(HIDDEN),
        "output.weight": rng.standard_normal((vocab, HIDDEN)) / np.sqrt(HIDDEN),
        "blk.0.attn_norm.weight": np.ones(HIDDEN),
        "blk.0.attn_q.weight": rng.standard_normal((HEADS * HEAD_DIM, HIDDEN)) / np.sqrt(HIDDEN),
        "blk.0.attn_k.weight": rng.standard_normal((KV_HEADS * HEAD_DIM, HIDDEN)) / np.sqrt(HIDDEN),
        "blk.0.attn_v.weight": rng.standard_normal((KV_HEADS * HEAD_DIM, HIDDEN)) / np.sqrt(HIDDEN),
        "blk.0.attn_output.weight": np.zeros((HIDDEN, HEADS * HEAD_DIM)),  # attention adds nothing
        "blk.0.attn_q_norm.weight": np.ones(HEAD_DIM),
        "blk.0.attn_k_norm.weight": np.ones(HEAD_DIM),
        "blk.0.ffn_norm.weight": 1.0 + 0.1 * rng.standard_normal(HIDDEN),
        "blk.0.ffn_gate_inp.weight": rng.standard_normal((E, HIDDEN)) / np.sqrt(HIDDEN),
    }
    f32 = {k: v.astype(np.float32) for k, v in f32.items()}
    ref = {k: v.astype(np.float64) for k, v in f32.items()}
    stored: dict[str, tuple[np.ndarray, str]] = {k: (v, "F32") for k, v in f32.items()}
    # the experts' output several times the embedding's: the logits are mostly theirs
    gate_up, down_std = 2.0 / np.sqrt(HIDDEN), 4.0 / np.sqrt(INTER)
    projections = [("gate", gate, (E, INTER, HIDDEN), gate_up), ("up", up, (E, INTER, HIDDEN), gate_up),
                   ("down", down, (E, HIDDEN, INTER), down_std)]  # fmt: skip
    for proj, fmt, shape, std in projections:
        data, values = make_weights(fmt, shape, std, rng)
        stored[f"blk.0.ffn_{proj}_exps.weight"] = (data, fmt)
        ref[f"blk.0.ffn_{proj}_exps.weight"] = values

    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_context_length(64)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(1)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(E)
    w.add_expert_used_count(TOP_K)
    w.add_expert_feed_forward_length(INTER)
    tok = tokenizer_keys(FOLDER, vocab)
    w.add_tokenizer_model(tok["model"])
    w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["token_type"])
    w.add_token_merges(tok["merges"])
    w.add_bos_token_id(config["bos_token_id"])
    w.add_eos_token_id(config["eos_token_id"])
    for name, (data, fmt) in stored.items():
        if fmt in ("F32", "F16"):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=_qtype(fmt))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ref


def _rms_norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * weight


def reference_logits(ref: dict[str, np.ndarray], ids: list[int], activations=None) -> np.ndarray:
    """The model's logits per position in float64 (its attention adds nothing: positions are independent).
    activations(x, projection): what the expert projection ("gate", "up", "down") reads of its input x (default: x)."""
    act = activations or (lambda x, _projection: x)
    x = ref["token_embd.weight"][ids]
    xn = _rms_norm(x, ref["blk.0.ffn_norm.weight"])
    scores = xn @ ref["blk.0.ffn_gate_inp.weight"].T
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)  # every expert chosen: the normalized top-k weights are the softmax
    for e in range(E):
        g = act(xn, "gate") @ ref["blk.0.ffn_gate_exps.weight"][e].T
        u = act(xn, "up") @ ref["blk.0.ffn_up_exps.weight"][e].T
        x = x + p[:, e : e + 1] * (act(g / (1.0 + np.exp(-g)) * u, "down") @ ref["blk.0.ffn_down_exps.weight"][e].T)
    return _rms_norm(x, ref["output_norm.weight"]) @ ref["output.weight"].T


def relative_error(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)


@pytest.fixture(scope="module", params=["best", "portable"])
def engine(request):
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, cpu_threads=1, kernels=request.param) as eng:
        yield eng


def _logits(model, precision: str) -> np.ndarray:
    with model.context(len(PROMPT)) as ctx:
        ctx.precision = precision
        return ctx.prefill(PROMPT)


@pytest.mark.parametrize(("gate", "up", "down"), TRIPLES, ids=["-".join(t) for t in TRIPLES])
def test_every_format_pair_in_both_precisions(engine, tmp_path, gate, up, down):
    path = tmp_path / "model.gguf"
    ref = reference_logits(write_model(path, gate, up, down, seed=TRIPLES.index((gate, up, down))), PROMPT)
    first = {}
    with engine.load(path) as model:
        # q8 first: an output it left unwritten would otherwise hold the f32 run's nearly equal values
        for precision, tolerance in (("q8", Q8_TOLERANCE), ("f32", F32_TOLERANCE)):
            for placement in PLACEMENTS:
                model.set_placement(placement)
                for _ in range(2):
                    ours = _logits(model, precision)
                    err = relative_error(ours, ref)
                    assert err.max() < tolerance, (
                        f"{precision} on {placement}: position {err.argmax()} off by {err.max():.3g} (relative L2)"
                    )
                    first.setdefault(precision, ours)
                    assert np.array_equal(ours, first[precision]), f"{precision} on {placement}: other bits"
    # formats without integer products (floats, Q5_0, Q5_1) are read with f32 activations in either precision
    if any(formats.get(f).q8_block for f in (gate, up, down)):
        assert not np.array_equal(first["q8"], first["f32"])
    else:
        assert np.array_equal(first["q8"], first["f32"])
