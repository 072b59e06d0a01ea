"""expertbench export: a profile's placement or routing in another engine's terms."""

from __future__ import annotations

import json
import shlex
import sys

from ..checkpoints.checkpoint import read_config
from ..core.files import atomic_write, check_output
from ..export.engines import ENGINE_EXPORTS, export_to
from ..export.llama_cpp import to_llama_cpp
from ..profiles.profile import ProfileError, load


def add_parser(sub):
    p = sub.add_parser(
        "export",
        help="a profile's placement or routing in another engine's terms (llama.cpp, SGLang, vLLM, lucebox, ...)",
        description="llama.cpp: the -ngl / --override-tensor (or --n-cpu-moe) arguments that reproduce the profile's "
        "placement on the same checkpoint converted to GGUF (whole layers; per-expert exceptions are reported on "
        "stderr as not expressible). hotness-csv: the profile's routing statistics (recorded by 'expertbench "
        "regress --record'). sglang: the --init-expert-location JSON (logical_count, or with --gpus a balanced "
        "physical_to_logical_map). vllm: its EPLB flags. lucebox: its placement JSON. ktransformers: its GPU "
        "experts flags. What a format cannot say is reported on stderr (profiles/README.md has each format's "
        "rules).",
    )
    p.add_argument("profile", metavar="PROFILE", help="a profile file (YAML)")
    p.add_argument("--format", required=True, help="what to write",
                   choices=("llama.cpp", "hotness-csv", *ENGINE_EXPORTS))  # fmt: skip
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.add_argument("--json", action="store_true", help="one JSON document (args, the file's content, notes)")
    p.add_argument("--gpus", type=int, metavar="N", help="sglang, vllm: the expert-parallel GPUs (sglang: write a "
                   "balanced physical_to_logical_map for them)")  # fmt: skip
    p.add_argument("--redundant", type=int, default=0, metavar="R",
                   help="sglang, vllm: replicas of hot experts beyond one each (default 0)")  # fmt: skip
    p.set_defaults(func=cmd_export)
    return p


def cmd_export(args) -> int:
    if args.output:
        check_output(args.output)  # before any note: the one line says what is wrong
    profile = load(args.profile)
    if args.format == "hotness-csv":
        stats = profile.routing_stats()
        if stats is None:
            raise ProfileError(f"{profile.where('routing')}: the profile has no routing statistics (record them "
                               f"with 'expertbench regress --record {args.profile}')")  # fmt: skip
        if args.output:
            _write(stats.write_hotness_csv, args.output)
            return 0
        text = stats.to_hotness_csv()
    elif args.format != "llama.cpp":
        folder = profile.model_folder()
        config = read_config(folder)
        placement, stats = profile.placement_for(config), profile.routing_stats()
        out = export_to(args.format, placement, config, stats, args.gpus, args.redundant)
        if args.json:
            text = json.dumps(out.to_dict(), indent=2) + "\n"
        else:
            text = json.dumps(out.document) + "\n" if out.document is not None else shlex.join(out.args) + "\n"
            if out.document is not None and out.args:
                print(f"expertbench: {args.format} arguments: {shlex.join(out.args)}", file=sys.stderr)
            if out.balance is not None:
                print(f"expertbench: predicted GPU load, max / mean: {out.balance['worst']:.3f} in the worst layer, "
                      f"{out.balance['mean']:.3f} on average", file=sys.stderr)  # fmt: skip
            for line in out.not_expressible:
                print(f"expertbench: not expressible in {args.format}: {line}", file=sys.stderr)
            for line in out.notes:
                print(f"expertbench: note: {line}", file=sys.stderr)
    else:
        folder = profile.model_folder()
        config = read_config(folder)
        exported = to_llama_cpp(profile.placement_for(config), profile.primary_device)
        text = json.dumps(exported.to_dict(), indent=2) + "\n" if args.json else exported.command_line() + "\n"
        if not args.json:
            for line in exported.not_expressible:
                print(f"expertbench: not expressible in llama.cpp: {line}", file=sys.stderr)
            for line in exported.notes:
                print(f"expertbench: note: {line}", file=sys.stderr)
    if args.output:
        _write(lambda path: atomic_write(path, text), args.output)
    else:
        sys.stdout.write(text)
    return 0


def _write(writer, path) -> None:
    try:
        writer(path)
    except OSError as exc:
        raise ProfileError(f"cannot write '{path}': {exc.strerror or exc}") from None
