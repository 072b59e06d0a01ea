"""The options and helpers the commands share: the device options, the model and demo options, the engine they
ask for, status lines on a terminal."""

from __future__ import annotations

import argparse
import sys

from ..checkpoints.demo import DEFAULT_FAMILY, DEMO_FORMATS, FAMILIES, QUANTS, SIZES, check_format, ensure_demo_pair
from ..core.errors import ArgumentError, EngineError
from ..devices import DeviceSettings
from ..model import Engine

SYNTHETIC_NOTE = "synthetic: random weights, its text is noise by design"


def engine_args(p: argparse.ArgumentParser, loads_models: bool = False) -> None:
    """The engine's options; loads_models: the command loads models, and takes the options of their loading too."""
    p.add_argument("--runtime", action="append", default=[], metavar="NAME",
                   help="load runtime NAME as well as cpu (cuda, hip, hostsim); repeat for several")  # fmt: skip
    p.add_argument("--cpu-devices", type=int, default=0,
                   help="split the CPU into N devices (default: one per NUMA node)")  # fmt: skip
    p.add_argument("--threads", type=int, default=0, help="worker threads per CPU device (default: all cores)")
    p.add_argument("--kernels", choices=("best", "avx2", "portable"),
                   help="the most the CPU kernels may use: best (AVX2, and AVX-512 VNNI for --precision q8, where the "
                        "CPU has them; the same results as avx2), avx2, or portable C (default: "
                        "$EXPERTBENCH_CPU_KERNELS, else best)")  # fmt: skip
    p.add_argument("--portable", action="store_true", help="the portable C kernels (same as --kernels portable)")
    p.add_argument("--module-path", action="append", default=[], metavar="NAME=FILE",
                   help="load runtime module NAME from FILE (authoritative)")  # fmt: skip
    if loads_models:
        p.add_argument("--no-check-weights", dest="check_weights", action="store_false",
                       help="load the weights without checking that every value is a number (a damaged file's NaN or "
                            "inf then fails the run at its first step instead of the load)")  # fmt: skip


def device_settings(args, strict: bool = True) -> DeviceSettings:
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


def make_engine(args, strict: bool = True) -> Engine:
    """The engine the command's device options ask for (engine.devices, as regress and the window make theirs)."""
    return device_settings(args, strict).open()


def tell(message: str) -> None:
    """A status line for a person at a terminal; nothing when stderr is piped."""
    if sys.stderr.isatty():
        print(f"expertbench: {message}", file=sys.stderr, flush=True)


def check_model_args(args) -> None:
    """--model and the demo's options (run, plan)."""
    demo = [f"--{k.replace('_', '-')}" for k in ("demo_family", "demo_size", "demo_format", "demo_quant")
            if getattr(args, k)]  # fmt: skip
    if args.model is not None and demo:
        raise EngineError(f"{' and '.join(demo)}: choose the demo pair, which runs only without --model")
    if args.demo_quant is not None and args.demo_format != "gguf":
        raise EngineError(f"--demo-quant {args.demo_quant}: only the GGUF demo is quantized (add --demo-format gguf)")


def check_prompt(text: str) -> None:
    """A prompt from the command line that is not UTF-8 reaches Python with its bad bytes as lone surrogates
    (surrogateescape), which the tokenizer cannot take: name the byte and where it is."""
    try:
        text.encode("utf-8")
        return
    except UnicodeEncodeError as exc:
        first = exc.start
    try:
        raw = text.encode("utf-8", "surrogateescape")  # the bytes of the command line
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArgumentError(f"--prompt {raw!r:.80} is not valid UTF-8: byte 0x{raw[exc.start]:02x} at offset "
                            f"{exc.start} ({exc.reason}); expected UTF-8 text") from None  # fmt: skip
    except UnicodeEncodeError:  # a surrogate no byte becomes (main() called from Python)
        pass
    raise ArgumentError(f"--prompt {text!r:.80} is not valid text: {text[first]!r} at index {first} is a lone "
                        "surrogate; expected UTF-8 text")  # fmt: skip


def model_paths(args, with_draft: bool) -> tuple:
    """The target (and draft) the options name: --model (--draft), else the demo pair (built once when missing)."""
    target_dir, draft_dir = args.model, getattr(args, "draft", None)
    if target_dir is None:
        size = args.demo_size or "default"
        family = args.demo_family or DEFAULT_FAMILY
        fmt = args.demo_format or "safetensors"
        quant = check_format(fmt, args.demo_quant, family)
        what = demo_name(size, fmt, quant, family)
        pair = ensure_demo_pair(size, format=fmt, quant=quant, family=family, on_build=lambda why: tell(
            f"building the synthetic demo model pair ({what}; {why}), once..."))  # fmt: skip
        target_dir = pair.target
        if draft_dir is None and with_draft:
            draft_dir = pair.draft
    return target_dir, draft_dir


def demo_args(p: argparse.ArgumentParser) -> None:
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


def demo_name(size: str, fmt: str, quant: str | None, family: str = DEFAULT_FAMILY) -> str:
    name = size if family == DEFAULT_FAMILY else f"{FAMILIES[family][0]} {size}"
    return name if fmt == "safetensors" else f"{name}, GGUF {quant}"


def synthetic_note(synthetic) -> str:
    return f"  ({SYNTHETIC_NOTE})" if synthetic else ""
