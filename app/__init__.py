"""The expertbench workbench window (PySide6 + pyqtgraph). `main(argv)` opens it; Qt is imported only then."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from .launch import main as launch

    return launch(argv)
