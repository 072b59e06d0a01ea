"""Seeded fuzzing of what users hand the engine: safetensors headers and truncated files, config.json, profiles and
placement texts. Every case either fails with an EngineError that names the file (or the value), or gives exactly the
logits of the unmutated input (a placement: of every expert on one device, reference mode). Bounded to run in CI;
the seeds make every failure reproducible (the case number is in the assertion)."""

import json
import math
import random
import shutil
import struct

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.checkpoints.checkpoint import Checkpoint
from engine.core.errors import EngineError
from engine.model import Engine
from engine.profiles import profile as P

PROMPT = [5, 17, 3, 44]
NAME = "qwen3moe-f32"


@pytest.fixture(scope="module")
def engine():
    with Engine(cpu_devices=2, cpu_threads=1) as eng:
        yield eng


@pytest.fixture(scope="module")
def reference(engine):
    with engine.load(FIXTURES / NAME) as model, model.context(16) as ctx:
        return ctx.prefill(PROMPT)


def logits_or_error(engine, folder):
    """The logits of the prompt, or the EngineError of loading the folder (any other exception fails the test). A
    config whose max_position_embeddings is below the prompt's length loads; its context then refuses the prompt."""
    try:
        model = engine.load(Checkpoint.open(folder), weights="map")
    except EngineError as exc:
        return exc
    with model, model.context(min(16, model.config.max_position_embeddings)) as ctx:
        if ctx.capacity < len(PROMPT):
            return None
        return ctx.prefill(PROMPT)


def read_st(path):
    raw = path.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    return raw[8 : 8 + hlen], raw[8 + hlen :]


JUNK = [None, True, -1, 0, 1, 2**31, 2**63, -(2**63), 2**64, 1.5, float("nan"), "", "x", [], {}, [1, 2], [[1]],
        "F32", "BF16", "F16", "I64", [0, 2**63], [-1, 4], [4, 2]]  # fmt: skip


def mutate_header(header: dict, rng: random.Random) -> dict:
    """One to three structural changes that make the header wrong (or leave the weights where they are)."""
    names = [k for k in header if k != "__metadata__"]
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(names)
        entry = header.get(name)
        if not isinstance(entry, dict):
            continue
        kind = rng.randrange(9)
        if kind == 0:
            entry["dtype"] = rng.choice(JUNK)
        elif kind == 1 and isinstance(entry.get("shape"), list):
            shape = list(entry["shape"])
            if shape:
                shape[rng.randrange(len(shape))] = rng.choice([0, 1, 3, 2**40, -1, 2**63, shape[0] + 1])
            entry["shape"] = rng.choice([shape, shape[::-1], shape + [1], shape[:-1], rng.choice(JUNK)])
        elif kind == 2 and isinstance(entry.get("data_offsets"), list) and len(entry["data_offsets"]) == 2:
            begin, end = entry["data_offsets"]
            d = rng.choice([1, 2, 4, 8, 1024, 2**32, -1, -8])
            entry["data_offsets"] = rng.choice([[begin + d, end], [begin, end + d], [begin + d, end + d], [end, begin]])
        elif kind == 3:
            entry[rng.choice(["dtype", "shape", "data_offsets"])] = rng.choice(JUNK)
        elif kind == 4:
            del entry[rng.choice(["dtype", "shape", "data_offsets"])]
        elif kind == 5:
            header[name] = rng.choice(JUNK)
        elif kind == 6:
            header[name + rng.choice(["x", ".bias", ""])] = dict(entry)  # a second name for the same bytes
        elif kind == 7:
            header["__metadata__"] = rng.choice([{"format": "pt"}, {"x": "y" * 100}, [], "oops", None])
        else:
            header[name] = dict(entry, extra=rng.choice(JUNK))
    return header


def write_st(path, header_text: bytes, data: bytes, hlen: int | None = None):
    path.write_bytes(struct.pack("<Q", len(header_text) if hlen is None else hlen) + header_text + data)


def test_safetensors_headers_and_truncations(engine, reference, tmp_path):
    folder = tmp_path / NAME
    shutil.copytree(FIXTURES / NAME, folder)
    st = folder / "model.safetensors"
    original = st.read_bytes()
    htext, data = read_st(st)
    rng = random.Random(20261201)
    outcomes = {"refused": 0, "same": 0}
    for case in range(2000):
        mode = case % 4
        if mode == 0:  # structural changes to the JSON
            text = json.dumps(mutate_header(json.loads(htext), rng)).encode()
            text += b" " * (-(8 + len(text)) % 8)
            write_st(st, text, data)
        elif mode == 1:  # bytes of the header text changed
            raw = bytearray(htext)
            for _ in range(rng.randint(1, 4)):
                raw[rng.randrange(len(raw))] = rng.choice(b'{}[]",:0123456789 eE-.xF')
            write_st(st, bytes(raw), data)
        elif mode == 2:  # the header length off by a little or a lot
            write_st(st, htext, data, hlen=max(0, len(htext) + rng.choice([-64, -9, -2, -1, 1, 2, 7, 2**20, 2**62])))
        else:  # the file cut short (or grown)
            cut = rng.choice([rng.randrange(0, 8), rng.randrange(8, 8 + len(htext)), rng.randrange(len(original))])
            st.write_bytes(original[:cut] if rng.random() < 0.9 else original + b"\0" * rng.randint(1, 64))
        got = logits_or_error(engine, folder)
        if isinstance(got, EngineError):
            assert str(st) in str(got) or str(folder) in str(got), f"case {case}: {got} names no file"
            outcomes["refused"] += 1
        else:
            assert np.array_equal(got, reference), f"case {case}: loaded, but the logits differ"
            outcomes["same"] += 1
    st.write_bytes(original)
    assert outcomes["refused"] > 1500, outcomes


CONFIG_BENIGN = [
    "eos_token_id",
    "bos_token_id",
    "transformers_version",
    "use_cache",
    "initializer_range",
    "router_aux_loss_coef",
    "output_router_logits",
    "attention_dropout",
    "model_type",
    "dtype",
    "unused",
]
CONFIG_SEMANTIC = {"rope_theta", "rms_norm_eps", "norm_topk_prob", "max_position_embeddings", "num_experts_per_tok",
                   "tie_word_embeddings"}  # valid other values of these compute another model  # fmt: skip
CONFIG_VALUES = JUNK + [float("inf"), -float("inf"), 1e-300, 1e300, 64, 32, 8, 3, 1000000.0, 1e-5, "silu", "gelu",
                        "Qwen3MoeForCausalLM", ["Qwen3MoeForCausalLM"], {"type": "yarn"}, [1, 1], [7]]  # fmt: skip


def test_configs(engine, reference, tmp_path):
    folder = tmp_path / NAME
    shutil.copytree(FIXTURES / NAME, folder)
    path = folder / "config.json"
    original = json.loads(path.read_text())
    rng = random.Random(7)
    refused = 0
    for case in range(500):
        config = dict(original)
        keys = rng.sample(sorted(original) + CONFIG_BENIGN, rng.randint(1, 3))
        for key in keys:
            if rng.random() < 0.1:
                config.pop(key, None)
            else:
                config[key] = rng.choice(CONFIG_VALUES)
        path.write_text(json.dumps(config))
        got = logits_or_error(engine, folder)
        if isinstance(got, EngineError):
            assert str(path) in str(got) or str(folder) in str(got), f"case {case}: {got} names no file"
            refused += 1
        elif got is None:
            assert "max_position_embeddings" in keys, f"case {case}: {keys}"
        elif set(keys) & CONFIG_SEMANTIC:  # a valid other value may change the numbers, never into nonsense
            assert got.shape == reference.shape and np.isfinite(got).all(), f"case {case}: {keys}"
        else:
            assert np.array_equal(got, reference), f"case {case}: {keys} changed the logits"
    assert refused > 200


PROFILE = (FIXTURES.parent.parent / "profiles" / "split.yaml").read_text()
PROFILE_VALUES = ["0", "-1", "99999999999", "1e309", ".nan", "!!int 'abc'", "*nope", "&a x", "[", "{", "~", "''",
                  "cpu:99", "hostsim:0", "'0-3'", "3-1", "[1, [2, [3]]]", "{a: {b: {c: d}}}", "!!python/object x",
                  str(2**70), "yes", "\"\\x00\"", "|\n  text"]  # fmt: skip


def test_profiles(tmp_path):
    rng = random.Random(11)
    lines = PROFILE.splitlines()
    loaded = 0
    for case in range(500):
        out = list(lines)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(out))
            kind = rng.randrange(4)
            if kind == 0 and ":" in out[i]:  # a value replaced
                key = out[i].split(":", 1)[0]
                out[i] = f"{key}: {rng.choice(PROFILE_VALUES)}"
            elif kind == 1:
                del out[i]
            elif kind == 2:
                out.insert(i, out[rng.randrange(len(out))])  # a line repeated elsewhere
            else:
                s = list(out[i]) or [" "]
                s[rng.randrange(len(s))] = rng.choice("-:[]{}#&*!|>'\"\t 09x")
                out[i] = "".join(s)
        path = tmp_path / f"p{case % 8}.yaml"
        path.write_text("\n".join(out) + "\n")
        try:
            profile = P.load(path)
            profile.to_yaml()  # what a save would write
            loaded += 1
        except EngineError as exc:
            assert str(exc).startswith(f"{path}:"), f"case {case}: {exc!r} does not start with file:line"
            assert str(exc).count(f"{path}:") == 1, f"case {case}: {exc}"
    assert 0 < loaded < 500


def placement_text(rng: random.Random, layers: int, experts: int) -> str:
    def index(n):
        bad = rng.random() < 0.1
        return str(rng.choice([n, n + 1, -1, 2**40, "x", ""]) if bad else rng.randrange(n))

    def span(n):
        a = index(n)
        return a if rng.random() < 0.5 else f"{a}-{index(n)}"

    rules = []
    for _ in range(rng.randint(1, 4)):
        device = rng.choice(["cpu:0", "cpu:1"] * 6 + ["cpu:2", "cuda:0", "cpu", "", "cpu:1\0x"])
        target = rng.choice(["*", span(layers), f"{span(layers)}.{span(experts)}", f"*.{span(experts)}"])
        rules.append(f"{target}={device}" if rng.random() < 0.95 else rng.choice([target, "=", ";;", device]))
    return rng.choice(["; ", ";", " ; "]).join(rules)


def test_placement_texts(engine, reference):
    rng = random.Random(3)
    with engine.load(FIXTURES / NAME) as model, model.context(16) as ctx:
        cfg = model.config
        applied = 0
        for case in range(200):
            text = placement_text(rng, cfg.num_layers, cfg.num_experts)
            before = model.placement.describe()
            try:
                model.set_placement(text)
            except EngineError as exc:
                assert str(exc), f"case {case}: {text!r}"
                assert model.placement.describe() == before, f"case {case}: a refused placement changed it"
                continue
            applied += 1
            ctx.truncate(0)
            assert np.array_equal(ctx.prefill(PROMPT), reference), f"case {case}: {text!r} changed the logits"
        assert 25 < applied < 200  # both kinds exercised (36 of 200 apply with this seed)
    assert math.isfinite(float(reference.sum()))
