"""`expertbench demo-model`: build (or check) the synthetic demo model pair in the cache folder."""

from __future__ import annotations

import argparse
import json
import time

from ..checkpoints.demo import (
    DEFAULT_FAMILY,
    DEMO_FORMATS,
    FAMILIES,
    QUANTS,
    SIZES,
    check_format,
    draft_kind,
    ensure_demo_pair,
    quant_formats,
)
from ..core.errors import EngineError
from .common import SYNTHETIC_NOTE, demo_name, tell


def add_parser(sub) -> argparse.ArgumentParser:
    demo = sub.add_parser(
        "demo-model",
        help="build (or check) the synthetic demo model pair in the cache folder",
        description="Writes a seeded synthetic Qwen3-MoE target and a dense Qwen3 draft built from it into "
        "$XDG_CACHE_HOME/expertbench (or ~/.cache/expertbench). Random weights: the text they write is noise, but the "
        "pair behaves like a real target and draft (acceptance about 75 % at q=2). --format gguf writes the same "
        "weights as GGUF files, quantized as llama.cpp quantizes them (--quant q8_0: every matrix Q8_0; mxfp4: MXFP4 "
        "experts and Q8_0 elsewhere, llama.cpp's MXFP4_MOE; norms and the router F32), a cache entry of its own per "
        "quantization; run it with 'expertbench run --demo-format gguf --demo-quant Q'. The mxfp4 pair's draft is a "
        "small Qwen3-MoE (the target's carried layers with their routers and MXFP4 experts, top-2), since a dense "
        "draft cannot follow 4-bit experts; its target is the safetensors target quantized. --family deepseek writes a"
        " DeepSeek-V3-shaped pair instead (MLA attention, grouped sigmoid routing, a shared expert, a dense first "
        "layer, YaRN; its draft a DeepSeek-V3 of dense layers), as safetensors folders; --family gpt-oss a "
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
    return demo


def cmd_demo_model(args) -> int:
    if args.quant is not None and args.format != "gguf":
        raise EngineError(f"--quant {args.quant}: only the GGUF demo is quantized (add --format gguf)")
    quant = check_format(args.format, args.quant, args.family)
    what = demo_name(args.size, args.format, quant, args.family)
    t0 = time.perf_counter()
    pair = ensure_demo_pair(args.size, verify=args.verify, rebuild=args.rebuild, format=args.format, quant=quant,
                            family=args.family, on_build=lambda why: tell(
                                f"building the synthetic demo model pair ({what}; {why})..."))  # fmt: skip
    seconds = time.perf_counter() - t0
    report = {"family": pair.family, "size": pair.size, "format": pair.format, "quant": pair.quant,
              "target": str(pair.target), "draft": str(pair.draft), "synthetic": True, "built": pair.built,
              "reason": pair.reason, "checked": "sha256" if args.verify else "sizes", "seconds": seconds}  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    state = f"built in {seconds:.1f} s ({pair.reason})" if pair.built else f"intact ({report['checked']} checked)"
    target_kind, drafted = FAMILIES[pair.family][0], draft_kind(pair.family, quant)
    print(f"demo model pair '{what}' ({SYNTHETIC_NOTE}): {state}")
    print(f"target    {pair.target}  ({target_kind}, {quant_formats(quant, 'target', pair.family)})")
    print(f"draft     {pair.draft}  ({drafted}, {quant_formats(quant, 'draft', pair.family)})")
    return 0
