"""Paths and helpers for the window's tests (a plain module: conftest names clash across test folders)."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TARGET = FIXTURES / "qwen3moe-f32"  # 3 layers (1 dense), 8 experts of 24 KiB: 192 KiB per MoE layer
DRAFT = FIXTURES / "qwen3-f32"
LAYER_BYTES = 8 * 24576
TIMEOUT_MS = 120_000  # generous: the machine may be busy; no test asserts a time


def on_engine(qtbot, state, fn):
    """Run fn(engine side) on the engine thread and return its result (tests read the real engine)."""
    box = {}
    state.worker.submit(lambda: fn(state._side), lambda r: box.setdefault("result", r),
                        lambda e: box.setdefault("error", e), "test")  # fmt: skip
    qtbot.waitUntil(lambda: bool(box), timeout=TIMEOUT_MS)
    if "error" in box:
        raise box["error"]
    return box["result"]
