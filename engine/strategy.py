"""Placement strategies: where each expert should live, under per-device memory budgets.

Every strategy returns a Plan: the Placement, the expert bytes per device, and the decode tokens/s the cost
model predicts for it (None without a calibration). Budgets are expert weight bytes per device; a device
without a budget is unlimited. A plan that cannot fit raises ArgumentError naming the device and the bytes.

    single_device   every expert on one device
    uniform_split   MoE layers in contiguous blocks of (nearly) equal size, one block per device
    cold_layers     whole layers only: the fast device takes as many layers as its budget holds, the hottest
                    first; the cold rest goes to the peer, so no layer step ever splits across two devices
    hot_first       experts from the most used down, filling the devices in order (fastest first)
    critical_path   start with everything on the peer; move experts to the fast device, most used first, each
                    only if it lowers the predicted max(fast, peer) time of its layer (and fits the budget)

"Hot" comes from routing statistics (RoutingStats): the share of tokens each expert served. Without them
every expert is equally hot and ties go to the lower layer and expert numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .costmodel import Calibration, ModelShape, expert_shares, layer_time, predict_tokens_per_second
from .errors import ArgumentError
from .placement import Placement
from .routing import RoutingStats


@dataclass
class Plan:
    strategy: str
    placement: Placement
    device_bytes: dict[str, int]
    predicted_tokens_per_second: float | None = None
    notes: list[str] = field(default_factory=list)


def placement_bytes(shape: ModelShape, placement: Placement) -> dict[str, int]:
    out: dict[str, int] = {}
    for layer in shape.moe_layers:
        for device in placement.owners[layer]:
            out[device] = out.get(device, 0) + shape.bytes_of(layer)
    return out


def _plan(name, shape, placement, budgets, calibration, stats, tokens_per_step=1, notes=()) -> Plan:
    used = placement_bytes(shape, placement)
    for device, nbytes in used.items():
        limit = (budgets or {}).get(device)
        if limit is not None and nbytes > limit:
            raise ArgumentError(f"{name}: {device} would hold {_mib(nbytes)} of experts, more than its budget "
                                f"({_mib(limit)})")  # fmt: skip
    predicted = None
    if calibration is not None:
        predicted = predict_tokens_per_second(shape, placement, calibration, stats, tokens_per_step)
    return Plan(name, placement, used, predicted, list(notes))


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


def _budget(budgets, device) -> float:
    limit = (budgets or {}).get(device)
    return float("inf") if limit is None else limit


def single_device(shape: ModelShape, device: str, budgets=None, calibration: Calibration | None = None,
                  stats: RoutingStats | None = None) -> Plan:  # fmt: skip
    return _plan("single device", shape, shape.empty_placement(device), budgets, calibration, stats)


def uniform_split(shape: ModelShape, devices: list[str], budgets=None, calibration: Calibration | None = None,
                  stats: RoutingStats | None = None) -> Plan:  # fmt: skip
    """MoE layers in contiguous blocks, one per device in the order given (earlier devices get the first layers;
    when the layers do not divide evenly, the earlier devices get one more)."""
    if not devices:
        raise ArgumentError("uniform split: no device given")
    placement = shape.empty_placement(devices[0])
    n, k = len(shape.moe_layers), len(devices)
    for i, layer in enumerate(shape.moe_layers):
        placement.move_layer(layer, devices[i * k // n])
    return _plan("uniform split", shape, placement, budgets, calibration, stats)


def layer_heat(shape: ModelShape, stats: RoutingStats | None = None, tokens_per_step: int = 1) -> np.ndarray:
    """Expected experts read per step in each MoE layer (its bytes per step / its expert bytes); 0 for dense layers.
    For one token per step every MoE layer reads exactly top_k experts; batches (speculative verification)
    read fewer distinct experts in layers whose routing is concentrated."""
    shares = expert_shares(shape, stats)
    heat = (1.0 - (1.0 - shares) ** tokens_per_step).sum(axis=1)
    mask = np.zeros(shape.num_layers, dtype=bool)
    mask[list(shape.moe_layers)] = True
    return np.where(mask, heat, 0.0)


def cold_layers(shape: ModelShape, fast: str, peer: str, budgets=None, calibration: Calibration | None = None,
                stats: RoutingStats | None = None, tokens_per_step: int = 1) -> Plan:  # fmt: skip
    """Whole layers only. The fast device takes as many MoE layers as its budget holds, the hottest first
    (layer_heat; ties: higher layer numbers first, so the cold ones are the first layers, as llama.cpp's
    --n-cpu-moe counts them); every other layer goes whole to the peer."""
    heat = layer_heat(shape, stats, tokens_per_step)
    room = _budget(budgets, fast)
    order = sorted(shape.moe_layers, key=lambda layer: (-round(heat[layer], 9), -layer))
    on_fast = set()
    for layer in order:  # hottest first, while the next one fits
        if shape.layer_bytes_of(layer) > room:
            break
        on_fast.add(layer)
        room -= shape.layer_bytes_of(layer)
    placement = shape.empty_placement(peer)
    for layer in on_fast:
        placement.move_layer(layer, fast)
    cold = sorted(set(shape.moe_layers) - on_fast)
    notes = [f"{len(cold)} of {len(shape.moe_layers)} MoE layers whole on {peer}"]
    return _plan("cold layers", shape, placement, budgets, calibration, stats, tokens_per_step, notes)


def _hot_order(shape: ModelShape, stats: RoutingStats | None) -> list[tuple[int, int]]:
    shares = expert_shares(shape, stats)
    pairs = [(layer, e) for layer in shape.moe_layers for e in range(shape.num_experts)]
    return sorted(pairs, key=lambda p: (-shares[p], p))


def hot_first(shape: ModelShape, devices: list[str], budgets=None, calibration: Calibration | None = None,
              stats: RoutingStats | None = None) -> Plan:  # fmt: skip
    """Experts sorted from the most used down fill the devices in the order given (fastest first), each up to
    its budget; the last device takes the rest when it has no budget."""
    if not devices:
        raise ArgumentError("hot experts first: no device given")
    placement = shape.empty_placement(devices[-1])
    room = [_budget(budgets, d) for d in devices]
    k = 0
    for layer, e in _hot_order(shape, stats):
        while k < len(devices) and room[k] < shape.bytes_of(layer):
            k += 1
        if k == len(devices):
            held = ", ".join(f"{d} {_mib(_budget(budgets, d))}" for d in devices)
            raise ArgumentError(f"hot experts first: the budgets ({held}) hold less than the {_mib(shape.total_bytes)} "
                                "of experts")  # fmt: skip
        placement.owners[layer][e] = devices[k]
        room[k] -= shape.bytes_of(layer)
    return _plan("hot experts first", shape, placement, budgets, calibration, stats)


def critical_path(shape: ModelShape, fast: str, peer: str, budgets=None, calibration: Calibration | None = None,
                  stats: RoutingStats | None = None, tokens_per_step: int = 1) -> Plan:  # fmt: skip
    """Start with every expert on the peer (moving the hottest to the fast device first while the peer's budget
    is exceeded); then, most used first, move an expert to the fast device only if that lowers the predicted
    time of its layer, max(fast, peer) in the cost model, and the fast device's budget still holds it."""
    if calibration is None:
        raise ArgumentError("critical-path balance needs a calibration (engine.costmodel.calibrate)")
    shares = expert_shares(shape, stats)
    n = tokens_per_step
    placement = shape.empty_placement(peer)
    picks = {layer: {fast: 0.0, peer: float(shares[layer].sum())} for layer in shape.moe_layers}
    distinct = {layer: {fast: 0.0, peer: float((1 - (1 - shares[layer]) ** n).sum())} for layer in shape.moe_layers}
    room_fast, room_peer = _budget(budgets, fast), _budget(budgets, peer)
    need_peer = shape.total_bytes
    moved = forced = 0

    def move(layer, e):
        p = shares[layer, e]
        picks[layer][fast] += p
        picks[layer][peer] -= p
        d = 1 - (1 - p) ** n
        distinct[layer][fast] += d
        distinct[layer][peer] -= d
        placement.owners[layer][e] = fast

    for layer, e in _hot_order(shape, stats):
        if need_peer > room_peer:  # forced: the peer cannot hold everything left
            if room_fast < shape.bytes_of(layer):
                raise ArgumentError(
                    f"critical-path balance: {fast} ({_mib(room_fast)} left) and {peer} "
                    f"({_mib(room_peer)}) cannot hold the {_mib(shape.total_bytes)} of experts"
                )
            move(layer, e)
            room_fast -= shape.bytes_of(layer)
            need_peer -= shape.bytes_of(layer)
            forced += 1
            continue
        if room_fast < shape.bytes_of(layer):
            continue  # a smaller expert of another layer may still fit
        before = layer_time(shape, picks[layer], distinct[layer], calibration, n, layer)
        move(layer, e)
        if layer_time(shape, picks[layer], distinct[layer], calibration, n, layer) < before - 1e-15:
            room_fast -= shape.bytes_of(layer)
            need_peer -= shape.bytes_of(layer)
            moved += 1
        else:  # undo
            p = shares[layer, e]
            picks[layer][fast] -= p
            picks[layer][peer] += p
            d = 1 - (1 - p) ** n
            distinct[layer][fast] -= d
            distinct[layer][peer] += d
            placement.owners[layer][e] = peer
    notes = [f"{moved + forced} experts on {fast}" + (f" ({forced} because {peer}'s budget required it)"
                                                      if forced else "")]  # fmt: skip
    return _plan("critical-path balance", shape, placement, budgets, calibration, stats, n, notes)
