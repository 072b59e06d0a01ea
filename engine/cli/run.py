"""`expertbench run`: greedy decode runs over prompts, with a draft model or without, and their report."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ..checkpoints.demo import DEMO_PROMPTS, is_synthetic
from ..core.errors import EngineError
from ..core.files import check_output
from ..core.formats import FORMATS
from ..core.trace import write_chrome_trace
from ..model import WEIGHTS_MODES
from ..profiles.profile import fingerprint
from ..runs.history import History, history_file
from ..runs.run import KV_CACHES, MAX_REPEATS, PRECISIONS, REDUCTION_MODES, DecodeRun, RunResult, StepEvent
from ..runs.speculative import MAX_DRAFT_TOKENS
from ..runs.workload import apply_chat_template, read_prompt_file, synthetic_ids
from ..session import judge_run, open_pair
from .common import (
    check_model_args,
    check_prompt,
    demo_args,
    engine_args,
    make_engine,
    model_paths,
    synthetic_note,
    tell,
)


def add_parser(sub) -> argparse.ArgumentParser:
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
        help="draft model folder or GGUF file, or 'self': the target's own multi-token-prediction module (a "
        "DeepSeek-V3 folder's MTP layer; a folder named self: ./self) (default: the demo draft when --model is not "
        "given, else none)",
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
                          "kernels, with the same bits on a GPU: faster and deterministic, but NOT the reference: "
                          "other logits, and its tokens and output hashes may differ from f32's). Float weights are "
                          "read in f32 either way")  # fmt: skip
    run.add_argument("--kv", default="f32", choices=KV_CACHES,
                     help="the KV caches' format: f32 (the reference; default), f16 or bf16 (half the cache's bytes: "
                          "each key and value rounded when stored, so other logits than f32, and its tokens and "
                          "hashes may differ; its quality cost is measured and reported). Models whose cache is other "
                          "state (DeepSeek-V3's latent, DeepSeek-V4) and GPU primaries keep f32 only: refused by "
                          "name")  # fmt: skip
    run.add_argument("--top-k", type=int, metavar="N",
                     help="decode with N experts per token instead of the model's own num_experts_per_tok (a speed "
                          "choice: its quality cost is measured and reported). Fewer than its own are a setting of "
                          "the run, with no second load; more than its own load the checkpoint with N, and a second "
                          "time at its own count for the quality measurement")  # fmt: skip
    run.add_argument("--no-quality", action="store_true",
                     help="skip measuring the quality cost of a fast mode (owner_local, q8, --kv, --top-k): greedy "
                          "agreement, mean KL divergence of the next-token distributions and the first divergence "
                          "against the reference mode, on the same prompts")  # fmt: skip
    run.add_argument("--placement", metavar="TEXT",
                     help="where the target's experts live: rules LAYERS=DEVICE or LAYER.EXPERTS=DEVICE separated by "
                          "';', applied in order over --device, e.g. '0-7=cuda:0; 12.3=cuda:0' (default: all on "
                          "--device)")  # fmt: skip
    sources = run.add_mutually_exclusive_group()
    sources.add_argument("--prompt", action="append", metavar="TEXT",
                         help="a prompt; repeat for several (default: 4 built-in prompts)")  # fmt: skip
    sources.add_argument("--prompt-file", metavar="FILE", type=Path,
                         help="the prompts of a file: UTF-8 text, one prompt per line, or JSON Lines (.jsonl, or a "
                              "first line starting with '{'), one {\"prompt\": \"...\"} per line: your own "
                              "workload, whose routing the run counts as any run's")  # fmt: skip
    sources.add_argument("--prompt-tokens", type=int, metavar="N",
                         help="one synthetic prompt of N tokens (ordinary text, as the model's tokenizer reads it): "
                              "prefill measured as llama-bench's pp N")  # fmt: skip
    run.add_argument("--chat", action="store_true",
                     help="each prompt as a user message in the model's chat template (a GGUF file's "
                          "tokenizer.chat_template, a folder's chat_template.jinja or tokenizer_config.json), the "
                          "assistant's turn begun: what a chat server feeds the model")  # fmt: skip
    run.add_argument("--depth", type=int, default=0, metavar="D",
                     help="D tokens of context (synthetic text) before each prompt, prefilled and not measured: "
                          "prefill and decode measured at that depth, as llama-bench's -d D (default 0)")  # fmt: skip
    run.add_argument("-n", type=int, default=64, help="tokens to generate per prompt (default 64)")
    run.add_argument("--repeats", type=int, default=3, help="passes over the prompts (default 3)")
    run.add_argument("--device", default="cpu:0", help="the target's primary device (default cpu:0)")
    run.add_argument("--weights", default="auto", choices=tuple(WEIGHTS_MODES),
                     help="hold the checkpoints' files copied onto huge pages (faster to stream), memory-mapped, or "
                     "auto: copied where huge pages are enabled and the files take at most half of the memory "
                     "available (default)")  # fmt: skip
    run.add_argument("--draft-device", help="the draft's device (default: --device)")
    run.add_argument("--draft-placement", metavar="TEXT",
                     help="where the draft's experts live (a MoE draft, the model's own MTP layer among them), as "
                          "--placement over --draft-device, e.g. '*=cuda:0' for a CPU draft's experts on the GPU "
                          "(default: all on --draft-device)")  # fmt: skip
    demo_args(run)
    run.add_argument("--json", action="store_true", help="print one JSON document")
    run.add_argument("--trace", metavar="FILE", type=Path,
                     help="write the per-token trace (what ran on which device, when, per step and layer) as Chrome "
                          "trace event JSON, for Perfetto or chrome://tracing")  # fmt: skip
    engine_args(run, loads_models=True)
    run.set_defaults(func=cmd_run)
    return run


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
    if args.repeats > MAX_REPEATS:
        raise EngineError(f"--repeats {args.repeats}: at most {MAX_REPEATS} passes over the prompts in one run")
    if not 1 <= args.q <= MAX_DRAFT_TOKENS:
        raise EngineError(f"--q {args.q}: expected a draft length of 1..{MAX_DRAFT_TOKENS} tokens")
    if args.top_k is not None and args.top_k < 1:
        raise EngineError(f"--top-k {args.top_k}: expected a positive number of experts per token")
    if args.prompt_tokens is not None and args.prompt_tokens < 1:
        raise EngineError(f"--prompt-tokens {args.prompt_tokens}: expected a positive number of tokens")
    if args.depth < 0:
        raise EngineError(f"--depth {args.depth}: expected a number of context tokens >= 0")
    if args.chat and args.prompt_tokens is not None:
        raise EngineError("--chat with --prompt-tokens: a synthetic prompt is tokens, not a message; use one of them")
    if args.prompt_file is not None:
        args.prompts_read = read_prompt_file(args.prompt_file)  # (ArgumentError naming the file and line)
    for p in args.prompt or ():
        if not p:
            raise EngineError("--prompt '' is empty: give some text")
        check_prompt(p)
    check_model_args(args)
    if args.trace is not None:
        folder = args.trace.parent
        if args.trace.is_dir():
            raise EngineError(f"--trace {args.trace}: is a folder, expected a file to write")
        check_output(args.trace)
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise EngineError(f"--trace {args.trace}: the folder {folder} does not exist or is not writable")


def cmd_run(args) -> int:
    _check_run_args(args)
    target_dir, draft_dir = model_paths(args, with_draft=not args.no_draft)
    prompts = args.prompt or getattr(args, "prompts_read", None) or DEMO_PROMPTS
    with make_engine(args) as eng:
        # fewer experts per token than the checkpoint's are the run's context setting; more need a load with more
        pair = open_pair(eng, target_dir, draft_dir, device=args.device, draft_device=args.draft_device,
                         weights=args.weights, check_weights=args.check_weights, top_k=args.top_k)  # fmt: skip
        target, draft = pair.target, pair.draft
        if args.draft_placement is not None:
            if draft is None or not draft.config.moe_layers:
                which = "no draft" if draft is None else f"the draft '{draft.checkpoint.folder}' routes to no experts"
                raise EngineError(f"--draft-placement {args.draft_placement!r}: {which} to place")
            draft.set_placement(args.draft_placement)
        placement = args.placement
        if placement is None and target.config.num_experts > 0:
            placement = f"*={args.device}"
        if args.chat and args.prompt_tokens is None:
            prompts = [apply_chat_template(target, p) for p in prompts]
        if args.prompt_tokens is not None:  # the text on from the depth's context, as one text reads
            prompts = [synthetic_ids(target, args.prompt_tokens, offset=args.depth)]
        run = DecodeRun(target, draft, prompts=prompts, tokens_per_prompt=args.n, repeats=args.repeats, q=args.q,
                        mode=args.mode, precision=args.precision, placement=placement,
                        trace=args.trace is not None, top_k=pair.run_top_k, depth=args.depth, kv=args.kv)  # fmt: skip
        # what decided the outputs: the depth's context and the prompt, as one sequence of ids
        decided = [run.context_ids + ids for ids in run.prompt_ids] if args.depth else prompts
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
        report = _report(result, target, draft, prompts, eng.runtimes[0].kernel_variant, run.prompt_ids, decided)
        report["quality"] = None
        if not (args.no_quality or interrupted or result.cancelled):
            cost = _quality(eng, args, target_dir, target, decided, result)
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
    """The quality cost of the run's fast settings (owner_local, q8, --kv, --top-k) against the reference mode on its
    prompts (engine.runs.quality), the run itself as the fast side; None for a run in the reference settings. With
    --top-k below the checkpoint's own the target is its own reference (the fast side's contexts decode with fewer);
    above it the reference is the checkpoint loaded again with its own experts per token."""
    from ..runs.quality import is_fast, quality_cost

    native = getattr(target, "native_top_k", target.config.top_k)
    if not is_fast(result.mode, result.precision, args.top_k, native, result.kv):
        return None
    tell("measuring the quality cost against the reference mode...")
    reference, top_k = target, None
    if args.top_k is not None and args.top_k != native:
        if target.config.top_k == native:  # loaded with its own count: the run's contexts decoded with fewer
            top_k = args.top_k
        else:
            reference = eng.load(target_dir, device=args.device, weights=args.weights, check_weights=args.check_weights)
    try:
        return quality_cost(reference, target, prompts=prompts, tokens=args.n, mode=result.mode,
                            precision=result.precision, fast_result=result, top_k=top_k, kv=result.kv)  # fmt: skip
    finally:
        if reference is not target:
            reference.close()


def _report(result: RunResult, target, draft, prompts, kernels: str, prompt_ids=None, decided=None) -> dict:
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
    report["draft_placement"] = draft.placement.describe() if draft is not None and draft.config.moe_layers else None
    report["prompts"] = [
        {"prompt": text if isinstance(text, str) else f"<{len(text)} synthetic tokens>",
         "text": target.decode_text(p.generated_ids), **entry}
        for text, p, entry in zip(prompts, result.prompts, report["prompts"], strict=False)
    ]  # fmt: skip
    report["tests"] = _tests(result, [len(ids) for ids in prompt_ids or ()])
    decided = prompts if decided is None else decided
    report.update(_reference(result, target, decided, [list(p) for p in decided] if result.depth else prompt_ids))
    return report


def _tests(result: RunResult, prompt_lengths: list[int]) -> list[dict]:
    """The run's two figures named as llama-bench names its tests: 'pp N' (prefill of N-token prompts; 'pp ~N' for
    prompts of mixed lengths, N their mean) and 'tg N' (decoding N tokens a prompt, its first from the prefill not
    counted), each '@ d D' at a depth."""
    at = f" @ d{result.depth}" if result.depth else ""
    n = round(sum(prompt_lengths) / len(prompt_lengths)) if prompt_lengths else 0
    pp = f"pp{n}" if len(set(prompt_lengths)) <= 1 else f"pp~{n}"
    return [
        {"test": pp + at, "tokens_per_second": result.prefill_tokens_per_second,
         "min": result.prefill_tokens_per_second_min, "max": result.prefill_tokens_per_second_max},
        {"test": f"tg{result.tokens_per_prompt - 1}{at}", "tokens_per_second": result.decode_tokens_per_second,
         "min": result.decode_tokens_per_second_min, "max": result.decode_tokens_per_second_max},
    ]  # fmt: skip


def _reference(result: RunResult, target, prompts, prompt_ids=None) -> dict:
    """The run judged against the window's history of its target (engine.session.judge_run; read only: `run` keeps
    nothing there): its output hash as the history shows it, and the reference run of the same outputs key, with
    whether they agree and, where they do not, why (engine.runs.diverge)."""
    try:
        fp = fingerprint(target.checkpoint.folder)
    except EngineError:  # no fingerprint, no history: only the hash
        return judge_run(History(), result, prompts, str(target.checkpoint.folder)).to_dict()
    return judge_run(History.load(history_file(fp)), result, prompts, fp, target, prompt_ids).to_dict()


def _formats(model) -> list[str]:
    """The weight formats of a model's tensors (engine/core/formats.py names), most bytes first (a gpt-oss folder's
    uint8 *_blocks and *_scales are the MXFP4 rows the core packs them into)."""
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


def _print_table(report: dict, result: RunResult, n_prompts: int) -> None:
    print(f"model     {report['target']}{synthetic_note(report['synthetic'])}")
    if report["draft"]:
        print(f"draft     {report['draft']}  q={report['q']}{synthetic_note(report['draft_synthetic'])}")
    else:
        print("draft     none (target-only greedy decoding)")
    devices = f"target {report['target_device']}" + (f", draft {report['draft_device']}" if report["draft"] else "")
    print(f"devices   {devices} ({report['kernels']} kernels)")
    print(f"mode      {report['mode']}")
    print(_precision_line(report))
    if report["kv"] != "f32":
        print(f"kv cache  {report['kv']} (half the cache's bytes, each key and value rounded when stored: not the "
              "reference, its tokens and hashes may differ from f32's)")  # fmt: skip
    w = report["weights"]
    huge = f", {_size(w['huge_page_bytes'])} on huge pages" if w["held"] == "copy" else ""
    print(f"weights   {w['held']} ({_size(w['file_bytes'])}{huge}; {', '.join(w['formats'])})")
    if report["placement"] is not None:
        print(f"placement {report['placement']}")
    if report.get("draft_placement") is not None:
        print(f"draft's   {report['draft_placement']}")
    depth = f" after {report['depth']} tokens of context" if report["depth"] else ""
    print(f"run       {n_prompts} prompts x {report['tokens_per_prompt']} tokens x {report['repeats']} repeats{depth}"
          f"{'  (cancelled: partial)' if report['cancelled'] else ''}")  # fmt: skip
    width = max(len(t["test"]) for t in report["tests"])
    for what, test in zip(("prefill", "decode"), report["tests"], strict=True):
        print(f"{what:9s} {test['test']:<{width}} {_rate(test['tokens_per_second'], test['min'], test['max'])}")
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
