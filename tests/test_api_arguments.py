"""Arguments a script can get wrong: each a clear EngineError naming the value, never a Python error from cffi
(OverflowError, AttributeError, TypeError) and never a name cut short at a NUL."""

import pytest
from fixture_paths import FIXTURES

from engine.errors import ArgumentError, EngineError, RangeError
from engine.model import Engine


@pytest.fixture(scope="module")
def model():
    with Engine(cpu_devices=1, cpu_threads=1) as eng, eng.load(FIXTURES / "qwen3moe-f32") as m:
        yield m


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"cpu_devices": -1}, "cpu_devices = -1"), ({"cpu_threads": -3}, "cpu_threads = -3"),
     ({"cpu_devices": 2**40}, "cpu_devices = 1099511627776"), ({"cpu_threads": 1.5}, "cpu_threads = 1.5"),
     ({"runtime_options": {"cpu": {"memory_limit": -1}}}, "memory_limit = -1"),
     ({"runtime_options": {"cpu": {"n_devices": 2**31}}}, "n_devices = 2147483648"),
     ({"runtimes": ("cpu\0x",)}, "contains a NUL"), ({"runtimes": (None,)}, "runtime name must be a name")],
)  # fmt: skip
def test_engine_options_out_of_range(kwargs, message):
    with pytest.raises(ArgumentError, match=message + r".*"):
        Engine(**kwargs)


def test_device_names_that_are_not_text_or_hold_a_nul(model):
    eng = model.engine
    with pytest.raises(ArgumentError, match="device must be a name"):
        eng.load(FIXTURES / "qwen3-f32", device=None)
    with pytest.raises(ArgumentError, match="contains a NUL"):
        eng.device_index("cpu:0\0junk")  # would have found cpu:0
    with pytest.raises(ArgumentError, match="placement must be a Placement or its text form"):
        model.set_placement(None)
    with pytest.raises(ArgumentError, match="placement must be a Placement"):
        model.placement_bytes(42)


def test_counts_beyond_the_cache_are_refused_before_anything_is_allocated(model):
    with model.context(16) as ctx:
        ctx.prefill([1, 2, 3])
        for n in (2**40, 2**31, 15):
            with pytest.raises(RangeError, match=f"{n} tokens to choose need {n - 1} more positions.*has 13 left"):
                ctx.greedy(1, n)
        assert len(ctx.greedy(1, 14)) == 14  # exactly what fits
        with pytest.raises(RangeError, match="more than the KV cache"):
            ctx.generate([1], 2**40)


def test_decode_text_of_ids_out_of_range(model):
    for ids, message in (([1, 2**40], "does not fit in int32"), ([1, -1], "token id -1 out of range"),
                         ([model.config.vocab_size], "out of range: expected 0..")):  # fmt: skip
        with pytest.raises(EngineError, match=message):
            model.decode_text(ids)
    assert model.decode_text([]) == ""
    assert isinstance(model.decode_text([1, 2, 3]), str)
