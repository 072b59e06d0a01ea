"""The placement strategies the window offers before the engine has routing statistics.

Strategies that need per-expert hit counts (complete-layer cold placement, hot experts first, critical-path
balance) belong to engine.placement with engine.routing; the window shows them disabled until then.
"""

from __future__ import annotations

from engine.checkpoint import ModelConfig
from engine.placement import Placement

NEEDS_ROUTING = "comes with the engine's placement strategies over routing statistics (issue 7)"


def all_on(config: ModelConfig, device: str) -> Placement:
    """Every expert of every MoE layer on one device."""
    return Placement.single(config, device)


def uniform_split(config: ModelConfig, devices: list[str]) -> Placement:
    """MoE layers in contiguous blocks of (nearly) equal size, one block per device, in the order given."""
    if not devices:
        raise ValueError("uniform split: no device to place experts on")
    placement = Placement.single(config, devices[0])
    layers = config.moe_layers
    n, k = len(layers), len(devices)
    for i, layer in enumerate(layers):
        placement.owners[layer] = [devices[i * k // n]] * config.num_experts
    return placement
