"""`expertbench plan`: a placement strategy's placement, the bytes per device and the predicted tokens/s."""

from __future__ import annotations

import argparse
import json
import sys

from ..checkpoints.demo import is_synthetic
from ..core.errors import EngineError
from ..model import WEIGHTS_MODES
from ..placement.strategy import STRATEGIES as _STRATEGIES
from ..placement.strategy import check_name
from .common import check_model_args, demo_args, engine_args, make_engine, model_paths, synthetic_note, tell

STRATEGY_NAMES = tuple(_STRATEGIES)


def add_parser(sub) -> argparse.ArgumentParser:
    plan = sub.add_parser(
        "plan",
        help="a placement strategy's placement, the bytes per device and the predicted tokens/s (nothing runs)",
        description="Places the target's experts with a strategy, as the window's strategy buttons do: on the fast "
        "device (--fast; default: a device that holds copies, an accelerator or a simulated one, other than the "
        "primary) and its peer (the primary, or the first other device when the fast one is the primary), the other "
        "devices by measured bandwidth. Each device holds at most its room for experts (free memory plus what the "
        "model's experts hold there, less a tenth, at most 1 GiB, for staging), or less where --budget says. The "
        "prediction comes from a short calibration made here (--no-calibrate: none). With no --model, the demo "
        "target.",
    )
    plan.add_argument("--strategy", required=True, metavar="NAME",
                      help=f"one of {', '.join(STRATEGY_NAMES)}")  # fmt: skip
    plan.add_argument("--budget", action="append", default=[], metavar="DEVICE=SIZE",
                      help="the most experts DEVICE may hold, e.g. cuda:0=20GiB or hostsim:0=40MB (KB, MB, GB: "
                           "powers of 1000; KiB, MiB, GiB: of 1024; plain bytes); repeat for several")  # fmt: skip
    plan.add_argument("--fast", metavar="DEVICE", help="the fast device (default: see above)")
    plan.add_argument("--routing", metavar="CSV",
                      help="routing statistics as a hotness table (expertbench import-routing, the window's export; "
                           "default: every expert equally used)")  # fmt: skip
    plan.add_argument("--no-calibrate", action="store_true",
                      help="no calibration: no prediction (critical-path needs one)")  # fmt: skip
    plan.add_argument("--model", metavar="PATH",
                      help="Hugging Face model folder or GGUF file (default: the synthetic demo target)")  # fmt: skip
    plan.add_argument("--device", default="cpu:0", help="the target's primary device (default cpu:0)")
    plan.add_argument("--weights", default="auto", choices=tuple(WEIGHTS_MODES),
                      help="how the engine holds the files (as for run; default auto)")  # fmt: skip
    demo_args(plan)
    plan.add_argument("--json", action="store_true", help="print one JSON document")
    engine_args(plan, loads_models=True)
    plan.set_defaults(func=cmd_plan)
    return plan


def cmd_plan(args) -> int:
    from ..placement.routing import RoutingStats
    from ..tune import plan

    try:
        check_name(args.strategy)
    except EngineError as exc:
        raise EngineError(f"--strategy {args.strategy}: {exc}") from None
    caps = plan.parse_budgets(args.budget)
    check_model_args(args)
    target_dir, _draft = model_paths(args, with_draft=False)
    with make_engine(args) as eng:
        target = eng.load(target_dir, device=args.device, weights=args.weights, check_weights=args.check_weights)
        routing = None
        if args.routing is not None:
            routing = RoutingStats.read_hotness_csv(args.routing)
        if not args.no_calibrate:
            tell("measuring the devices for the cost model (a few short decodes on each)...")
        report = plan.make_plan(target, args.strategy, args.fast, caps, measure=not args.no_calibrate,
                                routing=routing, routing_source=args.routing)  # fmt: skip
        report["synthetic"] = is_synthetic(target.checkpoint)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        sys.stdout.write(plan.text(report, synthetic_note(report["synthetic"])))
    return 0
