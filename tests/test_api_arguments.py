"""Arguments a script can get wrong: each a clear EngineError naming the value, never a Python error from cffi
(OverflowError, AttributeError, TypeError) and never a name cut short at a NUL."""

import re

import pytest
from fixture_paths import FIXTURES

import engine.model
from engine.core.errors import ArgumentError, EngineError, OutOfMemoryError, RangeError
from engine.core.native import ffi, lib
from engine.model import MAX_TRACE_SPANS, Engine
from engine.runs.run import DecodeRun


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


def still_decodes(ctx) -> None:
    """The context takes the next call as if the bad one had not been made."""
    before = ctx.position
    assert ctx.decode([1]).shape == (1, ctx.vocab_size)
    assert ctx.position == before + 1


@pytest.mark.parametrize("first", [2**31, -(2**31) - 1, 2**70])
def test_a_first_token_past_int32_is_a_range_error(model, first):
    with model.context(16) as ctx:
        with pytest.raises(RangeError, match=f"first token id {first} out of range: .* 0..511"):
            ctx.greedy(first, 2)
        assert ctx.position == 0
        assert len(ctx.greedy(1, 3)) == 3


@pytest.mark.parametrize("stop_ids", [5, None, 1.5, "12", b"\x01\x02", [1, "2"], [[1]]])
def test_stop_ids_that_are_not_a_list_of_ids(model, stop_ids):
    with model.context(16) as ctx:
        with pytest.raises(ArgumentError, match=r"stop ids must be integers, got .* \(stop_ids: expected a list of"):
            ctx.greedy(1, 2, stop_ids)
        with pytest.raises(ArgumentError, match=r"stop ids must be integers, got .* \(stop_ids: expected a list of"):
            ctx.generate([1, 2], 2, stop_ids)
        assert ctx.position == 0  # refused before the prompt was appended
        assert len(ctx.generate([1, 2], 2, stop_ids=(7, 2**40)).ids) >= 1  # any iterable of ids; unknown ids unused


@pytest.mark.parametrize("weights", [["map"], {"map": 1}, None, 1])
def test_a_weights_mode_that_is_not_a_name(model, weights):
    with pytest.raises(ArgumentError, match=r"weights .*: expected one of auto, map, copy"):
        model.engine.load(FIXTURES / "qwen3-f32", weights=weights)


@pytest.mark.parametrize("source", [None, 5, ["x"], b"folder"])
def test_a_model_that_is_not_a_path(model, source):
    with pytest.raises(ArgumentError, match=r"model must be the path of a model folder or GGUF file"):
        model.engine.load(source)


@pytest.mark.parametrize("setting", ["mode", "precision"])
@pytest.mark.parametrize("value", [["reference"], {"f32": 1}, None])
def test_context_settings_that_are_not_names(model, setting, value):
    with model.context(16) as ctx:
        before = getattr(ctx, setting)
        with pytest.raises(ArgumentError, match=re.escape(repr(value))):
            setattr(ctx, setting, value)
        assert getattr(ctx, setting) == before
        still_decodes(ctx)


@pytest.mark.parametrize("on_event", [5, "print", [print]])
def test_an_on_event_that_is_not_callable(model, on_event):
    with pytest.raises(ArgumentError, match=r"on_event .*: expected a function taking a StepEvent, or None"):
        DecodeRun(model, prompts=[[1, 2]], tokens_per_prompt=2, on_event=on_event)
    events = []
    DecodeRun(model, prompts=[[1, 2]], tokens_per_prompt=2, on_event=events.append).run()
    assert events


@pytest.mark.parametrize("text", ["a\ud800b", "\udcff", "tail \udfff"])
def test_a_lone_surrogate_is_refused_naming_the_prompt(model, text):
    """A lone surrogate (what a non-UTF-8 byte of a command line becomes in Python) is no text the tokenizer
    takes: ArgumentError naming the prompt, not tokenizers' TypeError."""
    with pytest.raises(ArgumentError, match=r"text to encode .* is not valid Unicode text: .* is a lone surrogate"):
        model.encode(text)
    with pytest.raises(ArgumentError, match=r"prompt 1 .* is not valid Unicode text: .* at index \d+ is a lone"):
        DecodeRun(model, prompts=["fine", text], tokens_per_prompt=2)
    with pytest.raises(ArgumentError, match=r"text to encode must be text \(str\), got bytes"):
        model.encode(b"bytes")
    assert model.encode("the quick brown fox")


def test_a_device_name_with_a_lone_surrogate(model):
    with pytest.raises(ArgumentError, match=r"device 'cpu:0\\ud800' is not valid Unicode text"):
        model.engine.device_index("cpu:0\ud800")
    with pytest.raises(ArgumentError, match=r"runtime name .* is not valid Unicode text"):
        model.engine.load_runtime("cpu\udcff")
    assert model.engine.device_index("cpu:0") == 0


# ---- the per-token trace's capacity ----------------------------------------------------------------------


def core_spans(ctx) -> int:
    """The spans the core holds for the context, read past the context's own buffer."""
    room = 1 << 16
    buf, n, lost = ffi.new("eb_trace_span[]", room), ffi.new("int64_t *"), ffi.new("int64_t *")
    assert lib.eb_context_read_trace(ctx._ptr, buf, room, n, lost) == 0
    return n[0] + lost[0]


@pytest.mark.parametrize("capacity", [MAX_TRACE_SPANS + 1, 2**26])
def test_a_trace_capacity_past_the_bound_is_refused_before_anything_is_allocated(model, capacity):
    with model.context(16) as ctx:
        ctx.trace = 8
        with pytest.raises(RangeError, match=rf"trace capacity {capacity}: expected 0 \(off\) .. {MAX_TRACE_SPANS} "
                                             r"spans \(at most \d+ MiB"):  # fmt: skip
            ctx.trace = capacity
        assert ctx.trace == 8
        still_decodes(ctx)
        assert 0 < len(ctx.trace_spans()) <= 8


class _NoTraceBuffer:
    """engine.model's ffi, but without memory for a trace read buffer."""

    def __init__(self, real):
        self._real = real

    def new(self, ctype, *args):
        if ctype == "eb_trace_span[]":
            raise MemoryError
        return self._real.new(ctype, *args)

    def __getattr__(self, name):
        return getattr(self._real, name)


@pytest.mark.parametrize("before", [0, 4])
def test_a_trace_without_memory_leaves_the_context_tracing_as_before(model, monkeypatch, before):
    with model.context(16) as ctx:
        ctx.trace = before
        with monkeypatch.context() as patch:
            patch.setattr(engine.model, "ffi", _NoTraceBuffer(ffi))
            with pytest.raises(OutOfMemoryError, match=f"out of memory for a trace of 1000 spans: tracing left at "
                                                       f"{before or 'off'}"):  # fmt: skip
                ctx.trace = 1000
        assert ctx.trace == before
        ctx.prefill([1, 2, 3])
        still_decodes(ctx)
        if before == 0:
            assert core_spans(ctx) == 0  # the core is not tracing either
        else:
            spans = ctx.trace_spans()
            assert len(spans) == before and ctx.trace_lost > 0  # the core still has room for 4, not 1000
        ctx.trace = 1000  # and the context takes a capacity once there is memory for it
        still_decodes(ctx)
        assert ctx.trace_spans()
