"""Placement: which device owns each expert of each MoE layer.

A Placement is plain data (device names per layer and expert); Model.set_placement hands it to the core,
which checks it first and keeps the previous placement if anything is wrong. The text form, used by the
command line, is a list of RULE=DEVICE separated by ';', applied in order over a default device:

    0-7=cuda:0; 8-15=cpu:0        layers 0..7 on the GPU, 8..15 on the CPU
    *=cpu:1; 3.0-5=cpu:0          every MoE layer on cpu:1, but experts 0..5 of layer 3 on cpu:0
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .checkpoint import ModelConfig
from .errors import ArgumentError, RangeError

_RULE = re.compile(r"^\s*(\*|\d+(?:-\d+)?)(?:\.(\*|\d+(?:-\d+)?))?\s*=\s*([a-z0-9_]+:\d+)\s*$")


def _span(text: str, limit: int, what: str, rule: str) -> range:
    if text == "*":
        return range(limit)
    first, _, last = text.partition("-")
    lo, hi = int(first), int(last or first)
    if lo > hi or hi >= limit:
        raise RangeError(f"placement rule {rule!r}: {what} {text} out of range (0..{limit - 1})")
    return range(lo, hi + 1)


@dataclass
class Placement:
    """owners[layer][expert] is a device name for MoE layers; None for every entry of a dense layer."""

    owners: list[list[str | None]]

    @classmethod
    def single(cls, config: ModelConfig, device: str) -> Placement:
        return cls(
            [
                [device if config.is_moe_layer(layer) else None] * config.num_experts
                for layer in range(config.num_layers)
            ]
        )

    @classmethod
    def parse(cls, text: str, config: ModelConfig, default: str = "cpu:0") -> Placement:
        """The text form (see the module docstring)."""
        placement = cls.single(config, default)
        if config.num_experts <= 0:
            raise ArgumentError("placement: this model has no experts to place")
        for rule in filter(None, (r.strip() for r in text.split(";"))):
            match = _RULE.match(rule)
            if not match:
                raise ArgumentError(
                    f"placement rule {rule!r}: expected LAYERS=DEVICE or LAYER.EXPERTS=DEVICE, e.g. '0-3=cuda:0'"
                )
            layers = _span(match.group(1), config.num_layers, "layer", rule)
            experts = _span(match.group(2) or "*", config.num_experts, "expert", rule)
            if not any(config.is_moe_layer(layer) for layer in layers):
                raise ArgumentError(f"placement rule {rule!r}: no MoE layer in {match.group(1)} (dense layers have no "
                                    "experts)")  # fmt: skip
            for layer in layers:
                if config.is_moe_layer(layer):
                    for e in experts:
                        placement.owners[layer][e] = match.group(3)
        return placement

    def move_layer(self, layer: int, device: str) -> None:
        if not 0 <= layer < len(self.owners) or self.owners[layer][0] is None:
            raise RangeError(f"layer {layer} is not an MoE layer of this model")
        self.owners[layer] = [device] * len(self.owners[layer])

    def move_expert(self, layer: int, expert: int, device: str) -> None:
        if not 0 <= layer < len(self.owners) or self.owners[layer][0] is None:
            raise RangeError(f"layer {layer} is not an MoE layer of this model")
        if not 0 <= expert < len(self.owners[layer]):
            raise RangeError(f"expert {expert} out of range (0..{len(self.owners[layer]) - 1})")
        self.owners[layer][expert] = device

    def devices(self) -> list[str]:
        return sorted({d for row in self.owners for d in row if d is not None})

    def describe(self) -> str:
        """The shortest text form this module writes: runs of whole MoE layers, then per-expert rules."""

        def runs(items):  # [(index, device)] -> [(first, last, device)]
            out = []
            for i, d in items:
                if out and out[-1][2] == d and out[-1][1] == i - 1:
                    out[-1][1] = i
                else:
                    out.append([i, i, d])
            return out

        def span(lo, hi):
            return f"{lo}-{hi}" if hi > lo else f"{lo}"

        moe = [layer for layer, row in enumerate(self.owners) if row and row[0] is not None]
        whole = [(k, self.owners[layer][0]) if len(set(self.owners[layer])) == 1 else (k, None) for k, layer in
                 enumerate(moe)]  # fmt: skip
        rules = []
        for first, last, dev in runs(whole):
            if dev is not None:
                rules.append(f"{span(moe[first], moe[last])}={dev}")
            else:
                for k in range(first, last + 1):
                    layer = moe[k]
                    for lo, hi, d in runs(list(enumerate(self.owners[layer]))):
                        rules.append(f"{layer}.{span(lo, hi)}={d}")
        return "; ".join(rules)

    def to_owner_array(self, device_index) -> np.ndarray:
        """Engine device indices, -1 for dense layers; device_index maps a name to an index."""
        index: dict[str, int] = {}
        rows = []
        for row in self.owners:
            out = []
            for d in row:
                if d is None:
                    out.append(-1)
                    continue
                if d not in index:
                    index[d] = device_index(d)
                out.append(index[d])
            rows.append(out)
        return np.ascontiguousarray(np.array(rows, dtype=np.int32).reshape(-1))
