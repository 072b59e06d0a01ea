"""The window's layout: compact below COMPACT_WIDTH, wide above, no panel over another, Start / Stop / progress
always shown, a saved layout that does not fit the screen not restored, --size for the screenshot."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402
from PySide6.QtCore import QPoint, QRect, QSize, Qt  # noqa: E402
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QScrollArea  # noqa: E402

from app.window import COMPACT_WIDTH, MainWindow, default_size, layout_fits, parse_rect  # noqa: E402


def panels(window: MainWindow) -> dict[str, QRect]:
    """The visible panels' rectangles in the main window's coordinates: docks (a tabbed dock only when its tab is the
    current one), the placement editor, the tool bar and the status bar."""
    out = {}
    widgets = {f"dock {key}": dock for key, dock in window.docks.items()}
    widgets["editor"] = window.centralWidget()
    widgets["status bar"] = window.statusBar()
    for bar in window.findChildren(type(window.addToolBar("probe"))):
        widgets[f"tool bar {bar.objectName()}"] = bar
    for name, widget in widgets.items():
        if widget.isVisible() and not widget.visibleRegion().isEmpty():
            rect = widget.rect()
            out[name] = QRect(widget.mapTo(window, rect.topLeft()), rect.size())
    return out


def shown_inside(window: MainWindow, widget) -> bool:
    """Visible, not covered or cut to nothing, and wholly inside the window."""
    rect = QRect(widget.mapTo(window, widget.rect().topLeft()), widget.size())
    return widget.isVisible() and not widget.visibleRegion().isEmpty() and window.rect().contains(rect)


def wholly_shown(window: MainWindow, widget) -> bool:
    """Shown inside the window and not cut at all: no scroll area, panel or window edge hides a part of it (of a plot,
    its viewport, which covers it)."""
    if isinstance(widget, QAbstractScrollArea):
        widget = widget.viewport()
    return shown_inside(window, widget) and widget.visibleRegion().boundingRect() == widget.rect()


@pytest.fixture
def themed():
    """The look a user gets (app.theme: Fusion, the palette and the style sheet's paddings), taken back after."""
    from app import theme

    app = QApplication.instance()
    before = (app.style().name(), app.palette(), app.styleSheet())
    theme.apply_theme(app, False)
    yield
    app.setStyle(before[0])
    app.setPalette(before[1])
    app.setStyleSheet(before[2])


def show_at(qtbot, window: MainWindow, size: tuple[int, int]) -> None:
    """--size WxH: the window at that size, its layout settled."""
    window.set_size(QSize(*size))
    qtbot.waitUntil(lambda: (window.width(), window.height()) == size)
    QApplication.processEvents()


def key_controls(window: MainWindow) -> dict[str, list]:
    """Per dock, the controls a user must see in it whole: the strategies, Tune and Cancel, the per-run plots, the
    device timeline."""
    return {"routing": [window.routing.strategies_box], "tune": [window.tune.start_button, window.tune.cancel_button],
            "plots": [window.plots.runs_plot, window.plots.hash_plot], "timeline": [window.timeline.plot]}  # fmt: skip


# a netbook (compact), the most common laptop screens, the README's screenshot, a desktop
@pytest.mark.parametrize("size", [(1100, 720), (1280, 720), (1366, 768), (1600, 1000), (1920, 1080)])
def test_no_panel_over_another_and_the_run_controls_shown(qtbot, make_window, size):
    import numpy as np

    window = make_window()
    cfg = window.state.model.config
    window.state.set_routing(np.ones((cfg.num_layers, cfg.num_experts)), "profiling")  # the map's caption: 3 lines
    window.resize(*size)
    qtbot.waitUntil(lambda: (window.width(), window.height()) == size)
    QApplication.processEvents()
    assert window.compact == (size[0] < COMPACT_WIDTH) == (size == (1100, 720))
    rects = panels(window)
    assert {"dock run", "editor", "status bar"} <= set(rects)
    names = sorted(rects)
    for i, a in enumerate(names):
        assert window.rect().contains(rects[a]), (a, rects[a], window.rect())
        for b in names[i + 1 :]:
            assert not rects[a].intersects(rects[b]), (a, rects[a], b, rects[b])
    run = window.run_panel
    for widget in (run.start_button, run.stop_button, run.progress):
        assert shown_inside(window, widget), widget
    if window.compact:  # the panels other than the run panel as tabs below the editor: one of them shown
        assert sum(f"dock {key}" in rects for key in ("plots", "history", "routing", "devices")) == 1
    else:  # every panel, but the devices behind the run settings' tab where the window is too low for both
        assert window.left_tabs == (size[1] < 1000) and ("dock devices" in rects) != window.left_tabs
        assert {f"dock {key}" for key in window.docks if key != "devices" or not window.left_tabs} <= set(rects)
    # every run setting whole, not scrolled away: the run panel has its column's height where the devices leave none
    settings = [run.q, run.repeats, run.mode, run.kv, run.precision, run.tokens, run.load_prompts_button, run.prompts]
    for widget in settings:
        assert wholly_shown(window, widget), (widget, widget.visibleRegion().boundingRect(), widget.rect())
    for key, controls in key_controls(window).items():
        if window.compact:  # its tab brought to the front, as a click on the tab does
            window.docks[key].raise_()
            QApplication.processEvents()
        for widget in controls:
            assert wholly_shown(window, widget), (key, widget, widget.visibleRegion().boundingRect(), widget.rect())


# a laptop's 1366 x 768 less a task bar, a desktop's, a 1280 x 720 less bars, a wide but low screen, a netbook
@pytest.mark.parametrize(("available", "compact"), [((1366, 728), False), ((1920, 1040), False), ((1280, 600), True),
                                                    ((1600, 600), True), ((1024, 560), True)])  # fmt: skip
def test_the_first_size_and_the_arrangement_follow_the_screens_available_area(qtbot, make_window, monkeypatch,
                                                                               available, compact):  # fmt: skip
    """A first launch (no saved layout) on a screen of that available area: the window fits it, height included, in
    the arrangement that fits it (the wide one only where the height leaves it room too), and asks no more."""
    area = QRect(0, 0, *available)
    monkeypatch.setattr(MainWindow, "_screens", lambda self: [area])
    window = make_window(settings_file=f"first-{available[0]}x{available[1]}.ini")
    size = default_size([area])
    qtbot.waitUntil(lambda: window.size() == size)
    QApplication.processEvents()
    assert window.compact is compact and window.size() == size
    minimum = window.minimumSizeHint()
    assert minimum.width() <= size.width() and minimum.height() <= size.height() <= area.height(), minimum


@pytest.mark.parametrize("size", [(1366, 768), (1280, 720), (1600, 500), (1100, 900)])
def test_set_size_gives_the_height_asked_for(qtbot, make_window, size):
    """--size WxH: the window gets that size, height too, from either arrangement (the wide one's minimum never makes
    it taller)."""
    from PySide6.QtCore import QSize

    window = make_window()
    for start in ((1920, 1080), (900, 600)):
        window.set_size(QSize(*start))
        qtbot.waitUntil(lambda start=start: (window.width(), window.height()) == start)
        window.set_size(QSize(*size))
        qtbot.waitUntil(lambda: (window.width(), window.height()) == size)
        QApplication.processEvents()
        assert (window.width(), window.height()) == size and window.compact == (size[0] < 1200 or size[1] < 600)


def test_the_arrangement_follows_the_width_and_keeps_closed_panels_closed(qtbot, make_window):
    window = make_window()
    window.resize(1600, 1000)
    qtbot.waitUntil(lambda: window.width() == 1600)
    assert window.compact is False
    window.docks["history"].close()
    window.resize(1100, 720)
    qtbot.waitUntil(lambda: window.width() == 1100)
    assert window.compact is True
    assert not window.docks["history"].isVisibleTo(window) and window.docks["plots"].isVisibleTo(window)
    window.resize(1600, 1000)
    qtbot.waitUntil(lambda: window.width() == 1600)
    assert window.compact is False and not window.docks["history"].isVisibleTo(window)
    window.act_reset_layout.trigger()
    assert window.docks["history"].isVisibleTo(window)


def test_every_panel_has_a_minimum_size_or_scrolls(make_window):
    window = make_window()
    for key, dock in window.docks.items():
        inner = dock.widget()
        if isinstance(inner, QScrollArea):
            assert inner.widgetResizable(), key
        else:
            hint = inner.minimumSize().expandedTo(inner.minimumSizeHint())
            assert hint.width() > 100 and hint.height() > 100, key
    # The compact arrangement fits the smaller screens: 1100 x 720 is not enlarged by the panels' minimum sizes.
    window.arrange(compact=True)
    minimum = window.minimumSizeHint()
    assert minimum.width() <= 1100 and minimum.height() <= 720, minimum


def test_a_saved_layout_that_does_not_fit_the_screen_is_not_restored(qtbot, make_window, tmp_path):
    screen = QApplication.primaryScreen().availableGeometry()  # 800 x 800 offscreen
    assert layout_fits(QRect(0, 0, screen.width(), screen.height()), [screen])
    assert layout_fits(QRect(-8, -8, screen.width() + 16, 100), [screen])  # a maximized window's frame
    assert not layout_fits(QRect(0, 0, screen.width() + 17, 100), [screen])
    assert not layout_fits(QRect(screen.right() + 10, 0, 100, 100), [screen])  # on a screen that is gone
    assert parse_rect("1,2,30,40") == QRect(1, 2, 30, 40) and parse_rect(None) is None and parse_rect("x") is None
    assert default_size([QRect(0, 0, 1000, 700)]).width() == 950 and default_size([]).width() == 1560
    window = make_window(settings_file="big.ini")
    window.resize(1600, 1000)  # larger than the screen: saved, but it cannot come back here
    qtbot.waitUntil(lambda: window.width() == 1600)
    window.close()
    again = make_window(settings_file="big.ini")
    assert again.width() <= screen.width() and again.height() <= screen.height()
    assert again.compact is True  # the default arrangement for the size it got
    for dock in again.docks.values():
        assert not dock.isFloating()
    small = make_window(settings_file="small.ini")
    small.resize(700, 650)
    qtbot.waitUntil(lambda: small.width() == max(700, small.minimumSizeHint().width()))
    small.docks["routing"].close()
    small.close()
    restored = make_window(settings_file="small.ini")  # fits: restored as it was
    assert restored.size() == small.size() and not restored.docks["routing"].isVisibleTo(restored)


def test_screenshot_size_option():
    from app.launch import build_parser

    assert build_parser().parse_args(["--screenshot", "x.png", "--size", "1100x720"]).size == (1100, 720)
    for bad in ("1100", "axb", "10x10"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--size", bad])


def test_the_screenshot_renders_at_the_size_asked_for(qtbot, make_window, tmp_path):
    """expertbench gui --screenshot FILE --size 1100x720: the PNG has that size, in the compact arrangement."""
    from PySide6.QtGui import QImage

    from app.launch import build_parser
    from app.screenshot import capture
    from engine.cli import window_arguments

    args = build_parser().parse_args(window_arguments(["gui", "--screenshot", "x.png", "--size", "1100x720"]))
    assert (args.screenshot, args.size) == ("x.png", (1100, 720))
    # the window's options open the window without `gui` too
    assert window_arguments(["--size", "1100x720"]) == ["--size", "1100x720"]
    assert window_arguments(["--size=800x600", "--theme", "dark"]) == ["--size=800x600", "--theme", "dark"]
    window = make_window()
    path = tmp_path / "small.png"
    assert capture(window, str(path), tokens=4, runs=1, size=args.size) == 0
    image = QImage(str(path))
    assert (image.width(), image.height()) == (1100, 720) and window.compact


# the README's screenshot, a desktop's screen and a larger one
@pytest.mark.parametrize("size", [(1600, 1000), (1920, 1080), (2560, 1440)])
def test_a_wide_window_shows_every_device_and_a_runs_judgement_whole(qtbot, make_window, size):
    """Where there is room, nothing that says how a run went or where it ran needs scrolling: every row and column
    of the Devices table, and the run history's speed, acceptance and hash (its first columns after #)."""
    from app.history import FIRST_COLUMNS, column

    window = make_window()
    window.set_size(QSize(*size))
    qtbot.waitUntil(lambda: (window.width(), window.height()) == size)
    QApplication.processEvents()
    view = window.devices.view
    assert wholly_shown(window, view)
    model = view.model()
    cells = [view.visualRect(model.index(r, c)) for r in range(model.rowCount()) for c in range(model.columnCount())
             if view.columnSpan(r, c) == 1 or c == 0]  # fmt: skip
    assert model.rowCount() >= 2
    # (the docks take their default shares once the resized layout has settled: arrange() sizes them again then)
    qtbot.waitUntil(lambda: all(view.viewport().rect().contains(cell) for cell in cells))
    history = window.history.view
    assert wholly_shown(window, history)
    header = history.horizontalHeader()

    def whole(name: str) -> bool:
        left = header.sectionViewportPosition(column(name))
        return left >= 0 and left + header.sectionSize(column(name)) <= history.viewport().width()

    qtbot.waitUntil(lambda: all(whole(name) for name in ("#", *FIRST_COLUMNS[:3])))


@pytest.mark.parametrize("size", [(1280, 720), (1366, 768)])
def test_a_low_wide_window_shows_the_devices_whole_in_a_tab_beside_the_run_settings(qtbot, make_window, themed,
                                                                                     size):  # fmt: skip
    """Too low for the devices above every run setting: the two are tabs of the left column, the run settings in
    front; a click on the Devices tab shows every device's row and column whole (GB/s too), a click on Run brings the
    settings back."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QTabBar

    window = make_window()
    window.set_size(QSize(*size))
    qtbot.waitUntil(lambda: (window.width(), window.height()) == size)
    QApplication.processEvents()
    assert window.left_tabs and wholly_shown(window, window.run_panel.start_button)

    def bars() -> list[QTabBar]:
        """The tab bar a person sees (Qt keeps those of earlier arrangements a while, hidden or out of the window)."""
        tabs = ["Run", "Devices"]
        return [
            b
            for b in window.findChildren(QTabBar)
            if [b.tabText(i) for i in range(b.count())] == tabs
            and shown_inside(window, b)
            and window.childAt(b.mapTo(window, b.tabRect(1).center())) is b
        ]

    qtbot.waitUntil(lambda: len(bars()) == 1)
    bar = bars()[0]
    assert bar.currentIndex() == 0
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(1).center())
    view = window.devices.view
    qtbot.waitUntil(lambda: wholly_shown(window, view))
    model = view.model()
    assert model.rowCount() >= 2
    columns = range(model.columnCount())
    cells = [view.visualRect(model.index(r, c)) for r in range(model.rowCount()) for c in columns
             if view.columnSpan(r, c) == 1 or c == 0]  # fmt: skip
    qtbot.waitUntil(lambda: all(view.viewport().rect().contains(cell) for cell in cells))
    assert not wholly_shown(window, window.run_panel.start_button)
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(0).center())
    qtbot.waitUntil(lambda: wholly_shown(window, window.run_panel.start_button))
    # taller again: one above the other, both shown
    window.set_size(QSize(1920, 1080))
    qtbot.waitUntil(lambda: (window.width(), window.height()) == (1920, 1080))
    QApplication.processEvents()
    assert not window.left_tabs and set(panels(window)) >= {"dock devices", "dock run"}
    assert wholly_shown(window, view) and wholly_shown(window, window.run_panel.prompts)


@pytest.mark.parametrize("size", [(1280, 720), (1366, 768), (1600, 1000), (1920, 1080)])
def test_every_tune_setting_shown_and_its_front_reached_without_hiding_them(qtbot, make_window, themed, size):
    """The Tune panel below Tune and Cancel: every setting whole ("also owner_local" and its KL limit too, not
    scrolled away), and a scroll of its results brings the front plot into view while the settings stay."""
    window = make_window()
    show_at(qtbot, window, size)
    tune = window.tune
    controls = [tune.start_button, tune.cancel_button, tune.time_budget, tune.q, tune.fast_device, tune.budget,
                tune.owner_local, tune.max_kl]  # fmt: skip
    qtbot.waitUntil(lambda: all(wholly_shown(window, w) for w in controls))
    viewport = tune.plot.viewport()

    def front_in_view() -> bool:
        tune.results_area.ensureWidgetVisible(tune.plot, 0, 0)  # as a turn of the wheel over the results does
        return not viewport.visibleRegion().isEmpty() and shown_inside(window, tune.results_area)

    qtbot.waitUntil(front_in_view)
    # (the docks take their default shares once the resized layout has settled)
    qtbot.waitUntil(lambda: all(wholly_shown(window, w) for w in controls) and not viewport.visibleRegion().isEmpty())
    # the owner_local box turns the KL limit on, in view
    qtbot.mouseClick(tune.owner_local, Qt.MouseButton.LeftButton)
    assert tune.owner_local.isChecked() and tune.max_kl.isEnabled() and wholly_shown(window, tune.max_kl)


@pytest.mark.parametrize("size", [(1280, 720), (1366, 768), (1600, 1000), (1920, 1080)])
def test_the_run_history_shows_a_runs_number_speed_acceptance_and_hash_without_scrolling(qtbot, make_window,
                                                                                          themed, size):  # fmt: skip
    """From the smallest wide window on, the run history's "#", Decode tok/s, Accept and Hash are whole without a
    sideways scroll, with runs in it, and still after a click on a heading sorts by that column (its arrow's room)."""
    from app_helpers import record, set_history

    from app.history import FIRST_COLUMNS, column

    window = make_window()
    runs = [record(i, decode_tokens_per_second=1234.56 / i, accept_rate=0.753, output_hash=f"{i}c32ebef560" * 6)
            for i in range(1, 13)]  # fmt: skip
    set_history(window.state, runs)
    show_at(qtbot, window, size)
    view = window.history.view
    header = view.horizontalHeader()
    names = ("#", *FIRST_COLUMNS[:3])

    def whole() -> bool:
        for name in names:
            left = header.sectionViewportPosition(column(name))
            if left < 0 or left + header.sectionSize(column(name)) > view.viewport().width():
                return False
        return wholly_shown(window, view) and view.horizontalScrollBar().value() == 0

    qtbot.waitUntil(whole)
    # the texts are whole in their columns: no cell of them elided
    for name in names:
        col = column(name)
        assert header.sectionSize(col) >= view.sizeHintForColumn(col), name
    for name in ("Accept", "Hash"):  # a click on the heading: sorted by it, its arrow beside its text
        at = header.sectionViewportPosition(column(name)) + header.sectionSize(column(name)) // 2
        qtbot.mouseClick(header.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(at, header.height() // 2))
        qtbot.waitUntil(lambda name=name: header.sortIndicatorSection() == column(name))
        qtbot.waitUntil(whole)
