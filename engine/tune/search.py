"""The search of `expertbench tune`: candidates within the budgets, measurements and points, the Pareto
front, and the successive halving over them on any bench (made-up measurements in tests). engine/tune/ says how."""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..core.errors import ArgumentError, EngineError
from ..placement import strategy as S
from ..placement.costmodel import Calibration, ModelShape, expert_shares, predict_tokens_per_second
from ..placement.placement import Placement, device_bytes, mib
from ..placement.routing import RoutingStats
from ..runs.speculative import MAX_DRAFT_TOKENS

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
    """--modes: reduction modes, comma-separated (engine.runs.run.REDUCTION_MODES), each once, in the order given."""
    from ..runs.run import REDUCTION_MODES

    modes = tuple(dict.fromkeys(m.strip() for m in text.split(",")))
    bad = [m for m in modes if m not in REDUCTION_MODES]
    if bad or not modes:
        what = f"unknown mode {bad[0]!r}" if bad and bad[0] else "an empty mode"
        raise ArgumentError(f"--modes {text}: {what}; expected a comma-separated list of "
                            f"{', '.join(REDUCTION_MODES)}")  # fmt: skip
    return modes


def parse_max_kl(text: str) -> float:
    """--max-kl: a number of nats >= 0 (engine.runs.quality.within_max_kl's rule)."""
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
                fasts = S.fast_devices(fast, names, peer, b, calibration)  # every GPU, balanced against the peer
                plan(f"critical path, {what}", lambda b=b, f=fasts: S.critical_path(shape, f, peer, b, **common))
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

    def _candidates(self) -> list[Point]:
        """The points a choice is made among: not flagged, not excluded, measured, at the deepest rung reached."""
        good = [p for p in self.points if p.excluded is None and not p.flagged and math.isfinite(p.speed)]
        top = max((p.rung for p in good), default=-1)
        return [p for p in good if p.rung == top]

    def _turn_scores(self, good: list[Point]) -> dict[int, list[float]]:
        """Per point (by id), its speed over the median of the others' in each turn they were measured in together."""
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
        return scores

    def chosen(self) -> Point | None:
        """The point to keep, of those not flagged (a reference-mode point's hashes are one device's) and that no
        constraint excludes: where the fastest were measured again in turns, the one fastest against the others of
        its turns (the median of its speed over the turn's median: a machine that speeds up or slows down between
        turns moves them all alike); else the fastest of those measured longest."""
        good = self._candidates()
        if not good:
            return None
        scores = self._turn_scores(good)
        if scores:
            return max((p for p in good if id(p) in scores), key=lambda p: statistics.median(scores[id(p)]))
        return max(good, key=lambda p: p.speed)

    def why_chosen(self) -> str | None:
        """Why the chosen point is not the fastest the front lists (None when it is): the faster one was measured
        in fewer runs, differs from one device's hashes, is excluded, or lost to it in the turns they ran in."""
        chosen = self.chosen()
        listed = [p for p in self.front if math.isfinite(p.speed)]
        if chosen is None or not listed:
            return None
        fastest = max(listed, key=lambda p: p.speed)
        if fastest is chosen or fastest.speed <= chosen.speed:
            return None
        what = f"the {fastest.speed:.1f} tokens/s point (q {fastest.candidate.q if fastest.candidate.q else '-'})"
        if fastest.flagged:
            return f"{what} gives other outputs than one device: never chosen"
        if fastest.excluded is not None:
            return f"{what} is excluded: {fastest.excluded}"
        if fastest.rung < chosen.rung:
            runs = f"{len(chosen.rates)} runs of {chosen.last.tokens} tokens per prompt"
            return f"{what} was measured in {len(fastest.rates)} short run(s) only; the chosen one in {runs}"
        scores = self._turn_scores(self._candidates())
        if id(fastest) in scores and id(chosen) in scores:
            mine, theirs = statistics.median(scores[id(chosen)]), statistics.median(scores[id(fastest)])
            turns = len(scores[id(chosen)])
            return (f"measured again in {turns} turns beside the other fastest points, the chosen one ran "
                    f"{100 * (mine - 1):+.1f} % against each turn's median and {what} {100 * (theirs - 1):+.1f} %: "
                    "its higher figure pools runs from turns where the machine ran faster")  # fmt: skip
        return f"{what} was not measured in the turns the chosen one was compared in"


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
