"""`expertbench gui`, and the command line's other ways to ask for the window: nothing, a profile file, or the
window's own options first. The one module of the command line that imports app/ (the window, which needs PySide6)."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> argparse.ArgumentParser:
    # only listed here: main() hands `gui ...` to the window (app/launch.py parses its options) before parsing
    return sub.add_parser("gui", add_help=False, help="open the workbench window (the default with no command; "
                          "expertbench gui --help for its options)")  # fmt: skip


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


def open_window(argv: list[str]) -> int:
    """The workbench window (app/, which needs PySide6 and pyqtgraph) with the window's arguments."""
    import app

    try:
        return app.main(argv)
    except ModuleNotFoundError as exc:
        print(f"expertbench: the window needs {exc.name} (pip install PySide6-Essentials pyqtgraph); the commands "
              "work without it: expertbench --help", file=sys.stderr)  # fmt: skip
        return 2
