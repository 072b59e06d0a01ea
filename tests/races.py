"""Two calls racing: one on a thread, the other here after a seeded number of yields (the concurrency tests')."""

import random
import threading


def race(first, second, seed: int):
    """Run first() on a thread and second() here after a seeded number of yields; returns first's error, if any."""
    errors: list[BaseException] = []

    def run():
        try:
            first()
        except BaseException as exc:  # handed to the caller
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    for _ in range(random.Random(seed).randrange(4)):
        threading.Event().wait(0)  # give the other thread a chance to be anywhere in its call
    second()
    t.join()
    return errors[0] if errors else None


def place_while_decoding(model, ctx, tokens, placements, expected, rounds: int, per_round: int) -> None:
    """Rounds of ctx decoding `tokens` from position 0 on a thread while here `per_round` placements (taken in turn
    from `placements`) are set on model: no error, and every round's logits equal to `expected`."""
    import numpy as np

    for r in range(rounds):
        got = []

        def decode(got=got):
            ctx.truncate(0)
            for t in tokens:
                got.append(ctx.decode([t]))

        def place(r=r):
            for k in range(per_round):
                model.set_placement(placements[(r + k) % len(placements)])

        assert race(decode, place, r) is None
        assert np.array_equal(np.concatenate(got), expected), f"round {r}"


def close_while_decoding(open_model, tokens, rounds: int) -> None:
    """Rounds of a fresh engine and model (open_model() -> (engine, model)) decoding `tokens` on a thread while here
    the model or (every other round) the engine is closed: the decode finishes or finds its handle closed
    (StateError), and both end closed."""
    from engine.core.errors import StateError

    for r in range(rounds):
        eng, model = open_model()
        ctx = model.context(16)

        def decode(ctx=ctx):
            for t in tokens:
                ctx.decode([t])

        err = race(decode, model.close if r % 2 else eng.close, r)
        assert err is None or isinstance(err, StateError), repr(err)
        assert ctx.closed and model.closed
        eng.close()
