"""`expertbench tune`: a measured search over placements and the draft length q, and its Pareto front.

The search space comes from what the engine already knows how to plan (engine.strategy): every strategy under the
devices' budgets, the k hottest whole layers on the fast device for every k, experts hottest first and the
critical-path balance at fractions of the fast device's budget, and single-expert moves of the hottest experts
onto the fast device (and of its coldest off it) from the placements the cost model (engine.costmodel) likes best;
each crossed with the draft lengths and the reduction modes asked for (--modes: the reference mode alone by
default; owner_local measures every placement in that mode too). Every candidate fits the budgets
(engine.placement's rule: a device's room for experts, or a smaller --budget) before it is ever measured.

Time goes to measurements, by successive halving: every candidate decodes a short run (rung 0); the better half
(a third when time is short; half of the places by speed, the rest by Pareto rank of speed against bytes on the
fast device, so the front keeps its cheap end) go on to longer runs, and so on up to the last rung's repeated runs.
The rungs are planned in PLAN_SHARE of the time budget from the one-device run's time (fewer candidates when even a
third at each rung does not fit) and cut to the time left at each rung. With the time left, the front's points
that were measured only briefly are measured at the deepest rung, then the fastest few again in turns, their runs
pooled; the choice among them compares each with the others of its turns, so that neither one run's luck nor the
machine's drift between turns decides it. Cancel stops before the next measurement (and the run under way
at its next step).

The report is the measured front of decode tokens/s against expert bytes on the fast device: each point with its
placement, q, mode, median and spread over its runs, bytes per device and output hashes. In the reference mode every
hash must equal that of one device alone (the target without draft, every expert on the primary, decoding as many
tokens): a point that differs is kept and flagged, never hidden, never chosen. owner_local points' outputs change
with the placement (another float association), so their hashes are not held to one device's: their quality is
what --max-kl judges. A constraint (a callable: point -> why it is excluded, or None) keeps points off the front and
out of the choice without hiding them; `--max-kl` is one (engine.quality.KLLimit: the mean KL of the point's mode
and placement against the reference mode, measured once per setting that can differ).

Search and Tuning (on an engine) are apart so that the search runs on made-up measurements in tests: a bench is any
object with reference(tokens) -> (hashes, seconds), measure(candidate, tokens, repeats) -> Measurement and
cancel().

The command's options and its printing are engine/cli/tune.py; the window's Tune panel (app/) drives the same Tuning.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import strategy as S
from .costmodel import Calibration, ModelShape, calibrate, expert_shares, predict_tokens_per_second
from .errors import ArgumentError, EngineError
from .placement import Placement, device_bytes, expert_rooms, mib
from .routing import RoutingStats
from .speculative import MAX_DRAFT_TOKENS

DEFAULT_TIME_BUDGET = 120.0  # seconds
AUTO_Q = (1, 2, 3, 4)  # the draft lengths `--q auto` tries
ETA = 3  # each rung keeps at least a third of the candidates (at least MIN_KEPT) ...
GENEROUS_ETA = 2  # ... a half where the time budget allows it
PLAN_SHARE = 0.6  # the rungs are planned in this share of the time budget; the rest settles the best (REFINE)
MIN_KEPT = 2
REFINE = 3  # the fastest points of the deepest rung measured again, in turns, while time is left ...
REFINE_ROUNDS = 6  # ... this many turns at most
SLOWDOWN = 1.5  # a candidate's run is assumed this much slower than one device's until measured
HOT_SEEDS = 3  # single-expert moves start from this many placements the cost model likes best
MOVE_STEPS = (1, 2, 4, 8)  # experts moved onto (or off) the fast device from each seed
BUDGET_FRACTIONS = (0.25, 0.5, 0.75)  # hot-first and critical-path also at these shares of the fast budget
CALIBRATION_TOKENS = 16  # the short calibration that seeds the candidates (as `expertbench plan` makes it)
QUALITY_TOKENS = 16  # tokens per prompt of the quality cost --max-kl measures for a fast mode's setting


@dataclass(frozen=True)
class Rung:
    tokens: int  # per prompt
    repeats: int


DEFAULT_RUNGS = (Rung(8, 1), Rung(16, 1), Rung(32, 2), Rung(64, 3))


# ---- candidates -----------------------------------------------------------------------------------------------


@dataclass
class Candidate:
    """A placement, a draft length (None: no draft) and a reduction mode, where it came from, its bytes per device
    and the cost model's decode tokens/s for the placement (target only; None without a calibration)."""

    placement: Placement
    q: int | None
    origin: str
    device_bytes: dict[str, int]
    predicted: float | None = None
    mode: str = "reference"

    @property
    def key(self) -> tuple[str, int | None, str]:
        return self.placement.describe(), self.q, self.mode


def parse_q(text: str) -> tuple[int, ...]:
    """--q: 'auto' (AUTO_Q) or one draft length 1..MAX_DRAFT_TOKENS."""
    if text == "auto":
        return AUTO_Q
    try:
        q = int(text)
    except ValueError:
        q = 0
    if not 1 <= q <= MAX_DRAFT_TOKENS:
        raise ArgumentError(f"--q {text}: expected auto or a draft length of 1..{MAX_DRAFT_TOKENS} tokens")
    return (q,)


def parse_modes(text: str) -> tuple[str, ...]:
    """--modes: reduction modes, comma-separated (engine.run.REDUCTION_MODES), each once, in the order given."""
    from .run import REDUCTION_MODES

    modes = tuple(dict.fromkeys(m.strip() for m in text.split(",")))
    bad = [m for m in modes if m not in REDUCTION_MODES]
    if bad or not modes:
        what = f"unknown mode {bad[0]!r}" if bad and bad[0] else "an empty mode"
        raise ArgumentError(f"--modes {text}: {what}; expected a comma-separated list of "
                            f"{', '.join(REDUCTION_MODES)}")  # fmt: skip
    return modes


def parse_max_kl(text: str) -> float:
    """--max-kl: a number of nats >= 0 (engine.quality.within_max_kl's rule)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:
        raise ArgumentError(f"--max-kl {text}: expected a number of nats >= 0")
    return value


def check_time_budget(seconds: float) -> float:
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ArgumentError(f"--time-budget {seconds}: expected a positive number of seconds")
    return float(seconds)


def check_budgets(shape: ModelShape, names: list[str], fast: str, budgets: dict[str, int], caps: dict[str, int],
                  rooms: dict) -> None:  # fmt: skip
    """ArgumentError when no placement fits the budgets (together they hold less than the experts), or when the fast
    device cannot hold a single expert (there is nothing to search)."""
    if all(d in budgets for d in names) and sum(budgets.values()) < shape.total_bytes:
        held = ", ".join(f"{d} {mib(budgets[d])}" for d in names)
        raise ArgumentError(f"--budget: the budgets ({held}) hold less than the {mib(shape.total_bytes)} of experts: "
                            "no placement fits; expected budgets that hold every expert together")  # fmt: skip
    smallest = min(shape.bytes_of(layer) for layer in shape.moe_layers)
    if budgets.get(fast, smallest) < smallest:
        why = (f"--budget {fast}={caps[fast]}: {fast}'s budget of {mib(budgets[fast])}" if fast in caps and
               caps[fast] == budgets[fast] else f"{fast} ({rooms[fast].explain()})")  # fmt: skip
        raise ArgumentError(f"{why} holds no expert (one is {mib(smallest)}): there is nothing to tune; expected at "
                            f"least {mib(smallest)} on the fast device")  # fmt: skip


def _fits(used: dict[str, int], budgets: dict[str, int]) -> bool:
    return all(n <= budgets.get(d, n) for d, n in used.items())


def search_space(shape: ModelShape, names: list[str], primary: str, fast: str, budgets: dict[str, int],
                 calibration: Calibration | None = None, stats: RoutingStats | None = None,
                 qs: Sequence[int | None] = (None,),
                 modes: Sequence[str] = ("reference",)) -> tuple[list[Candidate], list[str]]:  # fmt: skip
    """The candidates (see the module docstring), every one within the budgets, in the order the search keeps them
    when the time budget cannot measure them all: one device first, then the cost model's best (each placement in
    every mode with every q); and notes on what was left out and why."""
    notes: list[str] = []
    seeds: list[tuple[str, Placement]] = [("one device", shape.empty_placement(primary))]
    peer = S.peer_of(fast, names, primary) if len(names) > 1 else primary
    order = S.fastest_first(fast, names, calibration)
    common = {"calibration": calibration, "stats": stats}

    def plan(origin: str, make: Callable[[], S.Plan]) -> None:
        try:
            seeds.append((origin, make().placement))
        except EngineError as exc:  # the strategies' refusals name them already
            notes.append(str(exc) if str(exc).startswith(origin) else f"{origin}: {exc}")

    if len(names) > 1:
        plan("single device", lambda: S.single_device(shape, fast, budgets, **common))
        plan("uniform split", lambda: S.uniform_split(shape, order, budgets, **common))
        room = budgets.get(fast, shape.total_bytes)
        for k in range(1, len(shape.moe_layers) + 1):
            fast_room = min(room, sum(sorted(shape.layer_bytes_of(layer) for layer in shape.moe_layers)[:k]))
            plan(f"{k} cold layers", lambda r=fast_room: S.cold_layers(shape, fast, peer, {**budgets, fast: r},
                                                                      **common))  # fmt: skip
        for share in (*BUDGET_FRACTIONS, 1.0):
            b = {**budgets, fast: int(room * share)}
            what = f"{int(share * 100)} % of {fast}'s budget"
            plan(f"hot first, {what}", lambda b=b: S.hot_first(shape, order, b, **common))
            if calibration is not None:
                plan(f"critical path, {what}", lambda b=b: S.critical_path(shape, fast, peer, b, **common))
        seeds += _moves(shape, seeds, fast, peer, budgets, calibration, stats)
    placements: dict[str, tuple[str, Placement]] = {}
    for origin, placement in seeds:
        placements.setdefault(placement.describe(), (origin, placement))
    out: list[Candidate] = []
    for origin, placement in placements.values():
        used = device_bytes(placement, shape.bytes_of, names)
        if not _fits(used, budgets):
            notes.append(f"{origin}: over a budget ({placement.describe()})")
            continue
        predicted = None if calibration is None else predict_tokens_per_second(shape, placement, calibration, stats)
        out += [Candidate(placement, q, origin, used, predicted, mode) for mode in modes for q in qs]
    first, rest = out[: len(qs) * len(modes)], out[len(qs) * len(modes) :]
    rest.sort(key=lambda c: -(c.predicted or 0.0))  # stable: the strategies' order without a calibration
    return first + rest, notes


def _moves(shape: ModelShape, seeds: list[tuple[str, Placement]], fast: str, peer: str, budgets: dict[str, int],
           calibration: Calibration | None, stats: RoutingStats | None) -> list[tuple[str, Placement]]:  # fmt: skip
    """Single-expert moves: from the seeds the cost model likes best (the strategies' first without a calibration),
    the hottest experts elsewhere onto the fast device, and the coldest on it off to the peer, MOVE_STEPS at a
    time, while the budgets hold."""
    shares = expert_shares(shape, stats)
    pairs = sorted(((layer, e) for layer in shape.moe_layers for e in range(shape.num_experts)),
                   key=lambda p: (-shares[p], p))  # fmt: skip
    ranked = list(seeds)
    if calibration is not None:
        ranked = sorted(ranked, key=lambda s: -predict_tokens_per_second(shape, s[1], calibration, stats))
    out = []
    for origin, seed in ranked[:HOT_SEEDS]:
        for direction, device, chosen in (("+", fast, [p for p in pairs if seed.owners[p[0]][p[1]] != fast]),
                                          ("-", peer, [p for p in reversed(pairs)
                                                       if seed.owners[p[0]][p[1]] == fast])):  # fmt: skip
            for n in MOVE_STEPS:
                if n > len(chosen):
                    break
                moved = seed.copy()
                for layer, e in chosen[:n]:
                    moved.move_expert(layer, e, device)
                if not _fits(device_bytes(moved, shape.bytes_of), budgets):
                    break
                hot = "hottest" if direction == "+" else "coldest"
                out.append((f"{origin}, {direction}{n} {hot} expert{'s' if n > 1 else ''}", moved))
    return out


# ---- measurements and points ----------------------------------------------------------------------------------


@dataclass
class Measurement:
    """One measurement run of a candidate: decode tokens/s of each complete repeat, the output hashes (one per
    prompt), the acceptance, how long it took."""

    tokens: int
    repeats: int
    rates: list[float]
    output_sha256: list[str]
    accept_rate: float | None = None
    seconds: float = 0.0
    reference_sha256: list[str] = field(default_factory=list)  # the one-device hashes at these tokens
    rung: int = 0  # the rung whose length it ran
    turn: int | None = None  # the turn of measuring the fastest again it belongs to (Search._refine)

    @property
    def complete(self) -> bool:
        return bool(self.rates) and bool(self.output_sha256)


@dataclass
class Point:
    """A candidate with its measurements, one per rung it reached (the last is the longest: the one reported)."""

    candidate: Candidate
    measurements: list[Measurement] = field(default_factory=list)
    excluded: str | None = None  # why a constraint keeps it off the front and out of the choice

    @property
    def last(self) -> Measurement:
        return self.measurements[-1]

    @property
    def rung(self) -> int:
        return self.last.rung if self.measurements else -1

    @property
    def rates(self) -> list[float]:
        """Decode tokens/s of every repeat measured at the point's deepest rung (its measurements there pooled)."""
        top = self.rung
        return [r for m in self.measurements if m.rung == top for r in m.rates if math.isfinite(r)]

    @property
    def speed(self) -> float:
        rates = self.rates
        return statistics.median(rates) if rates else math.nan

    @property
    def spread(self) -> tuple[float, float]:
        rates = self.rates
        return (min(rates), max(rates)) if rates else (math.nan, math.nan)

    def fast_bytes(self, fast: str) -> int:
        return self.candidate.device_bytes.get(fast, 0)

    @property
    def same_as_reference(self) -> bool:
        """Every measurement gave the one-device hashes."""
        return all(m.output_sha256 == m.reference_sha256 for m in self.measurements)

    @property
    def flagged(self) -> bool:
        """A reference-mode point whose hashes differ from one device's (owner_local ones may: not flagged)."""
        return self.candidate.mode == "reference" and not self.same_as_reference


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """(speed, bytes): a is at least as fast with at most as many bytes, and better in one."""
    return a[0] >= b[0] and a[1] <= b[1] and (a[0] > b[0] or a[1] < b[1])


def front_of(items, speed, nbytes) -> list:
    """The items no other dominates (faster at no more bytes, or as fast at fewer), by bytes ascending; of equal
    items the first; items without a finite speed take no part. speed, nbytes: functions of an item."""
    alive = sorted((i for i in items if math.isfinite(speed(i))), key=lambda i: (nbytes(i), -speed(i)))
    front: list = []
    for i in alive:
        if not front or speed(i) > speed(front[-1]):
            front.append(i)
    return front


def pareto_front(points: Sequence[Point], fast: str) -> list[Point]:
    """The measured front: decode tokens/s against bytes on the fast device (front_of); points without a
    measurement or excluded by a constraint take no part."""
    alive = [p for p in points if p.excluded is None and p.measurements]
    return front_of(alive, lambda p: p.speed, lambda p: p.fast_bytes(fast))


def pareto_ranks(points: Sequence[Point], fast: str) -> dict[int, int]:
    """id(point) -> its front (0: the Pareto front, 1: the front once that is removed, ...)."""
    ranks, left, rank = {}, list(points), 0
    while left:
        front = pareto_front(left, fast) or left
        for p in front:
            ranks[id(p)] = rank
        ids = {id(p) for p in front}
        left = [p for p in left if id(p) not in ids]
        rank += 1
    return ranks


def promote(points: Sequence[Point], keep: int, fast: str) -> list[Point]:
    """The points that go on to the next rung: half of the places by speed, the rest by Pareto rank (then speed)."""
    alive = [p for p in points if p.excluded is None and math.isfinite(p.speed)]
    by_speed = sorted(alive, key=lambda p: -p.speed)
    chosen = by_speed[: (keep + 1) // 2]
    ranks, taken = pareto_ranks(alive, fast), {id(p) for p in chosen}
    rest = sorted((p for p in alive if id(p) not in taken), key=lambda p: (ranks[id(p)], -p.speed))
    return chosen + rest[: keep - len(chosen)]


# ---- the search -----------------------------------------------------------------------------------------------


@dataclass
class Progress:
    """What the search is doing, for a progress line or bar."""

    phase: str  # "calibrating", "reference", "measuring", "done"
    rung: int
    rungs: int
    done: int  # measurements made
    total: int  # measurements planned (changes when a rung is re-planned)
    elapsed: float
    budget: float
    best: float | None  # the fastest measured decode tokens/s so far
    point: Point | None = None  # the point just measured
    message: str = ""


@dataclass
class SearchResult:
    points: list[Point]
    front: list[Point]
    fast: str
    references: dict[int, list[str]]  # tokens per prompt -> the one-device hashes
    rungs: list[Rung]
    planned: list[int]  # candidates per rung as planned at the start
    seconds: float
    cancelled: bool
    stopped: str  # "" when every planned rung ran; otherwise why not
    notes: list[str] = field(default_factory=list)

    def chosen(self) -> Point | None:
        """The point to keep, of those not flagged (a reference-mode point's hashes are one device's) and that no
        constraint excludes: where the fastest were measured again in turns, the one fastest against the others of
        its turns (the median of its speed over the turn's median: a machine that speeds up or slows down between
        turns moves them all alike); else the fastest of those measured longest."""
        good = [p for p in self.points if p.excluded is None and not p.flagged and math.isfinite(p.speed)]
        if not good:
            return None
        top = max(p.rung for p in good)
        good = [p for p in good if p.rung == top]
        turns: dict[int, dict[int, float]] = {}
        for p in good:
            for m in p.measurements:
                if m.turn is not None and m.rates:
                    turns.setdefault(m.turn, {})[id(p)] = statistics.median(m.rates)
        scores: dict[int, list[float]] = {}
        for speeds in turns.values():
            if len(speeds) > 1:
                middle = statistics.median(speeds.values())
                for key, speed in speeds.items():
                    scores.setdefault(key, []).append(speed / middle)
        if scores:
            return max((p for p in good if id(p) in scores), key=lambda p: statistics.median(scores[id(p)]))
        return max(good, key=lambda p: p.speed)


class Search:
    """Successive halving over candidates with a bench (see the module docstring); run() on any thread, cancel()
    from another."""

    def __init__(self, candidates: Sequence[Candidate], bench, fast: str, *, time_budget: float = DEFAULT_TIME_BUDGET,
                 rungs: Sequence[Rung] = DEFAULT_RUNGS, eta: int = ETA,
                 constraints: Sequence[Callable[[Point], str | None]] = (), on_progress=None,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        if not candidates:
            raise ArgumentError("nothing to tune: no candidate placement fits the budgets")
        if eta < 2:
            raise ArgumentError(f"eta {eta}: expected 2 or more")
        self.points = [Point(c) for c in candidates]
        self.bench, self.fast = bench, fast
        self.budget = check_time_budget(time_budget)
        self.rungs, self.eta = list(rungs), eta
        self.constraints = list(constraints)
        self.on_progress = on_progress
        self.clock = clock
        self._cancel = threading.Event()
        self._references: dict[int, list[str]] = {}
        self._unit = math.nan  # seconds per token per prompt of a measurement (learned)
        self._t0 = 0.0
        self._done = self._total = 0
        self.notes: list[str] = []

    def cancel(self) -> None:
        self._cancel.set()
        self.bench.cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def elapsed(self) -> float:
        return self.clock() - self._t0

    def estimate(self, rung: Rung) -> float:
        return self._unit * rung.tokens * rung.repeats

    def plan(self, n: int, budget: float) -> list[int]:
        """Candidates per rung. Every candidate and every rung, each keeping half of the one before, when that fits
        in PLAN_SHARE of the budget; else a third; else as many rungs as fit with at least eta^(rungs - 1)
        candidates, then as many candidates as fit in the whole budget (at least MIN_KEPT each rung)."""

        def counts(n0: int, depth: int, eta: int) -> list[int]:
            out = [n0]
            for _ in range(depth - 1):
                out.append(min(out[-1], max(MIN_KEPT, math.ceil(out[-1] / eta))))
            return out

        def cost(c: list[int]) -> float:
            return sum(k * self.estimate(r) for k, r in zip(c, self.rungs, strict=False))

        for eta in sorted({min(GENEROUS_ETA, self.eta), self.eta}):
            if cost(counts(n, len(self.rungs), eta)) <= PLAN_SHARE * budget:
                return counts(n, len(self.rungs), eta)
        for depth in range(len(self.rungs), 0, -1):
            for n0 in range(n, min(n, self.eta ** (depth - 1)) - 1, -1):
                if cost(counts(n0, depth, self.eta)) <= budget:
                    return counts(n0, depth, self.eta)
        return [1]

    def _progress(self, phase: str, rung: int, point: Point | None = None, message: str = "") -> None:
        if self.on_progress is None:
            return
        speeds = [p.speed for p in self.points if p.measurements and math.isfinite(p.speed)]
        self.on_progress(Progress(phase, rung, len(self.rungs), self._done, self._total, self.elapsed(), self.budget,
                                  max(speeds) if speeds else None, point, message))  # fmt: skip

    def _reference(self, rung: int, tokens: int) -> list[str]:
        if tokens not in self._references:
            self._progress("reference", rung, message=f"one device, {tokens} tokens per prompt")
            hashes, seconds = self.bench.reference(tokens)
            self._references[tokens] = list(hashes)
            if not math.isfinite(self._unit):
                self._unit = SLOWDOWN * seconds / tokens
        return self._references[tokens]

    def _measure(self, point: Point, r: int, turn: int | None = None) -> bool:
        """One measurement of a point at rung r's length; False when cancelled (nothing is kept then)."""
        rung = self.rungs[r]
        reference = self._reference(r, rung.tokens)
        if self.cancelled:
            return False
        m = self.bench.measure(point.candidate, rung.tokens, rung.repeats)
        if self.cancelled and not m.complete:
            return False  # a run cut short measures nothing
        m.rung, m.turn, m.reference_sha256 = r, turn, list(reference)
        point.measurements.append(m)
        for check in self.constraints:
            point.excluded = point.excluded or check(point)
        self._learn(m)
        self._done += 1
        self._progress("measuring", r, point)
        return True

    def _fits(self, rung: Rung) -> bool:
        return self.elapsed() + self.estimate(rung) <= self.budget

    def run(self) -> SearchResult:
        """The rungs (module docstring), then, with the time left, the front's points measured at the deepest rung
        reached until every point of the front has been (a short run's luck does not stay on the front), then the
        fastest REFINE again in turns."""
        self._t0 = self.clock()
        stopped, planned, alive, deepest = "", [], list(self.points), 0
        for r, rung in enumerate(self.rungs):
            if self.cancelled:
                break
            self._reference(r, rung.tokens)
            left = self.budget - self.elapsed()
            if r == 0:
                planned = self.plan(len(alive), left)
                if planned[0] < len(alive):
                    self.notes.append(f"the time budget measures {planned[0]} of the {len(alive)} candidates (the "
                                      "cost model's best)")  # fmt: skip
                alive = alive[: planned[0]]
            else:
                wanted = planned[r] if r < len(planned) else max(MIN_KEPT, math.ceil(len(alive) / self.eta))
                keep = min(wanted, len(alive), math.floor(left / max(self.estimate(rung), 1e-9)))
                if keep < 1:
                    stopped = f"the time budget leaves no room for rung {r + 1} of {len(self.rungs)}"
                    break
                alive = promote(alive, keep, self.fast)
            self._total = self._done + len(alive) + sum(planned[r + 1 :])
            measured = []
            for point in alive:
                if measured and not self._fits(rung):
                    stopped = f"the time budget ran out in rung {r + 1} of {len(self.rungs)}"
                    break
                if not self._measure(point, r):
                    break
                measured.append(point)
            alive, deepest = measured, r if measured else deepest
            if stopped or self.cancelled or not alive:
                break
        for turn in range(REFINE_ROUNDS + 1):  # the front confirmed, then the fastest again, in turns
            if self.cancelled or not self._done or not self._confirm(deepest) or turn == REFINE_ROUNDS:
                break
            if not self._refine(deepest, turn):
                break
        if self.cancelled:
            stopped = "cancelled"
        front = pareto_front(self.points, self.fast)
        self._total = self._done
        self._progress("done", deepest, message=stopped or "every rung measured")
        return SearchResult([p for p in self.points if p.measurements], front, self.fast, dict(self._references),
                            self.rungs, planned, self.elapsed(), self.cancelled, stopped, list(self.notes))  # fmt: skip

    def _confirm(self, deepest: int) -> bool:
        """Every point of the front measured at the deepest rung (the front changes as they are); False when the
        time or a cancel ran out first."""
        while True:
            short = [p for p in pareto_front(self.points, self.fast) if p.rung < deepest]
            if not short:
                return True
            self._total = self._done + len(short)
            for point in sorted(short, key=lambda p: -p.speed):
                if not self._fits(self.rungs[deepest]) or not self._measure(point, deepest):
                    return False

    def _refine(self, deepest: int, turn: int) -> bool:
        """The REFINE fastest points of the deepest rung measured once more each (their runs pool); False when there
        is nothing to settle, or the time or a cancel ran out."""
        top = sorted((p for p in self.points if p.measurements and p.rung == deepest and p.excluded is None
                      and math.isfinite(p.speed)), key=lambda p: -p.speed)[:REFINE]  # fmt: skip
        if len(top) < 2:
            return False
        self._total = self._done + len(top)
        return all(self._fits(self.rungs[deepest]) and self._measure(point, deepest, turn) for point in top)

    def _learn(self, m: Measurement) -> None:
        unit = m.seconds / max(m.tokens * m.repeats, 1)
        if unit > 0:
            self._unit = unit if not math.isfinite(self._unit) or self._done == 0 else 0.7 * self._unit + 0.3 * unit


# ---- on an engine ---------------------------------------------------------------------------------------------


class EngineBench:
    """Measurements with engine.run.DecodeRun on a loaded target (and draft): every run in its candidate's mode (the
    one-device reference runs in the reference mode), its routing not counted into the target's statistics (a
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
        from .run import DecodeRun

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
        from .run import DecodeRun

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
        self.calibrate_fn = calibrate_fn or calibrate
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
                calibration = self.calibrate_fn(self.target, self.names, tokens=CALIBRATION_TOKENS, repeats=1,
                                                warmup_seconds=0.0)  # fmt: skip
                how = f"the strategies and the cost model, from a calibration of {CALIBRATION_TOKENS} decode steps"
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
    from .demo import DEMO_PROMPTS

    return list(DEMO_PROMPTS)


# ---- the report -----------------------------------------------------------------------------------------------


class KLConstraint:
    """--max-kl as the search's constraint: a point's mode and placement judged by an engine.quality.KLLimit (in f32,
    at the model's own experts per token; the reference mode costs nothing and is never measured). cost(point): what
    was measured for its setting (None: nothing, or not yet)."""

    def __init__(self, limit, primary: str):
        self.limit, self.devices = limit, (primary,)

    def __call__(self, point: Point) -> str | None:
        c = point.candidate
        return self.limit.why(c.mode, "f32", None, c.placement.describe(), self.devices)

    def cost(self, point: Point):
        from .quality import is_fast, quality_key

        c = point.candidate
        if not is_fast(c.mode, "f32"):
            return None
        return self.limit.costs.get(quality_key(c.mode, "f32", None, c.placement.describe(), self.devices))


def _number(v):
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def _quality_dict(cost) -> dict | None:
    if cost is None:
        return None
    return {"mean_kl": cost.mean_kl, "max_kl": cost.max_kl, "agreement": cost.agreement,
            "first_divergence": cost.first_divergence, "positions": cost.positions,
            "summary": cost.summary()}  # fmt: skip


def point_dict(p: Point, fast: str, quality: Callable | None = None) -> dict:
    """quality(point) -> its measured engine.quality.QualityCost or None (KLConstraint.cost)."""
    lo, hi = p.spread
    m = p.last
    return {
        "placement": p.candidate.placement.describe(),
        "q": p.candidate.q,
        "mode": p.candidate.mode,
        "origin": p.candidate.origin,
        "decode_tokens_per_second": _number(p.speed),
        "decode_tokens_per_second_min": _number(lo),
        "decode_tokens_per_second_max": _number(hi),
        "accept_rate": _number(m.accept_rate),
        "device_bytes": dict(p.candidate.device_bytes),
        "fast_bytes": p.fast_bytes(fast),
        "output_sha256": list(m.output_sha256),
        "same_as_reference": p.same_as_reference,
        "flagged": p.flagged,
        "quality": _quality_dict(None if quality is None else quality(p)),
        "predicted_tokens_per_second": _number(p.candidate.predicted),
        "tokens_per_prompt": m.tokens,
        "repeats": len(p.rates),  # the deepest rung's runs pooled
        "rung": p.rung,
        "excluded": p.excluded,
    }


def report(result: TuneResult, quality: Callable | None = None) -> dict:
    """One JSON-ready document: the front (bytes ascending), every point measured, the chosen one, the flagged
    (a reference-mode hash not one device's) and the excluded ones (with why), the references. quality: as for
    point_dict."""
    s = result.search
    chosen = s.chosen()

    def pd(p: Point) -> dict:
        return point_dict(p, s.fast, quality)

    return {
        "front": [pd(p) for p in s.front],
        "chosen": None if chosen is None else pd(chosen),
        "differing": [pd(p) for p in s.points if p.flagged],
        "excluded": [pd(p) for p in s.points if p.excluded is not None],
        "points": [pd(p) for p in sorted(s.points, key=lambda p: p.fast_bytes(s.fast))],
        "mode": ",".join(result.modes),  # the modes searched, as --modes takes them
        "modes": list(result.modes),
        "primary": result.primary,
        "fast": s.fast,
        "devices": result.devices,
        "budgets": result.budgets,
        "caps": result.caps,
        "reference": {"placement": f"*={result.primary}", "draft": None,
                      "output_sha256": {str(t): h for t, h in sorted(s.references.items())}},
        "rungs": [{"tokens_per_prompt": r.tokens, "repeats": r.repeats,
                   "planned": s.planned[i] if i < len(s.planned) else 0,
                   "measured": sum(1 for p in s.points if p.rung >= i)} for i, r in enumerate(s.rungs)],
        "candidates": result.candidates,
        "measurements": sum(len(p.measurements) for p in s.points),
        "seeded_by": result.calibrated,
        "routing": result.routing_source,
        "seconds": s.seconds,
        "cancelled": s.cancelled,
        "stopped": s.stopped or None,
        "notes": result.notes,
    }  # fmt: skip


def _elided(placement: str, width: int = 60) -> str:
    """A long placement's start (the JSON report has it whole)."""
    return placement if len(placement) <= width else placement[: width - 3] + "..."


def text(doc: dict, synthetic_note: str = "") -> str:
    """The report for a person: the front as a table, the chosen point, any hash that differs, the excluded points."""
    fast, modes = doc["fast"], doc.get("modes", ["reference"])
    mixed = modes != ["reference"]
    lines = [f"tuned      {doc['candidates']} candidates, {doc['measurements']} measurements in {doc['seconds']:.1f} s"
             f"{' (cancelled: partial)' if doc['cancelled'] else ''}{synthetic_note}",
             f"seeded by  {doc['seeded_by']}"]  # fmt: skip
    if doc["stopped"] and not doc["cancelled"]:
        lines.append(f"stopped    {doc['stopped']}")
    hashes = f"{'reference-mode hashes' if mixed else 'hashes'} against one device, {doc['primary']}"
    if "owner_local" in modes:
        hashes += "; owner_local's own hashes: 'own'"
    lines.append(f"front      decode tokens/s against experts on {fast} (mode {', '.join(modes)}; {hashes})")
    mode_col = f"  {'mode':11}" if mixed else ""
    lines.append(f"  {'tokens/s':>9}  {'min-max':>15}  {'on ' + fast:>12}  {'q':>2}{mode_col}  {'hash':8}  placement")
    for p in doc["front"]:
        lo, hi = p["decode_tokens_per_second_min"], p["decode_tokens_per_second_max"]
        spread = f"{lo:.1f}-{hi:.1f}" if lo is not None else "-"
        same = "same" if p["same_as_reference"] else "DIFFERS" if p["flagged"] else "own"
        q = "-" if p["q"] is None else p["q"]
        mode = f"  {p['mode']:11}" if mixed else ""
        lines.append(f"  {p['decode_tokens_per_second']:9.1f}  {spread:>15}  {mib(p['fast_bytes']):>12}  {q:>2}{mode}  "
                     f"{same:8}  {_elided(p['placement'])}  ({p['origin']})")  # fmt: skip
    c = doc["chosen"]
    if c is not None:
        mode = f", mode {c['mode']}" if mixed else ""
        lines.append(f"chosen     {c['decode_tokens_per_second']:.1f} tokens/s, q {c['q']}{mode}, {c['placement']} "
                     f"({c['origin']}; {c['repeats']} runs of {c['tokens_per_prompt']} tokens per prompt)")  # fmt: skip
    else:
        lines.append("chosen     none: no point was measured with the one-device hashes")
    for p in doc["differing"]:
        ref = doc["reference"]["output_sha256"].get(str(p["tokens_per_prompt"]), [])
        got, want = ", ".join(h[:12] for h in p["output_sha256"]), ", ".join(h[:12] for h in ref)
        lines.append(f"DIFFERS    q {p['q']}, {p['placement']}: output {got} against the one-device {want}")
    for p in doc.get("excluded", ()):
        lines.append(f"excluded   {p['mode']}, q {p['q']}, {_elided(p['placement'])}: {p['excluded']}")
    for note in doc["notes"]:
        lines.append(f"note       {note}")
    if doc.get("out"):
        lines.append(f"profile    {doc['out']}")
    return "\n".join(lines) + "\n"


# ---- the chosen point as a profile ----------------------------------------------------------------------------


def profile_for(point: Point, path, target_ref, draft_ref, primary: str, prompts: list | None,
                routing: RoutingStats | None = None):  # fmt: skip
    """The profile `expertbench regress` replays for a point: its placement, its q, its mode, the prompts and tokens
    it was measured with, the output hashes and acceptance it gave; the devices the placement names. target_ref and
    draft_ref: engine.profile.ModelRef (with fingerprints)."""
    from .demo import DEMO_PROMPTS
    from .history import min_accept_rate
    from .profile import DeviceSpec, Expectations, PlacementSpec, Profile, RoutingSpec, RunSettings, loads

    counts: dict[str, int] = {}
    for name in {primary, *point.candidate.placement.devices()}:
        runtime, _, index = name.partition(":")
        counts[runtime] = max(counts.get(runtime, 0), int(index) + 1)
    devices = {rt: DeviceSpec(n) for rt, n in sorted(counts.items(), key=lambda kv: (kv[0] != "cpu", kv[0]))}
    m = point.last
    use_draft = point.candidate.q is not None and draft_ref is not None
    run = RunSettings(prompts=None if prompts is None or list(prompts) == list(DEMO_PROMPTS) else list(prompts),
                      tokens=m.tokens, repeats=max(m.repeats, 1), q=point.candidate.q if use_draft else None,
                      mode=point.candidate.mode)  # fmt: skip
    accept = min_accept_rate(m.accept_rate) if use_draft and m.accept_rate is not None else None
    profile = Profile(model=target_ref, draft=draft_ref if use_draft else None,
                      description=f"expertbench tune: {point.candidate.origin}, {point.speed:.1f} decode tokens/s "
                                  f"measured", devices=devices, primary=primary,
                      placement=PlacementSpec.from_placement(point.candidate.placement), run=run,
                      expectations=Expectations(output_sha256=list(m.output_sha256), min_accept_rate=accept),
                      routing=None if routing is None else RoutingSpec.inline(routing),
                      path=Path(path).expanduser().resolve())  # fmt: skip
    loads(profile.to_yaml(), profile.path)  # what is written is what a load accepts
    return profile
