"""The run history: one row per run (placement, mode, precision, speed, acceptance, output hash), exportable as CSV.

A run's output is compared with the first complete run of the same target, prompts, length and precision: q8
activations give other logits than f32 by design, so each precision has its own first run."""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Callable
from typing import NamedTuple

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt, Slot
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableView, QVBoxLayout, QWidget

from engine.profile import atomic_write

from . import theme
from .state import RunRecord, WorkbenchState

_ROOT = QModelIndex()  # the invalid index: Qt's default parent


def _rate(v: float) -> str:
    return f"{v:.1f}" if math.isfinite(v) else "-"


def _accept(r: RunRecord) -> str:
    return "-" if r.accept_rate is None else f"{100 * r.accept_rate:.1f} %"


def _output(r: RunRecord) -> str:
    if r.cancelled and not r.output_hash:
        return "stopped"
    if r.is_reference:
        return "reference" if r.precision == "f32" else f"first {r.precision}"
    return {True: "same", False: "CHANGED", None: "-"}[r.stable]


class Field(NamedTuple):
    """One value of a run: its column in the table (None: CSV only) and its column in the CSV file."""

    header: str | None  # the table's column heading
    text: Callable[[RunRecord], str] | None  # the table's cell
    csv: str  # the CSV column's name
    value: Callable[[RunRecord], object]  # the CSV cell


# The one table of what a run shows: the history table's columns and write_csv's, in their order.
FIELDS = [
    Field("#", lambda r: str(r.index), "run", lambda r: r.index),
    Field("Time", lambda r: r.started, "time", lambda r: r.started),
    Field("Placement", lambda r: r.placement, "placement", lambda r: r.placement),
    Field("Mode", lambda r: r.mode, "mode", lambda r: r.mode),
    Field("Precision", lambda r: r.precision, "precision", lambda r: r.precision),
    Field("Draft", lambda r: "-" if r.draft is None else f"q={r.q}", "draft", lambda r: r.draft or ""),
    Field(None, None, "q", lambda r: "" if r.q is None else r.q),
    Field(
        "Tokens", lambda r: f"{r.prompts}×{r.tokens}×{r.repeats}", "tokens", lambda r: r.prompts * r.tokens * r.repeats
    ),
    Field(
        "Decode tok/s",
        lambda r: _rate(r.decode_tokens_per_second),
        "decode_tokens_per_second",
        lambda r: r.decode_tokens_per_second,
    ),
    Field(None, None, "prefill_tokens_per_second", lambda r: r.prefill_tokens_per_second),
    Field("Accept", _accept, "accept_rate", lambda r: "" if r.accept_rate is None else r.accept_rate),
    Field("Hash", lambda r: r.short_hash, "output_sha256", lambda r: r.output_hash),
    Field("Output", _output, "output", _output),
    Field(None, None, "cancelled", lambda r: r.cancelled),
]
COLUMNS = [f for f in FIELDS if f.header is not None]  # the history table's
NUMERIC = {"#", "Decode tok/s", "Accept", "Tokens"}
PRECISION_TIPS = {
    "f32": "activations meet exactly dequantized weights in f32: the reference",
    "q8": "activations quantized to int8 per block, as llama.cpp: not the reference (other logits)",
}


class HistoryModel(QAbstractTableModel):
    def __init__(self, state: WorkbenchState, parent=None):
        super().__init__(parent)
        self.state = state
        self._n = len(state.history)
        state.sigHistoryChanged.connect(self.refresh)

    @Slot()
    def refresh(self) -> None:
        n = len(self.state.history)
        if n > self._n:
            self.beginInsertRows(_ROOT, self._n, n - 1)
            self._n = n
            self.endInsertRows()
        elif n != self._n:
            self.beginResetModel()
            self._n = n
            self.endResetModel()

    def rowCount(self, parent: QModelIndex = _ROOT) -> int:
        return 0 if parent.isValid() else self._n

    def columnCount(self, parent: QModelIndex = _ROOT) -> int:
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section].header
        return None

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        r = self.state.history[index.row()]
        name = COLUMNS[index.column()].header
        if role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[index.column()].text(r)
        if role == Qt.ItemDataRole.ToolTipRole:
            if name == "Hash":
                return r.output_hash or "no complete output"
            if name == "Placement":
                return r.placement
            if name == "Draft":
                return r.draft or "target-only greedy decoding"
            if name == "Precision":
                return PRECISION_TIPS.get(r.precision)
            if name == "Output" and r.is_reference and r.precision != "f32":
                return f"the first complete {r.precision} run: later {r.precision} runs are compared with it"
            return None
        if role == Qt.ItemDataRole.TextAlignmentRole and name in NUMERIC:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ForegroundRole and name == "Output":
            key = {True: "ok", False: "bad"}.get(r.stable, "muted") if not r.is_reference else "text"
            return QColor(theme.colors()[key])
        return None

    def flags(self, index: QModelIndex) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable


def write_csv(path: str | os.PathLike, history: list[RunRecord]) -> None:
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow([f.csv for f in FIELDS])
    for r in history:
        writer.writerow([f.value(r) for f in FIELDS])
    atomic_write(path, out.getvalue())


class HistoryPanel(QWidget):
    def __init__(self, state: WorkbenchState, parent=None):
        super().__init__(parent)
        self.model = HistoryModel(state, self)
        self.view = QTableView()
        self.view.setModel(self.model)
        self.view.verticalHeader().hide()
        self.view.setShowGrid(False)
        self.view.setAlternatingRowColors(True)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.view.setWordWrap(False)
        self.view.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        header = self.view.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.view.verticalHeader().setDefaultSectionSize(24)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 8)
        layout.addWidget(self.view)
        self.model.rowsInserted.connect(self._inserted)
        self._fit()

    def _fit(self) -> None:
        for col in range(self.model.columnCount()):
            if col != 2:
                self.view.resizeColumnToContents(col)

    def _inserted(self, *_args) -> None:
        self._fit()
        self.view.scrollToBottom()
