"""Seeded fuzzing of GGUF headers: bytes flipped, overwritten, cut, inserted and deleted in the header region of a
small valid file (the qwen3moe-f32 fixture converted), its structural fields (lengths, counts, type codes,
dimensions, offsets) and its 4-byte configuration values (block_count, head counts, sizes, rope base ...) set to edge
values. Every case either reads, or fails with a CheckpointError /
UnsupportedError naming the file; a file that reads is loaded into the core and run (the core's own checks may
refuse it with an EngineError), so that the native code meets whatever got past the reader. Nothing else may be
raised, and nothing may hang (a watchdog turns a case that does not finish into a failure with its number).
"""

from __future__ import annotations

import random
import signal
import struct

import pytest
from fixture_paths import FIXTURES
from gguf_models import Layout, to_gguf

from engine.checkpoints.checkpoint import Checkpoint
from engine.core.errors import CheckpointError, EngineError, UnsupportedError
from engine.model import Engine

CASES = 2000
PROMPT = [5, 17, 3, 44]
EDGES8 = [0, 1, 2, 3, 4, 5, 31, 32, 33, 255, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63,
          2**64 - 1]  # fmt: skip
EDGES4 = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 30, 39, 40, 99, 2**16, 2**31, 2**32 - 1]


@pytest.fixture(scope="module")
def engine():
    with Engine(cpu_devices=1, cpu_threads=1) as eng:
        yield eng


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    path = to_gguf(FIXTURES / "qwen3moe-f32", tmp_path_factory.mktemp("fuzz-base") / "base.gguf")[0]
    return path.read_bytes()


def fields(layout: Layout) -> list[tuple[int, int]]:
    """(position, width) of every length, count, type code, dimension and offset in the header."""
    out = [(8, 8), (16, 8)]
    for start, vpos, _end in layout.kv.values():
        out += [(start, 8), (vpos, 4), (vpos + 4, 8), (vpos + 8, 8)]
    for t in layout.tensors.values():
        out += [(t["start"], 8), (t["n_dims"], 4), (t["type"], 4), (t["offset"], 8)]
        out += [(d, 8) for d in range(t["dims"], t["type"], 8)]
    return out


def mutate(raw: bytes, layout: Layout, rng: random.Random) -> bytes:
    data = bytearray(raw)
    header = layout.header_end
    kind = rng.randrange(7)
    if kind == 6:  # a scalar of the configuration (a count, a size, a float) set to another value
        scalars = [(k, vpos) for k, (_s, vpos, end) in layout.kv.items() if end - vpos == 8]
        key, vpos = rng.choice(scalars)
        (vtype,) = struct.unpack_from("<I", data, vpos)
        value = rng.choice([0, 1, 2, 3, 7, 8, 9, 16, 31, 32, 33, 64, 255, 511, 512, 513, 2**20, 2**31, 2**32 - 1])
        packed = struct.pack("<f", rng.choice([0.0, -1.0, 1e-30, 0.5, 1.0, 1e6, 1e13, float("inf"), float("nan")]))
        data[vpos + 4 : vpos + 8] = packed if vtype == 6 else value.to_bytes(4, "little")
    elif kind == 0:  # a structural field set to an edge value (or nudged)
        for _ in range(rng.randint(1, 2)):
            pos, width = rng.choice(fields(layout))
            old = int.from_bytes(data[pos : pos + width], "little")
            value = rng.choice(EDGES8 if width == 8 else EDGES4 + [old + 1, max(0, old - 1)])
            data[pos : pos + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
    elif kind == 1:  # bits flipped
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(header)] ^= 1 << rng.randrange(8)
    elif kind == 2:  # bytes overwritten
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(header)] = rng.choice([0, 0xFF, 0x7F, 0x80, ord("G"), rng.randrange(256)])
    elif kind == 3:  # cut short, in the header or the data
        return bytes(data[: rng.choice([rng.randrange(header), rng.randrange(len(data))])])
    elif kind == 4:  # bytes inserted
        pos = rng.randrange(header)
        data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    else:  # bytes deleted
        pos = rng.randrange(header)
        del data[pos : pos + rng.randint(1, 16)]
    return bytes(data)


class Hung(Exception):
    pass


def _alarm(_signum, _frame):
    raise Hung


def outcome(engine, path):
    """'read' and the logits (or the core's EngineError), or the reader's error."""
    try:
        ck = Checkpoint.open(path)
    except (CheckpointError, UnsupportedError) as exc:
        assert str(path) in str(exc), f"the message names no file: {exc}"
        return "refused"
    if ck.tokenizer is not None:
        ck.tokenizer.encode("fuzzed <|endoftext|> text 123")
    try:
        model = engine.load(ck, weights="map")
    except EngineError:
        return "core refused"
    with model, model.context(min(16, model.config.max_position_embeddings)) as ctx:
        if ctx.capacity >= len(PROMPT) and max(PROMPT) < model.config.vocab_size:
            assert ctx.prefill(PROMPT).shape == (len(PROMPT), model.config.vocab_size)
    return "ran"


def test_mutated_gguf_headers(engine, original, tmp_path):
    layout = Layout(original)
    path = tmp_path / "fuzzed.gguf"
    rng = random.Random(20261202)
    counts = {"refused": 0, "core refused": 0, "ran": 0}
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for case in range(CASES):
            path.write_bytes(mutate(original, layout, rng))
            signal.alarm(60)  # a watchdog, not a measurement: a case takes milliseconds
            try:
                counts[outcome(engine, path)] += 1
            except Hung:
                pytest.fail(f"case {case} did not finish")
            except Exception as exc:
                raise AssertionError(f"case {case}: {type(exc).__name__}: {exc}") from exc
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert counts["refused"] > CASES // 2, counts
    assert counts["ran"] > 0, counts


def test_the_unmutated_file_runs(engine, original, tmp_path):
    path = tmp_path / "base.gguf"
    path.write_bytes(original)
    assert outcome(engine, path) == "ran"
