"""The expertbench command line.

Exit codes: 0 success, 1 a regression (regress), 2 bad input or usage, 130 interrupted. Errors are one
line on stderr. Long work shows progress on stderr when it is a terminal and stays quiet when piped.
"""

from __future__ import annotations

import argparse
import sys

from ..core.errors import EngineError
from . import demo_model, devices, export, gui, import_routing, plan, regress, run, tune
from .gui import open_window, window_arguments


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="expertbench",
        description="Mixture-of-Experts tuning workbench. With no command, or with the window's options "
        "(expertbench --profile FILE --theme dark ...), it opens the window; expertbench FILE.yaml opens it on a "
        "profile; expertbench gui --help lists the window's options.",
    )
    sub = parser.add_subparsers(dest="command")
    gui.add_parser(sub)
    run.add_parser(sub)
    plan.add_parser(sub)
    demo_model.add_parser(sub)
    devices.add_parser(sub)
    regress.add_parser(sub)
    tune.add_parser(sub)
    export.add_parser(sub)
    import_routing.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    window = window_arguments(argv)
    if window is not None:
        return open_window(window)
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
