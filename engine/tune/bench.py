"""`expertbench tune` on an engine: measurements with DecodeRun (EngineBench), one tuning session (Tuning) and
the --max-kl constraint."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..core.errors import ArgumentError
from ..placement import strategy as S
from ..placement.costmodel import Calibration, ModelShape
from ..placement.placement import Placement, expert_rooms
from ..placement.routing import RoutingStats
from ..session import QUICK_CALIBRATION_TOKENS, calibrate_devices
from .search import (
    AUTO_Q,
    DEFAULT_RUNGS,
    DEFAULT_TIME_BUDGET,
    Candidate,
    Measurement,
    Point,
    Progress,
    Rung,
    Search,
    SearchResult,
    check_budgets,
    check_time_budget,
    parse_modes,
    parse_q,
    search_space,
)

# ---- on an engine ---------------------------------------------------------------------------------------------


class EngineBench:
    """Measurements with engine.runs.run.DecodeRun on a loaded target (and draft): every run in its candidate's mode
    (the one-device reference runs in the reference mode), its routing not counted into the target's statistics (a
    calibration's is not either)."""

    def __init__(self, target, draft, prompts):
        self.target, self.draft, self.prompts = target, draft, list(prompts)
        self._lock = threading.Lock()
        self._run = None
        self._cancelled = False
        self._references: dict[int, tuple[list[str], float]] = {}
        self.routing: RoutingStats | None = None  # what the first reference run routed

    def _start(self, run):
        with self._lock:
            self._run = run
            if self._cancelled:
                run.cancel()
        try:
            return run.run()
        finally:
            with self._lock:
                self._run = None

    def reference(self, tokens: int) -> tuple[list[str], float]:
        """The one-device hashes at this many tokens per prompt (measured once), and how long that run took."""
        from ..runs.run import DecodeRun

        if tokens in self._references:
            return self._references[tokens]
        before = RoutingStats.from_model(self.target)
        run = DecodeRun(self.target, None, prompts=self.prompts, tokens_per_prompt=tokens, repeats=1,
                        placement=Placement.single(self.target.config, self.target.device))  # fmt: skip
        result = self._start(run)
        if self.routing is None:
            after = RoutingStats.from_model(self.target)
            self.routing = RoutingStats(after.hits - before.hits, after.tokens - before.tokens, after.top_k)
        if not result.cancelled:
            self._references[tokens] = (list(result.output_sha256), result.seconds)
        return list(result.output_sha256), result.seconds

    def measure(self, candidate: Candidate, tokens: int, repeats: int) -> Measurement:
        from ..runs.run import DecodeRun

        draft = self.draft if candidate.q is not None else None
        run = DecodeRun(self.target, draft, prompts=self.prompts, tokens_per_prompt=tokens, repeats=repeats,
                        q=candidate.q or 1, mode=candidate.mode, placement=candidate.placement)  # fmt: skip
        with self.target.routing_paused():
            result = self._start(run)
        rates = [r.decode_tokens_per_second for r in result.repeat_results if r.complete]
        return Measurement(tokens, repeats, rates, list(result.output_sha256), result.accept_rate, result.seconds)

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._run is not None:
                self._run.cancel()


@dataclass
class TuneSettings:
    """What `expertbench tune` and the window's Tune panel ask for."""

    fast: str | None = None  # the device whose bytes the front counts (default: as `plan` picks it)
    caps: dict[str, int] = field(default_factory=dict)  # --budget
    qs: tuple[int, ...] = AUTO_Q  # draft lengths (ignored without a draft)
    modes: tuple[str, ...] = ("reference",)  # reduction modes each placement is measured in (--modes)
    time_budget: float = DEFAULT_TIME_BUDGET
    prompts: list | None = None  # None: the demo prompts
    routing: RoutingStats | None = None  # None: what the first one-device run routes
    calibrate: bool = True  # seed with the cost model (a short calibration first)
    calibration: Calibration | None = None  # figures measured before (the window's): no calibration then
    rungs: tuple[Rung, ...] = DEFAULT_RUNGS


@dataclass
class TuneResult:
    search: SearchResult
    primary: str
    devices: list[str]
    budgets: dict[str, int | None]
    caps: dict[str, int]
    candidates: int
    routing: RoutingStats | None
    routing_source: str  # "given", or measured on one device
    calibrated: str  # how the candidates were seeded
    notes: list[str]
    modes: tuple[str, ...] = ("reference",)


class Tuning:
    """One tuning session on a loaded target (and draft): everything is checked here, run() calibrates, measures
    the reference, builds the search space and searches; the target's placement is restored after. cancel() from
    any thread."""

    def __init__(self, target, draft, settings: TuneSettings, on_progress=None,
                 constraints: Sequence[Callable[[Point], str | None]] = (), calibrate_fn=None):  # fmt: skip
        self.target, self.draft, self.settings = target, draft, settings
        self.on_progress, self.constraints = on_progress, list(constraints)
        self.calibrate_fn = calibrate_fn  # None: engine.placement.costmodel.calibrate
        check_time_budget(settings.time_budget)
        if target.config.num_experts <= 0:
            raise ArgumentError(f"'{target.checkpoint.folder}' is a dense model: it has no experts to place")
        self.names = [d.name for d in target.engine.devices]
        self.primary = target.device
        if len(self.names) < 2:
            raise ArgumentError(f"tune needs a second device besides {self.primary}, and the engine has only that one "
                                "(add --runtime cuda, --runtime hostsim or --cpu-devices 2)")  # fmt: skip
        for device, size in settings.caps.items():
            if device not in self.names:
                raise ArgumentError(f"--budget {device}={size}: no device {device} (devices: "
                                    f"{', '.join(self.names)})")  # fmt: skip
        if settings.fast is not None and settings.fast not in self.names:
            raise ArgumentError(f"--fast {settings.fast}: no device {settings.fast} (devices: "
                                f"{', '.join(self.names)})")  # fmt: skip
        for q in settings.qs:
            parse_q(str(q))
        parse_modes(",".join(settings.modes))
        self.fast = settings.fast or S.default_fast(target.engine.devices, self.primary)
        self.shape = ModelShape.from_model(target)
        if settings.routing is not None and settings.routing.hits.shape != (self.shape.num_layers,
                                                                            self.shape.num_experts):  # fmt: skip
            raise ArgumentError(f"routing statistics of {settings.routing.hits.shape[0]} layers x "
                                f"{settings.routing.hits.shape[1]} experts: the model has {self.shape.num_layers} x "
                                f"{self.shape.num_experts}")  # fmt: skip
        self.rooms = expert_rooms(target.engine.devices, target.placement_bytes(target.placement))
        self.budgets = S.budgets_for(self.rooms, settings.caps)
        check_budgets(self.shape, self.names, self.fast, self.budgets, settings.caps, self.rooms)
        self.bench = EngineBench(target, draft, settings.prompts or _demo_prompts())
        self._cancel = threading.Event()
        self._search: Search | None = None
        self._lock = threading.Lock()

    def cancel(self) -> None:
        self._cancel.set()
        with self._lock:
            if self._search is not None:
                self._search.cancel()
        self.bench.cancel()

    def _say(self, phase: str, message: str) -> None:
        if self.on_progress is not None:
            self.on_progress(Progress(phase, 0, len(self.settings.rungs), 0, 0, 0.0, self.settings.time_budget, None,
                                      None, message))  # fmt: skip

    def run(self) -> TuneResult:
        saved = self.target.placement
        t0 = time.monotonic()
        try:
            return self._run(t0)
        finally:
            self.target.set_placement(saved)

    def _run(self, t0: float) -> TuneResult:
        s, notes = self.settings, []
        calibration, how = s.calibration, "the strategies and the cost model, from the devices measured before"
        if calibration is None:
            how = "strategies without the cost model (no calibration asked for)"
        if calibration is None and s.calibrate and not self._cancel.is_set():
            self._say("calibrating", "measuring the devices for the cost model")
            try:
                calibration = calibrate_devices(self.target, self.names, quick=True, calibrate_fn=self.calibrate_fn)
                how = (
                    f"the strategies and the cost model, from a calibration of {QUICK_CALIBRATION_TOKENS} decode steps"
                )
            except ArgumentError as exc:
                how = f"strategies without the cost model: the devices could not be measured ({exc})"
        routing, source = s.routing, "given"
        if routing is None and not self._cancel.is_set():  # the first reference run routes the prompts themselves
            self._say("reference", "one device: the reference hashes and the prompts' routing")
            self.bench.reference(s.rungs[0].tokens)
            routing, source = self.bench.routing, "measured: one run over the prompts on one device"
        qs = tuple(s.qs) if self.draft is not None else (None,)
        candidates, space_notes = search_space(self.shape, self.names, self.primary, self.fast, self.budgets,
                                               calibration, routing, qs, s.modes)  # fmt: skip
        notes += space_notes
        spent = time.monotonic() - t0
        search = Search(candidates, self.bench, self.fast, time_budget=max(s.time_budget - spent, 1e-3),
                        rungs=s.rungs, constraints=self.constraints, on_progress=self.on_progress)  # fmt: skip
        with self._lock:
            self._search = search
        if self._cancel.is_set():
            search.cancel()
        result = search.run()
        result.seconds += spent
        budgets = {d: self.budgets.get(d) for d in self.names}
        return TuneResult(result, self.primary, self.names, budgets, dict(s.caps), len(candidates), routing, source,
                          how, notes + result.notes, tuple(s.modes))  # fmt: skip


def _demo_prompts() -> list[str]:
    from ..checkpoints.demo import DEMO_PROMPTS

    return list(DEMO_PROMPTS)


class KLConstraint:
    """--max-kl as the search's constraint: a point's mode and placement judged by an engine.runs.quality.KLLimit (in
    f32, at the model's own experts per token; the reference mode costs nothing and is never measured). cost(point):
    what was measured for its setting (None: nothing, or not yet)."""

    def __init__(self, limit, primary: str):
        self.limit, self.devices = limit, (primary,)

    def __call__(self, point: Point) -> str | None:
        c = point.candidate
        return self.limit.why(c.mode, "f32", None, c.placement.describe(), self.devices)

    def cost(self, point: Point):
        from ..runs.quality import is_fast, quality_key

        c = point.candidate
        if not is_fast(c.mode, "f32"):
            return None
        return self.limit.costs.get(quality_key(c.mode, "f32", None, c.placement.describe(), self.devices))
