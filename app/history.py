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

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt, Slot
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableView, QVBoxLayout, QWidget

from engine.core.errors import EngineError
from engine.placement.placement import Placement
from engine.profiles.profile import atomic_write

from . import theme
from .state import RunRecord, WorkbenchState

_ROOT = QModelIndex()  # the invalid index: Qt's default parent


def _rate(v: float | None) -> str:
    return f"{v:.1f}" if v is not None and math.isfinite(v) else "-"


def _blank(v: float | None) -> str:
    """A speed that may be unknown: blank then (the prediction before the devices are measured)."""
    return f"{v:.1f}" if v is not None and math.isfinite(v) else ""


def _number(v) -> float | str:
    return v if isinstance(v, (int, float)) and math.isfinite(v) else ""


def predicted(r: RunRecord) -> float | None:
    """The cost model's tokens/s for the run's placement when the run started (None before the devices were
    measured, and for records that do not carry it)."""
    return getattr(r, "predicted_tokens_per_second", None)


def spread(r: RunRecord) -> tuple[float, float] | None:
    """(slowest, fastest) pass's decode tokens/s when the record carries them (median, min, max over repeats)."""
    lo = getattr(r, "decode_tokens_per_second_min", None)
    hi = getattr(r, "decode_tokens_per_second_max", None)
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    return lo, hi


def quality(r: RunRecord) -> dict | None:
    """The quality cost of the run's fast mode against the reference mode (engine.runs.quality), when measured."""
    return getattr(r, "quality", None)


def _quality_text(r: RunRecord) -> str:
    """'92.2 % · KL 0.0016' (greedy agreement, mean KL in nats) for a measured fast mode; blank otherwise."""
    q = quality(r)
    return "" if q is None else f"{100 * q['agreement']:.1f} % · KL {q['mean_kl']:.2g}"


def _quality_value(r: RunRecord, key: str) -> float | str:
    q = quality(r)
    return "" if q is None else q[key]


def _started(r: RunRecord) -> str:
    """RunRecord.started as a date and time ('2026-12-02T19:04:02' -> '2026-12-02 19:04:02'; a time as it is)."""
    return str(r.started).replace("T", " ")[:19]


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
    Field("Started", _started, "time", lambda r: r.started),
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
    Field("Quality", _quality_text, "greedy_agreement", lambda r: _quality_value(r, "agreement")),
    Field(None, None, "mean_kl", lambda r: _quality_value(r, "mean_kl")),
    Field(
        "Prefill tok/s",
        lambda r: _blank(r.prefill_tokens_per_second),
        "prefill_tokens_per_second",
        lambda r: r.prefill_tokens_per_second,
    ),
    Field(
        "Predicted tok/s",
        lambda r: _blank(predicted(r)),
        "predicted_tokens_per_second",
        lambda r: _number(predicted(r)),
    ),  # fmt: skip
    Field("Accept", _accept, "accept_rate", lambda r: "" if r.accept_rate is None else r.accept_rate),
    Field("Hash", lambda r: r.short_hash, "output_sha256", lambda r: r.output_hash),
    Field("Output", _output, "output", _output),
    Field(None, None, "cancelled", lambda r: r.cancelled),
]
COLUMNS = [f for f in FIELDS if f.header is not None]  # the history table's
FIRST_COLUMNS = ("Decode tok/s", "Accept", "Hash", "Mode", "Precision")  # shown right after "#"
NUMERIC = {"#", "Decode tok/s", "Prefill tok/s", "Predicted tok/s", "Accept", "Tokens", "Quality"}
PRECISION_TIPS = {
    "f32": "activations meet exactly dequantized weights in f32: the reference",
    "q8": "activations quantized to int8 per block, as llama.cpp: not the reference (other logits)",
}
HASH_SHOWN = 8  # a hash's characters in the view (the output-hash plot's labels show as many)
SortRole = Qt.ItemDataRole.UserRole + 1  # a cell's value for sorting: numbers as numbers, unknown lowest


def column(header: str) -> int:
    """The history table's column of a heading."""
    return next(i for i, f in enumerate(COLUMNS) if f.header == header)


def _sort_value(r: RunRecord, header: str) -> float | str:
    if header == "#":
        return float(r.index)
    if header == "Tokens":
        return float(r.prompts * r.tokens * r.repeats)
    if header == "Accept":
        return -1.0 if r.accept_rate is None else float(r.accept_rate)
    if header == "Quality":  # by mean KL, unmeasured first
        return -1.0 if quality(r) is None else float(quality(r)["mean_kl"])
    if header in NUMERIC:
        value = {"Decode tok/s": r.decode_tokens_per_second, "Prefill tok/s": r.prefill_tokens_per_second,
                 "Predicted tok/s": predicted(r)}[header]  # fmt: skip
        return float(value) if value is not None and math.isfinite(value) else -1.0
    return str(next(f for f in COLUMNS if f.header == header).text(r))


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
        elif n:  # the same number of rows, perhaps other runs (a history read back for another model)
            self.dataChanged.emit(self.index(0, 0), self.index(n - 1, len(COLUMNS) - 1))

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
        if role == SortRole:
            return _sort_value(r, name)
        if role == Qt.ItemDataRole.ToolTipRole:
            if name == "Decode tok/s":
                lohi = spread(r)
                passes = f"{r.repeats} passes" if r.repeats != 1 else "one pass"
                if lohi is None:
                    return f"Decode tokens/s: the median over {passes} over the prompts"
                return f"Decode tokens/s: the median over {passes}; slowest {lohi[0]:.1f}, fastest {lohi[1]:.1f}"
            if name == "Predicted tok/s":
                return ("The cost model's decode tokens/s for this placement when the run started (blank: the devices "
                        "were not measured yet)")  # fmt: skip
            if name == "Prefill tok/s":
                return "Prompt tokens per second of prefill (the draft's prefill included)"
            if name == "Quality":
                q = quality(r)
                if q is None:
                    return ("The quality cost of a fast mode (owner_local, q8) against the reference mode: greedy "
                            "agreement and mean KL divergence of the next-token distributions (blank: the "
                            "reference settings, or not measured)")  # fmt: skip
                first = (q.get("diagnosis") or {}).get("summary")
                return q["summary"] + (f"\n{first}" if first else "")
            if name == "Placement":
                return f"{r.placement}\n\nDouble-click: put this placement back in the editor (undoable)"
            if name == "Hash":
                return r.output_hash or "no complete output"
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


class _ViewTexts(QSortFilterProxyModel):
    """What the view shows narrower than the model's texts, so that "#", the decode speed, the acceptance and the
    hash fit a 1280-pixel window's history whole: a rate's unit on a second line of its heading ("Decode" over
    "tok/s"), and a hash's first HASH_SHOWN characters, as the output-hash plot labels it (its tooltip has all)."""

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        value = super().data(index, role)
        if role == Qt.ItemDataRole.DisplayRole and index.column() == column("Hash") and isinstance(value, str):
            return value[:HASH_SHOWN]
        return value

    def headerData(self, section: int, orientation, role=Qt.ItemDataRole.DisplayRole):
        value = super().headerData(section, orientation, role)
        if role == Qt.ItemDataRole.DisplayRole and isinstance(value, str) and value.endswith(" tok/s"):
            return value.replace(" tok/s", "\ntok/s")
        return value


class HistoryPanel(QWidget):
    """The history table, sortable by any column (runs in order by default); a double-click on a run puts its
    placement back in the editor, as one undoable edit."""

    def __init__(self, state: WorkbenchState, parent=None):
        super().__init__(parent)
        self.state = state
        self.model = HistoryModel(state, self)
        self.proxy = _ViewTexts(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SortRole)
        self.view = QTableView()
        self.view.setModel(self.proxy)
        self.view.verticalHeader().hide()
        self.view.setShowGrid(False)
        self.view.setAlternatingRowColors(True)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.view.setWordWrap(False)
        self.view.setTextElideMode(Qt.TextElideMode.ElideRight)  # a placement's end goes, its start stays
        self.view.setSortingEnabled(True)
        self.view.sortByColumn(0, Qt.SortOrder.AscendingOrder)
        header = self.view.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setSectionResizeMode(column("Placement"), QHeaderView.ResizeMode.Stretch)
        header.setMinimumSectionSize(28)  # "#" as narrow as its numbers once another column has the sort arrow
        # what a run is judged by first (its speed, acceptance and output), then its settings; the model keeps FIELDS'
        # order (the CSV's), only the view shows them so
        for visual, name in enumerate(FIRST_COLUMNS, start=1):
            header.moveSection(header.visualIndex(column(name)), visual)
        self.view.verticalHeader().setDefaultSectionSize(24)
        self.setMinimumSize(180, 104)  # a few rows and columns; the table scrolls
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 8)  # the table's frame is its edge: the columns the room
        layout.addWidget(self.view)
        self.model.rowsInserted.connect(self._inserted)
        self.view.doubleClicked.connect(self.restore)
        self.model.modelReset.connect(self._fit)
        header.sortIndicatorChanged.connect(self._fit)  # the arrow's room moves to the column sorted by
        self._fit()

    @Slot()
    def _fit(self) -> None:
        """Columns their text's width; the sort arrow's room only in the column sorted by (Qt gives every heading
        that room, which pushed the hash out of a 1280-pixel window's history)."""
        header = self.view.horizontalHeader()
        sorted_by = header.sortIndicatorSection()
        header.setSortIndicatorShown(False)
        plain = {col: header.sectionSizeHint(col) for col in range(self.model.columnCount())}
        header.setSortIndicatorShown(True)
        for col in range(self.model.columnCount()):
            if col != column("Placement"):
                head = header.sectionSizeHint(col) if col == sorted_by else plain[col]
                header.resizeSection(col, max(self.view.sizeHintForColumn(col), head))

    def judging_width(self) -> int:
        """What the panel needs to show "#" and the columns a run is judged by (speed, acceptance, hash) whole."""
        header = self.view.horizontalHeader()
        columns = sum(header.sectionSize(column(name)) for name in ("#", *FIRST_COLUMNS[:3]))
        margins = self.layout().contentsMargins()
        return (columns + 2 * self.view.frameWidth() + self.view.verticalScrollBar().sizeHint().width()
                + margins.left() + margins.right())  # fmt: skip

    def _inserted(self, *_args) -> None:
        self._fit()
        self.view.scrollToBottom()

    def record_at(self, index: QModelIndex) -> RunRecord:
        """The run of a row of the view (sorted or not)."""
        return self.state.history[self.proxy.mapToSource(index).row()]

    @Slot(QModelIndex)
    def restore(self, index: QModelIndex) -> bool:
        """Put the run's placement in the editor (state.set_placement: one undoable edit)."""
        if not index.isValid():
            return False
        return restore_placement(self.state, self.record_at(index))


def restore_placement(state: WorkbenchState, record: RunRecord) -> bool:
    """The placement a run was made with, back in the editor as one undoable edit; a run of another model, or a
    placement the loaded model cannot take, is said in the status bar instead."""
    model = state.model
    if model is None:
        state.sigMessage.emit("Open a model first")
        return False
    if record.target_path and model.target_path and record.target_path != model.target_path:
        state.sigMessage.emit(f"Run {record.index} was made with another model ({record.target}): its placement is "
                              "not restored")  # fmt: skip
        return False
    try:
        placement = Placement.parse(record.placement, model.config, model.primary)
    except EngineError as exc:
        state.sigMessage.emit(f"Run {record.index}'s placement cannot be restored: {exc}")
        return False
    if placement == state.placement:
        state.sigMessage.emit(f"Run {record.index}'s placement is the one in the editor")
        return True
    return state.set_placement(placement, f"placement of run {record.index}")
