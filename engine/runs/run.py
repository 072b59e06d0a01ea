"""Decode runs: greedy generation over a list of prompts, repeated, with or without a draft model.

A DecodeRun checks everything before it starts (prompts, counts, q, the draft's vocabulary, context room),
streams a StepEvent to a callback after every step, and ends in a RunResult whose field names follow what
benchmark scripts in this field record: decode_tokens_per_second, accept_rate, output_sha256.

    run = DecodeRun(target, draft, prompts=["Hello"], tokens_per_prompt=64, repeats=3, q=2, on_event=print)
    result = run.run()               # here, or:
    run.start(); ...; run.cancel(); result = run.wait()   # on a worker thread (the native calls release the GIL)

A placement given to the run is applied to the target when the run starts (and stays in force after it);
without one the run uses the target's current placement. The reduction mode and the activation precision are set on
the run's own caches.

Cancel stops the run before its next step; the caches are released and the models stay usable. The callback
runs on the run's own thread, between native calls: it should only copy the event somewhere (a queue, a
signal), because the next step waits for it.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..core.errors import ArgumentError, RangeError, StateError
from ..core.trace import Span
from ..model import Context, Model, _ids_array, check_context_top_k, check_text
from .diverge import Diagnosis, Outputs, Trail, diagnose
from .speculative import GreedyDecoder, check_draft_q, check_shared_vocabulary, decoder_for
from .workload import synthetic_ids

REDUCTION_MODES = tuple(Context.MODES)  # the context owns the mode names
PRECISIONS = tuple(Context.PRECISIONS)  # and the activation precisions (f32: the reference; q8: llama.cpp's way)
KV_CACHES = tuple(Context.KV_CACHES)  # and the KV cache formats (f32: the reference; f16, bf16: half the bytes)
# A step records at most a few spans per layer and device (attention, route, stage, experts per owner, join,
# combine), whatever its rows: room per layer, plus embed, logits and recorded parts.
TRACE_ROOM_PER_LAYER = 16
TRACE_ROOM_EXTRA = 64
# A traced run keeps its newest spans, whole steps, up to this many (some 40 MB of Span objects; a few thousand
# decode steps of a wide model): a run of any length stays bounded. Those dropped are counted (trace_dropped).
TRACE_KEPT_SPANS = 200_000
MAX_REPEATS = 10_000  # passes over the prompts in one run (each keeps its outputs and top-2 trails)


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One step of a run: the prefill of a prompt (which yields its first token) or one decode step.

    time: seconds from the start of the run to the end of this step; seconds: how long the step took.
    generated: tokens generated so far for this prompt (this step included). ids: the tokens this step emitted.
    """

    phase: str  # "prefill" or "decode"
    repeat: int
    prompt: int
    tokens: int
    drafted: int
    accepted: int
    generated: int
    time: float
    seconds: float
    ids: tuple[int, ...]
    prompt_tokens: int = 0  # prefill steps only
    spans: tuple[Span, ...] = ()  # with trace=True: what ran where during this step (engine.core.trace)
    # each device's running total of kernel time (Model.busy_seconds) at the end of the step: the change between
    # two events over the change in time is how busy each device was in between
    busy_seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class RepeatResult:
    """One pass over every prompt. complete is False for a pass cut short by cancel."""

    index: int
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    generated_tokens: int = 0  # every token generated, each prompt's first (from the prefill) included
    decode_tokens: int = 0  # tokens after each prompt's first
    decode_seconds: float = 0.0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    output_sha256: list[str] = field(default_factory=list)  # one per finished prompt
    complete: bool = False

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else math.nan

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else math.nan


@dataclass
class PromptResult:
    prompt_tokens: int
    generated_ids: list[int]
    output_sha256: str


@dataclass
class RunResult:
    """What a run measured. Speeds are the median over repeats, with min and max; NaN when not measured.

    decode tokens/s counts every generated token after each prompt's first, over the time of the decode steps
    (draft and verification together); prefill tokens/s counts prompt tokens over the prefill time (the draft's
    prefill included). accept_rate is accepted / drafted tokens (None without a draft). output_sha256 is the
    sha256 of each prompt's generated ids as int32 little-endian, from the first complete repeat;
    repeats_agree says whether every complete repeat produced the same hashes.

    From the engine's counters, over the run: device_busy_share (device -> time it spent running kernels, for
    any model, over the time of the steps; several threads or streams can make it exceed 1), staging_bytes
    ("src->dst" -> bytes copied between a model's primary device and an expert owner), joins (MoE layer steps
    whose experts ran on more than one device) and waits (device -> times the primary waited for it). With a
    primary that cannot read host memory (a GPU): host_round_trips (MoE layer steps that read their routing back
    to the host because experts lived elsewhere) and graph_launches (recorded parts of one-token steps launched:
    one per step while every expert is on the primary, one more per host round trip otherwise).
    placement is the target's placement in its text form (None for a dense target). precision is how activations
    met quantized weights: "f32" (the reference) or "q8" (int8 activations: other logits, so its hashes may differ).
    """

    target: str
    draft: str | None
    target_device: str
    draft_device: str | None
    mode: str
    precision: str
    placement: str | None
    q: int | None
    tokens_per_prompt: int
    repeats: int
    prompts: list[PromptResult]
    output_sha256: list[str]
    repeats_agree: bool
    decode_tokens_per_second: float
    decode_tokens_per_second_min: float
    decode_tokens_per_second_max: float
    prefill_tokens_per_second: float
    prefill_tokens_per_second_min: float
    prefill_tokens_per_second_max: float
    generated_tokens: int  # over every repeat, as the events count them
    drafted_tokens: int
    accepted_tokens: int
    accept_rate: float | None
    repeat_results: list[RepeatResult]
    cancelled: bool
    seconds: float
    device_busy_share: dict[str, float] = field(default_factory=dict)
    staging_bytes: dict[str, int] = field(default_factory=dict)
    joins: int = 0
    waits: dict[str, int] = field(default_factory=dict)
    host_round_trips: int = 0
    graph_launches: int = 0
    trace_spans: int = 0  # with trace=True: spans recorded, those the core had no room for, and those recorded but
    trace_lost: int = 0  # dropped to keep the run's trace bounded (the oldest steps': DecodeRun.spans holds the
    trace_dropped: int = 0  # rest, trace_spans - trace_dropped of them)
    kernels: str = ""  # the kernels of the target's runtime (RuntimeInfo.kernel_variant)
    top_k: int | None = None  # experts per token where the target decoded with another count than its checkpoint's
    depth: int = 0  # context tokens before each prompt, prefilled and not measured (decode at a depth)
    kv: str = "f32"  # the KV caches' format (KV_CACHES): f16 and bf16 give other logits than f32, so other hashes
    # per repeat, per finished prompt: each generated token's id, runner-up and top-2 logits (engine.runs.diverge)
    trails: list[list[Trail]] = field(default_factory=list, repr=False)

    def repeats_diagnosis(self) -> Diagnosis | None:
        """Where the first complete repeat whose hashes differ from the first's parts from it (None: they agree)."""
        complete = [r.index for r in self.repeat_results if r.complete]
        first = self.repeat_results[complete[0]] if complete else None
        other = next((i for i in complete if self.repeat_results[i].output_sha256 != first.output_sha256), None)
        if other is None:
            return None
        a = Outputs.of_result(self, f"repeat {complete[0]}", complete[0])
        return diagnose(a, Outputs.of_result(self, f"repeat {other}", other))

    def to_dict(self) -> dict:
        """Plain JSON-ready data (NaN becomes None); the trails are left out, a diagnosis of repeats that disagree
        is in (repeats_diagnosis)."""
        trails, self.trails = self.trails, []
        try:
            out = asdict(self)
        finally:
            self.trails = trails
        del out["trails"]
        diagnosis = self.repeats_diagnosis()
        out["repeats_diagnosis"] = None if diagnosis is None else diagnosis.to_dict()
        for r, rep in zip(out["repeat_results"], self.repeat_results, strict=True):
            r["decode_tokens_per_second"] = rep.decode_tokens_per_second
            r["prefill_tokens_per_second"] = rep.prefill_tokens_per_second
        return _finite(out)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def output_sha256(ids) -> str:
    """sha256 of token ids as int32 little-endian: the output hash a run reports."""
    return hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest()


def placement_devices(placement: str) -> list[str]:
    """The devices a placement's text form names (engine.placement.placement: RULE=DEVICE separated by ';')."""
    return sorted({rule.rpartition("=")[2].strip() for rule in placement.split(";") if "=" in rule})


def outputs_any_placement(mode: str, precision: str, devices: list[str]) -> bool:
    """Whether runs in this mode and precision give the same outputs whatever the placement over these devices:
    reference mode in either precision on any (in q8 the GPU modules compute the CPU module's q8 bits, and the core
    refuses a precision on a device that does not run it); owner-local mode never (its sums change association with
    the placement). The devices are the caller's to name; no runtime's answer depends on them today."""
    return mode == "reference"


def check_mode(mode: str) -> str:
    if mode not in REDUCTION_MODES:
        raise ArgumentError(f"reduction mode {mode!r} is unknown: expected one of {', '.join(REDUCTION_MODES)}")
    return mode


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ArgumentError(f"precision {precision!r} is unknown: expected one of {', '.join(PRECISIONS)}")
    return precision


def check_kv(kv: str) -> str:
    if kv not in KV_CACHES:
        raise ArgumentError(f"KV cache {kv!r} is unknown: expected one of {', '.join(KV_CACHES)}")
    return kv


def _positive(name: str, value) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ArgumentError(f"{name} = {value!r}: expected a positive integer")
    return int(value)


def context_survives(contexts, reach: int) -> bool:
    """Whether each context, truncated back to a position after at most `reach` positions past it, holds that
    position's rows as they were. A sliding-window layer's cache is a ring of window + n_batch - 1 rows, which the
    positions past it overwrite from the oldest: the window's rows before a position survive up to n_batch of them.
    Every other cache keeps a row per position."""
    return all(reach <= ctx.n_batch or not any(ctx.model.config.layer_windows) for ctx in contexts)


class DecodeRun:
    """A decode run over prompts (texts or token id lists), tokens_per_prompt tokens each, `repeats` times.

    draft: a model proposing q tokens per step (1..8), verified by the target in one pass; None for
    target-only decoding. mode: "reference" (expert outputs summed on the primary in a fixed order: outputs
    identical whatever the placement) or "owner_local" (each owner pre-sums its experts: faster, not the
    identity mode). precision: "f32" (activations meet exactly dequantized weights in f32: the reference) or
    "q8" (activations quantized to int8 per block, integer products, as llama.cpp: faster, deterministic,
    other logits than f32; float weights are read in f32 either way). placement: a Placement or its text form
    ("0-7=cuda:0; 8-15=cpu:0"), applied to the target when the run starts; None keeps the target's current one.
    top_k: experts per token the target decodes with (its context's Context.top_k: 1..the count it was loaded with);
    None: that count. kv: the format of both models' KV caches (Context.KV_CACHES): "f32" (the reference), "f16" or
    "bf16" (half the cache's bytes, each key and value rounded when stored: other logits than f32).
    on_event(StepEvent) is called after every step, on the run's thread. trace: record the per-token trace of both
    models (engine.core.trace): each StepEvent carries its step's spans, and DecodeRun.spans keeps the newest steps'
    spans, at most trace_keep of them (TRACE_KEPT_SPANS; the older steps' are counted in trace_dropped).
    Everything is checked here, before any run starts.
    """

    def __init__(
        self,
        target: Model,
        draft: Model | None = None,
        *,
        prompts=None,
        tokens_per_prompt: int = 64,
        repeats: int = 1,
        q: int = 2,
        mode: str = "reference",
        precision: str = "f32",
        placement=None,
        on_event=None,
        trace: bool = False,
        trace_keep: int = TRACE_KEPT_SPANS,
        top_k: int | None = None,
        depth: int = 0,
        kv: str = "f32",
    ):
        check_mode(mode)
        check_precision(precision)
        self.kv = check_kv(kv)
        self.top_k = None if top_k is None else check_context_top_k(target.config, top_k)
        if placement is not None:
            target.placement_bytes(placement)  # checks devices, layers and experts now; moves nothing yet
        self.target, self.draft = target, draft
        self.mode, self.precision, self.placement = mode, precision, placement
        self.tokens_per_prompt = _positive("tokens per prompt", tokens_per_prompt)
        self.repeats = _positive("repeats", repeats)
        if self.repeats > MAX_REPEATS:  # a run keeps every repeat's outputs: an endless one would grow without bound
            raise RangeError(f"repeats = {repeats}: at most {MAX_REPEATS} passes over the prompts in one run")
        self.q = check_draft_q(q) if draft is not None else None
        if draft is not None:
            check_shared_vocabulary(target, draft)
            own = Path(draft.checkpoint.folder).resolve() == Path(target.checkpoint.folder).resolve()
            if draft.config.next_token_module and not own:
                raise ArgumentError(
                    f"the draft is the multi-token-prediction module of '{draft.checkpoint.folder}', the target is "
                    f"'{target.checkpoint.folder}': a module drafts from its own model's hidden states"
                )
        if prompts is None:
            from ..checkpoints.demo import DEMO_PROMPTS

            prompts = DEMO_PROMPTS
        self.prompt_ids = self._encode_prompts(prompts)
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or depth < 0:
            raise ArgumentError(f"depth {depth!r}: expected a number of context tokens >= 0")
        self.depth = int(depth)
        # The target never holds more than depth + prompt + n - 1 positions (a draft of q is cut to the tokens due).
        self.n_ctx = depth + max(len(p) for p in self.prompt_ids) + self.tokens_per_prompt
        at = f"a depth of {depth} tokens, " if depth else ""
        for role, model in (("target", target), ("draft", draft)):
            if model is not None and self.n_ctx > model.config.max_position_embeddings:
                raise RangeError(
                    f"{at}the longest prompt and {self.tokens_per_prompt} generated tokens need {self.n_ctx} "
                    f"positions, more than the {role}'s max_position_embeddings "
                    f"({model.config.max_position_embeddings})"
                )
        self.context_ids = synthetic_ids(target, self.depth) if self.depth else []  # (checked against the room first)
        if on_event is not None and not callable(on_event):
            raise ArgumentError(f"on_event {on_event!r:.80}: expected a function taking a StepEvent, or None")
        self.on_event = on_event
        if not isinstance(trace, bool):
            raise ArgumentError(f"trace must be True or False, got {trace!r}")
        self.trace = trace
        self.trace_keep = _positive("trace_keep (spans kept)", trace_keep)
        self._kept: deque[tuple[Span, ...]] = deque()  # the newest steps' spans, trace_keep at most in all
        self._kept_spans = self.trace_dropped = 0
        self._trace_lost = 0
        self._contexts: list[tuple[Context, str]] = []
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._result: RunResult | None = None
        self._error: BaseException | None = None
        self._started = False

    def _encode_prompts(self, prompts) -> list[list[int]]:
        if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__"):
            raise ArgumentError(f"prompts must be a list of texts or of token id lists, got {type(prompts).__name__}")
        if len(prompts) == 0:
            raise ArgumentError("the prompt list is empty: expected at least one prompt")
        vocab = self.target.config.vocab_size
        out = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                if not p:
                    raise ArgumentError(f"prompt {i} is empty: expected some text")
                check_text(p, f"prompt {i}")
                ids = self.target.encode(p)
                if not ids:
                    raise ArgumentError(f"prompt {i} ({p!r}) encodes to no tokens: expected some text")
            else:
                try:
                    ids = _ids_array(p).tolist()
                except ArgumentError as exc:
                    raise ArgumentError(f"prompt {i}: {exc}") from None
                bad = [t for t in ids if not 0 <= t < vocab]
                if bad:
                    raise RangeError(f"prompt {i}: token id {bad[0]} out of range: expected 0..{vocab - 1}")
            out.append(ids)
        return out

    # -- running --------------------------------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop before the next step (thread-safe); run() / wait() then return the partial result."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def run(self) -> RunResult:
        """Run in the calling thread; returns when every step is done or the run is cancelled."""
        if self._started:
            raise StateError("this DecodeRun has already been started: make a new one for another run")
        self._started = True
        return self._execute()

    def start(self) -> DecodeRun:
        """Run on a worker thread; wait() for the result."""
        if self._started:
            raise StateError("this DecodeRun has already been started: make a new one for another run")
        self._started = True
        self._thread = threading.Thread(target=self._worker, name="expertbench-decode-run", daemon=True)
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> RunResult | None:
        """The result of a start()ed run (None if still running after timeout); re-raises the run's error."""
        if self._thread is None:
            raise StateError("this DecodeRun was not start()ed")
        self._thread.join(timeout)
        if self._thread.is_alive():
            return None
        if self._error is not None:
            raise self._error
        return self._result

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _worker(self) -> None:
        try:
            self._result = self._execute()
        except BaseException as exc:  # handed to wait(), which re-raises it on the caller's thread
            self._error = exc

    def _execute(self) -> RunResult:
        if self.placement is not None:
            self.target.set_placement(self.placement)
        target_ctx = self.target.context(self.n_ctx, kv=self.kv)
        draft_ctx = None
        try:
            target_ctx.mode = self.mode
            target_ctx.precision = self.precision
            if self.top_k is not None:
                target_ctx.top_k = self.top_k
            self._tap = _LogitsTap(target_ctx)
            if self.draft is not None:
                draft_ctx = self.draft.context(self.n_ctx, kv=self.kv)
                draft_ctx.mode = self.mode
                draft_ctx.precision = self.precision
            decoder = decoder_for(self._tap, draft_ctx, self.q)
            if self.trace:
                self._contexts = [(target_ctx, "target")] + ([(draft_ctx, "draft")] if draft_ctx else [])
                passes = 1 + (self.q or 0)  # the draft proposes q tokens a step, one pass each
                for ctx, _ in self._contexts:
                    ctx.trace = (TRACE_ROOM_PER_LAYER * ctx.model.config.num_layers + TRACE_ROOM_EXTRA) * passes
            # The context before the prompts is prefilled once and kept (start() truncates back to it), unless a
            # prompt, its tokens and a draft's verified tail can overwrite its rows in a sliding-window layer's ring.
            reach = (
                max(len(p) for p in self.prompt_ids) + self.tokens_per_prompt + (self.q if draft_ctx is not None else 0)
            )
            keep = context_survives([c for c in (target_ctx, draft_ctx) if c is not None], reach)
            models = [m for m in (self.target, self.draft) if m is not None]
            before = [m.counters() for m in models]
            result = self._loop(decoder, keep)
            _add_counters(result, models, before, [m.counters() for m in models])
            result.kernels = _kernels(self.target)
            result.trace_spans = self._kept_spans + self.trace_dropped
            result.trace_lost, result.trace_dropped = self._trace_lost, self.trace_dropped
            return result
        finally:
            if draft_ctx is not None:
                draft_ctx.close()
            target_ctx.close()

    def _loop(self, decoder: GreedyDecoder, keep_context: bool) -> RunResult:
        n, emit, clock = self.tokens_per_prompt, self.on_event, time.perf_counter
        t_run = clock()
        reps: list[RepeatResult] = []
        outputs: list[list[list[int]]] = []  # per repeat, per finished prompt
        self._trails: list[list[Trail]] = []  # the same, each token's top-2 logits
        tap = self._tap
        context_ready = False  # the depth's context prefilled and kept (keep_context) for the prompts after
        for r in range(self.repeats):
            rep = RepeatResult(r)
            reps.append(rep)
            outputs.append([])
            self._trails.append([])
            for p, prompt in enumerate(self.prompt_ids):
                if self._cancel.is_set():
                    break
                if self.depth and not context_ready:
                    decoder.begin(self.context_ids)  # the context before the prompt: not part of what is measured
                    context_ready = keep_context
                t0 = clock()
                out = [decoder.start(prompt)]
                t1 = clock()
                steps = [tap.choices(1)]  # (after the clock: the top-2 is no part of a step's time)
                rep.prefill_tokens += len(prompt)
                rep.prefill_seconds += t1 - t0
                rep.generated_tokens += 1
                spans = self._step_spans()
                if emit is not None:
                    emit(StepEvent("prefill", r, p, 1, 0, 0, 1, t1 - t_run, t1 - t0, (out[0],), len(prompt), spans,
                                   self.target.busy_seconds()))  # fmt: skip
                while len(out) < n and not self._cancel.is_set():
                    t0 = clock()
                    step = decoder.step(n - len(out))
                    t1 = clock()
                    out.extend(step.tokens)
                    steps.append(tap.choices(len(step.tokens)))
                    rep.decode_tokens += len(step.tokens)
                    rep.generated_tokens += len(step.tokens)
                    rep.decode_seconds += t1 - t0
                    rep.drafted_tokens += step.drafted
                    rep.accepted_tokens += step.accepted
                    spans = self._step_spans()
                    if emit is not None:
                        emit(StepEvent("decode", r, p, len(step.tokens), step.drafted, step.accepted, len(out),
                                       t1 - t_run, t1 - t0, tuple(step.tokens), 0, spans,
                                       self.target.busy_seconds()))  # fmt: skip
                if len(out) == n:
                    outputs[r].append(out)
                    self._trails[r].append(Trail.joined(steps))
                    rep.output_sha256.append(output_sha256(out))
            rep.complete = len(outputs[r]) == len(self.prompt_ids)
            if self._cancel.is_set():
                break
        return self._summary(reps, outputs, clock() - t_run)

    def _step_spans(self) -> tuple[Span, ...]:
        """The spans of the step just taken (none unless tracing), moved out of the contexts."""
        if not self._contexts:
            return ()
        spans: list[Span] = []
        for ctx, role in self._contexts:
            spans += ctx.trace_spans(role)
            self._trace_lost += ctx.trace_lost
            ctx.trace_lost = 0
        spans.sort(key=lambda s: s.start_ns)
        step = tuple(spans)
        if step:
            self._kept.append(step)
            self._kept_spans += len(step)
            while self._kept_spans > self.trace_keep and len(self._kept) > 1:  # the newest step stays whole
                n = len(self._kept.popleft())
                self._kept_spans -= n
                self.trace_dropped += n
        return step

    @property
    def spans(self) -> list[Span]:
        """The traced spans kept (the newest steps', oldest first; read it after the run)."""
        return [s for step in self._kept for s in step]

    def _summary(self, reps: list[RepeatResult], outputs: list[list[list[int]]], seconds: float) -> RunResult:
        complete = [r for r in reps if r.complete]
        measured = complete or [r for r in reps if r.decode_seconds > 0 or r.prefill_seconds > 0]
        first = next((i for i, r in enumerate(reps) if r.complete), None)
        prompts = []
        if first is not None:
            prompts = [PromptResult(len(ids), out, output_sha256(out))
                       for ids, out in zip(self.prompt_ids, outputs[first], strict=True)]  # fmt: skip
        drafted = sum(r.drafted_tokens for r in reps)
        accepted = sum(r.accepted_tokens for r in reps)
        decode = _spread([r.decode_tokens_per_second for r in measured])
        prefill = _spread([r.prefill_tokens_per_second for r in measured])
        return RunResult(
            target=str(self.target.checkpoint.folder),
            draft=None if self.draft is None else draft_label(self.draft),
            target_device=self.target.device,
            draft_device=None if self.draft is None else self.draft.device,
            mode=self.mode,
            precision=self.precision,
            placement=self.target.placement.describe() if self.target.config.num_experts > 0 else None,
            q=self.q,
            tokens_per_prompt=self.tokens_per_prompt,
            repeats=self.repeats,
            prompts=prompts,
            output_sha256=[p.output_sha256 for p in prompts],
            repeats_agree=bool(complete) and all(r.output_sha256 == complete[0].output_sha256 for r in complete),
            decode_tokens_per_second=decode[0],
            decode_tokens_per_second_min=decode[1],
            decode_tokens_per_second_max=decode[2],
            prefill_tokens_per_second=prefill[0],
            prefill_tokens_per_second_min=prefill[1],
            prefill_tokens_per_second_max=prefill[2],
            generated_tokens=sum(r.generated_tokens for r in reps),
            drafted_tokens=drafted,
            accepted_tokens=accepted,
            accept_rate=(accepted / drafted if drafted else None) if self.draft is not None else None,
            repeat_results=reps,
            cancelled=self._cancel.is_set(),
            seconds=seconds,
            top_k=_top_k_override(self.target, self.top_k),
            depth=self.depth,
            kv=self.kv,
            trails=self._trails,
        )


def draft_label(draft: Model) -> str:
    """How a run names its draft: the folder, or the module inside the target's folder."""
    if draft.config.next_token_module:
        return f"{draft.checkpoint.folder} (its multi-token-prediction module)"
    return str(draft.checkpoint.folder)


class _LogitsTap:
    """The target's cache as a decoder sees it, keeping the logits rows of its latest evaluation: a step's emitted
    tokens are its first rows (a prefill's last position; a verification's accepted positions and the next)."""

    def __init__(self, ctx: Context):
        self._ctx = ctx
        self._rows: np.ndarray | None = None

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def prefill(self, ids, all_rows: bool = True) -> np.ndarray:
        logits = self._ctx.prefill(ids, all_rows)
        self._rows = logits if all_rows else logits[None, :]
        return logits

    def decode(self, ids) -> np.ndarray:
        self._rows = self._ctx.decode(ids)
        return self._rows

    def eval_hidden(self, ids, all_rows: bool = True, hidden_in=None, hidden_out: bool = True):
        logits, hidden = self._ctx.eval_hidden(ids, all_rows, hidden_in, hidden_out)
        self._rows = logits if all_rows else logits[None, :]
        return logits, hidden

    def choices(self, n: int) -> Trail:
        """The top-2 of the n tokens the decoder just emitted."""
        return Trail.of_rows(self._rows[:n])


def _top_k_override(model: Model, top_k: int | None = None) -> int | None:
    """The experts per token a model decoded with (top_k, its context's; None: the count it was loaded with) where that
    is not its checkpoint's own."""
    native = getattr(model, "native_top_k", model.config.top_k)
    used = model.config.top_k if top_k is None else top_k
    return used if used != native else None


def _kernels(model: Model) -> str:
    """The kernel variant of the runtime of the model's primary device."""
    runtime = model.device.partition(":")[0]
    return next((r.kernel_variant for r in model.engine.runtimes if r.name == runtime), "")


def _add_counters(result: RunResult, models: list[Model], before: list[dict], after: list[dict]) -> None:
    """Fill the result's counter fields from the change in each model's counters over the run."""
    step_seconds = sum(r.prefill_seconds + r.decode_seconds for r in result.repeat_results)
    for device, end in after[0]["devices"].items():
        # busy time is per device, whatever model ran there: one model's view is enough
        busy = end["busy_seconds"] - before[0]["devices"][device]["busy_seconds"]
        if busy > 0 and step_seconds > 0:
            result.device_busy_share[device] = busy / step_seconds
    for model, start, end in zip(models, before, after, strict=True):
        result.joins += end["joins"] - start["joins"]
        result.host_round_trips += end["host_round_trips"] - start["host_round_trips"]
        result.graph_launches += end["graph_launches"] - start["graph_launches"]
        for device, c in end["devices"].items():
            c0 = start["devices"][device]
            moves = {f"{model.device}->{device}": c["bytes_to_device"] - c0["bytes_to_device"],
                     f"{device}->{model.device}": c["bytes_from_device"] - c0["bytes_from_device"]}  # fmt: skip
            for pair, nbytes in moves.items():
                if nbytes:
                    result.staging_bytes[pair] = result.staging_bytes.get(pair, 0) + nbytes
            if c["waits"] - c0["waits"]:
                result.waits[device] = result.waits.get(device, 0) + c["waits"] - c0["waits"]


def _spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of the finite values; NaN when there are none."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, math.nan, math.nan
    return statistics.median(finite), min(finite), max(finite)
