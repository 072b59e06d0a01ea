"""The quality cost of a fast mode: how far its next-token distributions and greedy choices are from the reference's.

The fast modes trade exactness for speed: `owner_local` sums (each owner pre-sums its experts: another float
association), the `q8` activation precision (int8 activations against quantized weights), a half KV cache (`f16` or
`bf16`: each key and value rounded when stored) and an experts-per-token
override (decoding with fewer experts than the model's own num_experts_per_tok: a context's top_k, or a Model loaded
with top_k for more than its own). The reference is the reference mode in f32 with the model's own experts per token.

On each prompt the reference decodes greedily; both sides then read the reference's own sequence (prompt and its
generated ids) in one pass each, so that they are compared on the same prefixes. Per generated position:

* agreement: whether the fast side's greedy choice equals the reference's (the greedy agreement rate is the share of
  positions where it does);
* the KL divergence KL(reference || fast) of the next-token distributions (softmax of the logits), in nats; the
  figure reported is its mean over every position of every prompt (and the largest);
* the first divergence: where the fast side's own greedy output (decoded freely, as a run in that mode decodes)
  first parts from the reference's, per prompt, with the top-2 logits there (engine.runs.diverge).

`expertbench run` reports it for a run in a fast mode, the window's history shows it beside the speed, and
`quality_cost` is what a tuner calls to keep only settings under a maximum mean KL (within_max_kl).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.errors import ArgumentError
from .diverge import Diagnosis, Outputs, diagnose


@dataclass
class QualityCost:
    """What a fast mode (mode, precision, top_k) costs against the reference mode over `positions` generated
    positions of `prompts` prompts. agreement: the greedy agreement rate (0..1); mean_kl, max_kl: KL(reference ||
    fast) in nats; first_divergence: the earliest generated token index at which a prompt's free-running fast
    output parts from the reference's (None: none parts within the tokens decoded), diagnosis: every prompt's."""

    mode: str
    precision: str
    top_k: int | None  # the experts per token the fast side decoded with (None: the model's own)
    native_top_k: int | None
    prompts: int
    tokens: int  # per prompt
    positions: int
    agreement: float
    mean_kl: float
    max_kl: float
    first_divergence: int | None
    diagnosis: Diagnosis | None
    kv: str = "f32"  # the fast side's KV cache format (engine.runs.run.KV_CACHES)

    @property
    def fast_mode(self) -> str:
        """The fast settings in words: 'owner_local, q8, top-2 experts' ('reference' when none)."""
        parts = [] if self.mode == "reference" else [self.mode]
        parts += [] if self.precision == "f32" else [self.precision]
        parts += [] if self.kv == "f32" else [f"{self.kv} KV cache"]
        if self.top_k is not None and self.top_k != self.native_top_k:
            parts.append(f"top-{self.top_k} experts (of {self.native_top_k})")
        return ", ".join(parts) or "reference"

    def summary(self) -> str:
        """One line: agreement, mean KL, first divergence."""
        first = "none" if self.first_divergence is None else f"token {self.first_divergence}"
        return (f"{self.fast_mode}: greedy agreement {100 * self.agreement:.1f} %, mean KL {self.mean_kl:.3g} nats "
                f"(max {self.max_kl:.3g}) over {self.positions} positions; first divergence {first}")  # fmt: skip

    def short(self) -> str:
        """For a table cell: '98.4 % · KL 0.0012'."""
        return f"{100 * self.agreement:.1f} % · KL {self.mean_kl:.2g}"

    def to_dict(self) -> dict:
        return {
            "fast_mode": self.fast_mode, "mode": self.mode, "precision": self.precision, "kv": self.kv,
            "top_k": self.top_k,
            "native_top_k": self.native_top_k, "prompts": self.prompts, "tokens_per_prompt": self.tokens,
            "positions": self.positions, "agreement": self.agreement, "mean_kl": self.mean_kl, "max_kl": self.max_kl,
            "first_divergence": self.first_divergence, "summary": self.summary(),
            "diagnosis": None if self.diagnosis is None else self.diagnosis.to_dict(),
        }  # fmt: skip


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-probabilities, in float64."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_divergence(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """KL(P || Q) in nats per row, P and Q the softmax of each row of logits."""
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return np.maximum((np.exp(lp) * (lp - lq)).sum(axis=-1), 0.0)  # never below 0 by rounding


def agreement(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """Per row, whether the greedy (argmax) choices of two logits rows agree."""
    return np.argmax(p_logits, axis=-1) == np.argmax(q_logits, axis=-1)


def is_fast(mode: str, precision: str, top_k: int | None = None, native_top_k: int | None = None,
            kv: str = "f32") -> bool:  # fmt: skip
    """Whether these settings are not the reference's (so that they have a quality cost to measure)."""
    return mode != "reference" or precision != "f32" or kv != "f32" or (top_k is not None and top_k != native_top_k)


def within_max_kl(cost: QualityCost, max_kl: float) -> bool:
    """The constraint `tune --max-kl` applies: the mean KL of the next-token distributions at most max_kl nats."""
    if not isinstance(max_kl, (int, float)) or isinstance(max_kl, bool) or not max_kl >= 0:
        raise ArgumentError(f"--max-kl {max_kl!r}: expected a number of nats >= 0")
    return cost.mean_kl <= max_kl


def _rows(model, sequence: Sequence[int], first: int, mode: str, precision: str, top_k=None,
          kv: str = "f32") -> np.ndarray:  # fmt: skip
    """The logits of every position of `sequence` from `first` on, in one prefill, in this mode and precision (and
    experts per token: None, the model's loaded count; KV cache format)."""
    ctx = model.context(len(sequence), kv=kv)
    try:
        ctx.mode, ctx.precision = mode, precision
        if top_k is not None:
            ctx.top_k = top_k
        return ctx.prefill(list(sequence), all_rows=True)[first:]
    finally:
        ctx.close()


def quality_cost(reference, fast=None, *, prompts=None, tokens: int = 32, mode: str = "reference",
                 precision: str = "f32", placement=None, reference_result=None, fast_result=None,
                 top_k: int | None = None, kv: str = "f32") -> QualityCost:  # fmt: skip
    """Measure a fast mode against the reference mode on the prompts (texts or id lists; default the demo prompts),
    `tokens` generated per prompt.

    reference: the Model at its own experts per token (run in reference mode, f32); fast: the Model the fast side
    decodes with (None: the reference model itself; one loaded with top_k for more experts per token than its own),
    in `mode` and `precision` with its KV caches in `kv`, with `top_k` experts per token (its contexts' Context.top_k;
    None: as loaded), on
    `placement` (None: its current one; it stays in force, as a run's does). The routing statistics do not count
    these decodes. reference_result / fast_result: RunResults of these prompts and
    tokens already decoded in those settings (a run just made), reused instead of decoding again."""
    from ..model import check_context_top_k
    from .run import DecodeRun, _top_k_override, check_kv, check_mode, check_precision

    check_mode(mode)
    check_precision(precision)
    check_kv(kv)
    fast = reference if fast is None else fast
    if fast.config.vocab_size != reference.config.vocab_size:
        raise ArgumentError("the fast model's vocabulary is not the reference's: load the same checkpoint")
    if top_k is not None:
        top_k = check_context_top_k(fast.config, top_k)
    with reference.routing_paused(), fast.routing_paused():
        if reference_result is None:
            reference_result = DecodeRun(reference, prompts=prompts, tokens_per_prompt=tokens).run()
        if fast_result is None:
            fast_result = DecodeRun(fast, prompts=prompts, tokens_per_prompt=tokens, mode=mode, precision=precision,
                                    placement=placement, top_k=top_k, kv=kv).run()  # fmt: skip
        prompt_ids = DecodeRun(reference, prompts=prompts, tokens_per_prompt=tokens).prompt_ids
        _check_pair(reference_result, fast_result, len(prompt_ids), tokens, mode, precision, kv)
        override = _top_k_override(fast, top_k)
        if reference_result.top_k is not None:
            raise ArgumentError(f"the reference run decoded with top_k {reference_result.top_k}: expected the "
                                "checkpoint's own experts per token")  # fmt: skip
        if fast_result.top_k != override:
            raise ArgumentError(f"the fast run decoded with top_k {fast_result.top_k}: expected {override} (None: the "
                                f"checkpoint's own experts per token)")  # fmt: skip
        kls, agree = [], []
        for ids, p in zip(prompt_ids, reference_result.prompts, strict=True):
            sequence = ids + p.generated_ids[:-1]  # each generated token is predicted from the ones before it
            ref_rows = _rows(reference, sequence, len(ids) - 1, "reference", "f32")
            fast_rows = _rows(fast, sequence, len(ids) - 1, mode, precision, top_k, kv)
            kls.append(kl_divergence(ref_rows, fast_rows))
            agree.append(agreement(ref_rows, fast_rows))
    kl, same = np.concatenate(kls), np.concatenate(agree)
    sides = Outputs.of_result(reference_result, "the reference mode"), Outputs.of_result(fast_result, "the fast mode")
    for side in sides:
        side.settings.pop("q", None)  # a draft never changes the output: the reference decodes without one
    diagnosis = diagnose(*sides)
    found = [d.index for d in diagnosis.divergences if d.index is not None]
    moe = fast.config.num_experts > 0
    return QualityCost(
        mode=mode,
        precision=precision,
        top_k=(fast.config.top_k if top_k is None else top_k) if moe else None,
        native_top_k=getattr(reference, "native_top_k", reference.config.top_k) if moe else None,
        prompts=len(prompt_ids),
        tokens=tokens,
        positions=len(kl),
        agreement=float(same.mean()),
        mean_kl=float(kl.mean()),
        max_kl=float(kl.max()),
        first_divergence=min(found) if found else None,
        diagnosis=diagnosis if diagnosis.divergences else None,
        kv=kv,
    )


def _check_pair(ref, fast, n_prompts: int, tokens: int, mode: str, precision: str, kv: str = "f32") -> None:
    """Results handed in must be complete runs of these prompts and tokens in the settings they stand for."""
    for what, result, want in (("reference", ref, ("reference", "f32", "f32")), ("fast", fast, (mode, precision, kv))):
        got = (result.mode, result.precision, result.kv)
        if got != want:

            def said(s):
                return f"{s[0]}, {s[1]}" + ("" if s[2] == "f32" else f", a {s[2]} KV cache")

            raise ArgumentError(f"the {what} run ran in {said(got)}: expected {said(want)}")
        if len(result.prompts) != n_prompts or result.tokens_per_prompt != tokens or result.cancelled:
            raise ArgumentError(f"the {what} run is not a complete run of {n_prompts} prompts x {tokens} tokens")


def quality_key(mode: str, precision: str, top_k: int | None = None, placement: str = "", devices=()) -> tuple:
    """What a quality cost depends on: settings with equal keys cost the same. The placement counts only where the
    outputs depend on it (engine.runs.run.outputs_any_placement: owner_local always); the draft and q
    never do."""
    from .run import outputs_any_placement, placement_devices

    key = (mode, precision, top_k)
    if not outputs_any_placement(mode, precision, [*placement_devices(placement), *devices]):
        key += (placement,)
    return key


class KLLimit:
    """A maximum mean KL divergence (nats) as a tuner's constraint (`tune --max-kl`): why(settings) is None for settings
    within it, else the reason they are excluded. Each distinct quality_key is measured once, by measure(mode,
    precision, top_k, placement) -> QualityCost (for_model: quality_cost on a loaded model); the reference settings
    cost nothing and are never measured. costs holds what was measured."""

    def __init__(self, max_kl: float, measure):
        within_max_kl(QualityCost("reference", "f32", None, None, 0, 0, 0, 1.0, 0.0, 0.0, None, None), max_kl)
        self.max_kl, self.measure = float(max_kl), measure
        self.costs: dict[tuple, QualityCost] = {}

    @classmethod
    def for_model(cls, max_kl: float, reference, *, prompts=None, tokens: int = 32, load_top_k=None) -> KLLimit:
        """On a loaded target: each fast setting decoded once against the reference mode; a top_k up to the target's
        own count through its contexts' setting, one above it on load_top_k(n) -> a Model of the same checkpoint at n
        experts per token (the caller closes it)."""

        def measure(mode, precision, top_k, placement):
            fast, k = reference, top_k
            if top_k is not None and top_k > reference.config.top_k:
                if load_top_k is None:
                    raise ArgumentError(f"experts per token (top_k) {top_k}: more than the model's "
                                        f"{reference.config.top_k} needs load_top_k (another load)")  # fmt: skip
                fast, k = load_top_k(top_k), None
            return quality_cost(reference, fast, prompts=prompts, tokens=tokens, mode=mode, precision=precision,
                                placement=placement or None, top_k=k)  # fmt: skip

        return cls(max_kl, measure)

    def cost(self, mode: str, precision: str, top_k: int | None = None, placement: str = "",
             devices=()) -> QualityCost | None:  # fmt: skip
        """The measured cost of these settings (None: the reference settings, which cost nothing)."""
        if not is_fast(mode, precision, top_k):
            return None
        key = quality_key(mode, precision, top_k, placement, devices)
        if key not in self.costs:
            self.costs[key] = self.measure(mode, precision, top_k, placement)
        return self.costs[key]

    def why(self, mode: str, precision: str, top_k: int | None = None, placement: str = "", devices=()) -> str | None:
        cost = self.cost(mode, precision, top_k, placement, devices)
        if cost is None or within_max_kl(cost, self.max_kl):
            return None
        return f"{cost.fast_mode}: mean KL {cost.mean_kl:.3g} nats > --max-kl {self.max_kl:g}"
