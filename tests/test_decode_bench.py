"""bench/decode.py's paired rounds: each decode between two sustained samples of the ceiling, compared with the
higher of them; steady pairs grouped by the machine's state (the core-to-core round trip)."""

import sys
from pathlib import Path

import pytest

from engine.checkpoints.demo import DEMO_PROMPTS
from engine.model import Engine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from decode import by_state, paired  # noqa: E402


class Samples:
    """Stands in for readpass: answers each request with the next of fixed reads (STREAM's at half of them and a
    round trip of 100 ns per request so far), keeping the requests."""

    def __init__(self, reads):
        self.reads, self.requests = list(reads), []

    def read(self, nbytes):
        self.requests.append(nbytes)
        gbs = self.reads.pop(0)
        return {"read": gbs, "stream": gbs / 2, "round_trip_ns": 100.0 * len(self.requests)}


def test_each_decode_is_compared_with_the_higher_sample_beside_it(fixtures):
    samples = Samples([10.0, 40.0, 20.0, 5.0])
    with Engine(cpu_threads=1) as eng:
        model = eng.load(fixtures / "qwen3moe-bf16", weights="map")
        out = paired(model, model.encode(DEMO_PROMPTS[0]), tokens=3, pairs=3, reader=samples)
        per_token = model.info["bytes_per_token"]
    assert samples.requests == [3 * per_token] * 4  # sample, decode, sample, decode, sample, decode, sample
    assert out["read_gbs"] == [10.0, 40.0, 20.0, 5.0] and out["stream_gbs"] == [5.0, 20.0, 10.0, 2.5]
    assert out["round_trip_ns"] == [100.0, 200.0, 300.0, 400.0]
    d = out["decode_gbs"]
    assert len(d) == 3 and all(v > 0 for v in d)
    assert out["fractions"] == [d[0] / 40.0, d[1] / 40.0, d[2] / 20.0]
    assert out["stream_fractions"] == [d[0] / 20.0, d[1] / 20.0, d[2] / 10.0]


def pairs(reads, trips, decodes):
    """A round as paired() returns it (STREAM's bandwidth at 0.9 of each read)."""
    fractions = [d / max(a, b) for d, a, b in zip(decodes, reads, reads[1:], strict=False)]
    stream = [0.9 * r for r in reads]
    return {"read_gbs": reads, "stream_gbs": stream, "round_trip_ns": trips, "decode_gbs": decodes,
            "fractions": fractions, "stream_fractions": [f / 0.9 for f in fractions]}  # fmt: skip


def test_steady_pairs_are_grouped_by_the_round_trip():
    slow = pairs([50.0, 50.0, 52.0, 80.0, 81.0], [50.0, 48.0, 52.0, 400.0, 410.0], [45.0, 44.0, 60.0, 64.0])
    fast = pairs([82.0, 80.0, 84.0], [390.0, 420.0, 380.0], [66.0, 68.0])
    groups = by_state([slow, fast])
    assert [g["pairs"] for g in groups] == [2, 3]  # the pair across the change of state (52 -> 80 GB/s) is left out
    low, high = groups
    assert low["round_trip_ns"][0] == 49.0 and low["round_trip_ns"][2] == 50.0
    assert low["fraction"] == [pytest.approx(44 / 52), pytest.approx((45 / 50 + 44 / 52) / 2), pytest.approx(45 / 50)]
    assert high["read_gbs"] == [81.0, 82.0, 84.0]
    assert high["fraction"][0] == pytest.approx(64 / 81) and high["fraction"][2] == pytest.approx(68 / 84)
    assert high["stream_fraction"][1] == pytest.approx(66 / 82 / 0.9)
    one_state = by_state([pairs([50.0, 51.0, 50.0], [45.0, 60.0, 50.0], [40.0, 41.0])])
    assert len(one_state) == 1 and one_state[0]["pairs"] == 2  # round trips within 3x: one group
    assert by_state([pairs([50.0, 80.0], [50.0, 400.0], [45.0])]) == []  # no steady pair
    flipped = pairs([80.0, 81.0], [400.0, 400.0], [64.0])
    flipped["stream_gbs"] = [75.0, 45.0]  # the state changed between the read and STREAM's passes of one sample
    assert by_state([flipped]) == []
