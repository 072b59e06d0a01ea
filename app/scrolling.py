"""Panels that scroll when their dock is smaller than they want, so that nothing overlaps."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtWidgets import QFrame, QScrollArea, QWidget


class Scrolling(QScrollArea):
    """A panel in a scroll area: the dock may be smaller than the panel wants, and nothing overlaps then. Not
    sideways: it scrolls up and down only, and the dock is never narrower than the panel's minimum width, whatever
    the panel holds now (a device more, a longer text): a cut plot title or button would want a sideways scroll."""

    def __init__(self, panel: QWidget, sideways: bool = True, min_height: int = 90):
        super().__init__()
        self.sideways, self.min_height = sideways, min_height
        self.setWidget(panel)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        if not sideways:
            self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
            panel.installEventFilter(self)

    def minimumSizeHint(self) -> QSize:
        if self.sideways or self.widget() is None:
            return QSize(160, self.min_height)
        panel = self.widget()
        width = panel.minimumSizeHint().expandedTo(panel.minimumSize()).width()
        return QSize(width + self.verticalScrollBar().sizeHint().width(), self.min_height)

    def eventFilter(self, watched, event) -> bool:
        if event.type() == QEvent.Type.LayoutRequest and watched is self.widget():
            self.updateGeometry()  # the panel's minimum may have changed: the dock asks again
        return super().eventFilter(watched, event)


class FitsItsHeight:
    """A panel whose text wraps (a QLabel with word wrap) in a scroll area: asked its height for a width, Qt's answer
    is its layout's preferred height (a plot's too), which the scroll area gives it, and a button at its end scrolls
    out of view though its dock had room for it. Its least height for the width instead: it takes what the dock has."""

    def heightForWidth(self, width: int) -> int:
        layout = self.layout()
        return layout.minimumHeightForWidth(width) if layout is not None and layout.hasHeightForWidth() else -1
