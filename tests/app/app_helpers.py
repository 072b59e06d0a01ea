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


def record(index, placement="0-2=cpu:0", **fields):
    """A run history row as the state makes one (app.state.RunRecord), for the views' tests: a complete f32 run of
    the fixture pair unless fields say otherwise."""
    from app.state import RunRecord

    values = dict(index=index, started=f"2026-12-02T10:00:{index:02d}", target="qwen3moe-f32", draft="qwen3-f32",
                  placement=placement, mode="reference", precision="f32", q=2, tokens=8, repeats=3, prompts=1,
                  decode_tokens_per_second=100.0, prefill_tokens_per_second=50.0, accept_rate=0.5,
                  output_hash="ab" * 32, reference_hash="ab" * 32, cancelled=False, seconds=1.0,
                  target_path=str(TARGET))  # fmt: skip
    values.update(fields)
    return RunRecord(**values)


def set_history(state, records):
    """Replace the state's run history (its public list) and tell the views, as the state does."""
    state.history[:] = records
    state.sigHistoryChanged.emit()
