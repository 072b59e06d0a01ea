"""Look: a light and a dark palette that follow the system, device colours, icons drawn from assets/.

Icons are monochrome SVG files using `currentColor`; they are rendered here in the palette's text colour, so
one file serves both palettes (the run icons carry their own colours).
"""

from __future__ import annotations

import html
import os
from functools import lru_cache
from pathlib import Path

import pyqtgraph as pg
from PySide6 import QtGui
from PySide6.QtCore import QByteArray, QEvent, QObject, QRectF, Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QAbstractItemView, QApplication, QMenu, QToolTip, QWidget


def _assets() -> Path:
    """assets/: app/assets in an installed package (pyproject maps the repository's assets/ there), else the
    source tree's."""
    here = Path(__file__).resolve().parent
    installed = here / "assets"
    return installed if (installed / "icons").is_dir() else here.parent / "assets"


ASSETS = _assets()

LIGHT = {
    "window": "#f3f4f6", "base": "#ffffff", "alt": "#f7f8fa", "text": "#1d2430", "muted": "#6b7280",
    "button": "#eceef2", "highlight": "#2f6fdf", "highlight_text": "#ffffff", "border": "#d5d9e0",
    "chip": "#eef2f8", "ok": "#2e9d5b", "bad": "#d2463c", "warn": "#c98a14", "edge": "#b9bfc9",
}  # fmt: skip
DARK = {
    "window": "#1e2227", "base": "#252a31", "alt": "#2a3038", "text": "#e3e6ea", "muted": "#9aa3ae",
    "button": "#2f353d", "highlight": "#4c8dff", "highlight_text": "#ffffff", "border": "#3a414b",
    "chip": "#2f3640", "ok": "#48c07a", "bad": "#ef6a5f", "warn": "#e0a93a", "edge": "#5d6672",
}  # fmt: skip

# One colour per device kind, used by columns, bars and plots.
KIND_COLORS = {"cpu": "#2f6fdf", "gpu": "#2e9d5b", "sim": "#8e5bd6"}

_current = dict(LIGHT)


def colors() -> dict[str, str]:
    return _current


def device_kind(name: str, kind: str = "") -> str:
    """'cpu', 'gpu' or 'sim' for a device name such as cuda:0 or hostsim:0."""
    runtime = name.partition(":")[0]
    if runtime == "hostsim" or kind == "sim":
        return "sim"
    if runtime in ("cuda", "hip") or kind == "gpu":
        return "gpu"
    return "cpu"


# What each kind is called: (short, for the devices table's narrow column; long, where there is room: the placement
# editor's column heading, where a simulated device's description is the host's CPU and "simulated" alone would read
# as a simulated CPU).
KIND_TEXT = {"cpu": ("CPU", "CPU"), "gpu": ("GPU", "GPU"), "sim": ("simulated", "simulated accelerator")}


def kind_text(kind: str, long: bool = False) -> str:
    """The words for a device_kind() ('cpu', 'gpu', 'sim')."""
    return KIND_TEXT[kind][long]


def device_color(name: str, kind: str = "") -> QColor:
    return QColor(KIND_COLORS[device_kind(name, kind)])


def system_is_dark() -> bool:
    forced = os.environ.get("EXPERTBENCH_THEME", "").lower()
    if forced in ("dark", "light"):
        return forced == "dark"
    app = QGuiApplication.instance()
    if app is None:
        return False
    scheme = app.styleHints().colorScheme()
    if scheme == Qt.ColorScheme.Dark:
        return True
    if scheme == Qt.ColorScheme.Light:
        return False
    return app.palette().color(QPalette.ColorRole.Window).lightness() < 128


def make_palette(dark: bool) -> QPalette:
    c = DARK if dark else LIGHT
    p = QPalette()
    role = QPalette.ColorRole
    for r, key in ((role.Window, "window"), (role.WindowText, "text"), (role.Base, "base"),
                   (role.AlternateBase, "alt"), (role.Text, "text"), (role.Button, "button"),
                   (role.ButtonText, "text"), (role.Highlight, "highlight"),
                   (role.HighlightedText, "highlight_text"), (role.ToolTipBase, "base"), (role.ToolTipText, "text"),
                   (role.PlaceholderText, "muted"), (role.Link, "highlight")):  # fmt: skip
        p.setColor(r, QColor(c[key]))
    for r in (role.WindowText, role.Text, role.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, r, QColor(c["muted"]))
    p.setColor(role.Mid, QColor(c["border"]))
    p.setColor(role.Midlight, QColor(c["border"]))
    p.setColor(role.Light, QColor(c["alt"] if dark else "#ffffff"))
    p.setColor(role.Dark, QColor(c["muted"]))
    p.setColor(role.Shadow, QColor(c["border"]))
    return p


def checkbox_palette(dark: bool) -> QPalette:
    """Check boxes' own palette. Fusion outlines a check box in the window colour darkened by 140 %: in the dark
    palette that is near black on a near-black box, so the box gets a lighter window colour (its outline) and
    base (its fill) here; the label's text keeps the palette's."""
    p = make_palette(dark)
    if dark:
        p.setColor(QPalette.ColorRole.Window, QColor("#8a939f"))
        p.setColor(QPalette.ColorRole.Base, QColor("#323943"))
    return p


def field_palette(dark: bool) -> QPalette:
    """A number or text field's palette: Fusion draws its frame in the window colour darkened by 40 %, which is no
    edge at all on the dark theme's background; a lighter window colour for the fields alone gives them the "edge"
    colour's frame (their text and background stay the palette's)."""
    p = make_palette(dark)
    edge = QColor((DARK if dark else LIGHT)["edge"])
    p.setColor(QPalette.ColorRole.Window, edge.lighter(140))
    return p


def apply_theme(app: QApplication, dark: bool | None = None) -> bool:
    """Fusion style with our palette (light or dark: the system's when dark is None); returns dark."""
    if dark is None:
        dark = system_is_dark()
    app.setStyle("Fusion")
    _current.clear()
    _current.update(DARK if dark else LIGHT)
    app.setPalette(make_palette(dark))
    app.setPalette(checkbox_palette(dark), "QCheckBox")
    for kind in ("QAbstractSpinBox", "QLineEdit"):
        app.setPalette(field_palette(dark), kind)
    app.setStyleSheet(STYLE_SHEET.format(**_current))
    pg.setConfigOptions(antialias=True, background=_current["base"], foreground=_current["text"])
    icon.cache_clear()
    return dark


STYLE_SHEET = """
QDockWidget::title {{ padding: 6px 8px; background: {window}; font-weight: 600; }}
QToolBar {{ spacing: 4px; padding: 3px 6px; border: none; border-bottom: 1px solid {border}; }}
QStatusBar {{ border-top: 1px solid {border}; }}
QGroupBox {{ font-weight: 600; border: 1px solid {border}; border-radius: 6px; margin-top: 10px;
             padding: 10px 8px 8px 8px; }}
QGroupBox::title {{ subcontrol-origin: margin; left: 10px; padding: 0 4px; }}
QFrame#deviceColumn {{ background: {base}; border: 1px solid {border}; border-radius: 8px; }}
QFrame#deviceColumn[dropTarget="true"] {{ border: 2px solid {highlight}; background: {chip}; }}
QLabel#muted {{ color: {muted}; }}
QLabel#heading {{ font-weight: 600; }}
QLabel#banner {{ color: {warn}; }}
QTreeView, QTableView, QPlainTextEdit {{ border: 1px solid {border}; border-radius: 4px; }}
QTreeView#columnView {{ border: none; background: transparent; }}
QScrollBar:vertical {{ background: transparent; width: 10px; margin: 0; }}
QScrollBar:horizontal {{ background: transparent; height: 10px; margin: 0; }}
QScrollBar::handle {{ background: {border}; border-radius: 4px; min-height: 24px; min-width: 24px; }}
QScrollBar::handle:hover {{ background: {muted}; }}
QScrollBar::add-line, QScrollBar::sub-line {{ width: 0; height: 0; }}
QScrollBar::add-page, QScrollBar::sub-page {{ background: none; }}
QHeaderView::section {{ padding: 4px 6px; border: none; border-bottom: 1px solid {border};
                        background: {alt}; font-weight: 600; }}
"""


@lru_cache(maxsize=128)
def icon(name: str) -> QIcon:
    """An icon from assets/icons/NAME.svg in the current palette's text colour (empty if missing)."""
    path = ASSETS / "icons" / f"{name}.svg"
    if not path.is_file():
        return QIcon()
    svg = path.read_text(encoding="utf-8")
    out = QIcon()
    for mode, key in ((QIcon.Mode.Normal, "text"), (QIcon.Mode.Disabled, "muted")):
        renderer = QSvgRenderer(QByteArray(svg.replace("currentColor", _current[key]).encode()))
        for size in (16, 20, 24, 32, 48):
            pix = QPixmap(size, size)
            pix.fill(Qt.GlobalColor.transparent)
            painter = QPainter(pix)
            renderer.render(painter, QRectF(0, 0, size, size))
            painter.end()
            out.addPixmap(pix, mode)
    return out


def app_icon() -> QIcon:
    path = ASSETS / "expertbench.svg"
    return QIcon(str(path)) if path.is_file() else QIcon()


def heat_color(value: float) -> QColor:
    """0..1 to a cold-to-hot colour (the heat map's colour map)."""
    cmap = pg.colormap.get("inferno")
    return cmap.map(0.15 + 0.8 * min(max(value, 0.0), 1.0), mode="qcolor")


TIP_WRAP = 80  # characters: a plain tooltip longer than this is shown wrapped


def wrapped_tip(text: str | None) -> str | None:
    """A tooltip as Qt shows it wrapped: plain text longer than TIP_WRAP becomes rich text (which Qt wraps at about
    80 characters), its line breaks kept; rich text and short text as they are."""
    if not text or len(text) <= TIP_WRAP or QtGui.Qt.mightBeRichText(text):  # QtGui's Qt namespace has it
        return text
    return f"<p style='white-space:pre-wrap'>{html.escape(text)}</p>"


class TipWrapper(QObject):
    """Every tooltip of the application wrapped (wrapped_tip): a widget's, an item view's (its model's
    ToolTipRole) and a menu action's, so that none is a line across the screen."""

    def eventFilter(self, obj, event) -> bool:
        if event.type() != QEvent.Type.ToolTip or not isinstance(obj, QWidget):
            return False
        text = None
        view = obj.parent()
        if isinstance(view, QAbstractItemView) and obj is view.viewport():
            index = view.indexAt(event.pos())
            text = index.data(Qt.ItemDataRole.ToolTipRole) if index.isValid() else None
        elif isinstance(obj, QMenu):
            action = obj.actionAt(event.pos())
            text = action.toolTip() if action is not None and obj.toolTipsVisible() else None
        else:
            text = obj.toolTip()
        if not isinstance(text, str) or wrapped_tip(text) == text:
            return False  # Qt's own handling
        QToolTip.showText(event.globalPos(), wrapped_tip(text), obj)
        return True


_tip_wrapper: TipWrapper | None = None


def wrap_tooltips(app: QApplication) -> None:
    """Install the TipWrapper on the application (once)."""
    global _tip_wrapper
    if _tip_wrapper is None:
        _tip_wrapper = TipWrapper()
        app.installEventFilter(_tip_wrapper)
