"""The placement editor: one column per device, one chip per MoE layer, drag chips (or single experts) across.

Each column is a DeviceColumnModel over the state's placement (napari's pattern): the model only forwards the
state's changes, and a drop only calls `state.move(...)`, which checks memory, records the edit for undo and
has the engine apply it on its thread. While a drag hovers over a column, the memory bars show the result.
"""

from __future__ import annotations

import json

from PySide6.QtCore import QAbstractItemModel, QMimeData, QModelIndex, QRectF, QSize, Qt, QTimer, Slot
from PySide6.QtGui import QColor, QFont, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QScrollArea,
    QSizePolicy,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QToolButton,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from . import actions, theme
from .state import WorkbenchState, format_bytes

_ROOT = QModelIndex()  # the invalid index: Qt's default parent
MIME = "application/x-expertbench-experts"
BANNER_MS = 12_000  # how long a refused move is said above the columns

LayerRole = Qt.ItemDataRole.UserRole + 1  # layer index
ExpertsRole = Qt.ItemDataRole.UserRole + 2  # experts of that layer in this row (list)
BytesRole = Qt.ItemDataRole.UserRole + 3
HeatRole = Qt.ItemDataRole.UserRole + 4  # 0..1 (a layer row: one per expert in it), None without statistics
ShareRole = Qt.ItemDataRole.UserRole + 6  # share of the layer's routed hits its experts here serve (0..1)
WholeRole = Qt.ItemDataRole.UserRole + 5  # True when every expert of the layer is on this device

_TOP = 0  # internal id of a layer row; an expert row stores its layer row + 1


def encode_moves(source: str, moves: dict[int, list[int]]) -> QMimeData:
    data = QMimeData()
    payload = {"source": source, "moves": {str(k): sorted(v) for k, v in moves.items()}}
    data.setData(MIME, json.dumps(payload).encode())
    return data


def decode_moves(data: QMimeData) -> tuple[str, dict[int, list[int]]] | None:
    if data is None or not data.hasFormat(MIME):
        return None
    try:
        payload = json.loads(bytes(data.data(MIME)).decode())
        return payload["source"], {int(k): [int(e) for e in v] for k, v in payload["moves"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


class DeviceColumnModel(QAbstractItemModel):
    """The MoE layers with experts on one device (top level) and those experts (children)."""

    def __init__(self, state: WorkbenchState, device: str, parent=None):
        super().__init__(parent)
        self.state, self.device = state, device
        self._rows: list[tuple[int, list[int]]] = self._compute()
        state.sigPlacementChanged.connect(self.refresh)
        state.sigRoutingChanged.connect(self._routing_changed)

    def _compute(self) -> list[tuple[int, list[int]]]:
        p = self.state.placement
        if p is None:
            return []
        rows = []
        for layer, owners in enumerate(p.owners):
            experts = [e for e, d in enumerate(owners) if d == self.device]
            if experts:
                rows.append((layer, experts))
        return rows

    @Slot()
    def refresh(self) -> None:
        rows = self._compute()
        if rows == self._rows:
            return
        self.beginResetModel()
        self._rows = rows
        self.endResetModel()

    @Slot()
    def _routing_changed(self) -> None:
        """New hit counts change only the heat of the rows there are: every chip and expert repaints."""
        if not self._rows:
            return
        roles = [HeatRole, ShareRole]
        self.dataChanged.emit(self.index(0, 0), self.index(len(self._rows) - 1, 0), roles)
        for row, (_layer, experts) in enumerate(self._rows):
            parent = self.index(row, 0)
            self.dataChanged.emit(self.index(0, 0, parent), self.index(len(experts) - 1, 0, parent), roles)

    # -- structure -----------------------------------------------------------------------------------------

    def index(self, row: int, column: int, parent: QModelIndex = _ROOT) -> QModelIndex:
        if column != 0 or row < 0:
            return QModelIndex()
        if not parent.isValid():
            return self.createIndex(row, 0, _TOP) if row < len(self._rows) else QModelIndex()
        if parent.internalId() != _TOP or parent.column() != 0 or parent.row() >= len(self._rows):
            return QModelIndex()
        if row >= len(self._rows[parent.row()][1]):
            return QModelIndex()
        return self.createIndex(row, 0, parent.row() + 1)

    def parent(self, index: QModelIndex | None = None):
        if index is None:  # QObject.parent(), which this overload hides
            return super().parent()
        if not index.isValid() or index.internalId() == _TOP:
            return QModelIndex()
        return self.createIndex(index.internalId() - 1, 0, _TOP)

    def rowCount(self, parent: QModelIndex = _ROOT) -> int:
        if not parent.isValid():
            return len(self._rows)
        if parent.column() != 0 or parent.internalId() != _TOP or parent.row() >= len(self._rows):
            return 0
        return len(self._rows[parent.row()][1])

    def columnCount(self, parent: QModelIndex = _ROOT) -> int:
        return 1

    def hasChildren(self, parent: QModelIndex = _ROOT) -> bool:
        return self.rowCount(parent) > 0

    # -- content -------------------------------------------------------------------------------------------

    def _item(self, index: QModelIndex) -> tuple[int, list[int], bool]:
        """(layer, experts, is_layer_row)"""
        if index.internalId() == _TOP:
            layer, experts = self._rows[index.row()]
            return layer, experts, True
        layer, experts = self._rows[index.internalId() - 1]
        return layer, [experts[index.row()]], False

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        layer, experts, is_layer = self._item(index)
        model = self.state.model
        if role == Qt.ItemDataRole.DisplayRole:
            return f"Layer {layer}" if is_layer else f"Expert {experts[0]}"
        if role == LayerRole:
            return layer
        if role == ExpertsRole:
            return list(experts)
        if role == BytesRole:
            return 0 if model is None else model.shape.bytes_of(layer) * len(experts)
        if role == WholeRole:
            return model is not None and len(experts) == model.config.num_experts
        if role == HeatRole:
            heat = self.state.expert_heat()
            if heat is None:
                return None
            return [float(h) for h in heat[layer, experts]] if is_layer else float(heat[layer, experts[0]])
        if role == ShareRole:
            hits = self.state.routing
            if hits is None or hits[layer].sum() <= 0:
                return None
            return float(hits[layer, experts].sum() / hits[layer].sum())
        if role == Qt.ItemDataRole.ToolTipRole:
            size = format_bytes(0 if model is None else model.shape.bytes_of(layer) * len(experts))
            if is_layer:
                n = 0 if model is None else model.config.num_experts
                share = self.data(index, ShareRole)
                hits = "" if share is None else f" They serve {100 * share:.0f} % of the layer's routed hits."
                return (f"Layer {layer}: {len(experts)} of {n} experts on {self.device} ({size}).{hits}\n"
                        "Drag to another device to move them; expand to drag single experts.")  # fmt: skip
            return f"Expert {experts[0]} of layer {layer} on {self.device} ({size})"
        return None

    def flags(self, index: QModelIndex) -> Qt.ItemFlag:
        base = Qt.ItemFlag.ItemIsDropEnabled
        if not index.isValid():
            return base
        return base | Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsDragEnabled

    # -- drag and drop -------------------------------------------------------------------------------------

    def mimeTypes(self) -> list[str]:
        return [MIME]

    def supportedDragActions(self) -> Qt.DropAction:
        return Qt.DropAction.MoveAction

    def supportedDropActions(self) -> Qt.DropAction:
        return Qt.DropAction.MoveAction | Qt.DropAction.CopyAction

    def moves_for(self, indexes) -> dict[int, list[int]]:
        moves: dict[int, set[int]] = {}
        for index in indexes:
            if index.isValid() and index.model() is self:
                layer, experts, _ = self._item(index)
                moves.setdefault(layer, set()).update(experts)
        return {layer: sorted(ex) for layer, ex in sorted(moves.items())}

    def mimeData(self, indexes) -> QMimeData:
        return encode_moves(self.device, self.moves_for(indexes))

    def canDropMimeData(self, data, action, row, column, parent) -> bool:
        decoded = decode_moves(data)
        return decoded is not None and decoded[0] != self.device and bool(decoded[1])

    def dropMimeData(self, data, action, row, column, parent) -> bool:
        """A drop only asks the state to move the experts here; the state refuses what would not fit."""
        if not self.canDropMimeData(data, action, row, column, parent):
            return False
        return self.state.move(decode_moves(data)[1], self.device)


class ChipDelegate(QStyledItemDelegate):
    """Draws a layer as a rounded chip (name, bytes, expert count, heat), an expert as a small pill."""

    def __init__(self, device: str, kind: str, parent=None):
        super().__init__(parent)
        self.accent = theme.device_color(device, kind)

    def sizeHint(self, option, index) -> QSize:
        top = index.internalId() == _TOP
        return QSize(140, 46 if top else 26)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        top = index.internalId() == _TOP
        rect = QRectF(option.rect).adjusted(2, 3, -4, -3)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        c = theme.colors()
        fill = QColor(c["chip"])
        if selected:
            fill = QColor(self.accent)
            fill.setAlpha(60)
        path = QPainterPath()
        path.addRoundedRect(rect, 6, 6)
        painter.fillPath(path, fill)
        painter.setPen(QPen(self.accent if selected else QColor(c["border"]), 1.2))
        painter.drawPath(path)
        stripe = QPainterPath()
        stripe.addRoundedRect(QRectF(rect.left(), rect.top(), 4, rect.height()), 2, 2)
        painter.fillPath(stripe, self.accent)
        heat = index.data(HeatRole)
        text_rect = rect.adjusted(12, 0, -10, 0)
        font = QFont(option.font)
        size = format_bytes(index.data(BytesRole) or 0)
        if top:
            font.setBold(True)
            painter.setFont(font)
            painter.setPen(QColor(c["text"]))
            line1 = QRectF(text_rect.left(), rect.top() + 4, text_rect.width(), 18)
            painter.drawText(line1, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, index.data())
            font.setBold(False)
            painter.setFont(font)
            painter.drawText(line1, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, size)
            experts = index.data(ExpertsRole) or []
            total = self.parent().state.model.config.num_experts if self.parent().state.model else len(experts)
            detail = "all experts" if len(experts) == total else f"{len(experts)} of {total} experts"
            small = QFont(option.font)
            small.setPointSizeF(max(7.0, option.font.pointSizeF() - 1))
            painter.setFont(small)
            painter.setPen(QColor(c["muted"]))
            line2 = QRectF(text_rect.left(), rect.top() + 22, text_rect.width(), 16)
            painter.drawText(line2, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, detail)
            if heat:  # one cell per expert of the chip, coloured by its hits (relative to the layer's hottest)
                # In a narrow column the strip shrinks and the share of hits goes first: nothing overlaps the count.
                metrics = painter.fontMetrics()
                room = line2.width() - metrics.horizontalAdvance(detail) - 8
                width = min(80.0, room)
                share = index.data(ShareRole)
                hits = "" if share is None or len(experts) == total else f"{100 * share:.0f} % of hits"
                if hits and metrics.horizontalAdvance(hits) + 8 <= room - width:  # a whole layer serves all its hits
                    painter.drawText(line2.adjusted(0, 0, -(width + 8), 0), Qt.AlignmentFlag.AlignRight
                                     | Qt.AlignmentFlag.AlignVCenter, hits)  # fmt: skip
                if width < 16:
                    painter.restore()
                    return
                strip = QRectF(line2.right() - width, line2.center().y() - 4, width, 8)
                cell = strip.width() / len(heat)
                for i, h in enumerate(heat):
                    painter.fillRect(QRectF(strip.left() + i * cell, strip.top(), cell + 0.5, strip.height()),
                                     theme.heat_color(h))  # fmt: skip
        else:
            painter.setFont(font)
            painter.setPen(QColor(c["text"]))
            painter.drawText(text_rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, index.data())
            painter.setPen(QColor(c["muted"]))
            right = text_rect.adjusted(0, 0, -14 if heat is not None else 0, 0)
            painter.drawText(right, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, size)
            if heat is not None:
                painter.setBrush(theme.heat_color(heat))
                painter.setPen(Qt.PenStyle.NoPen)
                painter.drawEllipse(QRectF(text_rect.right() - 8, text_rect.center().y() - 4, 8, 8))
        painter.restore()


class DeviceColumnView(QTreeView):
    """A column's list of chips; shows the drop's effect on the memory bars while a drag hovers."""

    def __init__(self, model: DeviceColumnModel, kind: str, parent=None):
        super().__init__(parent)
        self.setObjectName("columnView")
        self.setModel(model)
        self.state = model.state
        self.setItemDelegate(ChipDelegate(model.device, kind, self))
        self.setHeaderHidden(True)
        self.setIndentation(14)
        self.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.setDragDropMode(QAbstractItemView.DragDropMode.DragDrop)
        self.setDefaultDropAction(Qt.DropAction.MoveAction)
        self.setDropIndicatorShown(False)
        self.setAnimated(True)
        self.setUniformRowHeights(False)
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self._expanded: set[int] = set()
        model.modelAboutToBeReset.connect(self._remember_expanded)
        model.modelReset.connect(self._restore_expanded)

    def _remember_expanded(self) -> None:
        m = self.model()
        self._expanded = {m.index(r, 0).data(LayerRole) for r in range(m.rowCount()) if self.isExpanded(m.index(r, 0))}

    def _restore_expanded(self) -> None:
        m = self.model()
        for r in range(m.rowCount()):
            if m.index(r, 0).data(LayerRole) in self._expanded:
                self.expand(m.index(r, 0))

    def dragEnterEvent(self, event) -> None:
        super().dragEnterEvent(event)
        self._hover(event)

    def dragMoveEvent(self, event) -> None:
        super().dragMoveEvent(event)
        self._hover(event)

    def _hover(self, event) -> None:
        decoded = decode_moves(event.mimeData())
        if decoded is None or decoded[0] == self.model().device:
            event.ignore()
            return
        self.state.preview_move(decoded[1], self.model().device)
        self.set_drop_target(True)
        event.setDropAction(Qt.DropAction.MoveAction)
        event.accept()

    def set_drop_target(self, on: bool) -> None:
        """Highlight the column a drag hovers over (its frame, through the style sheet's dropTarget rule)."""
        column = self.parentWidget()
        if column is None or bool(column.property("dropTarget")) == on:
            return
        column.setProperty("dropTarget", on)
        column.style().unpolish(column)
        column.style().polish(column)
        column.update()

    def dragLeaveEvent(self, event) -> None:
        super().dragLeaveEvent(event)
        self.set_drop_target(False)
        self.state.clear_preview()

    def dropEvent(self, event) -> None:
        # Drop anywhere in the column: hand the data to the model directly (no row / parent semantics).
        data = event.mimeData()
        model = self.model()
        ok = model.dropMimeData(data, Qt.DropAction.MoveAction, -1, -1, QModelIndex())
        self.set_drop_target(False)
        self.state.clear_preview()
        if ok:
            event.setDropAction(Qt.DropAction.CopyAction)  # nothing for the source view to remove
            event.accept()
        else:
            event.ignore()


class MemoryBar(QWidget):
    """Expert bytes on a device against the room it has; a hovering drag shows its result as a ghost."""

    def __init__(self, state: WorkbenchState, device: str, kind: str, parent=None):
        super().__init__(parent)
        self.state, self.device = state, device
        self.accent = theme.device_color(device, kind)
        self.setMinimumHeight(34)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        for sig in (state.sigPlacementChanged, state.sigPreviewChanged, state.sigDevicesChanged):
            sig.connect(self.update)

    @property
    def used(self) -> int:
        return self.state.used_bytes.get(self.device, 0)  # counted by the state once per edit

    @property
    def capacity(self) -> int:
        return self.state.capacity.get(self.device, 0)

    @property
    def preview(self) -> int | None:
        return None if self.state.preview is None else self.state.preview.get(self.device, 0)

    def text(self) -> str:
        shown = self.preview if self.preview is not None else self.used
        return f"{format_bytes(shown)} of {format_bytes(self.capacity)}"

    def paintEvent(self, event) -> None:
        c = theme.colors()
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        font = QFont(self.font())
        font.setPointSizeF(max(7.0, font.pointSizeF() - 1))
        p.setFont(font)
        label = QRectF(0, 0, self.width(), 14)
        p.setPen(QColor(c["muted"]))
        p.drawText(label, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, "experts")
        used, preview, capacity = self.used, self.preview, self.capacity  # plain reads: no counting per paint
        cap = max(capacity, 1)
        over = preview is not None and preview > capacity and preview > used
        p.setPen(QColor(c["bad"] if over else c["text"]))
        p.drawText(label, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, self.text())
        track = QRectF(0, 18, self.width(), 10)
        path = QPainterPath()
        path.addRoundedRect(track, 4, 4)
        p.fillPath(path, QColor(c["border"]))
        p.setClipPath(path)
        share = min(1.0, used / cap)
        # Very small shares still get a visible sliver, so a device that holds something never looks empty.
        width = max(3.0, track.width() * share) if used else 0.0
        p.fillRect(QRectF(track.left(), track.top(), width, track.height()), self.accent)
        if preview is not None and preview != used:
            ghost = QColor(c["bad"] if over else c["ok"])
            ghost.setAlpha(150)
            pw = max(3.0, track.width() * min(1.0, preview / cap)) if preview else 0.0
            lo, hi = sorted((width, pw))
            p.fillRect(QRectF(track.left() + lo, track.top(), hi - lo, track.height()), ghost)
        p.end()


class DeviceColumn(QFrame):
    def __init__(self, state: WorkbenchState, device: str, kind: str, description: str, note: str = "", parent=None):
        super().__init__(parent)
        self.setObjectName("deviceColumn")
        self.device = device
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 10, 10, 8)
        layout.setSpacing(6)
        head = QHBoxLayout()
        head.setSpacing(6)
        icon = QLabel()
        icon.setPixmap(theme.icon(f"device-{theme.device_kind(device, kind)}").pixmap(20, 20))
        name = QLabel(device)
        name.setObjectName("heading")
        self.count = QLabel()
        self.count.setObjectName("muted")
        head.addWidget(icon)
        head.addWidget(name)
        head.addStretch(1)
        head.addWidget(self.count)
        layout.addLayout(head)
        sub = QLabel(description)
        sub.setObjectName("muted")
        layout.addWidget(sub)
        if note:  # what runs here whatever the placement (the primary's shared experts)
            pinned = QLabel(note)
            pinned.setObjectName("muted")
            pinned.setWordWrap(True)
            pinned.setToolTip(
                "The shared experts run on the primary in every MoE layer, beside the routed experts "
                "placed here or elsewhere; they are not placed (expertbench's cost model counts them)"
            )
            layout.addWidget(pinned)
        self.bar = MemoryBar(state, device, kind)
        layout.addWidget(self.bar)
        self.model = DeviceColumnModel(state, device, self)
        self.view = DeviceColumnView(self.model, kind)
        layout.addWidget(self.view, 1)
        self.model.modelReset.connect(self._count)
        self._count()
        self.setMinimumWidth(190)

    def _count(self) -> None:
        whole = sum(1 for r in range(self.model.rowCount()) if self.model.index(r, 0).data(WholeRole))
        part = self.model.rowCount() - whole
        text = f"{whole} layer{'s' if whole != 1 else ''}"
        self.count.setText(text + (f" + {part} split" if part else ""))


class PlacementText(QLabel):
    """The placement's text form. A placement split expert by expert is a long text: it never widens the window;
    when it does not fit it ends in an ellipsis (the whole text is in the tooltip)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def paintEvent(self, event) -> None:
        room = self.contentsRect()
        metrics = self.fontMetrics()
        if metrics.horizontalAdvance(self.text()) <= room.width():
            super().paintEvent(event)  # fits: QLabel's own painting, with mouse selection
            return
        p = QPainter(self)
        p.setPen(self.palette().color(self.foregroundRole()))
        elided = metrics.elidedText(self.text(), Qt.TextElideMode.ElideRight, room.width())
        p.drawText(room, int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter), elided)


class PlacementEditor(QWidget):
    """Undo / redo, the apply indicator, the placement text, and the device columns."""

    def __init__(self, state: WorkbenchState, parent=None):
        super().__init__(parent)
        self.state = state
        self.columns: dict[str, DeviceColumn] = {}
        outer = QVBoxLayout(self)
        outer.setContentsMargins(8, 8, 8, 8)
        outer.setSpacing(8)
        bar = QHBoxLayout()
        bar.setSpacing(6)
        title = QLabel("Expert placement")
        title.setObjectName("heading")
        bar.addWidget(title)
        self.undo_button = QToolButton()
        self.undo_button.setIcon(theme.icon("undo"))
        actions.connect(self.undo_button.clicked, self.undo, "Undo", parent=self)
        self.redo_button = QToolButton()
        self.redo_button.setIcon(theme.icon("redo"))
        actions.connect(self.redo_button.clicked, self.redo, "Redo", parent=self)
        bar.addSpacing(8)
        bar.addWidget(self.undo_button)
        bar.addWidget(self.redo_button)
        self.text = PlacementText()
        self.text.setObjectName("muted")
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        bar.addSpacing(8)
        bar.addWidget(self.text, 1)
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)
        self.progress.setFixedWidth(90)
        self.progress.setFixedHeight(10)
        self.progress.setTextVisible(False)
        self.progress.hide()
        self.apply_label = QLabel()
        self.apply_label.setObjectName("muted")
        bar.addWidget(self.progress)
        bar.addWidget(self.apply_label)
        outer.addLayout(bar)
        self.banner = QLabel()
        self.banner.setObjectName("banner")
        self.banner.setWordWrap(True)
        self.banner.hide()
        self.banner.setToolTip("Click to dismiss")
        self.banner.mousePressEvent = lambda _event: self.banner.hide()
        self.banner_timer = QTimer(self)
        self.banner_timer.setSingleShot(True)
        self.banner_timer.setInterval(BANNER_MS)
        self.banner_timer.timeout.connect(self.banner.hide)
        outer.addWidget(self.banner)
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.holder = QWidget()
        self.row = QHBoxLayout(self.holder)
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.setSpacing(10)
        self.scroll.setWidget(self.holder)
        outer.addWidget(self.scroll, 1)
        self.empty = QLabel("No model loaded")
        self.empty.setObjectName("muted")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.row.addWidget(self.empty)
        state.sigModelChanged.connect(self.rebuild)
        state.sigEngineChanged.connect(self.rebuild)
        state.sigPlacementChanged.connect(self._update_text)
        state.sigUndoChanged.connect(self._update_undo)
        state.sigApplyingChanged.connect(self._applying)
        state.sigRefused.connect(self._refused)
        self._update_undo()
        self.rebuild()

    @Slot()
    def rebuild(self) -> None:
        for col in self.columns.values():
            self.row.removeWidget(col)
            col.deleteLater()
        self.columns.clear()
        self.empty.setVisible(self.state.model is None)
        if self.state.model is None:
            return
        for d in self.state.devices:
            kind = theme.device_kind(d.name, d.kind)
            description = f"{theme.kind_text(kind, long=True)} · {d.description}"
            note = ""
            if d.name == self.state.model.primary:
                description += " · primary"
                shape = self.state.model.shape
                if shape is not None and shape.shared_bytes:  # DeepSeek's always-on experts never move
                    total = shape.shared_bytes * len(shape.moe_layers)
                    note = f"+ shared experts of {len(shape.moe_layers)} layers, {total / 2**20:.1f} MiB (pinned)"
            col = DeviceColumn(self.state, d.name, d.kind, description, note)
            self.columns[d.name] = col
            self.row.addWidget(col, 1)
        self._update_text()

    @Slot()
    def _update_text(self) -> None:
        p = self.state.placement
        text = "" if p is None else p.describe()
        self.text.setText(text)
        self.text.setToolTip(f"{text}\n\nThe placement in its text form (as `expertbench run --placement` reads it)")
        self.banner.hide()

    @Slot()
    def undo(self) -> None:
        """Undo the last edit and say which in the status bar (Edit > Undo and the editor's button)."""
        self._step(self.state.undo_text, self.state.undo, "Undone")

    @Slot()
    def redo(self) -> None:
        self._step(self.state.redo_text, self.state.redo, "Redone")

    def _step(self, label: str, step, said: str) -> None:
        if label:
            step()
            self.state.sigMessage.emit(f"{said}: {label}")

    @Slot()
    def _update_undo(self) -> None:
        self.undo_button.setEnabled(bool(self.state.undo_text))
        self.redo_button.setEnabled(bool(self.state.redo_text))
        self.undo_button.setToolTip(f"Undo {self.state.undo_text}" if self.state.undo_text else "Nothing to undo")
        self.redo_button.setToolTip(f"Redo {self.state.redo_text}" if self.state.redo_text else "Nothing to redo")

    @Slot(bool)
    def _applying(self, on: bool) -> None:
        self.progress.setVisible(on)
        self.apply_label.setText("applying…" if on else "applied to the engine")

    @Slot(str, str)
    def _refused(self, reason: str, text: str) -> None:
        """An edit that would overflow a device: said above the columns until the next edit, a click on it, or
        BANNER_MS (the status bar says the other refusals)."""
        if reason != "overflow":
            return
        self.banner.setText(text)
        self.banner.show()
        self.banner_timer.start()
