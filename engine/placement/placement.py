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

from ..checkpoints.checkpoint import ModelConfig
from ..core.errors import ArgumentError, RangeError

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

    def copy(self) -> Placement:
        return Placement([list(row) for row in self.owners])

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


# ---- fit checks and moves ------------------------------------------------------------------------------------
#
# The window and the command line judge edits with these; the core judges them again when a placement is applied
# (it keeps the previous one when a device cannot take the copies), so these are the user-facing explanation.

MIB = 1 << 20
STAGING_SHARE = 10  # a device that holds copies keeps 1/STAGING_SHARE of its memory for experts out of a plan ...
STAGING_MAX = 1 << 30  # ... but never more than this: staging arenas and the runtime's own allocations


class PlacementRefused(ArgumentError):
    """A move or a placement that does not fit or makes no sense; the message says why, with the numbers."""


def format_bytes(n: float) -> str:
    """Bytes as a person reads them: '768 B', '48.0 MiB', '23.5 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def mib(nbytes: float) -> str:
    """Bytes in MiB, one decimal (four below 0.1 MiB, so that a small size does not read as nothing)."""
    value = nbytes / MIB
    return f"{value:.1f} MiB" if value == 0 or abs(value) >= 0.1 else f"{value:.4f} MiB"


def reads_mapped_files(kind: str) -> bool:
    """A CPU device reads experts from the mapped checkpoint: they cost it no memory of its own."""
    return kind == "cpu"


@dataclass(frozen=True)
class ExpertRoom:
    """What one device can give this model's experts: its free memory plus what this model's experts already hold
    there (a plan may reuse that), less a reserve for staging on devices that hold copies."""

    device: str
    free: int  # the device's free memory now
    held: int  # bytes of this model's experts on it now
    reserve: int  # kept out of plans for staging arenas (0 on devices that read the mapped files)
    unlimited: bool = False  # a CPU device: its experts are the mapped files

    @property
    def capacity(self) -> int:
        """Free plus held: what a single edit may fill (the core's own limit)."""
        return self.free + self.held

    @property
    def room(self) -> int:
        """Capacity less the reserve: what a strategy may plan on (never negative)."""
        return max(self.capacity - self.reserve, 0)

    def explain(self) -> str:
        """The rule in numbers, e.g. 'the device has 40.0 MiB for experts = free 2.0 MiB + this model's experts
        42.4 MiB - reserve 4.4 MiB'."""
        if self.unlimited:
            return "the device reads the experts from the mapped files (no memory of its own is needed)"
        return (f"the device has {mib(self.room)} for experts = free {mib(self.free)} + this model's experts "
                f"{mib(self.held)} - reserve {mib(self.reserve)} (a tenth for staging, at most "
                f"{mib(STAGING_MAX)})")  # fmt: skip


def expert_room(device, held: int = 0) -> ExpertRoom:
    """A DeviceInfo's room for this model's experts (held: bytes its experts occupy on the device now)."""
    held = int(held)
    if reads_mapped_files(device.kind):
        return ExpertRoom(device.name, int(device.memory_free), held, 0, unlimited=True)
    capacity = int(device.memory_free) + held
    return ExpertRoom(device.name, int(device.memory_free), held, min(capacity // STAGING_SHARE, STAGING_MAX))


def expert_rooms(devices, held: dict[str, int]) -> dict[str, ExpertRoom]:
    """Every device's room, held the bytes per device of the placement the engine has now."""
    return {d.name: expert_room(d, held.get(d.name, 0)) for d in devices}


def device_bytes(placement: Placement | None, expert_bytes, devices=()) -> dict[str, int]:
    """Expert weight bytes each device holds under a placement; expert_bytes: one expert's bytes per layer (a
    sequence, 0 for dense layers) or a function of the layer. Devices given start at 0."""
    out = dict.fromkeys(devices, 0)
    if placement is None:
        return out
    size = expert_bytes if callable(expert_bytes) else expert_bytes.__getitem__
    for layer, row in enumerate(placement.owners):
        if not row or row[0] is None:
            continue
        nbytes = size(layer)
        for device in row:
            out[device] = out.get(device, 0) + nbytes
    return out


def model_bytes(device: str, primary: str, experts: int, weight_bytes: int, all_expert_bytes: int,
                draft_weight_bytes: int = 0) -> int:  # fmt: skip
    """Bytes of a model (and its draft) on a device: the experts placed there (experts), plus, on the primary, every
    other weight of the target and all of the draft's."""
    if device != primary:
        return experts
    return experts + weight_bytes - all_expert_bytes + draft_weight_bytes


def overflow(before: dict[str, int], after: dict[str, int], rooms: dict[str, ExpertRoom]) -> str:
    """'' when every device that grows still fits its capacity (free + held), else the first that does not, in
    numbers: what it would hold (needed) against what it has (free + held)."""
    for device, n in after.items():
        room = rooms.get(device)
        if room is None or room.unlimited or n <= before.get(device, 0) or n <= room.capacity:
            continue
        return (f"{device} would hold {mib(n)} of experts but has room for {mib(room.capacity)} (free "
                f"{mib(room.free)} + this model's experts there {mib(room.held)})")  # fmt: skip
    return ""


def moved(placement: Placement, moves: dict[int, list[int]], device: str, devices: list[str]) -> Placement:
    """The placement after moving experts ({layer: [expert, ...]}) to a device; PlacementRefused (why) otherwise:
    an unknown device, a dense layer, an expert out of range, or nothing that changes."""
    if device not in devices:
        raise PlacementRefused(f"device {device} is unknown (devices: {', '.join(devices)})")
    new = placement.copy()
    changed = 0
    for layer, experts in moves.items():
        if not 0 <= layer < len(new.owners) or not new.owners[layer] or new.owners[layer][0] is None:
            raise PlacementRefused(f"layer {layer} is not an MoE layer: it has no experts to move")
        row = new.owners[layer]
        for e in experts:
            if not 0 <= e < len(row):
                raise PlacementRefused(f"expert {e} of layer {layer} does not exist (0..{len(row) - 1})")
            if row[e] != device:
                row[e] = device
                changed += 1
    if not changed:
        raise PlacementRefused(f"already on {device}")
    return new


def check_fits(before: Placement | None, after: Placement, expert_bytes, rooms: dict[str, ExpertRoom],
               what: str = "placement") -> dict[str, int]:  # fmt: skip
    """after's bytes per device when it fits every device it grows; PlacementRefused naming the device and the
    numbers otherwise, and any device the placement names that is not among rooms."""
    unknown = sorted(set(after.devices()) - set(rooms))
    if unknown:
        raise PlacementRefused(f"the {what} names {', '.join(unknown)}, which this engine does not have (devices: "
                               f"{', '.join(rooms)})")  # fmt: skip
    used_after = device_bytes(after, expert_bytes, rooms)
    problem = overflow(device_bytes(before, expert_bytes, rooms), used_after, rooms)
    if problem:
        raise PlacementRefused(f"{problem}: the {what} is refused")
    return used_after


_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40}  # fmt: skip


def parse_size(text: str) -> int:
    """A memory size: bytes, or a number with a unit (KB, MB, GB, TB: powers of 1000; KiB, MiB, GiB, TiB: of 1024),
    e.g. '40MB', '1.5 GiB', '65536'."""
    m = _SIZE.match(text or "")
    if not m:
        raise ArgumentError(f"size {text!r}: expected bytes or a number with a unit (KB, MB, GB, TB, KiB, MiB, GiB, "
                            "TiB), e.g. 40MB or 1.5GiB")  # fmt: skip
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "b").lower()])
