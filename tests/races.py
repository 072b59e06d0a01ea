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
