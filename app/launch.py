"""Opening the window: `python -m app [--model PATH] [--draft PATH] [--profile FILE] [--screenshot PNG [--size WxH]]`
(a model is a Hugging Face folder or a .gguf file).

With no model the built-in synthetic demo pair opens (built into the cache the first time).
"""

from __future__ import annotations

import argparse
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="expertbench gui",
        description="The expertbench workbench window (also "
        "`expertbench` with these options, and `expertbench FILE.yaml`: --profile FILE.yaml)",
    )
    p.add_argument("--model", help="target model: a folder or a .gguf file (default: the synthetic demo pair)")
    drafts = p.add_mutually_exclusive_group()
    drafts.add_argument(
        "--draft",
        metavar="PATH",
        help="draft model: a folder or a .gguf file, or 'self': the model's own MTP layer (default: the demo draft "
        "with the demo)",
    )
    drafts.add_argument("--no-draft", action="store_true", help="no draft model")
    p.add_argument("--profile", "--placement", metavar="FILE", dest="profile",
                   help="open a profile once the model is loaded")  # fmt: skip
    p.add_argument("--device", default="cpu:0", help="the target's primary device (default cpu:0)")
    p.add_argument("--cpu-devices", type=int, default=0, help="split the CPU into N devices (default: per NUMA node)")
    p.add_argument("--runtimes", help="runtime modules to load, comma-separated (default: cpu,cuda,hip, and "
                   "hostsim when no accelerator is found)")  # fmt: skip
    p.add_argument("--theme", choices=("system", "light", "dark"), default="system")
    p.add_argument("--screenshot", metavar="PNG", help="open, make a short demo run, save the window as PNG, exit "
                   "(on a private state: the run history and window settings kept for you are neither shown nor "
                   "changed)")  # fmt: skip
    p.add_argument("--size", metavar="WxH", type=window_size,
                   help="the window's size in pixels, e.g. 1100x720 (default: the last one, or 1560x980; "
                   "1600x1000 for --screenshot)")  # fmt: skip
    return p


def window_size(text: str) -> tuple[int, int]:
    """'1100x720' -> (1100, 720); argparse's type for --size."""
    width, sep, height = text.lower().partition("x")
    try:
        size = int(width), int(height)
    except ValueError:
        size = (0, 0)
    if not sep or min(size) < 200 or max(size) > 16384:
        raise argparse.ArgumentTypeError(f"'{text}' is not a window size such as 1100x720 (200 to 16384 pixels)")
    return size


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.screenshot and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    if args.theme != "system":
        os.environ["EXPERTBENCH_THEME"] = args.theme

    from PySide6.QtCore import QSize
    from PySide6.QtWidgets import QApplication

    from . import theme
    from .state import default_engine
    from .window import MainWindow

    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setApplicationName("expertbench")
    app.setOrganizationName("expertbench")
    app.setWindowIcon(theme.app_icon())
    theme.apply_theme(app)
    if args.screenshot:
        from .screenshot import private_window

        window, private = private_window()
    else:
        window, private = MainWindow(), None
    state = window.state
    runtimes = tuple(r.strip() for r in args.runtimes.split(",")) if args.runtimes else None
    state.open_engine(lambda: default_engine(args.cpu_devices, runtimes))
    if args.model:
        state.load_models(args.model, None if args.no_draft else args.draft, primary=args.device)
    else:
        state.load_models(None, primary=args.device, demo="default", demo_draft=not args.no_draft)
    if args.profile:

        def open_profile():
            if state.model is not None:
                state.sigModelChanged.disconnect(open_profile)
                window.open_profile(args.profile)

        state.sigModelChanged.connect(open_profile)
    if args.screenshot:
        from .screenshot import SIZE, capture

        with private:
            return capture(window, args.screenshot, size=args.size or SIZE)
    from . import actions

    actions.install_excepthook()  # an exception in any slot is a dialog, not a line on stderr alone
    if args.size:
        window.set_size(QSize(*args.size))
    window.show()
    return app.exec()
