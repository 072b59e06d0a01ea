"""`expertbench plan`: a strategy's placement for a loaded model on an engine's devices, without running it.

The strategy is chosen as the window chooses it (engine.placement.strategy.choose: the fast device, its peer, the others
by measured bandwidth, each device's budget from its room for experts or a smaller --budget). The prediction is the
cost model's (engine.placement.costmodel) from a short calibration made here, or unavailable (--no-calibrate, or a
device that cannot be measured: the report says which and why).
"""

from __future__ import annotations

import math

from ..core.errors import ArgumentError
from ..placement import strategy as S
from ..placement.costmodel import ModelShape
from ..placement.placement import expert_rooms, mib, parse_size
from ..placement.routing import RoutingStats
from ..session import QUICK_CALIBRATION_REPEATS, QUICK_CALIBRATION_TOKENS, calibrate_devices


def parse_budgets(items: list[str]) -> dict[str, int]:
    """--budget DEVICE=SIZE, repeated: {device: bytes}; ArgumentError naming the item and what was expected."""
    out: dict[str, int] = {}
    for item in items:
        device, sep, size = item.partition("=")
        device = device.strip()
        if not sep or ":" not in device or not size.strip():
            raise ArgumentError(f"--budget {item!r}: expected DEVICE=SIZE, e.g. cuda:0=20GiB or hostsim:0=40MB")
        if device in out:
            raise ArgumentError(f"--budget {item!r}: {device} has a budget already")
        try:
            out[device] = parse_size(size)
        except ArgumentError as exc:
            raise ArgumentError(f"--budget {item!r}: {exc}") from None
    return out


def make_plan(target, name: str, fast: str | None = None, caps: dict[str, int] | None = None,
              measure: bool = True, routing: RoutingStats | None = None, routing_source: str | None = None,
              calibrate_fn=None) -> dict:  # fmt: skip
    """The plan of strategy `name` for a loaded target (engine.model.Model) as one JSON-ready document."""
    info = S.check_name(name)
    engine = target.engine
    devices = engine.devices
    names = [d.name for d in devices]
    for device in caps or {}:
        if device not in names:
            raise ArgumentError(f"--budget {device}={caps[device]}: no device {device} (devices: {', '.join(names)})")
    primary = target.device
    if len(names) < 2 and name != "single-device":
        raise ArgumentError(f"--strategy {name}: {info.title} needs a second device besides {primary}, and the engine "
                            "has only that one (add --runtime cuda, --runtime hostsim or --cpu-devices 2)")  # fmt: skip
    if fast is not None and fast not in names:
        raise ArgumentError(f"--fast {fast}: no device {fast} (devices: {', '.join(names)})")
    fast = fast or S.default_fast(devices, primary)
    shape = ModelShape.from_model(target)
    if routing is not None and routing.hits.shape != (shape.num_layers, shape.num_experts):
        raise ArgumentError(f"--routing {routing_source}: counts for {routing.hits.shape[0]} layers of "
                            f"{routing.hits.shape[1]} experts, the model has {shape.num_layers} of "
                            f"{shape.num_experts}")  # fmt: skip
    rooms = expert_rooms(devices, target.placement_bytes(target.placement))
    calibration, how = None, "unavailable: --no-calibrate"
    if measure:
        try:
            calibration = calibrate_devices(target, names, quick=True, calibrate_fn=calibrate_fn)
            how = (f"the cost model's, for target-only greedy decoding (one token per step), from the devices "
                   f"measured here: {QUICK_CALIBRATION_TOKENS} decode steps per device and batch size, "
                   f"{QUICK_CALIBRATION_REPEATS} pass after a warm-up")  # fmt: skip
        except ArgumentError as exc:
            if info.measured:
                raise
            how = f"unavailable: the devices could not be measured ({exc})"
    elif info.measured:
        raise ArgumentError(f"--strategy {name}: {info.title} needs the devices measured: drop --no-calibrate")
    plan = S.choose(name, shape, names, primary, fast, rooms, calibration, routing, caps)
    budgets = S.budgets_for(rooms, caps)
    predicted = plan.predicted_tokens_per_second
    report = {
        "strategy": name,
        "title": info.title,
        "model": str(target.checkpoint.folder),
        "primary": primary,
        "fast": fast,
        "peer": S.peer_of(fast, names, primary) if info.pair else None,
        "placement": plan.placement.describe(),
        "device_bytes": {d: plan.device_bytes.get(d, 0) for d in names},
        "budgets": {d: budgets.get(d) for d in names},
        "rooms": {
            d: {"free": r.free, "held": r.held, "reserve": r.reserve, "room": None if r.unlimited else r.room}
            for d, r in rooms.items()
        },  # fmt: skip
        "caps": dict(caps or {}),
        "predicted_tokens_per_second": predicted if predicted is not None and math.isfinite(predicted) else None,
        "prediction": how,
        "routing": routing_source or "none: every expert equally used",
        "notes": list(plan.notes),
    }
    return report


def text(report: dict, synthetic_note: str = "") -> str:
    """The report for a person: the placement, the bytes per device with each budget's reason, the prediction."""
    peer = f", peer {report['peer']}" if report["peer"] else ""
    lines = [f"strategy   {report['title']} ({report['strategy']}): fast device {report['fast']}{peer}",
             f"model      {report['model']}{synthetic_note}",
             f"placement  {report['placement']}"]  # fmt: skip
    width = max(len(d) for d in report["device_bytes"])
    for device, nbytes in report["device_bytes"].items():
        budget, room, cap = report["budgets"][device], report["rooms"][device], report["caps"].get(device)
        if budget is None:
            why = "no budget: it reads the experts from the mapped files"
        elif cap is not None and (room["room"] is None or cap <= room["room"]):
            why = f"budget {mib(budget)} (--budget)"
        else:
            why = (f"budget {mib(budget)} = free {mib(room['free'])} + this model's experts {mib(room['held'])} - "
                   f"reserve {mib(room['reserve'])}")  # fmt: skip
        lines.append(f"{device:<{width}}  {mib(nbytes):>10} of experts  ({why})")
    rate = report["predicted_tokens_per_second"]
    shown = f"{rate:.1f} tokens/s" if rate is not None else "-"
    lines.append(f"predicted  {shown}  ({report['prediction']})")
    lines.append(f"routing    {report['routing']}")
    for note in report["notes"]:
        lines.append(f"note       {note}")
    return "\n".join(lines) + "\n"
