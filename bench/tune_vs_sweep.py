"""The tuner (engine.tune) against an exhaustive sweep, on the demo pair with two devices.

The space swept: every set of at most --max-layers whole MoE layers on the fast device (default hostsim:0, a
simulated accelerator on the CPU; the rest on the primary cpu:0), crossed with the draft lengths --qs. Each point is
measured as the tuner's last rung measures (64 tokens per prompt, 3 repeats, the demo prompts). Then the tuner runs
on the same pair under the same budget (the fast device holds at most --max-layers layers' experts) with the same
draft lengths and --time-budget seconds, default a fifth of the sweep's time: its own space (strategies, whole-layer
counts, single-expert moves; seeded by the cost model), calibration included. Last, the tuner's chosen point and
the sweep's best are measured again in --rounds alternating rounds, so that their ratio is not one run's luck.

Reported: the best ratio (tuner's best / sweep's best: the medians of the alternating rounds, the median of each
round's ratio, and as each measured itself),
the time ratio (the tuner's seconds / the sweep's), and how many points gave another output than one device.

    python bench/tune_vs_sweep.py --json bench/results/tune_vs_sweep.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import time
from pathlib import Path

from engine import tune
from engine.checkpoints.demo import DEMO_PROMPTS, ensure_demo_pair
from engine.model import Engine
from engine.placement.costmodel import ModelShape
from engine.placement.placement import device_bytes

LAST = tune.DEFAULT_RUNGS[-1]


def sweep_space(shape: ModelShape, primary: str, fast: str, max_layers: int, qs) -> list[tune.Candidate]:
    out = []
    names = [primary, fast]
    for k in range(max_layers + 1):
        for layers in itertools.combinations(shape.moe_layers, k):
            placement = shape.empty_placement(primary)
            for layer in layers:
                placement.move_layer(layer, fast)
            used = device_bytes(placement, shape.bytes_of, names)
            out += [tune.Candidate(placement, q, f"layers {list(layers)}", used) for q in qs]
    return out


def head_to_head(bench: tune.EngineBench, a: tune.Candidate, b: tune.Candidate, rounds: int) -> tuple[list, list]:
    """Both measured in turn, the first alternating: decode tokens/s medians per round."""
    speeds: tuple[list, list] = ([], [])
    for r in range(rounds):
        order = ((0, a), (1, b)) if r % 2 == 0 else ((1, b), (0, a))
        for i, c in order:
            m = bench.measure(c, LAST.tokens, LAST.repeats)
            speeds[i].append(statistics.median(m.rates))
    return speeds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="default", help="the demo pair's size (default: default)")
    p.add_argument("--fast", default="hostsim:0", help="the fast device (default hostsim:0)")
    p.add_argument("--max-layers", type=int, default=2, help="whole layers at most on the fast device (default 2)")
    p.add_argument("--qs", type=int, nargs="+", default=[1, 2, 3], help="draft lengths (default 1 2 3)")
    p.add_argument("--time-budget", type=float, help="the tuner's seconds (default: a fifth of the sweep's)")
    p.add_argument("--rounds", type=int, default=10, help="alternating rounds of the two bests (default 10)")
    p.add_argument("--json", metavar="FILE", help="write the figures here")
    args = p.parse_args()
    pair = ensure_demo_pair(args.size)
    runtime = args.fast.partition(":")[0]
    with Engine(runtimes=("cpu", runtime)) as eng:
        target, draft = eng.load(pair.target), eng.load(pair.draft)
        primary = target.device
        shape = ModelShape.from_model(target)
        space = sweep_space(shape, primary, args.fast, args.max_layers, args.qs)
        bench = tune.EngineBench(target, draft, DEMO_PROMPTS)
        reference, _ = bench.reference(LAST.tokens)
        bench.measure(space[-1], LAST.tokens, 1)  # warm-up: the peer's arenas, the page cache
        print(f"sweep: {len(space)} points ({len(space) // len(args.qs)} placements x q {args.qs}), {LAST.tokens} "
              f"tokens x {LAST.repeats} repeats x {len(DEMO_PROMPTS)} prompts each", flush=True)  # fmt: skip
        t0 = time.monotonic()
        swept = []
        for c in space:
            m = bench.measure(c, LAST.tokens, LAST.repeats)
            swept.append((c, statistics.median(m.rates), m.output_sha256 == reference))
        sweep_seconds = time.monotonic() - t0
        best_c, best_speed, _ = max(swept, key=lambda s: s[1])
        print(f"sweep: {sweep_seconds:.1f} s; best {best_speed:.1f} tokens/s, q {best_c.q}, "
              f"{best_c.placement.describe()}", flush=True)  # fmt: skip

        budget = args.time_budget or sweep_seconds / 5
        cap = {args.fast: args.max_layers * shape.layer_bytes}
        settings = tune.TuneSettings(fast=args.fast, caps=cap, qs=tuple(args.qs), time_budget=budget)
        t0 = time.monotonic()
        result = tune.Tuning(target, draft, settings).run()
        tune_seconds = time.monotonic() - t0
        chosen = result.search.chosen()
        print(f"tuner: {tune_seconds:.1f} s (budget {budget:.1f} s), {result.candidates} candidates, "
              f"{sum(len(p.measurements) for p in result.search.points)} measurements; chosen "
              f"{chosen.speed:.1f} tokens/s, q {chosen.candidate.q}, {chosen.candidate.placement.describe()} "
              f"({chosen.candidate.origin})", flush=True)  # fmt: skip

        tuned, swept_best = head_to_head(bench, chosen.candidate, best_c, args.rounds)
        differ = sum(1 for _c, _s, same in swept if not same) + sum(
            1 for p in result.search.points if not p.same_as_reference
        )
    ratio = statistics.median(tuned) / statistics.median(swept_best)
    # each round's two runs are seconds apart: their ratio does not move with the machine's state between rounds
    paired = statistics.median(a / b for a, b in zip(tuned, swept_best, strict=True))
    figures = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "processor": _cpu_name()},
        "size": args.size,
        "devices": [primary, args.fast],
        "space": {
            "placements": len(space) // len(args.qs),
            "qs": args.qs,
            "points": len(space),
            "max_layers_on_fast": args.max_layers,
        },
        "sweep": {
            "seconds": sweep_seconds,
            "best_tokens_per_second": best_speed,
            "best_q": best_c.q,
            "best_placement": best_c.placement.describe(),
        },
        "tuner": {
            "seconds": tune_seconds,
            "time_budget": budget,
            "candidates": result.candidates,
            "measurements": sum(len(p.measurements) for p in result.search.points),
            "chosen_tokens_per_second": chosen.speed,
            "chosen_q": chosen.candidate.q,
            "chosen_placement": chosen.candidate.placement.describe(),
            "chosen_origin": chosen.candidate.origin,
            "front": len(result.search.front),
            "deepest": [
                {
                    "placement": p.candidate.placement.describe(),
                    "q": p.candidate.q,
                    "origin": p.candidate.origin,
                    "tokens_per_second": p.speed,
                    "runs": len(p.rates),
                }
                for p in sorted(result.search.points, key=lambda p: (-p.rung, -p.speed))[:8]
            ],  # fmt: skip
        },
        "sweep_top": [
            {"placement": c.placement.describe(), "q": c.q, "tokens_per_second": v}
            for c, v, _same in sorted(swept, key=lambda s: -s[1])[:8]
        ],
        "rounds": {"tuner": tuned, "sweep": swept_best},
        "best_ratio": ratio,
        "best_ratio_paired": paired,
        "best_ratio_as_measured": chosen.speed / best_speed,
        "time_ratio": tune_seconds / sweep_seconds,
        "points_differing_from_one_device": differ,
    }
    print(f"best ratio {ratio:.3f}, paired by round {paired:.3f} (alternating rounds: tuner "
          f"{statistics.median(tuned):.1f}, sweep {statistics.median(swept_best):.1f} tokens/s; as measured "
          f"{figures['best_ratio_as_measured']:.3f}); time ratio {figures['time_ratio']:.3f}; points differing from "
          f"one device: {differ}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())
