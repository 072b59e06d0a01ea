"""What the window's buttons and menu actions do when clicked, and what the user sees when that fails.

Qt's `clicked` and `triggered` carry a `checked` flag, and PySide6 hands it to any slot that takes an optional
argument (a `start(settings=None)` got `False` for its settings): `connect` calls the handler with no argument at all.
An exception in a handler, or in any other slot of the GUI thread (`install_excepthook`), is said in a dialog, its
traceback on stderr, rather than on stderr alone; the handler's `recover` then puts its panel right (its buttons
enabled again), so the window stays usable.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

from PySide6.QtCore import QThread
from PySide6.QtWidgets import QApplication, QMessageBox, QWidget


def failure_text(exc: BaseException) -> str:
    """An exception as the dialog says it: its message, and its type where that helps (a bare AttributeError)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def dialog(title: str, text: str, parent: QWidget | None = None) -> None:
    QMessageBox.critical(parent or QApplication.activeWindow(), title, text)


# Where a failure is said: a dialog, or what replaces it where none may open (the screenshot collects them)
report: Callable[[str, str, QWidget | None], None] = dialog
_showing = False  # one failure dialog at a time: a failing repaint would otherwise open one per frame


def show_failure(title: str, exc: BaseException, parent: QWidget | None = None) -> None:
    """The traceback on stderr, and `report` saying what failed (nothing more while it is saying another)."""
    global _showing
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    if _showing:
        return
    _showing = True
    try:
        report(title, f"{failure_text(exc)}\n\nThe window goes on; the details are on the terminal it was started "
               "from.", parent)  # fmt: skip
    finally:
        _showing = False


def connect(signal, handler: Callable[[], object], what: str, recover: Callable[[], object] | None = None,
            parent: QWidget | None = None) -> None:  # fmt: skip
    """Connect a button's `clicked` or an action's `triggered` to handler(), called with no argument; an exception in
    it is shown as "`what` failed" and recover() runs after it."""

    def clicked(*_checked) -> None:
        try:
            handler()
        except Exception as exc:
            if recover is not None:
                recover()
            show_failure(f"{what.rstrip('…')} failed", exc, parent)

    signal.connect(clicked)


def install_excepthook() -> Callable:
    """Show any exception that escapes a slot of the GUI thread in a dialog (PySide6 hands those to sys.excepthook);
    elsewhere, or with no application, the previous hook prints it. Returns the previous hook."""
    previous = sys.excepthook

    def hook(kind, exc, tb) -> None:
        app = QApplication.instance()
        if app is None or QThread.currentThread() != app.thread() or not isinstance(exc, Exception):
            previous(kind, exc, tb)
            return
        show_failure("Something went wrong", exc.with_traceback(tb))

    sys.excepthook = hook
    return previous
