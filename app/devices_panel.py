"""The devices panel: every device the engine reports, and every runtime that did not load, with its reason."""

from __future__ import annotations

import html

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt, Signal, Slot
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QAbstractItemView, QLabel, QTableView, QVBoxLayout, QWidget

from engine.model import describe_load_error

from . import theme
from .state import WorkbenchState, format_bytes

_ROOT = QModelIndex()  # the invalid index: Qt's default parent


def _held(model) -> str:
    """How the target's files are held in host memory, for its primary device's tooltip."""
    if model.weights == "copy":
        return (f"; the model's files ({format_bytes(model.file_bytes)}) copied into memory, "
                f"{format_bytes(model.huge_page_bytes)} of them on huge pages")  # fmt: skip
    return f"; the model's files ({format_bytes(model.file_bytes)}) memory-mapped"


class DevicesModel(QAbstractTableModel):
    COLUMNS = ["Device", "Kind", "This model", "Free / total", "GB/s"]

    def __init__(self, state: WorkbenchState, parent=None):
        super().__init__(parent)
        self.state = state
        self._rows = self._compute()
        for sig in (state.sigEngineChanged, state.sigDevicesChanged, state.sigModelChanged,
                    state.sigPlacementChanged, state.sigCalibrationChanged):  # fmt: skip
            sig.connect(self.refresh)

    def _compute(self) -> list[dict]:
        rows = []
        calibration = self.state.calibration
        model = self.state.model
        for d in self.state.devices:
            kind = theme.device_kind(d.name, d.kind)
            # expert-weight bandwidth measured by the cost model's calibration (first strategy use)
            rate = calibration.devices.get(d.name) if calibration is not None else None
            gbs = rate.bandwidth / 1e9 if rate is not None else None
            measured = f"{gbs:.1f} GB/s of expert weights (measured)" if gbs is not None else "not calibrated yet"
            rows.append({
                "name": d.name, "kind": kind, "ok": True,
                "model": self.state.model_bytes_on(d.name) if self.state.model else None,
                "free": d.memory_free, "total": d.memory_total, "gbs": gbs,
                "tip": f"{d.name}: {d.description}, {d.threads} thread{'s' if d.threads != 1 else ''}; "
                       f"bandwidth: {measured}" + (_held(model) if model and d.name == model.primary else ""),
            })  # fmt: skip
        for runtime, reason in sorted(self.state.load_errors.items()):
            rows.append({"name": runtime, "kind": "", "ok": False, "reason": describe_load_error(runtime, reason),
                         "tip": reason})  # fmt: skip
        return rows

    @Slot()
    def refresh(self) -> None:
        rows = self._compute()
        if [(r["name"], r["ok"]) for r in rows] == [(r["name"], r["ok"]) for r in self._rows]:
            self._rows = rows
            if rows:
                self.dataChanged.emit(self.index(0, 0), self.index(len(rows) - 1, len(self.COLUMNS) - 1))
            return
        self.beginResetModel()
        self._rows = rows
        self.endResetModel()

    def rowCount(self, parent: QModelIndex = _ROOT) -> int:
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: QModelIndex = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.COLUMNS)

    def headerData(self, section: int, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self.COLUMNS[section]
        return None

    def is_unavailable(self, row: int) -> bool:
        return not self._rows[row]["ok"]

    def reason(self, row: int) -> str:
        return self._rows[row].get("reason", "")

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        r, col = self._rows[index.row()], index.column()
        if role == Qt.ItemDataRole.ToolTipRole:
            return r["tip"]
        if role == Qt.ItemDataRole.ForegroundRole and not r["ok"]:
            return QColor(theme.colors()["muted"])
        if role == Qt.ItemDataRole.DecorationRole and col == 0:
            return theme.icon(f"device-{r['kind'] or 'gpu'}")
        if role == Qt.ItemDataRole.TextAlignmentRole and col >= 2:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role != Qt.ItemDataRole.DisplayRole:
            return None
        if not r["ok"]:
            return [r["name"], "not available", "", "", ""][col]
        if col == 0:
            return r["name"]
        if col == 1:
            return theme.kind_text(r["kind"])
        if col == 2:
            return "-" if r["model"] is None else format_bytes(r["model"])
        if col == 3:  # "21.6 / 23.5 GiB": the unit once where both have it (a 1280-pixel window shows GB/s too)
            free, total = format_bytes(r["free"]), format_bytes(r["total"])
            number, _, unit = free.rpartition(" ")
            return f"{number} / {total}" if number and total.endswith(f" {unit}") else f"{free} / {total}"
        return "-" if r["gbs"] is None else f"{r['gbs']:.1f}"

    def flags(self, index: QModelIndex) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        if not self._rows[index.row()]["ok"]:
            return Qt.ItemFlag.NoItemFlags  # greyed: shown, not selectable
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable


class DevicesPanel(QWidget):
    sigTableWidthChanged = Signal(int)  # the table's columns, sized to their contents, take this many pixels now

    def __init__(self, state: WorkbenchState, parent=None):
        super().__init__(parent)
        self.model = DevicesModel(state, self)
        self.view = QTableView()
        self.view.setModel(self.model)
        self.view.verticalHeader().hide()
        self.view.setShowGrid(False)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setWordWrap(True)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        header = self.view.horizontalHeader()
        # columns their contents' width (a stretched last one would keep the default section's 100 pixels at least)
        header.setMinimumSectionSize(32)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 8)
        layout.setSpacing(6)
        layout.addWidget(self.view, 1)
        self.reasons = QLabel()
        self.reasons.setObjectName("muted")
        self.reasons.setWordWrap(True)
        self.reasons.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(self.reasons)
        layout.addStretch(1)  # a tall panel (a tab of its own) keeps the reasons right below the table
        self.model.modelReset.connect(self._spans)
        self.model.dataChanged.connect(lambda *_: self._fit_columns())
        self._spans()

    def table_width(self) -> int:
        """What the table needs to show its columns whole."""
        return self.view.horizontalHeader().length() + 2 * self.view.frameWidth()

    def _fit_columns(self) -> None:
        before = self.table_width()
        self.view.resizeColumnsToContents()
        if self.table_width() != before:
            self.sigTableWidthChanged.emit(self.table_width())

    @Slot()
    def _spans(self) -> None:
        self.view.clearSpans()
        reasons = []
        for row in range(self.model.rowCount()):
            if self.model.is_unavailable(row):
                self.view.setSpan(row, 1, 1, len(DevicesModel.COLUMNS) - 1)
                name = self.model.index(row, 0).data()
                reasons.append(f"<b>{html.escape(name)}</b>: {html.escape(self.model.reason(row))}")
        self.reasons.setText("<br>".join(reasons))
        self.reasons.setVisible(bool(reasons))
        self._fit_columns()
        # As tall as its rows (no scroll bar for a handful of devices); the reasons sit right below.
        rows = sum(self.view.rowHeight(r) for r in range(self.model.rowCount()))
        self.view.setFixedHeight(self.view.horizontalHeader().height() + rows + 2 * self.view.frameWidth() + 6)
