"""The cost model's predicted decode tokens/s against measured speed, for several placements of the demo model.

Calibrates the model on the devices (engine.placement.costmodel.calibrate: a short decode with every expert on the
primary, and one with every expert on the peer), profiles the routing over the demo prompts, then for each placement
(single devices, which are the calibration points, and the strategies of engine.placement.strategy) prints the predicted
and the measured greedy decode tokens/s (target only, median of --repeats after a warm-up) and the error
predicted / measured - 1. A last run of the first placement shows how far the machine drifted meanwhile.

    python bench/costmodel.py --size default --peer cpu:1 --json bench/results/costmodel_cpu.json
    python bench/costmodel.py --size default --peer cuda:0 --threads 16        # on a machine with a GPU
    python bench/costmodel.py --size bench --primary cuda:0 --peer cpu:0      # a GPU primary, experts on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from engine.checkpoints.demo import DEMO_PROMPTS, ensure_demo_pair
from engine.core.errors import OutOfMemoryError
from engine.model import Engine
from engine.placement import strategy as S
from engine.placement.costmodel import ModelShape, calibrate, measure_decode, predict_tokens_per_second
from engine.placement.routing import profile as profile_routing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import add_weights_argument  # noqa: E402


def placements(shape: ModelShape, primary: str, peer: str, cal, stats) -> list[tuple[str, object, bool]]:
    """(name, placement, calibration point?) for every placement measured."""
    half = shape.total_bytes // 2
    five_eighths = shape.layer_bytes * round(len(shape.moe_layers) * 5 / 8)
    mixed = shape.empty_placement(primary)
    for layer in shape.moe_layers:
        for e in range(shape.num_experts // 2, shape.num_experts):
            mixed.owners[layer][e] = peer
    first_half = shape.empty_placement(primary)
    for layer in shape.moe_layers[: len(shape.moe_layers) // 2]:
        first_half.owners[layer] = [peer] * shape.num_experts
    fast_primary = S.critical_path(shape, primary, peer, calibration=cal, stats=stats).placement
    fast_peer = S.critical_path(shape, peer, primary, calibration=cal, stats=stats).placement
    out = [
        (f"all on {primary}", shape.empty_placement(primary), True),
        (f"all on {peer}", shape.empty_placement(peer), True),
        ("uniform split", S.uniform_split(shape, [primary, peer]).placement, False),
        (f"cold layers, {primary} 5/8", S.cold_layers(shape, primary, peer, {primary: five_eighths}).placement,
         False),
        (f"cold layers, {peer} 5/8", S.cold_layers(shape, peer, primary, {peer: five_eighths}).placement, False),
        (f"hot first, {peer} 1/2", S.hot_first(shape, [peer, primary], {peer: half}, stats=stats).placement, False),
        ("half of every layer on the peer", mixed, False),
        ("first half of the expert layers on the peer", first_half, False),
        (f"critical path, fast {primary}", fast_primary, False),
        (f"critical path, fast {peer}", fast_peer, False),
    ]  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="default", help="demo model size (default, bench)")
    ap.add_argument("--primary", default="cpu:0", help="the primary device (cpu:0, or a GPU such as cuda:0)")
    ap.add_argument("--peer", default="cpu:1", help="the second device (cpu:1, hostsim:0, cuda:0, cpu:0, ...)")
    ap.add_argument("--threads", type=int, default=0, help="threads per CPU device (default: cores / CPU devices)")
    ap.add_argument("--tokens", type=int, default=32, help="decode steps per measurement")
    ap.add_argument("--repeats", type=int, default=5, help="measurements per placement (median)")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--model", help="a target checkpoint (folder or .gguf) instead of the demo's of --size")
    add_weights_argument(ap)
    args = ap.parse_args()
    names = [args.primary, args.peer]
    cpu_devices = max(int(d.split(":")[1]) + 1 for d in names if d.startswith("cpu:")) if any(
        d.startswith("cpu:") for d in names) else 1  # fmt: skip
    runtimes = ("cpu", *dict.fromkeys(d.split(":")[0] for d in names if not d.startswith("cpu:")))
    target = args.model or ensure_demo_pair(args.size).target
    with Engine(runtimes=runtimes, cpu_devices=cpu_devices, cpu_threads=args.threads) as eng:
        model = eng.load(target, device=args.primary, weights=args.weights)
        primary = model.device
        shape = ModelShape.from_model(model)
        devices = {d.name: f"{d.description} ({d.threads} threads)" for d in eng.devices}
        prompts = [model.encode(p) for p in DEMO_PROMPTS]
        stats = profile_routing(model, prompts, 32)
        t0 = time.perf_counter()
        cal = calibrate(model, [primary, args.peer], tokens=args.tokens, repeats=args.repeats)
        calibration_seconds = time.perf_counter() - t0
        rows, skipped = [], []
        for name, placement, is_calibration in placements(shape, primary, args.peer, cal, stats):
            predicted = predict_tokens_per_second(shape, placement, cal, stats)
            try:
                m = measure_decode(model, placement, args.tokens, args.repeats)
            except OutOfMemoryError as exc:  # a placement this machine's devices cannot hold: said, not measured
                skipped.append({"placement": name, "text": placement.describe(), "reason": str(exc)})
                print(f"{name:34s} predicted {predicted:8.1f}  not measured: {exc}", flush=True)
                continue
            measured = 1.0 / m["seconds"]
            rows.append({"placement": name, "text": placement.describe(), "calibration_point": is_calibration,
                         "predicted_tokens_per_second": predicted, "measured_tokens_per_second": measured,
                         "measured_min": 1.0 / max(m["samples"]), "measured_max": 1.0 / min(m["samples"]),
                         "error": predicted / measured - 1.0})  # fmt: skip
            print(f"{name:34s} predicted {predicted:8.1f}  measured {measured:8.1f} tok/s  "
                  f"error {100 * rows[-1]['error']:+6.1f} %{'  (calibration point)' if is_calibration else ''}",
                  flush=True)  # fmt: skip
        again = measure_decode(model, shape.empty_placement(primary), args.tokens, args.repeats)
        drift = 1.0 / again["seconds"]
    held_out = [abs(r["error"]) for r in rows if not r["calibration_point"]]
    summary = {
        "mean_abs_error": statistics.mean(held_out),
        "max_abs_error": max(held_out),
        "within_10_percent": sum(e <= 0.10 for e in held_out),
        "within_25_percent": sum(e <= 0.25 for e in held_out),
        "not_measured": skipped,
        "placements": len(held_out),
        "drift_first_placement": drift / rows[0]["measured_tokens_per_second"] - 1.0,
    }
    print(f"\nheld-out placements: mean |error| {100 * summary['mean_abs_error']:.1f} %, max "
          f"{100 * summary['max_abs_error']:.1f} %, {summary['within_10_percent']}/{len(held_out)} within 10 %, "
          f"{summary['within_25_percent']}/{len(held_out)} within 25 %; "
          f"'{rows[0]['placement']}' measured again at the end: {drift:.1f} tok/s "
          f"({100 * summary['drift_first_placement']:+.1f} %)")  # fmt: skip
    print(f"calibration ({calibration_seconds:.1f} s): fixed {1e3 * cal.fixed_seconds:.3f} ms/step; "
          + "; ".join(f"{d} {r.bandwidth / 1e9:.1f} GB/s, dispatch {1e6 * r.dispatch_seconds:.1f} us, join "
                      f"{1e6 * r.join_seconds:.1f} us"
                      for d, r in cal.devices.items()))  # fmt: skip
    if args.json:
        report = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "devices": devices},
                  "model": str(target), "size": args.size, "shape": shape.__dict__, "args": vars(args),
                  "calibration": cal.to_dict(), "calibration_seconds": calibration_seconds, "rows": rows,
                  "summary": summary}  # fmt: skip
        Path(args.json).write_text(json.dumps(report, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
