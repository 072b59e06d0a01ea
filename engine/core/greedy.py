"""Choosing a token from logits in Python: the greedy choice, which refuses a row that is not numbers."""

from __future__ import annotations

import numpy as np

from .errors import NumericError


def greedy_choice(logits: np.ndarray, step: int, position: int, what: str = "the logits"):
    """The greedy choice of a logits row (np.argmax's: the lowest id of a tie), or of each row of a 2-D array (a list;
    row i is step + i, at position + i). A row holding NaN or inf is a NumericError naming its step, its position and
    the first bad token id: never a token chosen from it (np.argmax would choose the first NaN's id)."""
    rows = np.atleast_2d(logits)
    finite = np.isfinite(rows)
    if not finite.all():
        r, bad = (int(i) for i in np.argwhere(~finite)[0])
        value = rows[r, bad]
        kind = "NaN" if np.isnan(value) else "inf" if value > 0 else "-inf"
        raise NumericError(f"step {step + r} (position {position + r}): {what} hold {kind} at token id {bad}: the "
                           "model's numbers overflowed or a weight is damaged")  # fmt: skip
    ids = rows.argmax(axis=1).tolist()
    return ids[0] if np.ndim(logits) == 1 else ids
