"""Placement strategies: where each expert should live, under per-device memory budgets.

Every strategy returns a Plan: the Placement, the expert bytes per device, and the decode tokens/s the cost
model predicts for it (None without a calibration). Budgets are expert weight bytes per device; a device
without a budget is unlimited. A plan that cannot fit raises ArgumentError naming the device and the bytes.

    single_device   every expert on one device
    uniform_split   MoE layers in contiguous blocks of (nearly) equal size, one block per device
    cold_layers     whole layers only: the fast device takes as many layers as its budget holds, the hottest
                    first; the cold rest goes to the peer, so no layer step ever splits across two devices
    hot_first       experts from the most used down, filling the devices in order (fastest first)
    critical_path   start with everything on the peer; move experts to the fast device (or, with several GPUs,
                    to the one that helps most), most used first, each only if it lowers the predicted time of its
                    layer, the max over the layer's devices (and fits the budget)

"Hot" comes from routing statistics (RoutingStats): the share of tokens each expert served. Without them
every expert is equally hot and ties go to the lower layer and expert numbers.

choose() is how the window and `expertbench plan` pick one: a fast device, its peer (the primary, or the first
other device when the fast one is the primary), the others ordered by measured bandwidth, and budgets from each
device's room for experts (engine.placement.placement.ExpertRoom: free memory plus what this model's experts already
hold there, less a reserve for staging), so a device full of the current placement is not taken for a full one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..core.errors import ArgumentError
from .costmodel import Calibration, ModelShape, expert_shares, layer_time, predict_tokens_per_second
from .placement import ExpertRoom, Placement, mib, reads_mapped_files
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
            raise ArgumentError(f"{name}: {device} would hold {mib(nbytes)} of experts, more than its budget "
                                f"({mib(limit)})")  # fmt: skip
    predicted = None
    if calibration is not None:
        predicted = predict_tokens_per_second(shape, placement, calibration, stats, tokens_per_step)
    return Plan(name, placement, used, predicted, list(notes))


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
            held = ", ".join(f"{d} {mib(_budget(budgets, d))}" for d in devices)
            raise ArgumentError(f"hot experts first: the budgets ({held}) hold less than the {mib(shape.total_bytes)} "
                                "of experts")  # fmt: skip
        placement.owners[layer][e] = devices[k]
        room[k] -= shape.bytes_of(layer)
    return _plan("hot experts first", shape, placement, budgets, calibration, stats)


def critical_path(shape: ModelShape, fast: str | Sequence[str], peer: str, budgets=None,
                  calibration: Calibration | None = None, stats: RoutingStats | None = None,
                  tokens_per_step: int = 1) -> Plan:  # fmt: skip
    """Start with every expert on the peer (moving the hottest to a fast device first while the peer's budget is
    exceeded); then, most used first, move an expert to the fast device that gives its layer the lowest predicted
    time, max over the layer's devices in the cost model, when that is lower than where it is and the device's budget
    still holds it; last, the experts the statistics never saw chosen to the fast devices while they have room.
    fast: one device, or several (two GPUs: the balance is across them and the peer), the fastest first."""
    if calibration is None:
        raise ArgumentError("critical-path balance needs a calibration (engine.placement.costmodel.calibrate)")
    fasts = [fast] if isinstance(fast, str) else list(dict.fromkeys(fast))
    if not fasts or peer in fasts:
        raise ArgumentError(f"critical-path balance: the fast devices {fasts} must be others than the peer {peer}")
    shares = expert_shares(shape, stats)
    n = tokens_per_step
    placement = shape.empty_placement(peer)
    picks = {layer: {**dict.fromkeys(fasts, 0.0), peer: float(shares[layer].sum())} for layer in shape.moe_layers}
    distinct = {layer: {**dict.fromkeys(fasts, 0.0), peer: float((1 - (1 - shares[layer]) ** n).sum())}
                for layer in shape.moe_layers}  # fmt: skip
    room = {f: _budget(budgets, f) for f in fasts}
    room_peer = _budget(budgets, peer)
    need_peer = shape.total_bytes
    moved = dict.fromkeys(fasts, 0)
    forced = 0

    def shift(layer, e, src, dst):
        p = shares[layer, e]
        d = 1 - (1 - p) ** n
        picks[layer][src] -= p
        picks[layer][dst] += p
        distinct[layer][src] -= d
        distinct[layer][dst] += d
        placement.owners[layer][e] = dst

    def best_move(layer, e):
        """(time, device): the fast device with room that gives the layer the lowest predicted time."""
        best = None
        for f in fasts:
            if room[f] < shape.bytes_of(layer):
                continue
            shift(layer, e, peer, f)
            t = layer_time(shape, picks[layer], distinct[layer], calibration, n, layer)
            shift(layer, e, f, peer)
            if best is None or t < best[0] - 1e-15:
                best = (t, f)
        return best

    def take(layer, e, f):
        shift(layer, e, peer, f)
        room[f] -= shape.bytes_of(layer)
        moved[f] += 1

    for layer, e in _hot_order(shape, stats):
        best = best_move(layer, e)
        if need_peer > room_peer:  # forced: the peer cannot hold everything left
            if best is None:
                rooms = ", ".join(f"{f} ({mib(room[f])} left)" for f in fasts)
                raise ArgumentError(f"critical-path balance: {rooms} and {peer} ({mib(room_peer)}) cannot hold the "
                                    f"{mib(shape.total_bytes)} of experts")  # fmt: skip
            take(layer, e, best[1])
            need_peer -= shape.bytes_of(layer)
            forced += 1
            continue
        if best is None:
            continue  # a smaller expert of another layer may still fit
        before = layer_time(shape, picks[layer], distinct[layer], calibration, n, layer)
        if best[0] < before - 1e-15:
            take(layer, e, best[1])
            need_peer -= shape.bytes_of(layer)
    # Experts the statistics never saw chosen cost nothing in the model wherever they are, but one chosen after
    # all makes its layer's step wait on the peer (measured on an H100: three such experts left on the CPU, all the
    # rest on the GPU, decoded 13 % slower than all on the GPU): they go to the fast devices while they have room
    # (the fastest first). They come last in the hot order, so they take only room that nothing chosen could use.
    unseen = 0
    if stats is not None:
        for layer, e in _hot_order(shape, stats):
            if shares[layer, e] != 0.0 or placement.owners[layer][e] != peer:
                continue
            f = next((f for f in fasts if room[f] >= shape.bytes_of(layer)), None)
            if f is not None:
                placement.owners[layer][e] = f
                room[f] -= shape.bytes_of(layer)
                unseen += 1
    total = sum(moved.values()) + unseen
    on = fasts[0] if len(fasts) == 1 else ", ".join(f"{moved[f]} on {f}" for f in fasts)
    notes = [(f"{total} experts on {on}" if len(fasts) == 1 else f"{total} experts moved: {on}")
             + (f" ({forced} because {peer}'s budget required it)" if forced else "")]  # fmt: skip
    if unseen:
        notes.append(f"{unseen} experts the routing statistics never saw chosen on "
                     f"{' and '.join(fasts)}, where there was room")  # fmt: skip
    return _plan("critical-path balance", shape, placement, budgets, calibration, stats, n, notes)


def fast_devices(fast: str, devices: list[str], peer: str, budgets: dict, calibration: Calibration | None) -> list[str]:
    """The devices a critical-path balance moves experts to: the fast one, then every other device with a budget
    (one holding copies: a GPU, a simulated one; not the peer), fastest measured first: two GPUs beside the CPU are
    both balanced against it."""
    return [d for d in fastest_first(fast, devices, calibration) if d != peer and (d == fast or d in budgets)]


# ---- choosing: the window's strategy buttons and `expertbench plan` ------------------------------------------


@dataclass(frozen=True)
class Strategy:
    title: str  # as a button or a report names it
    what: str  # what it does, in one sentence
    ranks: bool  # ranks experts by routing statistics (without them every expert is equally used)
    pair: bool  # places on the fast device and one other (the peer); else on several
    measured: bool = False  # needs the devices measured (a calibration), not only for its prediction


STRATEGIES = {
    "single-device": Strategy("Single device", "every expert on the fast device", False, False),
    "uniform-split": Strategy("Uniform split", "MoE layers in contiguous blocks of equal size, one block per device, "
                              "the fast device first", False, False),
    "cold-layers": Strategy("Cold layers", "whole MoE layers on the fast device, as many as its budget holds; the rest "
                            "whole on the other device", False, True),
    "hot-first": Strategy("Hot first", "the most used experts on the fast device until its budget is full, then on the "
                          "next device by measured bandwidth", True, False),
    "critical-path": Strategy("Critical path", "from the other device, the most used experts move to the fast device "
                              "(and to every other GPU, where there are several) while that lowers the predicted "
                              "layer time, the max over the layer's devices", True, True, True),
}  # fmt: skip
BUTTONS = ("cold-layers", "hot-first", "critical-path")  # the window's strategy buttons (both others have their own)


def check_name(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ArgumentError(f"strategy {name!r} is unknown: expected one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def default_fast(devices, primary: str) -> str:
    """The fast device when none is named: the first that holds copies (an accelerator, a simulated one) other than
    the primary, else any other than the primary, else the primary. devices: DeviceInfo (name, kind)."""
    others = [d for d in devices if d.name != primary]
    copies = [d.name for d in others if not reads_mapped_files(d.kind)]
    return (copies or [d.name for d in others] or [primary])[0]


def peer_of(fast: str, devices: list[str], primary: str) -> str:
    """The other device of a two-device strategy: the primary, or, when the fast device is the primary, the first
    other device."""
    if fast != primary:
        return primary
    others = [d for d in devices if d != fast]
    if not others:
        raise ArgumentError(f"this strategy needs a second device besides {fast}")
    return others[0]


def fastest_first(fast: str, devices: list[str], calibration: Calibration | None) -> list[str]:
    """The fast device, then the others from the highest measured bandwidth down (as given without figures)."""
    rest = [d for d in devices if d != fast]
    if calibration is not None:
        rest.sort(key=lambda d: -calibration.rate(d).bandwidth if d in calibration.devices else 0.0)
    return [fast, *rest]


def budgets_for(rooms: dict[str, ExpertRoom], caps: dict[str, int] | None = None) -> dict[str, int]:
    """Each device's budget for a plan: its room (free + this model's experts there - reserve), or the cap asked for
    when smaller; a CPU device (it reads the mapped files) has none unless capped."""
    out: dict[str, int] = {}
    for device, room in rooms.items():
        cap = (caps or {}).get(device)
        limits = [v for v in (None if room.unlimited else room.room, cap) if v is not None]
        if limits:
            out[device] = min(limits)
    return out


def _why_not(what: str, device: str, need: int, rooms: dict[str, ExpertRoom], caps: dict[str, int] | None) -> str:
    room, cap = rooms[device], (caps or {}).get(device)
    if cap is not None and (room.unlimited or cap < room.room):
        return f"{device}'s budget of {mib(cap)} is less than {what} ({mib(need)})"
    return f"{device} cannot hold {what}: it needs {mib(need)}; {room.explain()}"


def choose(name: str, shape: ModelShape, devices: list[str], primary: str, fast: str, rooms: dict[str, ExpertRoom],
           calibration: Calibration | None = None, stats: RoutingStats | None = None,
           caps: dict[str, int] | None = None) -> Plan:  # fmt: skip
    """A strategy of STRATEGIES with the window's and the command line's choices filled in: the fast device, its peer
    (peer_of), the others' order (fastest_first) and every device's budget (budgets_for: its room for experts, or a
    smaller cap). ArgumentError in numbers when the fast device can hold nothing of what the strategy puts there."""
    info = check_name(name)
    unknown = [d for d in (fast, *(caps or {})) if d not in devices]
    if unknown:
        raise ArgumentError(f"{info.title}: no device {unknown[0]} (devices: {', '.join(devices)})")
    if info.measured and calibration is None:
        raise ArgumentError(f"{info.title} needs the devices measured (a calibration)")
    budgets = budgets_for({d: rooms[d] for d in devices if d in rooms}, caps)
    smallest = min(shape.bytes_of(layer) for layer in shape.moe_layers)
    need = {"single-device": shape.total_bytes, "cold-layers": min(shape.layer_bytes_of(layer) for layer in
                                                                    shape.moe_layers)}.get(name, smallest)  # fmt: skip
    what = {"single-device": "every expert", "cold-layers": "one MoE layer's experts"}.get(name, "one expert")
    if fast in budgets and budgets[fast] < need and name != "uniform-split":
        raise ArgumentError(f"{info.title}: {_why_not(what, fast, need, rooms, caps)}")
    common = {"budgets": budgets, "calibration": calibration, "stats": stats}
    if name == "single-device":
        return single_device(shape, fast, **common)
    if name == "uniform-split":
        return uniform_split(shape, fastest_first(fast, devices, calibration), **common)
    if name == "cold-layers":
        return cold_layers(shape, fast, peer_of(fast, devices, primary), **common)
    if name == "critical-path":
        peer = peer_of(fast, devices, primary)
        return critical_path(shape, fast_devices(fast, devices, peer, budgets, calibration), peer, **common)
    return hot_first(shape, fastest_first(fast, devices, calibration), **common)
