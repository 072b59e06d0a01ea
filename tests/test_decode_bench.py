"""bench/decode.py's paired rounds: each decode between two sustained reads, compared with the higher of them."""

import sys
from pathlib import Path

from engine.demo import DEMO_PROMPTS
from engine.model import Engine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from decode import paired  # noqa: E402


class Reads:
    """Stands in for readpass: answers each request with the next of a fixed list of GB/s, keeping the requests."""

    def __init__(self, answers):
        self.answers, self.requests = list(answers), []

    def read(self, nbytes):
        self.requests.append(nbytes)
        return self.answers.pop(0), 100.0 * len(self.requests)


def test_each_decode_is_compared_with_the_higher_read_beside_it(fixtures):
    reads = Reads([10.0, 40.0, 20.0, 5.0])
    with Engine(cpu_threads=1) as eng:
        model = eng.load(fixtures / "qwen3moe-bf16", weights="map")
        out = paired(model, model.encode(DEMO_PROMPTS[0]), tokens=3, pairs=3, reader=reads)
        per_token = model.info["bytes_per_token"]
    assert reads.requests == [3 * per_token] * 4  # read, decode, read, decode, read, decode, read
    assert out["read_gbs"] == [10.0, 40.0, 20.0, 5.0] and len(out["decode_gbs"]) == 3
    assert out["round_trip_ns"] == [100.0, 200.0, 300.0, 400.0]
    assert all(d > 0 for d in out["decode_gbs"])
    d = out["decode_gbs"]
    assert out["fractions"] == [d[0] / 40.0, d[1] / 40.0, d[2] / 20.0]
