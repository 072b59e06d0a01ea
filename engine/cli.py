"""The expertbench command line.

Exit codes: 0 success, 1 a regression (regress), 2 bad input or usage, 130 interrupted. Errors are one
line on stderr. Long work shows progress on stderr when it is a terminal and stays quiet when piped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .checkpoint import Checkpoint
from .demo import (
    DEFAULT_FAMILY,
    DEMO_FORMATS,
    DEMO_PROMPTS,
    FAMILIES,
    QUANTS,
    SIZES,
    check_format,
    ensure_demo_pair,
    is_synthetic,
    quant_formats,
)
from .devices import DeviceSettings
from .errors import EngineError
from .export import add_import_parser
from .export import add_parser as add_export_parser
from .formats import FORMATS
from .model import WEIGHTS_MODES, Engine
from .regress import add_parser as add_regress_parser
from .run import PRECISIONS, REDUCTION_MODES, DecodeRun, RunResult, StepEvent
from .speculative import MAX_DRAFT_TOKENS
from .strategy import STRATEGIES as _STRATEGIES
from .trace import write_chrome_trace
from .tune import add_parser as add_tune_parser

SYNTHETIC_NOTE = "synthetic: random weights, its text is noise by design"
STRATEGY_NAMES = tuple(_STRATEGIES)


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runtime", action="append", default=[], metavar="NAME",
                   help="load runtime NAME as well as cpu (cuda, hip, hostsim); repeat for several")  # fmt: skip
    p.add_argument("--cpu-devices", type=int, default=0, help="split the CPU into N devices (default 1)")
    p.add_argument("--threads", type=int, default=0, help="worker threads per CPU device (default: all cores)")
    p.add_argument("--kernels", choices=("best", "avx2", "portable"),
                   help="the most the CPU kernels may use: best (AVX2, and AVX-512 VNNI for --precision q8, where the "
                        "CPU has them; the same results as avx2), avx2, or portable C (default: "
                        "$EXPERTBENCH_CPU_KERNELS, else best)")  # fmt: skip
    p.add_argument("--portable", action="store_true", help="the portable C kernels (same as --kernels portable)")
    p.add_argument("--module-path", action="append", default=[], metavar="NAME=FILE",
                   help="load runtime module NAME from FILE (authoritative)")  # fmt: skip


def _device_settings(args, strict: bool = True) -> DeviceSettings:
    paths = {}
    for item in args.module_path:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise EngineError(f"--module-path {item!r}: expected NAME=FILE, e.g. cpu=/path/expertbench_rt_cpu.so")
        paths[name] = file
    if args.cpu_devices < 0 or args.threads < 0:
        raise EngineError("--cpu-devices and --threads must be >= 0")
    runtimes = ("cpu", *(r for r in dict.fromkeys(args.runtime) if r != "cpu"))
    return DeviceSettings(runtimes=runtimes, required=None if strict else (), module_paths=paths,
                          cpu_devices=args.cpu_devices, cpu_threads=args.threads, portable=args.portable or None,
                          kernels=args.kernels)  # fmt: skip


def _make_engine(args, strict: bool = True) -> Engine:
    """The engine the command's device options ask for (engine.devices, as regress and the window make theirs)."""
    return _device_settings(args, strict).open()


def _tell(message: str) -> None:
    """A status line for a person at a terminal; nothing when stderr is piped."""
    if sys.stderr.isatty():
        print(f"expertbench: {message}", file=sys.stderr, flush=True)


class ProgressBar:
    """One self-overwriting line on stderr, redrawn at most 10 times a second from the run's thread."""

    def __init__(self, total_tokens: int, repeats: int, prompts: int, stream=None):
        self.total, self.repeats, self.prompts = total_tokens, repeats, prompts
        self.stream = stream if stream is not None else sys.stderr
        self.done = self.drafted = self.accepted = 0
        self.decode_tokens, self.decode_seconds = 0, 0.0
        self._last_draw = 0.0

    def __call__(self, event: StepEvent) -> None:
        self.done += event.tokens
        self.drafted += event.drafted
        self.accepted += event.accepted
        if event.phase == "decode":
            self.decode_tokens += event.tokens
            self.decode_seconds += event.seconds
        now = time.monotonic()
        if now - self._last_draw >= 0.1 or self.done >= self.total:
            self._last_draw = now
            self._draw(event)

    def _draw(self, event: StepEvent) -> None:
        width = 24
        filled = width * self.done // max(1, self.total)
        rate = f"{self.decode_tokens / self.decode_seconds:8.1f} tok/s" if self.decode_seconds > 0 else " " * 14
        accept = f"  accept {100 * self.accepted / self.drafted:5.1f} %" if self.drafted else ""
        where = f"repeat {event.repeat + 1}/{self.repeats}  prompt {event.prompt + 1}/{self.prompts}"
        line = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} tokens  {where}  {rate}{accept}"
        self.stream.write("\r\033[K" + line)
        self.stream.flush()

    def clear(self) -> None:
        self.stream.write("\r\033[K")
        self.stream.flush()


def _check_run_args(args) -> None:
    """Cheap checks first, so bad input fails before any model is loaded or built."""
    if args.n < 1:
        raise EngineError(f"-n {args.n}: expected a positive number of tokens")
    if args.repeats < 1:
        raise EngineError(f"--repeats {args.repeats}: expected a positive number")
    if not 1 <= args.q <= MAX_DRAFT_TOKENS:
        raise EngineError(f"--q {args.q}: expected a draft length of 1..{MAX_DRAFT_TOKENS} tokens")
    if args.top_k is not None and args.top_k < 1:
        raise EngineError(f"--top-k {args.top_k}: expected a positive number of experts per token")
    for p in args.prompt or ():
        if not p:
            raise EngineError("--prompt '' is empty: give some text")
    _check_model_args(args)
    if args.trace is not None:
        folder = args.trace.parent
        if args.trace.is_dir():
            raise EngineError(f"--trace {args.trace}: is a folder, expected a file to write")
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise EngineError(f"--trace {args.trace}: the folder {folder} does not exist or is not writable")


def _check_model_args(args) -> None:
    """--model and the demo's options (run, plan)."""
    demo = [f"--{k.replace('_', '-')}" for k in ("demo_family", "demo_size", "demo_format", "demo_quant")
            if getattr(args, k)]  # fmt: skip
    if args.model is not None and demo:
        raise EngineError(f"{' and '.join(demo)}: choose the demo pair, which runs only without --model")
    if args.demo_quant is not None and args.demo_format != "gguf":
        raise EngineError(f"--demo-quant {args.demo_quant}: only the GGUF demo is quantized (add --demo-format gguf)")


def _model_paths(args, with_draft: bool) -> tuple:
    """The target (and draft) the options name: --model (--draft), else the demo pair (built once when missing)."""
    target_dir, draft_dir = args.model, getattr(args, "draft", None)
    if target_dir is None:
        size = args.demo_size or "default"
        family = args.demo_family or DEFAULT_FAMILY
        fmt = args.demo_format or "safetensors"
        quant = check_format(fmt, args.demo_quant, family)
        what = _demo_name(size, fmt, quant, family)
        pair = ensure_demo_pair(size, format=fmt, quant=quant, family=family, on_build=lambda why: _tell(
            f"building the synthetic demo model pair ({what}; {why}), once..."))  # fmt: skip
        target_dir = pair.target
        if draft_dir is None and with_draft:
            draft_dir = pair.draft
    return target_dir, draft_dir


def cmd_run(args) -> int:
    _check_run_args(args)
    target_dir, draft_dir = _model_paths(args, with_draft=not args.no_draft)
    prompts = args.prompt or DEMO_PROMPTS
    with _make_engine(args) as eng:
        # fewer experts per token than the checkpoint's are the run's context setting; more need a load with more
        checkpoint = Checkpoint.open(target_dir)
        reload = args.top_k is not None and args.top_k > checkpoint.config.top_k
        target = eng.load(checkpoint, device=args.device, weights=args.weights, top_k=args.top_k if reload else None)
        draft = None
        if draft_dir is not None:
            draft = eng.load(draft_dir, device=args.draft_device or args.device, weights=args.weights)
        if draft is not None and draft.config.moe_layers:  # (the DeepSeek demo's draft has experts, but no MoE layer)
            draft.set_placement(f"*={draft.device}")  # a GPU primary's experts start in host memory
        placement = args.placement
        if placement is None and target.config.num_experts > 0:
            placement = f"*={args.device}"
        run = DecodeRun(target, draft, prompts=prompts, tokens_per_prompt=args.n, repeats=args.repeats, q=args.q,
                        mode=args.mode, precision=args.precision, placement=placement,
                        trace=args.trace is not None, top_k=None if reload else args.top_k)  # fmt: skip
        progress = None
        if sys.stderr.isatty():
            progress = ProgressBar(args.n * len(prompts) * args.repeats, args.repeats, len(prompts))
            run.on_event = progress
        # On a worker thread, so that Ctrl-C cancels at the next step and the partial result is still reported.
        run.start()
        interrupted = False
        try:
            result = run.wait()
        except KeyboardInterrupt:
            interrupted = True
            run.cancel()
            result = run.wait()
        finally:
            if progress is not None:
                progress.clear()
        report = _report(result, target, draft, prompts, eng.runtimes[0].kernel_variant, run.prompt_ids)
        report["quality"] = None
        if not (args.no_quality or interrupted or result.cancelled):
            cost = _quality(eng, args, target_dir, target, prompts, result)
            report["quality"] = None if cost is None else cost.to_dict()
    if args.trace is not None:
        meta = {k: report.get(k) for k in ("target", "draft", "target_device", "mode", "precision", "placement", "q",
                                           "trace_spans", "trace_lost", "trace_dropped")}  # fmt: skip
        write_chrome_trace(args.trace, run.spans, metadata=meta)
        report["trace"] = str(args.trace)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(report, result, len(prompts))
    if interrupted:
        print("expertbench: interrupted", file=sys.stderr)
        return 130
    return 0


def _quality(eng, args, target_dir, target, prompts, result: RunResult):
    """The quality cost of the run's fast settings (owner_local, q8, --top-k) against the reference mode on its prompts
    (engine.quality), the run itself as the fast side; None for a run in the reference settings. With --top-k below the
    checkpoint's own the target is its own reference (the fast side's contexts decode with fewer); above it the
    reference is the checkpoint loaded again with its own experts per token."""
    from .quality import is_fast, quality_cost

    native = getattr(target, "native_top_k", target.config.top_k)
    if not is_fast(result.mode, result.precision, args.top_k, native):
        return None
    _tell("measuring the quality cost against the reference mode...")
    reference, top_k = target, None
    if args.top_k is not None and args.top_k != native:
        if target.config.top_k == native:  # loaded with its own count: the run's contexts decoded with fewer
            top_k = args.top_k
        else:
            reference = eng.load(target_dir, device=args.device, weights=args.weights)
    try:
        return quality_cost(reference, target, prompts=prompts, tokens=args.n, mode=result.mode,
                            precision=result.precision, fast_result=result, top_k=top_k)  # fmt: skip
    finally:
        if reference is not target:
            reference.close()


def _report(result: RunResult, target, draft, prompts, kernels: str, prompt_ids=None) -> dict:
    report = {
        "synthetic": is_synthetic(target.checkpoint),
        "draft_synthetic": None if draft is None else is_synthetic(draft.checkpoint),
        "kernels": kernels,
        **result.to_dict(),
    }
    info = target.info
    report["weights"] = {"held": info["weights"], "file_bytes": info["file_bytes"],
                         "huge_page_bytes": info["huge_page_bytes"], "formats": _formats(target)}  # fmt: skip
    if draft is not None:
        report["draft_weights"] = {"formats": _formats(draft)}
    report["prompts"] = [
        {"prompt": text, "text": target.decode_text(p.generated_ids), **entry}
        for text, p, entry in zip(prompts, result.prompts, report["prompts"], strict=False)
    ]
    report.update(_reference(result, target, prompts, prompt_ids))
    return report


def _reference(result: RunResult, target, prompts, prompt_ids=None) -> dict:
    """The run's output hash as the window's history shows it (engine.history.combined_hash), and the reference run
    of the same outputs key in that history (read only: `run` keeps nothing there), with whether they agree and,
    where they do not, why (engine.diverge)."""
    from .history import History, combined_hash, diagnose_change, history_file, outputs_key
    from .profile import fingerprint

    complete = bool(result.output_sha256) and len(result.output_sha256) == len(prompts)
    out = {"output_hash": combined_hash(result.output_sha256) if complete else None, "reference": None}
    try:
        fp = fingerprint(target.checkpoint.folder)
    except EngineError:
        return out
    key = outputs_key(fp, list(prompts), result.tokens_per_prompt, result.precision, result.mode,
                      result.placement or "", [result.target_device], result.top_k)  # fmt: skip
    ref = History.load(history_file(fp)).reference(key)
    if ref is not None and complete:
        diagnosis = diagnose_change(ref, result, target, prompt_ids)
        out["reference"] = {"run": ref.index, "started": ref.started, "output_hash": ref.output_hash,
                            "same": ref.output_hash == out["output_hash"],
                            "diagnosis": None if diagnosis is None else diagnosis.to_dict()}  # fmt: skip
    return out


def _formats(model) -> list[str]:
    """The weight formats of a model's tensors (engine/formats.py names), most bytes first (a gpt-oss folder's uint8
    *_blocks and *_scales are the MXFP4 rows the core packs them into)."""
    held: dict[str, int] = {}
    for name, t in model.checkpoint.tensors.items():
        fmt = "MXFP4" if t.dtype == "U8" and name.endswith(("_blocks", "_scales")) else t.dtype
        held[fmt] = held.get(fmt, 0) + t.nbytes
    return sorted(held, key=lambda f: (-held[f], f))


def _quantized(formats_: list[str]) -> bool:
    return any(FORMATS[f].quantized for f in formats_ if f in FORMATS)


PRECISION_NOTES = {
    "f32": "activations meet exactly dequantized weights in f32: the reference",
    "q8": "activations quantized to int8 per block, integer products as llama.cpp: not the reference, its "
    "tokens and hashes may differ from f32's",
}


def _precision_line(report: dict) -> str:
    note = PRECISION_NOTES[report["precision"]]
    formats_ = report["weights"]["formats"] + report.get("draft_weights", {}).get("formats", [])
    if report["precision"] == "q8" and not _quantized(formats_):
        note = "no quantized weights here: float weights are read in f32, the same output as f32"
    return f"precision {report['precision']} ({note})"


def _rate(median, lo, hi) -> str:
    if median is None:
        return "not measured"
    spread = f"  (min {lo:.1f}, max {hi:.1f})" if lo != hi else ""
    return f"{median:10.1f} tokens/s{spread}"


def _size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if nbytes < 1024:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} GiB"


def _synthetic_note(synthetic) -> str:
    return f"  ({SYNTHETIC_NOTE})" if synthetic else ""


def _print_table(report: dict, result: RunResult, n_prompts: int) -> None:
    print(f"model     {report['target']}{_synthetic_note(report['synthetic'])}")
    if report["draft"]:
        print(f"draft     {report['draft']}  q={report['q']}{_synthetic_note(report['draft_synthetic'])}")
    else:
        print("draft     none (target-only greedy decoding)")
    devices = f"target {report['target_device']}" + (f", draft {report['draft_device']}" if report["draft"] else "")
    print(f"devices   {devices} ({report['kernels']} kernels)")
    print(f"mode      {report['mode']}")
    print(_precision_line(report))
    w = report["weights"]
    huge = f", {_size(w['huge_page_bytes'])} on huge pages" if w["held"] == "copy" else ""
    print(f"weights   {w['held']} ({_size(w['file_bytes'])}{huge}; {', '.join(w['formats'])})")
    if report["placement"] is not None:
        print(f"placement {report['placement']}")
    print(f"run       {n_prompts} prompts x {report['tokens_per_prompt']} tokens x {report['repeats']} repeats"
          f"{'  (cancelled: partial)' if report['cancelled'] else ''}")  # fmt: skip
    for what in ("prefill", "decode"):
        key = f"{what}_tokens_per_second"
        print(f"{what:9s} {_rate(report[key], report[key + '_min'], report[key + '_max'])}")
    if report.get("quality") is not None:
        q = report["quality"]
        experts = f", {q['native_top_k']} experts per token" if q["native_top_k"] else ""
        print(f"quality   {q['summary']}  (against the reference mode, f32{experts})")
        if q["diagnosis"] is not None:
            print(f"          {q['diagnosis']['summary']}")
    if report["accept_rate"] is not None:
        print(f"accept    {100 * report['accept_rate']:10.1f} %  ({report['accepted_tokens']} of "
              f"{report['drafted_tokens']} drafted tokens)")  # fmt: skip
    if report["device_busy_share"]:
        busy = ", ".join(f"{d} {100 * v:.0f} %" for d, v in report["device_busy_share"].items())
        print(f"busy      {busy}")
    if report["staging_bytes"]:
        staged = ", ".join(f"{pair} {_size(n)}" for pair, n in report["staging_bytes"].items())
        print(f"staged    {staged}  ({report['joins']} joins)")
    if report["host_round_trips"] or report["graph_launches"]:
        print(f"primary   {report['host_round_trips']} host round trips (MoE layer steps with experts elsewhere), "
              f"{report['graph_launches']} recorded parts launched")  # fmt: skip
    if report.get("trace"):
        lost = f", {report['trace_lost']} lost" if report["trace_lost"] else ""
        if report["trace_dropped"]:
            lost += (f"; the newest {report['trace_spans'] - report['trace_dropped']} written, the first "
                     f"{report['trace_dropped']} dropped to keep the trace bounded")  # fmt: skip
        print(f"trace     {report['trace']} ({report['trace_spans']} spans{lost}; open in Perfetto)")
    complete = sum(r.complete for r in result.repeat_results)
    if complete > 1:
        held = "held over" if report["repeats_agree"] else "CHANGED between"
        print(f"hashes    {held} {complete} repeats")
        diagnosis = result.repeats_diagnosis()
        for line in diagnosis.lines() if diagnosis is not None else ():
            print(f"          {line}")
    ref = report.get("reference")
    if ref is not None:
        said = "the same output as" if ref["same"] else f"CHANGED from {ref['output_hash'][:12]} of"
        print(f"reference {report['output_hash'][:12]}: {said} run {ref['run']} of the window's history "
              f"({ref['started'].replace('T', ' ')})")  # fmt: skip
        for line in (ref.get("diagnosis") or {}).get("lines", ()):
            print(f"          {line}")
    print()
    print(f"{'#':>2}  {'prompt':>6}  {'output sha256':16}  output")
    for i, p in enumerate(report["prompts"]):
        text = p["text"].replace("\n", " ")
        text = text if len(text) <= 60 else text[:57] + "..."
        print(f"{i:>2}  {p['prompt_tokens']:>6}  {p['output_sha256'][:16]}  {text!r}")


def cmd_plan(args) -> int:
    from . import plan
    from .routing import RoutingStats
    from .strategy import check_name

    try:
        check_name(args.strategy)
    except EngineError as exc:
        raise EngineError(f"--strategy {args.strategy}: {exc}") from None
    caps = plan.parse_budgets(args.budget)
    _check_model_args(args)
    target_dir, _draft = _model_paths(args, with_draft=False)
    with _make_engine(args) as eng:
        target = eng.load(target_dir, device=args.device, weights=args.weights)
        routing = None
        if args.routing is not None:
            routing = RoutingStats.read_hotness_csv(args.routing)
        if not args.no_calibrate:
            _tell("measuring the devices for the cost model (a few short decodes on each)...")
        report = plan.make_plan(target, args.strategy, args.fast, caps, measure=not args.no_calibrate,
                                routing=routing, routing_source=args.routing)  # fmt: skip
        report["synthetic"] = is_synthetic(target.checkpoint)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        sys.stdout.write(plan.text(report, _synthetic_note(report["synthetic"])))
    return 0


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--demo-family", choices=tuple(FAMILIES),
                   help="which demo pair to use when no --model is given: qwen3 (Qwen3-MoE target, dense Qwen3 "
                        "draft; default), deepseek (DeepSeek-V3 target, dense DeepSeek-V3 draft) or gpt-oss "
                        "(gpt-oss target with MXFP4 experts, one-expert gpt-oss draft); the last two safetensors "
                        "only")  # fmt: skip
    p.add_argument("--demo-size", choices=sorted(SIZES),
                   help="which demo pair to use when no --model is given (default: default)")  # fmt: skip
    p.add_argument(
        "--demo-format",
        choices=DEMO_FORMATS,
        help="the demo pair as safetensors folders (bf16; default) or as GGUF files (see --demo-quant)",
    )
    p.add_argument("--demo-quant", choices=tuple(QUANTS),
                   help="with --demo-format gguf: q8_0 (every matrix Q8_0; default) or mxfp4 (MXFP4 experts, Q8_0 "
                        "elsewhere, as llama.cpp's MXFP4_MOE)")  # fmt: skip


def _demo_name(size: str, fmt: str, quant: str | None, family: str = DEFAULT_FAMILY) -> str:
    name = size if family == DEFAULT_FAMILY else f"{FAMILIES[family][0]} {size}"
    return name if fmt == "safetensors" else f"{name}, GGUF {quant}"


def cmd_demo_model(args) -> int:
    if args.quant is not None and args.format != "gguf":
        raise EngineError(f"--quant {args.quant}: only the GGUF demo is quantized (add --format gguf)")
    quant = check_format(args.format, args.quant, args.family)
    what = _demo_name(args.size, args.format, quant, args.family)
    t0 = time.perf_counter()
    pair = ensure_demo_pair(args.size, verify=args.verify, rebuild=args.rebuild, format=args.format, quant=quant,
                            family=args.family, on_build=lambda why: _tell(
                                f"building the synthetic demo model pair ({what}; {why})..."))  # fmt: skip
    seconds = time.perf_counter() - t0
    report = {"family": pair.family, "size": pair.size, "format": pair.format, "quant": pair.quant,
              "target": str(pair.target), "draft": str(pair.draft), "synthetic": True, "built": pair.built,
              "reason": pair.reason, "checked": "sha256" if args.verify else "sizes", "seconds": seconds}  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    state = f"built in {seconds:.1f} s ({pair.reason})" if pair.built else f"intact ({report['checked']} checked)"
    target_kind, draft_kind = FAMILIES[pair.family]
    print(f"demo model pair '{what}' ({SYNTHETIC_NOTE}): {state}")
    print(f"target    {pair.target}  ({target_kind}, {quant_formats(quant, 'target', pair.family)})")
    print(f"draft     {pair.draft}  ({draft_kind}, {quant_formats(quant, 'draft', pair.family)})")
    return 0


def cmd_devices(args) -> int:
    """Every runtime this build has, loaded side by side; one that cannot run here is listed with its reason."""
    if not args.runtime:
        args.runtime = ["hostsim", "cuda", "hip"]
    with _make_engine(args, strict=False) as eng:
        runtimes = eng.runtimes
        devices = eng.devices
        missing = dict(eng.load_errors)
    if args.json:
        print(json.dumps({"runtimes": [r.__dict__ for r in runtimes], "devices": [d.__dict__ for d in devices],
                          "unavailable": missing}, indent=2))  # fmt: skip
        return 0
    gib = 1 << 30
    for r in runtimes:
        print(f"runtime {r.name}: {r.n_devices} device(s), {r.kernel_variant} kernels, ABI {r.abi_version}, {r.path}")
        for d in devices:
            if d.name.split(":")[0] == r.name:
                threads = f"{d.threads} threads, " if d.threads else ""
                print(f"  {d.name:10s} {d.kind:4s} {d.description} - {threads}"
                      f"{d.memory_free / gib:.1f} of {d.memory_total / gib:.1f} GiB free")  # fmt: skip
    for name, reason in missing.items():
        print(f"runtime {name}: unavailable - {reason}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="expertbench",
        description="Mixture-of-Experts tuning workbench. With no command, or with the window's options "
        "(expertbench --profile FILE --theme dark ...), it opens the window; expertbench FILE.yaml opens it on a "
        "profile; expertbench gui --help lists the window's options.",
    )
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("gui", add_help=False, help="open the workbench window (the default with no command; "
                   "expertbench gui --help for its options)")  # fmt: skip
    run = sub.add_parser(
        "run",
        help="decode runs: tokens/s, draft acceptance and output hashes",
        description="Greedy decode runs over prompts, with a draft model (speculative decoding) or without. "
        "With no --model, runs the built-in synthetic demo pair (see 'expertbench demo-model'; --demo-family, "
        "--demo-size, --demo-format and --demo-quant choose which).",
    )
    run.add_argument("--model", metavar="PATH",
                     help="Hugging Face model folder or GGUF file (default: the synthetic demo target)")  # fmt: skip
    drafts = run.add_mutually_exclusive_group()
    drafts.add_argument(
        "--draft",
        metavar="PATH",
        help="draft model folder or GGUF file (default: the demo draft when --model is not given, else none)",
    )
    drafts.add_argument("--no-draft", action="store_true", help="target-only greedy decoding")
    run.add_argument("--q", type=int, default=2, help=f"draft tokens per step, 1..{MAX_DRAFT_TOKENS} (default 2)")
    run.add_argument("--mode", default="reference", choices=REDUCTION_MODES,
                     help="expert reduction: reference (identical outputs on any placement; default) or owner_local "
                          "(each owner pre-sums its experts: fewer bytes, another float association)")  # fmt: skip
    run.add_argument("--precision", default="f32", choices=PRECISIONS,
                     help="how activations meet quantized weights (GGUF Q8_0, Q4_K, Q5_K, Q6_K, MXFP4): f32 (exactly "
                          "dequantized weights, f32 sums: the reference, identical on any placement; default) or q8 "
                          "(activations quantized to int8 per block, integer products, as llama.cpp's CPU "
                          "kernels: faster and deterministic, but NOT the reference: other logits, and its tokens "
                          "and output hashes may differ from f32's). Float weights are read in f32 either "
                          "way")  # fmt: skip
    run.add_argument("--top-k", type=int, metavar="N",
                     help="decode with N experts per token instead of the model's own num_experts_per_tok (a speed "
                          "choice: its quality cost is measured and reported). Fewer than its own are a setting of "
                          "the run, with no second load; more than its own load the checkpoint with N, and a second "
                          "time at its own count for the quality measurement")  # fmt: skip
    run.add_argument("--no-quality", action="store_true",
                     help="skip measuring the quality cost of a fast mode (owner_local, q8, --top-k): greedy "
                          "agreement, mean KL divergence of the next-token distributions and the first divergence "
                          "against the reference mode, on the same prompts")  # fmt: skip
    run.add_argument("--placement", metavar="TEXT",
                     help="where the target's experts live: rules LAYERS=DEVICE or LAYER.EXPERTS=DEVICE separated by "
                          "';', applied in order over --device, e.g. '0-7=cuda:0; 12.3=cuda:0' (default: all on "
                          "--device)")  # fmt: skip
    run.add_argument("--prompt", action="append", metavar="TEXT",
                     help="a prompt; repeat for several (default: 4 built-in prompts)")  # fmt: skip
    run.add_argument("-n", type=int, default=64, help="tokens to generate per prompt (default 64)")
    run.add_argument("--repeats", type=int, default=3, help="passes over the prompts (default 3)")
    run.add_argument("--device", default="cpu:0", help="the target's primary device (default cpu:0)")
    run.add_argument("--weights", default="auto", choices=tuple(WEIGHTS_MODES),
                     help="hold the checkpoints' files copied onto huge pages (faster to stream), memory-mapped, or "
                     "auto: copied where huge pages are enabled and the files take at most half of the memory "
                     "available (default)")  # fmt: skip
    run.add_argument("--draft-device", help="the draft's device (default: --device)")
    _demo_args(run)
    run.add_argument("--json", action="store_true", help="print one JSON document")
    run.add_argument("--trace", metavar="FILE", type=Path,
                     help="write the per-token trace (what ran on which device, when, per step and layer) as Chrome "
                          "trace event JSON, for Perfetto or chrome://tracing")  # fmt: skip
    _engine_args(run)
    run.set_defaults(func=cmd_run)
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
    _demo_args(plan)
    plan.add_argument("--json", action="store_true", help="print one JSON document")
    _engine_args(plan)
    plan.set_defaults(func=cmd_plan)
    demo = sub.add_parser(
        "demo-model",
        help="build (or check) the synthetic demo model pair in the cache folder",
        description="Writes a seeded synthetic Qwen3-MoE target and a dense Qwen3 draft built from it into "
        "$XDG_CACHE_HOME/expertbench (or ~/.cache/expertbench). Random weights: the text they write is noise, "
        "but the pair behaves like a real target and draft (acceptance about 75 % at q=2). --format gguf writes "
        "the same weights as GGUF files, quantized as llama.cpp quantizes them (--quant q8_0: every matrix Q8_0; "
        "mxfp4: MXFP4 experts and Q8_0 elsewhere, llama.cpp's MXFP4_MOE; norms and the router F32), a cache entry "
        "of its own per quantization; run it with 'expertbench run --demo-format gguf --demo-quant Q'. The 4-bit "
        "experts stray further from the Q8_0 draft: the mxfp4 pair accepts fewer draft tokens. --family deepseek "
        "writes a DeepSeek-V3-shaped pair instead (MLA attention, grouped sigmoid routing, a shared expert, a dense "
        "first layer, YaRN; its draft a DeepSeek-V3 of dense layers), as safetensors folders; --family gpt-oss a "
        "gpt-oss-shaped pair in the released layout (MXFP4 experts, bf16 elsewhere; sliding and full attention "
        "alternating, attention sinks, biases, the clamped SwiGLU, YaRN; its draft a gpt-oss of fewer layers with one "
        "expert each).",
    )
    demo.add_argument("--family", default=DEFAULT_FAMILY, choices=tuple(FAMILIES),
                      help="qwen3: a Qwen3-MoE target and a dense Qwen3 draft (default); deepseek: a DeepSeek-V3 "
                           "target (DeepseekV3ForCausalLM) and a dense DeepSeek-V3 draft; gpt-oss: a gpt-oss target "
                           "(GptOssForCausalLM, MXFP4 experts) and a one-expert gpt-oss draft")  # fmt: skip
    demo.add_argument("--size", default="default", choices=sorted(SIZES),
                      help="default (about 60 M parameters; gpt-oss: 110 M, MXFP4 experts) or bench (about 1 B; "
                           "gpt-oss: 0.9 B in 600 MB)")  # fmt: skip
    demo.add_argument("--format", default="safetensors", choices=DEMO_FORMATS,
                      help="safetensors: model folders of bf16 weights (default); gguf: the same weights as GGUF files "
                           "(llama.cpp's format), quantized as --quant says")  # fmt: skip
    demo.add_argument("--quant", choices=tuple(QUANTS),
                      help="with --format gguf: q8_0 (every matrix Q8_0; default) or mxfp4 (MXFP4 experts, Q8_0 "
                           "elsewhere, as llama.cpp's MXFP4_MOE); norms and the router stay F32")  # fmt: skip
    demo.add_argument("--verify", action="store_true", help="re-hash every file (otherwise sizes are checked)")
    demo.add_argument("--rebuild", action="store_true", help="build again even when intact")
    demo.add_argument("--json", action="store_true", help="print one JSON document")
    demo.set_defaults(func=cmd_demo_model)
    dev = sub.add_parser("devices", help="list runtimes and devices")
    dev.add_argument("--json", action="store_true")
    _engine_args(dev)
    dev.set_defaults(func=cmd_devices)
    add_regress_parser(sub)
    add_tune_parser(sub)
    add_export_parser(sub)
    add_import_parser(sub)
    return parser


# The window's options (app/launch.py): given first, they mean the window, as `expertbench gui` with them does.
WINDOW_OPTIONS = ("--model", "--draft", "--no-draft", "--profile", "--placement", "--device", "--cpu-devices",
                  "--runtimes", "--theme", "--screenshot", "--size")  # fmt: skip


def window_arguments(argv: list[str]) -> list[str] | None:
    """The window's arguments when argv asks for the window: nothing, `gui ...`, a profile file (FILE.yaml ...) or
    the window's own options first; None for a command."""
    if not argv:
        return []
    if argv[0] == "gui":
        return argv[1:]
    if argv[0].endswith((".yaml", ".yml")) and not argv[0].startswith("-"):
        return ["--profile", *argv]
    if argv[0].split("=", 1)[0] in WINDOW_OPTIONS:
        return argv
    return None


def _open_window(argv: list[str]) -> int:
    """The workbench window (app/, which needs PySide6 and pyqtgraph) with the window's arguments."""
    import app

    try:
        return app.main(argv)
    except ModuleNotFoundError as exc:
        print(f"expertbench: the window needs {exc.name} (pip install PySide6-Essentials pyqtgraph); the commands "
              "work without it: expertbench --help", file=sys.stderr)  # fmt: skip
        return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    window = window_arguments(argv)
    if window is not None:
        return _open_window(window)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except EngineError as exc:
        print(f"expertbench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("expertbench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
