"""Greedy speculative decoding: a draft model proposes q tokens, the target verifies them in one batched pass.

The target checks q+1 positions (the last accepted token plus the q proposals) in one `Context.decode` call,
which returns every position's logits. Acceptance is greedy: a proposal is kept while it equals the target's
own argmax, and the target's argmax at the first mismatch (or after the last proposal) is emitted as well.
The emitted ids are therefore exactly what target-only greedy decoding produces, for every q.

Bookkeeping: `ids` is the whole sequence (prompt and generated tokens). The target's KV cache always holds
ids[:-1]: the last token is the one the next step feeds. The draft's cache holds a prefix ids[:draft.position];
on rejection it is truncated back, and after a full acceptance it lags by the last proposal, which the next
step feeds together with the newest token (one call, no separate re-feed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import ArgumentError, RangeError
from ..core.greedy import greedy_choice
from ..model import Context, Model, _ids_array

MAX_DRAFT_TOKENS = 8


@dataclass(slots=True)
class Step:
    """What one decode step produced: the emitted ids, how many were proposed and how many of those held, and what."""

    tokens: list[int]
    drafted: int
    accepted: int
    proposals: tuple[int, ...] = ()  # the draft's proposed tokens, in order


def check_draft_q(q) -> int:
    if not isinstance(q, int) or isinstance(q, bool) or not 1 <= q <= MAX_DRAFT_TOKENS:
        raise RangeError(f"draft length q = {q!r} out of range: expected an integer 1..{MAX_DRAFT_TOKENS}")
    return q


def check_shared_vocabulary(target: Model, draft: Model) -> None:
    """A draft is only usable when its token ids mean the same as the target's: same vocab_size, same tokens."""
    t_size, d_size = target.config.vocab_size, draft.config.vocab_size
    if t_size != d_size:
        raise ArgumentError(
            f"draft '{draft.checkpoint.folder}' has vocab_size {d_size}, the target '{target.checkpoint.folder}' "
            f"has {t_size}: a draft must share the target's vocabulary"
        )
    # Without a tokenizer on one side only the size can be compared; ids are then taken at their word. The
    # checkpoints read and digest their vocabularies once, so checking again (each run does) costs nothing.
    t_digest, d_digest = target.checkpoint.vocabulary_digest, draft.checkpoint.vocabulary_digest
    if t_digest is None or d_digest is None or t_digest == d_digest:
        return
    t_vocab, d_vocab = target.checkpoint.vocabulary, draft.checkpoint.vocabulary
    if t_vocab != d_vocab:
        differ = sorted(tok for tok in t_vocab.keys() | d_vocab.keys() if t_vocab.get(tok) != d_vocab.get(tok))
        tok = differ[0]
        raise ArgumentError(
            f"draft '{draft.checkpoint.folder}' and target '{target.checkpoint.folder}' have different tokenizers "
            f"({len(differ)} of {len(t_vocab)} tokens differ, e.g. {tok!r}: id {t_vocab.get(tok)} in the target, "
            f"{d_vocab.get(tok)} in the draft): a draft must share the target's vocabulary"
        )


class GreedyDecoder:
    """Target-only greedy decoding, one token per step: the baseline a speculative run must reproduce."""

    def __init__(self, target: Context):
        self.target = target
        self.ids: list[int] = []
        self.n_prompt = 0
        self.n_context = 0  # the context begin() prefilled, which the next start() continues after

    @property
    def steps(self) -> int:
        """Tokens generated so far: the step of the next one (the first is step 0)."""
        return len(self.ids) - self.n_prompt

    def begin(self, context_ids) -> None:
        """Prefill context_ids from position 0 and choose nothing: the next start() prefills its prompt after them
        (a run at a depth: what it measures comes after this)."""
        context = _ids_array(context_ids) if len(context_ids) else None
        self.target.truncate(0)
        self.ids, self.n_context = ([] if context is None else context.tolist()), len(context_ids)
        if context is not None:
            self._target_prefill(context)

    def start(self, prompt_ids) -> int:
        """Prefill the prompt after the context begin() prefilled (from position 0 without one); returns the first
        generated token. The context holds until the next begin()."""
        prompt = _ids_array(prompt_ids)
        self.target.truncate(self.n_context)
        self.ids = self.ids[: self.n_context] + prompt.tolist()
        self.n_prompt = len(self.ids)
        first = greedy_choice(self._target_prefill(prompt), 0, self.n_prompt - 1)
        self.ids.append(first)
        return first

    def _target_prefill(self, ids) -> np.ndarray:
        """Append ids to the target; the last position's logits."""
        return self.target.prefill(ids, all_rows=False)

    def _verify(self, proposals: list[int], rows: np.ndarray, base: int) -> int:
        """The target's rows of the newest token and the proposals (from position base): the proposals that equal its
        argmax are kept, then its own choice after them; the target's cache cut after the last kept position, the
        emitted tokens appended to ids. Returns how many proposals held."""
        q = len(proposals)
        predicted = np.argmax(rows, axis=1)
        accepted = 0
        while accepted < q and int(predicted[accepted]) == proposals[accepted]:
            accepted += 1
        greedy_choice(rows[: accepted + 1], self.steps, base)  # the rows the emitted tokens come from hold numbers
        if accepted < q:
            self.target.truncate(base + 1 + accepted)
        self.ids.extend(proposals[:accepted] + [int(predicted[accepted])])
        return accepted

    def step(self, max_tokens: int) -> Step:
        row = self.target.decode(self.ids[-1:])[0]
        token = greedy_choice(row, self.steps, self.target.position - 1)
        self.ids.append(token)
        return Step([token], 0, 0)


class SpeculativeDecoder(GreedyDecoder):
    """Greedy speculative decoding of one sequence over a target and a draft context."""

    def __init__(self, target: Context, draft: Context, q: int):
        super().__init__(target)
        check_shared_vocabulary(target.model, draft.model)
        self.draft = draft
        self.q = check_draft_q(q)

    def begin(self, context_ids) -> None:
        super().begin(context_ids)
        self.draft.truncate(0)
        if self.n_context:
            self.draft.prefill(self.ids, all_rows=False)

    def start(self, prompt_ids) -> int:
        first = super().start(prompt_ids)
        self.draft.truncate(self.n_context)
        self.draft.prefill(self.ids[self.n_context : -1], all_rows=False)
        return first

    def step(self, max_tokens: int) -> Step:
        """One draft-and-verify round; emits 1..min(q + 1, max_tokens) tokens."""
        ids, target, draft = self.ids, self.target, self.draft
        # Proposing more than max_tokens - 1 would only verify tokens that are never emitted.
        q = min(self.q, max_tokens - 1)
        proposals: list[int] = []
        if q > 0:
            # Catch the draft up (the newest token, plus the last proposal after a full acceptance), then propose.
            row = draft.decode(ids[draft.position :])[-1]
            while True:
                step = self.steps + len(proposals)
                proposals.append(greedy_choice(row, step, draft.position - 1, "the draft's logits"))
                if len(proposals) == q:
                    break
                row = draft.decode(proposals[-1:])[0]
        base, before = target.position, len(ids)
        accepted = self._verify(proposals, target.decode(ids[-1:] + proposals), base)
        if draft.position > len(ids) - 1:
            draft.truncate(len(ids) - 1)
        return Step(ids[before:], q, accepted, tuple(proposals))


class NextTokenDecoder(GreedyDecoder):
    """Greedy speculative decoding with the target's own multi-token-prediction module as the draft (Checkpoint.
    next_token_module): the module's position j reads token ids[j + 1] and the target's hidden state at j (after its
    final norm) and predicts ids[j + 2]; a chained proposal reads the module's own state instead of the target's.

    Bookkeeping: the target's verification gives the hidden states of the positions it keeps (no second pass); they
    wait in `_hidden` until the module has read them. The module's cache holds the positions whose inputs were the
    target's states; the chained positions of a step are cut after verification and read again from the target's
    states in the next step's one call, together with that step's first proposal."""

    def __init__(self, target: Context, module: Context, q: int):
        super().__init__(target)
        if not module.model.config.next_token_module:
            raise ArgumentError(f"'{module.model.checkpoint.folder}' is a model, not a multi-token-prediction module: "
                                "use SpeculativeDecoder for a draft model")  # fmt: skip
        check_shared_vocabulary(target.model, module.model)
        width, target_width = module.model.config.hidden_size, target.model.config.hidden_size
        if width != target_width:
            raise ArgumentError(f"the module's hidden_size {width} is not the target's {target_width}: a module reads "
                                "its own target's states")  # fmt: skip
        self.draft = module
        self.q = check_draft_q(q)
        self._hidden = np.zeros((0, target.model.config.hidden_size), dtype=np.float32)
        self._hidden_at = 0  # the position of _hidden's first row
        self._context_last = self._hidden  # the target's state at the context's last position (begin)

    def _keep(self, at: int, rows: np.ndarray) -> None:
        """The target's states of positions at.. (replacing any kept from at on); those the module has read go."""
        keep_from = min(self.draft.position, at)
        if keep_from < self._hidden_at:
            self._hidden, self._hidden_at = rows, at
            return
        old = self._hidden[keep_from - self._hidden_at : max(0, at - self._hidden_at)]
        self._hidden, self._hidden_at = np.concatenate([old, rows]), keep_from

    def _target_prefill(self, ids) -> np.ndarray:
        at = self.target.position
        logits, hidden = self.target.eval_hidden(ids, all_rows=False)
        self._keep(at, hidden)
        return logits

    def _catch_up(self) -> tuple[np.ndarray, np.ndarray]:
        """Feed the module every position it has not read, up to the newest token's (ids[-1] with the target's state
        before it); the last position's logits and the module's state there."""
        lo, hi = self.draft.position, len(self.ids) - 1
        rows = self._hidden[lo - self._hidden_at : hi - self._hidden_at]
        logits, state = self.draft.eval_hidden(self.ids[lo + 1 : hi + 1], all_rows=False, hidden_in=rows)
        return logits, state[-1:]

    def begin(self, context_ids) -> None:
        self.draft.truncate(0)
        self._hidden, self._hidden_at = self._hidden[:0], 0
        super().begin(context_ids)
        if self.n_context > 1:  # the module reads the context's pairs now; its last state waits for each prompt
            self.draft.eval_hidden(self.ids[1 : self.n_context], all_rows=False,
                                   hidden_in=self._hidden[: self.n_context - 1], hidden_out=False)  # fmt: skip
        self._context_last = self._hidden[self.n_context - 1 :].copy()  # (not a view keeping the context's states)

    def start(self, prompt_ids) -> int:
        self.draft.truncate(max(0, self.n_context - 1))
        self._hidden, self._hidden_at = self._context_last, max(0, self.n_context - 1)
        return super().start(prompt_ids)

    def step(self, max_tokens: int) -> Step:
        """One draft-and-verify round; emits 1..min(q + 1, max_tokens) tokens."""
        ids, target, draft = self.ids, self.target, self.draft
        q = min(self.q, max_tokens - 1)
        proposals: list[int] = []
        if q > 0:
            row, state = self._catch_up()
            while True:
                step = self.steps + len(proposals)
                proposals.append(greedy_choice(row, step, draft.position - 1, "the draft's logits"))
                if len(proposals) == q:
                    break
                rows, state = draft.eval_hidden(proposals[-1:], all_rows=True, hidden_in=state)
                row = rows[0]
        base, before = target.position, len(ids)
        rows, hidden = target.eval_hidden(ids[-1:] + proposals, all_rows=True)
        accepted = self._verify(proposals, rows, base)
        if draft.position > base:  # the chained positions read the module's own states: read again next step
            draft.truncate(base)
        self._keep(base, hidden[: accepted + 1])
        return Step(ids[before:], q, accepted, tuple(proposals))


def decoder_for(target: Context, draft: Context | None, q: int) -> GreedyDecoder:
    """The decoder of a target and its draft: target-only greedy (None), a draft model, or a multi-token-prediction
    module of the target's checkpoint."""
    if draft is None:
        return GreedyDecoder(target)
    if draft.model.config.next_token_module:
        return NextTokenDecoder(target, draft, q)
    return SpeculativeDecoder(target, draft, q)


def generate(target: Context, draft: Context | None, prompt_ids, n: int, q: int = 2) -> list[int]:
    """Generate n tokens greedily after prompt_ids (both caches restart at position 0); draft None: target only."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ArgumentError(f"number of tokens to generate must be a positive integer, got {n!r}")
    decoder = decoder_for(target, draft, q)
    out = [decoder.start(prompt_ids)]
    while len(out) < n:
        out.extend(decoder.step(n - len(out)).tokens)
    return out
