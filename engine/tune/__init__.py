"""`expertbench tune`: a measured search over placements and the draft length q, and its Pareto front.

The search space comes from what the engine already knows how to plan (engine.placement.strategy): every strategy under
the devices' budgets, the k hottest whole layers on the fast device for every k, experts hottest first and the
critical-path balance at fractions of the fast device's budget, and single-expert moves of the hottest experts
onto the fast device (and of its coldest off it) from the placements the cost model (engine.placement.costmodel) likes
best; each crossed with the draft lengths and the reduction modes asked for (--modes: the reference mode alone by
default; owner_local measures every placement in that mode too). Every candidate fits the budgets
(engine.placement.placement's rule: a device's room for experts, or a smaller --budget) before it is ever measured.

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
out of the choice without hiding them; `--max-kl` is one (engine.runs.quality.KLLimit: the mean KL of the point's mode
and placement against the reference mode, measured once per setting that can differ).

Search and Tuning (on an engine) are apart so that the search runs on made-up measurements in tests: a bench is any
object with reference(tokens) -> (hashes, seconds), measure(candidate, tokens, repeats) -> Measurement and
cancel().

The command's options and its printing are engine/cli/tune.py; the window's Tune panel (app/) drives the same Tuning.
"""

from __future__ import annotations

from ..session import QUICK_CALIBRATION_TOKENS as CALIBRATION_TOKENS  # the calibration that seeds the candidates
from .bench import EngineBench, KLConstraint, TuneResult, TuneSettings, Tuning
from .report import point_dict, profile_for, report, text
from .search import (
    AUTO_Q,
    BUDGET_FRACTIONS,
    DEFAULT_RUNGS,
    DEFAULT_TIME_BUDGET,
    ETA,
    GENEROUS_ETA,
    HOT_SEEDS,
    MIN_KEPT,
    MOVE_STEPS,
    PLAN_SHARE,
    QUALITY_TOKENS,
    REFINE,
    REFINE_ROUNDS,
    SLOWDOWN,
    Candidate,
    Measurement,
    Point,
    Progress,
    Rung,
    Search,
    SearchResult,
    check_budgets,
    check_time_budget,
    dominates,
    front_of,
    pareto_front,
    pareto_ranks,
    parse_max_kl,
    parse_modes,
    parse_q,
    promote,
    search_space,
)
