"""The placement strategies the window offers: engine.strategy, with the window's choices filled in.

The routing panel names a fast device and a budget for it; the other devices are limited by what they have room
for. The two-device strategies (cold layers, critical path) pair the fast device with the primary, or, when the
fast device is the primary, with the first other device; hot-first fills the fast device first, then the others
from the highest measured bandwidth down. Predictions are the cost model's (engine.costmodel) for target-only
greedy decoding, one token per step.
"""

from __future__ import annotations

from engine import strategy
from engine.costmodel import Calibration, ModelShape
from engine.errors import ArgumentError
from engine.placement import Placement
from engine.routing import RoutingStats

# the strategy buttons: name -> (button text, what it does, whether it needs routing statistics)
STRATEGIES = {
    "cold-layers": ("Cold layers", "whole MoE layers on the fast device, as many as its budget holds; the rest "
                    "whole on the other device, so no layer step splits across two devices", False),
    "hot-first": ("Hot first", "the experts the router picks most go to the fast device until its budget is "
                  "full, then to the next device", True),
    "critical-path": ("Critical path", "from the other device, the most used experts move to the fast device while "
                      "that lowers the predicted layer time, max(fast, other)", True),
}  # fmt: skip


def all_on(shape: ModelShape, device: str) -> Placement:
    """Every expert of every MoE layer on one device."""
    return strategy.single_device(shape, device).placement


def uniform_split(shape: ModelShape, devices: list[str]) -> Placement:
    """MoE layers in contiguous blocks of (nearly) equal size, one block per device, in the order given."""
    return strategy.uniform_split(shape, devices).placement


def peer_of(fast: str, devices: list[str], primary: str) -> str:
    """The other device of a two-device strategy."""
    if fast != primary:
        return primary
    others = [d for d in devices if d != fast]
    if not others:
        raise ArgumentError(f"this strategy needs a second device besides {fast}")
    return others[0]


def plan(name: str, shape: ModelShape, devices: list[str], primary: str, fast: str, budgets: dict[str, int],
         calibration: Calibration | None, stats: RoutingStats | None) -> strategy.Plan:  # fmt: skip
    """engine.strategy's plan for one of STRATEGIES; ArgumentError (the engine's text) when budgets cannot hold it."""
    common = {"budgets": budgets, "calibration": calibration, "stats": stats}
    if name == "cold-layers":
        return strategy.cold_layers(shape, fast, peer_of(fast, devices, primary), **common)
    if name == "critical-path":
        return strategy.critical_path(shape, fast, peer_of(fast, devices, primary), **common)
    if name == "hot-first":
        rest = [d for d in devices if d != fast]
        if calibration is not None:
            rest.sort(key=lambda d: -calibration.rate(d).bandwidth)
        return strategy.hot_first(shape, [fast, *rest], **common)
    raise ArgumentError(f"unknown strategy {name!r} (expected one of {', '.join(STRATEGIES)})")
