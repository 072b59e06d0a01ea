"""The expertbench command line.

Exit codes: 0 success, 1 a regression (later: regress), 2 bad input or usage. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from .errors import EngineError
from .model import Engine, default_model_path

DEFAULT_PROMPT = "The quick brown fox jumps over the lazy dog."


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cpu-devices", type=int, default=0, help="split the CPU into N devices (default 1)")
    p.add_argument("--threads", type=int, default=0, help="worker threads per CPU device (default: all cores)")
    p.add_argument("--portable", action="store_true", help="use the portable C kernels instead of AVX2")
    p.add_argument("--module-path", action="append", default=[], metavar="NAME=FILE",
                   help="load runtime module NAME from FILE (authoritative)")  # fmt: skip


def _make_engine(args) -> Engine:
    paths = {}
    for item in args.module_path:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise EngineError(f"--module-path {item!r}: expected NAME=FILE, e.g. cpu=/path/expertbench_rt_cpu.so")
        paths[name] = file
    if args.cpu_devices < 0 or args.threads < 0:
        raise EngineError("--cpu-devices and --threads must be >= 0")
    return Engine(module_paths=paths, cpu_devices=args.cpu_devices, cpu_threads=args.threads,
                  portable=args.portable or None)  # fmt: skip


def cmd_run(args) -> int:
    if args.n < 1:
        raise EngineError(f"-n {args.n}: expected a positive number of tokens")
    model_dir = args.model or default_model_path()
    with _make_engine(args) as eng:
        model = eng.load(model_dir, device=args.device)
        ids = model.encode(args.prompt) if args.prompt is not None else []
        if not ids:
            raise EngineError("the prompt is empty: give --prompt with some text")
        n_ctx = min(model.config.max_position_embeddings, len(ids) + args.n)
        with model.context(n_ctx) as ctx:
            res = ctx.generate(ids, args.n)
        text = model.decode_text(res.ids)
        report = {
            "model": str(model_dir),
            "synthetic": model.config.synthetic,
            "device": args.device,
            "kernels": eng.runtimes[0].kernel_variant,
            "prompt_tokens": res.prefill_tokens,
            "generated_tokens": len(res.ids),
            "prefill_tokens_per_second": res.prefill_tokens_per_second,
            "decode_tokens_per_second": res.decode_tokens_per_second,
            "generated_ids": res.ids,
            "text": text,
        }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"model    {report['model']}{'  (synthetic)' if report['synthetic'] else ''}")
    print(f"device   {args.device} ({report['kernels']} kernels)")
    print(f"prompt   {args.prompt!r} ({res.prefill_tokens} tokens)")
    print(f"output   {text!r}")
    print(f"prefill  {res.prefill_tokens_per_second:10.1f} tokens/s")
    print(f"decode   {res.decode_tokens_per_second:10.1f} tokens/s ({res.decode_tokens} tokens)")
    return 0


def cmd_devices(args) -> int:
    with _make_engine(args) as eng:
        runtimes = eng.runtimes
        devices = eng.devices
    if args.json:
        print(json.dumps({"runtimes": [r.__dict__ for r in runtimes], "devices": [d.__dict__ for d in devices]},
                         indent=2))  # fmt: skip
        return 0
    for r in runtimes:
        print(f"runtime {r.name}: {r.n_devices} device(s), {r.kernel_variant} kernels, ABI {r.abi_version}, {r.path}")
    for d in devices:
        gib = 1 << 30
        print(f"  {d.name:8s} {d.kind:4s} {d.description} - {d.threads} threads, "
              f"{d.memory_free / gib:.1f} of {d.memory_total / gib:.1f} GiB free")  # fmt: skip
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="expertbench", description="Mixture-of-Experts tuning workbench")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="generate text greedily and report prefill / decode tokens/s")
    run.add_argument("--model", help="Hugging Face model folder (default: the bundled tiny Qwen3-MoE fixture)")
    run.add_argument("--prompt", default=DEFAULT_PROMPT)
    run.add_argument("-n", type=int, default=32, help="tokens to generate (default 32)")
    run.add_argument("--device", default="cpu:0", help="primary device (default cpu:0)")
    run.add_argument("--json", action="store_true", help="print one JSON document")
    _engine_args(run)
    run.set_defaults(func=cmd_run)
    dev = sub.add_parser("devices", help="list runtimes and devices")
    dev.add_argument("--json", action="store_true")
    _engine_args(dev)
    dev.set_defaults(func=cmd_devices)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 0
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
