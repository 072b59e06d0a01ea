"""The placement strategies the window offers: engine.placement.strategy's, which also picks the peer, orders the
devices and sets the budgets (engine.placement.strategy.choose). This module only names the buttons."""

from __future__ import annotations

from engine.placement import strategy
from engine.placement.costmodel import ModelShape
from engine.placement.placement import Placement

# the strategy buttons: name -> (button text, what it does, whether it needs routing statistics)
STRATEGIES = {name: (strategy.STRATEGIES[name].title, strategy.STRATEGIES[name].what, strategy.STRATEGIES[name].ranks)
              for name in strategy.BUTTONS}  # fmt: skip


def all_on(shape: ModelShape, device: str) -> Placement:
    """Every expert of every MoE layer on one device."""
    return strategy.single_device(shape, device).placement


def uniform_split(shape: ModelShape, devices: list[str]) -> Placement:
    """MoE layers in contiguous blocks of (nearly) equal size, one block per device, in the order given."""
    return strategy.uniform_split(shape, devices).placement
