"""Closing, re-placing and decoding from two threads at once: a close waits for the call in flight and the call then
finds its handle closed (StateError), a placement waits for the step in flight and, in reference mode, changes no
bit of any step; nothing crashes. 1,000 rounds of each race, on the tiny fixtures."""

import numpy as np
import pytest
from fixture_paths import FIXTURES
from races import close_while_decoding, place_while_decoding, race

from engine.core.errors import StateError
from engine.model import Engine

ROUNDS = 1000
TOKENS = [3, 17, 42, 5, 9, 1, 30, 7]


def test_closing_a_context_while_another_thread_decodes():
    with Engine(cpu_devices=2, cpu_threads=1) as eng:
        model = eng.load(FIXTURES / "qwen3moe-f32")
        model.set_placement("*=cpu:0; 0=cpu:1")  # a peer in the step too
        outcomes = {"finished": 0, "closed": 0}
        for r in range(ROUNDS):
            ctx = model.context(16)

            def decode(ctx=ctx):
                for t in TOKENS:
                    ctx.decode([t])

            err = race(decode, ctx.close, r)
            if err is None:
                outcomes["finished"] += 1
            else:
                assert isinstance(err, StateError) and "this Context is closed" in str(err), repr(err)
                outcomes["closed"] += 1
            assert ctx.closed
        assert sum(outcomes.values()) == ROUNDS
        assert model.context(4).decode([1]).shape == (1, model.config.vocab_size)  # the model still works


def test_placing_experts_while_another_thread_decodes_changes_no_bit():
    with Engine(cpu_devices=2, cpu_threads=1) as eng:
        model = eng.load(FIXTURES / "qwen3moe-f32")
        with model.context(len(TOKENS)) as ctx:
            expected = np.concatenate([ctx.decode([t]) for t in TOKENS])
        placements = ["*=cpu:0", "*=cpu:1", "*=cpu:0; 0=cpu:1; 2.3-5=cpu:1"]
        with model.context(len(TOKENS)) as ctx:
            place_while_decoding(model, ctx, TOKENS, placements, expected, ROUNDS // 10, 10)


def test_closing_a_model_or_its_engine_while_another_thread_decodes():
    def open_model():
        eng = Engine(cpu_devices=1, cpu_threads=1)
        return eng, eng.load(FIXTURES / "qwen3-f32")

    close_while_decoding(open_model, TOKENS, ROUNDS // 10)


def test_closing_the_engine_while_another_thread_loads():
    for r in range(50):
        eng = Engine(cpu_devices=1, cpu_threads=1)
        loaded = []
        err = race(lambda eng=eng, loaded=loaded: loaded.append(eng.load(FIXTURES / "qwen3-f32")), eng.close, r)
        # the load finished first (its model is then closed with the engine) or found the engine closed
        assert (err is None and loaded and loaded[0].closed) or isinstance(err, StateError), repr(err)
        with pytest.raises(StateError, match="this Engine is closed"):
            eng.load(FIXTURES / "qwen3-f32")
