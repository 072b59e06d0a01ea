"""`expertbench tune`: engine.tune's measured search over placements and the draft length q on the command line,
its Pareto front as a table or one JSON document, the chosen point as a profile (--out)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from ..checkpoints.demo import DEFAULT_FAMILY, check_format, is_synthetic
from ..core.errors import ArgumentError
from ..core.files import check_output
from ..model import WEIGHTS_MODES
from ..placement.routing import RoutingStats
from ..runs.run import draft_label
from ..runs.speculative import MAX_DRAFT_TOKENS
from ..session import is_self_draft, open_pair
from ..tune import (
    AUTO_Q,
    DEFAULT_TIME_BUDGET,
    QUALITY_TOKENS,
    KLConstraint,
    Progress,
    TuneResult,
    TuneSettings,
    Tuning,
    check_time_budget,
    parse_max_kl,
    parse_modes,
    parse_q,
    profile_for,
    report,
    text,
)
from .common import check_model_args, check_prompt, demo_args, engine_args, make_engine, model_paths, synthetic_note


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "tune",
        help="measure placements and draft lengths; report the Pareto front of tokens/s against fast-device bytes",
        description="Searches placements (whole layers and single experts) and the draft length q, seeded by the "
        "placement strategies and the cost model, under each device's budget (its room for experts, or less where "
        "--budget says), and spends --time-budget on measurements by successive halving: short runs for every "
        "candidate, longer ones for the promising. Reports the measured Pareto front of decode tokens/s against "
        "expert bytes on the fast device (--fast; default as for plan), each point with its placement, q, spread and "
        "output hashes, which in the reference mode must equal those of one device alone (a point that differs is "
        "reported). --modes reference,owner_local measures every placement in owner_local mode too (its outputs "
        "differ with the placement: --max-kl NATS excludes the points whose mean KL against the reference mode is "
        "larger). --out writes the chosen point (the fastest measured longest) as a profile for 'expertbench "
        "regress' and the window. With no --model, the demo pair.",
    )
    p.add_argument("--model", metavar="PATH",
                   help="Hugging Face model folder or GGUF file (default: the synthetic demo target)")  # fmt: skip
    drafts = p.add_mutually_exclusive_group()
    drafts.add_argument("--draft", metavar="PATH",
                        help="draft model folder or GGUF file, or 'self': the model's own multi-token-prediction "
                             "layer (default: the demo draft when --model is not given, else none)")  # fmt: skip
    drafts.add_argument("--no-draft", action="store_true", help="target-only greedy decoding (no q to search)")
    p.add_argument("--budget", action="append", default=[], metavar="DEVICE=SIZE",
                   help="the most experts DEVICE may hold, e.g. cuda:0=20GiB or hostsim:0=40MB; repeat for "
                        "several")  # fmt: skip
    p.add_argument(
        "--time-budget",
        type=float,
        default=DEFAULT_TIME_BUDGET,
        metavar="SECONDS",
        help=f"seconds to spend measuring, calibration included (default {DEFAULT_TIME_BUDGET:.0f})",
    )
    p.add_argument("--q", default="auto", metavar="auto|N",
                   help=f"draft lengths to search: auto ({', '.join(map(str, AUTO_Q))}) or one N of "
                        f"1..{MAX_DRAFT_TOKENS} (default auto)")  # fmt: skip
    p.add_argument("--fast", metavar="DEVICE", help="the device whose bytes the front counts (default: as plan)")
    p.add_argument("--modes", default="reference", metavar="MODE[,MODE]",
                   help="reduction modes to measure each placement in: reference, owner_local (default "
                        "reference)")  # fmt: skip
    p.add_argument("--max-kl", metavar="NATS",
                   help="exclude points whose mean KL divergence of the next-token distributions against the "
                        f"reference mode is over NATS (measured once per setting, {QUALITY_TOKENS} tokens per "
                        "prompt)")  # fmt: skip
    p.add_argument(
        "--routing",
        metavar="CSV",
        help="routing statistics as a hotness table (default: what one run over the prompts routes)",
    )
    p.add_argument("--prompt", action="append", metavar="TEXT",
                   help="a prompt; repeat for several (default: 4 built-in prompts)")  # fmt: skip
    p.add_argument("--no-calibrate", action="store_true", help="seed with the strategies alone (no cost model)")
    p.add_argument("--out", metavar="PROFILE", type=Path, help="write the chosen point as a profile (YAML)")
    p.add_argument("--device", default="cpu:0", help="the target's primary device (default cpu:0)")
    p.add_argument("--weights", default="auto", choices=tuple(WEIGHTS_MODES),
                   help="how the engine holds the files (as for run; default auto)")  # fmt: skip
    demo_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    engine_args(p, loads_models=True)
    p.set_defaults(func=cmd_tune)
    return p


class _ProgressLine:
    """One self-overwriting line on stderr (a terminal only)."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self._last = 0.0

    def __call__(self, p: Progress) -> None:
        now = time.monotonic()
        if now - self._last < 0.1 and p.phase == "measuring":
            return
        self._last = now
        best = f"  best {p.best:.1f} tok/s" if p.best else ""
        what = (f"rung {p.rung + 1}/{p.rungs}  {p.done}/{p.total} measured" if p.phase in ("measuring", "done")
                else p.message)  # fmt: skip
        self.stream.write(f"\r\033[K[{p.phase}] {what}{best}  {p.elapsed:.0f} of {p.budget:.0f} s")
        self.stream.flush()

    def clear(self) -> None:
        self.stream.write("\r\033[K")
        self.stream.flush()


def _check_args(args) -> tuple[tuple[int, ...], dict[str, int]]:
    from ..tune.plan import parse_budgets

    qs = parse_q(args.q)
    args.modes = parse_modes(args.modes)
    args.max_kl = None if args.max_kl is None else parse_max_kl(args.max_kl)
    if args.no_draft and args.q != "auto":
        raise ArgumentError(f"--q {args.q}: there is no draft to give a length (drop --no-draft or --q)")
    check_time_budget(args.time_budget)
    caps = parse_budgets(args.budget)
    for p in args.prompt or ():
        if not p:
            raise ArgumentError("--prompt '' is empty: give some text")
        check_prompt(p)
    if args.out is not None:
        if args.out.is_dir():
            raise ArgumentError(f"--out {args.out}: is a folder, expected a profile file to write")
        check_output(args.out)
        folder = args.out.expanduser().resolve().parent
        if not folder.is_dir():
            raise ArgumentError(f"--out {args.out}: the folder {folder} does not exist")
    check_model_args(args)
    return qs, caps


def _model_ref(args, folder):
    from ..profiles.profile import ModelRef, fingerprint

    if is_self_draft(folder):  # the model's own MTP layer: its files and fingerprint are the model's
        return ModelRef(own=True)
    fp = fingerprint(folder)
    if args.model is None:  # the demo pair, by its name (never a path into the cache)
        fmt = args.demo_format or "safetensors"
        family = args.demo_family or DEFAULT_FAMILY
        quant = check_format(fmt, args.demo_quant, family)
        return ModelRef(demo=args.demo_size or "default", fingerprint=fp,
                        family=None if family == DEFAULT_FAMILY else family,
                        format=None if fmt == "safetensors" else fmt, quant=quant)  # fmt: skip
    return ModelRef(path=str(Path(folder).expanduser().resolve()), fingerprint=fp)


def cmd_tune(args) -> int:
    qs, caps = _check_args(args)
    target_dir, draft_dir = model_paths(args, with_draft=not args.no_draft)
    if draft_dir is None and args.q != "auto":
        raise ArgumentError(f"--q {args.q}: there is no draft to give a length (add --draft)")
    prompts = args.prompt or None
    with make_engine(args) as eng:
        pair = open_pair(
            eng, target_dir, draft_dir, device=args.device, weights=args.weights, check_weights=args.check_weights
        )
        target, draft = pair.target, pair.draft
        routing = RoutingStats.read_hotness_csv(args.routing) if args.routing else None
        settings = TuneSettings(fast=args.fast, caps=caps, qs=qs, modes=args.modes, time_budget=args.time_budget,
                                prompts=prompts, routing=routing, calibrate=not args.no_calibrate)  # fmt: skip
        constraints, kl = [], None
        if args.max_kl is not None:
            from ..runs.quality import KLLimit

            limit = KLLimit.for_model(args.max_kl, target, prompts=prompts, tokens=QUALITY_TOKENS)
            kl = KLConstraint(limit, target.device)
            constraints.append(kl)
        progress = _ProgressLine() if sys.stderr.isatty() else None
        tuning = Tuning(target, draft, settings, on_progress=progress, constraints=constraints)
        result, interrupted = _run_interruptible(tuning)
        if progress is not None:
            progress.clear()
        doc = report(result, None if kl is None else kl.cost)
        doc["max_kl"] = args.max_kl
        if args.max_kl is not None and args.modes == ("reference",):
            doc["notes"].append(f"--max-kl {args.max_kl:g}: only the reference mode was searched, which costs "
                                "nothing: nothing to exclude (add --modes reference,owner_local)")  # fmt: skip
        if args.routing:
            doc["routing"] = args.routing
        doc["model"] = str(target.checkpoint.folder)
        doc["draft"] = None if draft is None else draft_label(draft)
        doc["synthetic"] = is_synthetic(target.checkpoint)
        chosen = result.search.chosen()
        if args.out is not None and chosen is not None:
            draft_ref = None if draft is None else _model_ref(args, draft_dir)
            profile = profile_for(chosen, args.out, _model_ref(args, target_dir), draft_ref, target.device,
                                  prompts, result.routing)  # fmt: skip
            profile.save(args.out)
            doc["out"] = str(args.out)
        elif args.out is not None:
            doc["notes"].append(f"--out {args.out}: not written: no point was measured with the one-device hashes")
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        sys.stdout.write(text(doc, synthetic_note(doc["synthetic"])))
    if interrupted:
        print("expertbench: interrupted", file=sys.stderr)
        return 130
    return 0


def _run_interruptible(tuning: Tuning) -> tuple[TuneResult, bool]:
    """run() on a worker thread, so that Ctrl-C cancels at the next step and the partial front is still reported."""
    box: dict = {}

    def work():
        try:
            box["result"] = tuning.run()
        except BaseException as exc:  # re-raised on the calling thread
            box["error"] = exc

    thread = threading.Thread(target=work, name="expertbench-tune", daemon=True)
    thread.start()
    interrupted = False
    while thread.is_alive():
        try:
            thread.join(0.2)
        except KeyboardInterrupt:
            interrupted = True
            tuning.cancel()
    if "error" in box:
        raise box["error"]
    return box["result"], interrupted
