"""The themes as a user sees them: a number or text field has a visible edge on either theme's background (Fusion
draws a field's frame in its palette's window colour darkened by 40 %)."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402
from PySide6.QtGui import QColor  # noqa: E402
from PySide6.QtWidgets import QApplication, QLineEdit, QSpinBox  # noqa: E402

from app import theme  # noqa: E402


@pytest.mark.parametrize("dark", [True, False])
def test_a_fields_frame_stands_out_from_the_background(qtbot, dark):
    app = QApplication.instance()
    before = (app.palette(), app.styleSheet())
    try:
        theme.apply_theme(app, dark)
        background = QColor((theme.DARK if dark else theme.LIGHT)["window"])
        for field in (QSpinBox(), QLineEdit()):
            qtbot.addWidget(field)
            field.show()  # (its palette is resolved once it is shown)
            frame = field.palette().window().color().darker(140)
            assert abs(frame.lightness() - background.lightness()) >= 40, (type(field).__name__, frame.name())
            assert field.palette().base().color() == QColor((theme.DARK if dark else theme.LIGHT)["base"])
    finally:
        app.setPalette(before[0])
        app.setStyleSheet(before[1])
