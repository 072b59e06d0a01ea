"""The main window: the placement editor in the middle, panels in docks around it, menus, status bar."""

from __future__ import annotations

import html
import importlib.metadata
import json
import shlex
from pathlib import Path

from PySide6.QtCore import QRect, QSettings, QSize, Qt, QTimer, Slot
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QGuiApplication, QKeySequence, QResizeEvent
from PySide6.QtWidgets import (
    QApplication,
    QDialogButtonBox,
    QDockWidget,
    QFileDialog,
    QInputDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QToolBar,
    QWidget,
)

from engine.checkpoints.demo import (
    DEFAULT_FAMILY,
    DEFAULT_QUANT,
    FAMILIES,
    FOLDER_FORMATS,
    MOE_DRAFTS,
    QUANTS,
    demo_name,
    draft_kind,
    quant_formats,
)
from engine.core.errors import ArgumentError, EngineError
from engine.core.files import atomic_write
from engine.export.engines import ENGINE_EXPORTS, EngineExport, export_to
from engine.export.llama_cpp import LlamaCppExport, to_llama_cpp
from engine.families import family as model_family
from engine.model import WEIGHTS_MODES
from engine.session import SELF_DRAFT

from . import actions, history, theme
from .devices_panel import DevicesPanel
from .placement_editor import PlacementEditor
from .plots import LivePlots
from .routing_panel import RoutingPanel
from .run_panel import RunPanel
from .scrolling import Scrolling
from .state import WorkbenchState
from .timeline import Timeline
from .tune_panel import TunePanel

MAX_RECENT = 8
DOCK_MARGINS = 48  # a dock's frame, its panel's margins and a scroll bar's width beside what the panel shows
DOCK_TITLE = 28  # a dock's title bar
DOCK_SEPARATORS = 32  # what the separators between the docks of a column and the rows take, and a little room
BOTTOM_LEAST = 290  # the wide arrangement's bottom row at its least: the plots whole
PLOTS_LEAST = 300  # the live plots' least width in the wide arrangement: two plots side by side
DOCK_FRAME = 8  # a dock's frame beside its panel
EDITOR_ROOM = 500  # the placement editor's two device columns with their chips' names and sizes apart
# 2: the compact and wide arrangements, 3: the device timeline, 4: Tune beside the history (the routing panel the
# right column's whole height), 5: the timeline below the history and Tune (the plots the bottom row's whole height);
# an older layout is not restored
LAYOUT_VERSION = 5
# Windows narrower or lower than these, or than the wide arrangement's own minimum, show the side panels as tabs (the
# compact arrangement): the wide one fits 1280 x 720 (a 1366 x 768 screen less a task bar and a title bar too)
COMPACT_WIDTH = 1200
COMPACT_HEIGHT = 600
SWITCH_ROOM = 16  # pixels above the wide arrangement's minimum where a shrinking window turns compact
DEFAULT_SIZE = (1560, 980)  # the first launch's size, or the screen's available area less a margin
DEMO_SIZE = "default"  # the demo pair File > Open demo model pair opens (engine.checkpoints.demo.SIZES)
SYNTHETIC = "synthetic: random weights, its text is noise by design"


def demo_choices(family: str = DEFAULT_FAMILY) -> list[tuple[str, str | None, str, str]]:
    """File > Open demo model pair: (format, quant, menu text, tip) for the folder pair and each GGUF quantization;
    for another demo family (engine.checkpoints.demo.FAMILIES), its folder pair (the DeepSeek and gpt-oss pairs have
    no GGUF form; the gpt-oss folders hold MXFP4 experts, as released)."""
    if family != DEFAULT_FAMILY:
        target, draft = FAMILIES[family]
        weights = FOLDER_FORMATS.get(family)
        return [("safetensors", None, f"Folders (safetensors, {weights or 'bf16'})",
                 f"The built-in {target} demo pair (a {target} target, a {draft} draft) as safetensors folders, "
                 f"{weights or 'bf16'} weights ({SYNTHETIC})")]  # fmt: skip
    out = [("safetensors", None, "Folders (safetensors, bf16)",
            f"The built-in demo pair as safetensors folders, bf16 weights ({SYNTHETIC})")]  # fmt: skip
    for quant in QUANTS:
        formats = quant_formats(quant)
        default = ", the default" if quant == DEFAULT_QUANT else ""
        draft = f"; the draft a {draft_kind(DEFAULT_FAMILY, quant)}" if quant in MOE_DRAFTS else ""
        out.append(("gguf", quant, f"GGUF files, {formats} (quantized)",
                    f"The same demo pair as GGUF files quantized as llama.cpp does ({quant}{default}: {formats}"
                    f"{draft}; {SYNTHETIC})"))  # fmt: skip
    return out


def llama_cpp_note(exported: LlamaCppExport) -> str:
    """What the llama.cpp export dialog says above the arguments: where they go, and what they cannot say."""
    lines = ["Expert tensors placed as here, for llama-cli / llama-server on the same checkpoint as GGUF:"]
    lines += [f"Not expressible: {line}" for line in exported.not_expressible]
    lines += [f"Note: {line}" for line in exported.notes]
    return "\n".join(lines)


def engine_note(title: str, exported: EngineExport, saved: str | None) -> str:
    """What another engine's export dialog says above its arguments: the file written, the predicted balance, and
    what the engine cannot say of this placement."""
    lines = [f"For {title}" + (f"; its file is written to {saved}" if saved else "") + ":"]
    if exported.balance is not None:
        lines.append(f"Predicted GPU load, max / mean: {exported.balance['worst']:.3f} in the worst layer")
    lines += [f"Not expressible: {line}" for line in exported.not_expressible]
    lines += [f"Note: {line}" for line in exported.notes]
    return "\n".join(lines)


# File > Hold weights as: what each choice does (README's switch table says the same)
WEIGHTS_TIPS = {
    "auto": "copy where transparent huge pages are enabled and the files take at most half of the memory "
    "available, else map",
    "map": "memory-map the files: instant load, shared page cache, a model larger than memory still runs",
    "copy": "read the files into private memory on 2 MiB pages: the CPU streams weights faster, the load reads "
    "the files",
}


def version() -> str:
    try:
        return importlib.metadata.version("expertbench")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


README = Path(__file__).resolve().parent.parent / "README.md"  # present in a source tree, not in a wheel


def about_text() -> str:
    """Help > About: the version, what the tool is, and where its documentation is."""
    readme = (f'<a href="{README.as_uri()}">README.md</a> (the switches, the profile format, the commands)'
              if README.is_file() else "the README in expertbench's source")  # fmt: skip
    return (f"<h3>expertbench {html.escape(version())}</h3>"
            "<p>A tuning workbench for Mixture-of-Experts LLMs on mixed hardware: place experts on devices, run "
            "decodes with a draft model, compare speed and output hashes, save the placement as a profile.</p>"
            f"<p>Documentation: {readme}.<br>The commands: <code>expertbench --help</code>; the window's options: "
            "<code>expertbench gui --help</code>.</p>")  # fmt: skip


def add_copy_button(dialog: QInputDialog) -> QPushButton:
    """A Copy button beside OK and Cancel of a text dialog: its text to the clipboard, the dialog left open."""
    button = QPushButton(theme.icon("export"), "Copy")
    button.setObjectName("copy")
    button.setToolTip("Copy the text to the clipboard")
    button.setAutoDefault(False)

    def copy():
        QGuiApplication.clipboard().setText(dialog.textValue())
        button.setText("Copied")

    actions.connect(button.clicked, copy, "Copy", parent=dialog)
    dialog.findChild(QDialogButtonBox).addButton(button, QDialogButtonBox.ButtonRole.ActionRole)
    return button


def parse_rect(value) -> QRect | None:
    """'x,y,w,h' (as closeEvent saves the window's frame) to a QRect; None when absent or damaged."""
    try:
        x, y, w, h = (int(v) for v in str(value).split(","))
    except ValueError:
        return None
    return QRect(x, y, w, h) if w > 0 and h > 0 else None


def layout_fits(rect: QRect, screens: list[QRect], slack: int = 16) -> bool:
    """A saved window (its contents' rectangle) fits when one screen's available area is at least its size, give or
    take `slack` pixels of window frame, and shows part of it."""
    return any(rect.width() <= a.width() + slack and rect.height() <= a.height() + slack and a.intersects(rect)
               for a in screens)  # fmt: skip


def default_size(screens: list[QRect]) -> QSize:
    """The first launch's size, no larger than the first screen's available area less a margin."""
    width, height = DEFAULT_SIZE
    if screens:
        width, height = min(width, screens[0].width() * 95 // 100), min(height, screens[0].height() * 95 // 100)
    return QSize(width, height)


class MainWindow(QMainWindow):
    def __init__(self, state: WorkbenchState | None = None, settings: QSettings | None = None, parent=None):
        super().__init__(parent)
        self.state = state or WorkbenchState(self)
        self.settings = settings or QSettings("expertbench", "workbench")
        self.setWindowTitle("expertbench")
        self.setWindowIcon(theme.app_icon())
        self.setDockNestingEnabled(True)
        app = QApplication.instance()
        if app is not None:
            theme.wrap_tooltips(app)
        self.editor = PlacementEditor(self.state)
        self.setCentralWidget(self.editor)
        self.devices = DevicesPanel(self.state)
        self.devices.sigTableWidthChanged.connect(self._devices_widened)
        # (queued: the panel sizes its table to the new rows first)
        self.devices.model.modelReset.connect(self._fit_left_column, Qt.ConnectionType.QueuedConnection)
        self.run_panel = RunPanel(self.state)
        self.routing = RoutingPanel(self.state, prompts_source=lambda: self.run_panel.settings().prompts)
        self.plots = LivePlots(self.state)
        self.history = history.HistoryPanel(self.state)
        self.tune = TunePanel(self.state, settings_source=self.run_panel.settings)
        self.timeline = Timeline(self.state)
        self.docks: dict[str, QDockWidget] = {}
        # The run panel keeps its minimum size (Start, Stop and the progress never go under another panel); the
        # others scroll when the window leaves them less room than their contents want.
        self._dock("devices", "Devices", Scrolling(self.devices))
        self._dock("run", "Run", self.run_panel)
        self._dock("routing", "Routing and strategies", Scrolling(self.routing, sideways=False))
        self._dock("plots", "Live plots", Scrolling(self.plots, sideways=False))
        self._dock("history", "Run history", self.history)
        self._dock("tune", "Tune", Scrolling(self.tune, sideways=False))
        self._dock("timeline", "Device timeline", Scrolling(self.timeline))
        self.compact: bool | None = None  # which arrangement the docks are in (None: not arranged yet)
        self.left_tabs = False  # the wide arrangement's Devices and Run as tabs (a low window: wants_left_tabs)
        self._pending_size: QSize | None = None  # set_size's, until the window has it (default_sizes then)
        self.arrange(compact=False)
        self.wide_minimum = self.minimumSizeHint()  # the wide arrangement's, measured anew while it is shown
        self._build_actions()
        self._build_menus()
        self._build_toolbar()
        self._build_status()
        self._connect()
        self._restore_layout()
        self.state.trace_runs = self.docks["timeline"].toggleViewAction().isChecked()
        self._update_title()

    # ---- construction ------------------------------------------------------------------------------------

    def _dock(self, key: str, title: str, widget: QWidget) -> None:
        dock = QDockWidget(title, self)
        dock.setObjectName(f"dock-{key}")
        dock.setWidget(widget)
        dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable
                         | QDockWidget.DockWidgetFeature.DockWidgetFloatable
                         | QDockWidget.DockWidgetFeature.DockWidgetClosable)  # fmt: skip
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, dock)
        self.docks[key] = dock

    def _action(self, text: str, slot, shortcut=None, icon: str | None = None, tip: str = "") -> QAction:
        action = QAction(text, self)
        if icon:
            action.setIcon(theme.icon(icon))
        if shortcut is not None:
            action.setShortcut(shortcut)
        if tip:
            action.setStatusTip(tip)
            action.setToolTip(tip)
        actions.connect(action.triggered, slot, text, parent=self)
        return action

    def _build_actions(self) -> None:
        S, a = QKeySequence.StandardKey, self._action
        self.act_open_model = a("Open model folder…", self.open_model, S.Open, "open", "Open a model folder")
        self.act_open_gguf = a("Open GGUF file…", self.open_model_file, None, None,
                               "Open a model in llama.cpp's GGUF format (any part of a split one)")  # fmt: skip
        self.act_open_draft = a("Open draft folder…", self.open_draft, None, None, "Open a draft model folder")
        self.act_open_draft_gguf = a("Open draft GGUF file…", self.open_draft_file, None, None,
                                     "Open a draft model in GGUF format")  # fmt: skip
        self.act_self_draft = a("Draft with the model's own MTP layer", self.use_self_draft, None, None,
                                "The target checkpoint's multi-token-prediction layer as the draft (DeepSeek-V3's "
                                "released folders hold one)")  # fmt: skip
        self.act_open_demos = {}  # (format, quant) -> the action that opens that demo pair
        for fmt, quant, text, tip in demo_choices():
            self.act_open_demos[fmt, quant] = a(text, lambda f=fmt, q=quant: self.open_demo(f, q), None, None,
                                                tip)  # fmt: skip
        self.act_open_demo = self.act_open_demos["safetensors", None]
        self.act_open_family_demos = {}  # family -> (format, quant) -> its action, for the other demo families
        for family in FAMILIES:
            if family == DEFAULT_FAMILY:
                continue
            self.act_open_family_demos[family] = {
                (fmt, quant): a(text, lambda f=fmt, q=quant, fam=family: self.open_demo(f, q, fam), None, None,
                                tip)
                for fmt, quant, text, tip in demo_choices(family)
            }  # fmt: skip
        self.act_open_profile = a("Open profile…", self.open_profile, "Ctrl+Shift+O", "open",
                                  "Open a profile: its placement, run settings and routing")  # fmt: skip
        replays = "Save the placement and run settings as a profile (expertbench regress replays it)"
        self.act_save = a("Save profile", self.save, S.Save, "save", replays)
        self.act_save_as = a("Save profile as…", self.save_as, S.SaveAs)
        self.act_export_llama = a("llama.cpp arguments…", self.export_llama, None, "export")
        self.act_export_engines = {
            fmt: a(f"{title} arguments…", lambda f=fmt: self.export_engine(f), None, None,
                   f"The placement and routing statistics in {title}'s terms: its arguments, and its file where it "
                   "reads one")
            for fmt, (title, _) in ENGINE_EXPORTS.items()
        }  # fmt: skip
        self.act_export_hotness = a("Hotness CSV…", self.export_hotness)
        self.act_export_plots = a("Plots as PNG…", self.export_plots)
        self.act_export_history = a("Run history as CSV…", self.export_history)
        self.act_export_trace = a("Trace for Perfetto…", self.export_trace, None, None,
                                  "The last run's per-token trace as Chrome trace event JSON (Perfetto, "
                                  "chrome://tracing)")  # fmt: skip
        self.act_quit = a("Quit", self.close, S.Quit)
        self.act_undo = a("Undo", self.editor.undo, S.Undo, "undo")
        self.act_redo = a("Redo", self.editor.redo, S.Redo, "redo")
        self.act_start = a("Start run", self.run_panel.start, "Ctrl+R", "start", "Start a decode run")
        self.act_stop = a("Stop run", self.state.stop_run, "Ctrl+.", "stop", "Stop at the next step")
        self.act_tune = a("Tune placements…", self.show_tune, None, None,
                          "Measure placements and draft lengths: the Pareto front of tokens/s against fast-device "
                          "bytes")  # fmt: skip
        self.act_clear_history = a("Clear run history", self.state.clear_history, None, "clear")
        self.act_reset_layout = a("Reset layout", self.reset_layout)
        self.act_about = a("About expertbench", self.about)
        self.act_stop.setEnabled(False)

    def _build_menus(self) -> None:
        m = self.menuBar().addMenu("&File")
        for act in (self.act_open_model, self.act_open_gguf, self.act_open_draft, self.act_open_draft_gguf,
                    self.act_self_draft):  # fmt: skip
            m.addAction(act)
        self.demo_menu = m.addMenu("Open demo model pair (synthetic)")
        self.demo_menu.setToolTipsVisible(True)
        for act in self.act_open_demos.values():
            self.demo_menu.addAction(act)
        self.family_demo_menus = {}  # the other demo families' pairs, each a menu below the default one's
        for family, family_actions in self.act_open_family_demos.items():
            menu = m.addMenu(f"Open {FAMILIES[family][0]} demo model pair (synthetic)")
            menu.setToolTipsVisible(True)
            for act in family_actions.values():
                menu.addAction(act)
            self.family_demo_menus[family] = menu
        self.weights_menu = m.addMenu("Hold weights as")
        self.weights_menu.setToolTipsVisible(True)
        group = QActionGroup(self)
        saved = str(self.settings.value("weights", "auto"))
        self.state.set_weights(saved if saved in WEIGHTS_MODES else "auto")
        self.act_weights = {}
        for mode, tip in WEIGHTS_TIPS.items():
            act = self.weights_menu.addAction(mode)
            act.setCheckable(True)
            act.setChecked(mode == self.state.weights)
            act.setToolTip(tip)
            actions.connect(act.triggered, lambda mode=mode: self.set_weights(mode), f"Hold weights as {mode}",
                            parent=self)  # fmt: skip
            group.addAction(act)
            self.act_weights[mode] = act
        m.addSeparator()
        m.addAction(self.act_open_profile)
        self.recent_menu = m.addMenu("Open recent")
        m.addAction(self.act_save)
        m.addAction(self.act_save_as)
        m.addSeparator()
        export = m.addMenu(theme.icon("export"), "Export")
        for act in (self.act_export_llama, *self.act_export_engines.values(), self.act_export_hotness,
                    self.act_export_plots, self.act_export_history, self.act_export_trace):  # fmt: skip
            export.addAction(act)
        m.addSeparator()
        m.addAction(self.act_quit)
        e = self.menuBar().addMenu("&Edit")
        e.addAction(self.act_undo)
        e.addAction(self.act_redo)
        r = self.menuBar().addMenu("&Run")
        r.addAction(self.act_start)
        r.addAction(self.act_stop)
        r.addAction(self.act_tune)
        r.addSeparator()
        r.addAction(self.act_clear_history)
        v = self.menuBar().addMenu("&View")
        for dock in self.docks.values():
            v.addAction(dock.toggleViewAction())
        v.addSeparator()
        v.addAction(self.act_reset_layout)
        h = self.menuBar().addMenu("&Help")
        h.addAction(self.act_about)
        self._fill_recent()

    def _build_toolbar(self) -> None:
        tb = self.addToolBar("Main")
        tb.setObjectName("toolbar-main")
        tb.setMovable(False)
        tb.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        for act in (self.act_open_model, self.act_open_profile, self.act_save, None, self.act_start,
                    self.act_stop):  # fmt: skip
            if act is None:
                tb.addSeparator()
            else:
                tb.addAction(act)

    def _build_status(self) -> None:
        bar = self.statusBar()
        self.busy_label = QLabel()
        self.busy_label.setObjectName("muted")
        self.busy_bar = QProgressBar()
        self.busy_bar.setRange(0, 0)
        self.busy_bar.setFixedSize(80, 10)
        self.busy_bar.setTextVisible(False)
        self.busy_bar.hide()
        bar.addPermanentWidget(self.busy_label)
        bar.addPermanentWidget(self.busy_bar)

    def _connect(self) -> None:
        s = self.state
        s.sigError.connect(self.show_error)
        s.sigModelChanged.connect(self._model_loaded)
        s.sigMessage.connect(lambda text: self.statusBar().showMessage(text, 8000))
        s.sigBusyChanged.connect(self._busy)
        s.sigUndoChanged.connect(self._update_undo)
        s.sigDirtyChanged.connect(lambda _dirty: self._update_title())
        s.sigPathChanged.connect(self._update_title)
        s.sigModelChanged.connect(self._update_title)
        s.sigModelChanged.connect(self._update_actions)
        s.sigRoutingChanged.connect(self._update_actions)
        s.sigRunStarted.connect(self._update_actions)
        s.sigRunFinished.connect(lambda _r: self._update_actions())
        s.sigHistoryChanged.connect(self._update_actions)
        # Runs record the trace while the timeline is open (it costs a decode about half a percent:
        # bench/trace_cost.py)
        traced = self.docks["timeline"].toggleViewAction()
        traced.toggled.connect(lambda on: setattr(s, "trace_runs", on))
        self._update_undo()
        self._update_actions()
        hints = QGuiApplication.styleHints()
        hints.colorSchemeChanged.connect(self._scheme_changed)

    # ---- reactions ---------------------------------------------------------------------------------------

    @Slot()
    def show_tune(self) -> None:
        dock = self.docks["tune"]
        dock.show()
        dock.raise_()

    @Slot()
    def about(self) -> None:
        QMessageBox.about(self, "About expertbench", about_text())

    @Slot(str, str)
    def show_error(self, title: str, text: str) -> None:
        QMessageBox.critical(self, title, text)

    @Slot(str)
    def _busy(self, label: str) -> None:
        self.busy_label.setText(label + "…" if label else "")
        self.busy_bar.setVisible(bool(label))

    @Slot()
    def _update_undo(self) -> None:
        s = self.state
        self.act_undo.setEnabled(bool(s.undo_text))
        self.act_redo.setEnabled(bool(s.redo_text))
        self.act_undo.setText(f"Undo {s.undo_text}" if s.undo_text else "Undo")
        self.act_redo.setText(f"Redo {s.redo_text}" if s.redo_text else "Redo")

    @Slot()
    def _update_actions(self) -> None:
        s = self.state
        has = s.model is not None
        for act in (self.act_save, self.act_save_as, self.act_open_profile, self.act_export_llama,
                    *self.act_export_engines.values(), self.act_open_draft, self.act_open_draft_gguf):  # fmt: skip
            act.setEnabled(has)
        self.act_self_draft.setEnabled(has and s.model.has_next_token_module and s.model.draft_path != SELF_DRAFT)
        self.act_export_hotness.setEnabled(has and s.routing is not None)
        self.act_export_history.setEnabled(bool(s.history))
        self.act_start.setEnabled(has and not s.running)
        self.act_stop.setEnabled(s.running)

    @Slot()
    def _update_title(self) -> None:
        s = self.state
        parts = ["expertbench"]
        if s.model is not None:
            # the family first: two demos' targets are both 'target' (its format and quantization in the brackets)
            name = f"{model_family(s.model.config.architecture).title}: {Path(s.model.target_path).name}"
            if s.model.demo_quant is not None:
                parts.append(f"{name} (synthetic demo, {quant_formats(s.model.demo_quant)})")
            else:
                parts.append(f"{name} (synthetic demo)" if s.model.synthetic else name)
        if s.profile_path is not None:
            parts.append(s.profile_path.name)
        self.setWindowTitle(" — ".join(parts) + (" *" if s.dirty else ""))

    def _scheme_changed(self, *_args) -> None:
        app = QApplication.instance()
        if app is not None:
            theme.apply_theme(app)
            self.update()

    # ---- file actions ------------------------------------------------------------------------------------

    def _directory(self) -> str:
        return str(self.settings.value("last_directory", str(Path.home())))

    def _remember_directory(self, path: str) -> None:
        self.settings.setValue("last_directory", str(Path(path).parent if Path(path).is_file() else path))

    @Slot()
    def open_model(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open a model folder", self._directory())
        if folder:
            self._remember_directory(folder)
            if self.confirm_discard():
                self._load_recent_on_success(folder)

    @Slot()
    def open_draft(self) -> None:
        if self.state.model is None:
            return
        folder = QFileDialog.getExistingDirectory(self, "Open a draft model folder", self._directory())
        if folder:
            self._remember_directory(folder)
            if self.confirm_discard():
                self.state.load_models(self.state.model.target_path, folder)

    @Slot()
    def use_self_draft(self) -> None:
        if self.state.model is None or not self.state.model.has_next_token_module:
            return
        if self.confirm_discard():
            self.state.load_models(self.state.model.target_path, SELF_DRAFT)

    def _gguf_file(self, title: str) -> str:
        path, _ = QFileDialog.getOpenFileName(self, title, self._directory(), "GGUF model (*.gguf);;All files (*)")
        if path:
            self._remember_directory(path)
        return path

    @Slot()
    def open_model_file(self) -> None:
        path = self._gguf_file("Open a GGUF model file")
        if path and self.confirm_discard():
            self._load_recent_on_success(path)

    @Slot()
    def open_draft_file(self) -> None:
        if self.state.model is None:
            return
        path = self._gguf_file("Open a GGUF draft model file")
        if path and self.confirm_discard():
            self.state.load_models(self.state.model.target_path, path)

    def set_weights(self, mode: str) -> None:
        """How the next model opened is held; kept in the settings."""
        self.state.set_weights(mode)
        self.settings.setValue("weights", mode)
        self.act_weights[mode].setChecked(True)

    def open_demo(self, format: str = "safetensors", quant: str | None = None, family: str = DEFAULT_FAMILY) -> None:
        """The built-in synthetic demo pair: safetensors folders (bf16) or GGUF files (quant:
        engine.checkpoints.demo.QUANTS), of the Qwen3-MoE family or another (engine.checkpoints.demo.FAMILIES: named to
        the state as 'family/size')."""
        if self.confirm_discard():
            self.state.load_models(None, demo=demo_name(DEMO_SIZE, family), demo_format=format, demo_quant=quant)

    @Slot()
    def open_profile(self, path: str | None = None) -> None:
        if not path:
            path, _ = QFileDialog.getOpenFileName(self, "Open a profile", self._directory(),
                                                  "Profile (*.yaml *.yml);;All files (*)")  # fmt: skip
        if path:
            self._remember_directory(path)
            profile = self.state.open_profile(path)
            if profile is not None:
                self._add_recent("profile", path)
                self.run_panel.apply_profile(profile)

    @Slot()
    def save(self) -> bool:
        if self.state.profile_path is None:
            return self.save_as()
        return self.state.save_profile(self.state.profile_path, self.run_panel.settings())

    @Slot()
    def save_as(self) -> bool:
        if self.state.model is None:
            return False
        start = str(Path(self._directory()) / "profile.yaml")
        path, _ = QFileDialog.getSaveFileName(self, "Save the profile", start, "Profile (*.yaml *.yml)")
        if not path:
            return False
        if not path.endswith((".yaml", ".yml")):
            path += ".yaml"
        self._remember_directory(path)
        ok = self.state.save_profile(path, self.run_panel.settings())
        if ok:
            self._add_recent("profile", path)
        return ok

    def _save_path(self, title: str, name: str, filt: str) -> str:
        path, _ = QFileDialog.getSaveFileName(self, title, str(Path(self._directory()) / name), filt)
        if path:
            self._remember_directory(path)
        return path

    @Slot()
    def export_llama(self) -> None:
        if self.state.placement is None or self.state.model is None:
            return
        try:
            exported = to_llama_cpp(self.state.placement, self.state.model.primary)
        except EngineError as exc:
            QMessageBox.warning(self, "Cannot export to llama.cpp", str(exc))
            return
        QTimer.singleShot(0, self._offer_copy)  # once the modal dialog below shows: its Copy button
        QInputDialog.getMultiLineText(self, "llama.cpp arguments", llama_cpp_note(exported), exported.command_line())

    @Slot()
    def export_engine(self, fmt: str) -> None:
        """The placement (and routing statistics) for another engine (engine.export.engines.ENGINE_EXPORTS): its file
        saved where the user says when it reads one (SGLang's expert location, lucebox's placement), then its arguments
        with that path in place of FILE.json, and what it cannot say, in a dialog with a Copy button."""
        s = self.state
        if s.placement is None or s.model is None:
            return
        title = ENGINE_EXPORTS[fmt][0]
        try:
            exported = export_to(fmt, s.placement, s.model.config, s.routing_stats)
        except EngineError as exc:
            QMessageBox.warning(self, f"Cannot export to {title}", str(exc))
            return
        saved = None
        if exported.document is not None:
            saved = self._save_path(f"{title}'s file", f"{fmt}-placement.json", "JSON (*.json)")
            if not saved:
                return
            try:
                atomic_write(saved, json.dumps(exported.document) + "\n")
            except (OSError, EngineError) as exc:
                text = f"'{saved}': {exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)
                QMessageBox.warning(self, f"Cannot export to {title}", text)
                return
        args = [saved if saved and a == "FILE.json" else a for a in exported.args]
        QTimer.singleShot(0, self._offer_copy)
        # an engine that takes no arguments (lucebox) reads the file: its path is what to copy
        QInputDialog.getMultiLineText(self, f"{title} arguments", engine_note(title, exported, saved),
                                      shlex.join(args) if args else saved or "")  # fmt: skip

    def _offer_copy(self) -> None:
        for dialog in self.findChildren(QInputDialog):
            if dialog.isVisible() and dialog.findChild(QPushButton, "copy") is None:
                add_copy_button(dialog)

    @Slot()
    def export_hotness(self) -> None:
        if self.state.routing is None:
            return
        path = self._save_path("Export expert hotness", "hotness.csv", "CSV (*.csv)")
        if path:
            try:
                self.state.routing_stats.write_hotness_csv(path)
            except OSError as exc:
                QMessageBox.warning(self, "Cannot export the hotness table", f"'{path}': {exc.strerror or exc}")

    @Slot()
    def export_plots(self) -> None:
        path = self._save_path("Export plots", "plots.png", "PNG image (*.png)")
        if path and not self.plots.export_png(path):
            QMessageBox.warning(self, "Cannot export the plots", f"'{path}' could not be written")

    @Slot()
    def export_history(self) -> None:
        path = self._save_path("Export the run history", "runs.csv", "CSV (*.csv)")
        if path:
            try:
                history.write_csv(path, self.state.history)
            except ArgumentError as exc:  # atomic_write's: it names the file and why, and leaves the old one
                QMessageBox.warning(self, "Cannot export the history", str(exc))

    @Slot()
    def export_trace(self, path: str | None = None) -> None:
        """The last run's trace as Chrome trace event JSON; says so when that run was not traced."""
        trace = self.state.last_trace
        if trace is None:
            last = self.state.history[-1].index if self.state.history else None
            why = "No run yet" if last is None else f"Run {last} was not traced"
            QMessageBox.information(self, "No traced run", f"{why}: runs are traced while the device timeline is "
                                    "open (View > Device timeline). Open it and start a run.")  # fmt: skip
            return
        path = path or self._save_path("Export the trace", f"run{trace.run}.trace.json", "Chrome trace (*.json)")
        if not path:
            return
        try:
            trace.write(path)
        except ArgumentError as exc:
            QMessageBox.warning(self, "Cannot export the trace", str(exc))
            return
        lost = f", {trace.lost} lost" if trace.lost else ""
        if trace.dropped:
            lost += f"; the run's first {trace.dropped} not kept"
        self.statusBar().showMessage(f"Run {trace.run}'s trace ({len(trace.spans)} spans{lost}) written to {path}: "
                                     "open it in Perfetto", 8000)  # fmt: skip

    # ---- recent files ------------------------------------------------------------------------------------

    def _recent(self) -> list[list[str]]:
        value = self.settings.value("recent", []) or []
        return [item.split("\t", 1) for item in value if isinstance(item, str) and "\t" in item]

    def _add_recent(self, kind: str, path: str) -> None:
        items = [f"{k}\t{p}" for k, p in self._recent() if p != str(path)]
        self.settings.setValue("recent", [f"{kind}\t{path}", *items][:MAX_RECENT])
        self._fill_recent()

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        recent = self._recent()
        for kind, path in recent:
            act = self.recent_menu.addAction(f"{Path(path).name}  ({kind}: {path})")
            actions.connect(act.triggered, lambda k=kind, p=path: self._open_recent(k, p), f"Opening {path}",
                            parent=self)  # fmt: skip
        self.recent_menu.setEnabled(bool(recent))

    def _load_recent_on_success(self, path: str) -> None:
        """Load a model; it joins Open recent once it has loaded (a folder that failed to load is not listed)."""
        self._pending_recent = str(path)
        self.state.load_models(path, None)

    def _model_loaded(self) -> None:
        model, pending = self.state.model, getattr(self, "_pending_recent", None)
        if pending is not None and model is not None and model.target_path == pending:
            self._add_recent("model", pending)
        self._pending_recent = None

    def _open_recent(self, kind: str, path: str) -> None:
        if kind == "model":
            if self.confirm_discard():
                self._load_recent_on_success(path)
        else:
            self.open_profile(path)

    # ---- layout and closing ------------------------------------------------------------------------------

    def _screens(self) -> list[QRect]:
        return [screen.availableGeometry() for screen in QGuiApplication.screens()]

    def _restore_layout(self) -> None:
        """The last session's size, position and dock arrangement, when they fit a screen of this session; else the
        default arrangement for a default size that fits. Which panels the user closed is kept either way."""
        geometry = self.settings.value("geometry")
        layout = self.settings.value("window_state")
        rect = parse_rect(self.settings.value("window_rect"))
        restored = (geometry is not None and layout is not None and rect is not None
                    and layout_fits(rect, self._screens()) and self.restoreGeometry(geometry)
                    and self.restoreState(layout, LAYOUT_VERSION))  # fmt: skip
        if restored:
            self.compact = str(self.settings.value("compact", "false")).lower() == "true"
        else:
            self.set_size(default_size(self._screens()))
        hidden = str(self.settings.value("hidden_docks", "") or "").split(",")
        for key in hidden:
            if key in self.docks:
                self.docks[key].hide()

    def arrange(self, compact: bool, size: QSize | None = None) -> None:
        """Put the docks in the compact arrangement (narrow windows: the run panel down the left, the other panels
        as tabs below the editor) or the wide one (every panel at once: devices and run on the left, routing down
        the right, plots and history below; in a window of `size` too low for both devices and run whole, those two
        as tabs, run in front); closed panels stay closed."""
        d, area = self.docks, Qt.DockWidgetArea
        left_tabs = not compact and self.wants_left_tabs(self.size() if size is None else size)
        hidden = {key for key, dock in d.items() if dock.isHidden() and self.compact is not None}
        for dock in d.values():
            dock.setFloating(False)
        self.setCorner(Qt.Corner.BottomLeftCorner, area.LeftDockWidgetArea if compact else area.BottomDockWidgetArea)
        self.setCorner(Qt.Corner.BottomRightCorner, area.RightDockWidgetArea)
        if compact:
            self.addDockWidget(area.LeftDockWidgetArea, d["run"])
            for key in ("plots", "timeline", "history", "routing", "devices", "tune"):
                self.removeDockWidget(d[key])  # out of the wide arrangement's nested splits first
                self.addDockWidget(area.BottomDockWidgetArea, d[key])
            for key in ("timeline", "history", "routing", "devices", "tune"):
                self.tabifyDockWidget(d["plots"], d[key])
        else:
            if self.left_tabs:
                for key in ("devices", "run"):
                    self.removeDockWidget(d[key])  # out of their tabs
            self.addDockWidget(area.LeftDockWidgetArea, d["devices"])
            self.addDockWidget(area.LeftDockWidgetArea, d["run"])
            if left_tabs:
                self.tabifyDockWidget(d["run"], d["devices"])  # Run the first tab
            else:
                self.splitDockWidget(d["devices"], d["run"], Qt.Orientation.Vertical)
            self.addDockWidget(area.RightDockWidgetArea, d["routing"])
            # below: the plots, then the history and Tune side by side over the timeline (the plots their row's
            # whole height, so that a 768-pixel screen leaves them room)
            self.addDockWidget(area.BottomDockWidgetArea, d["plots"])
            self.splitDockWidget(d["plots"], d["history"], Qt.Orientation.Horizontal)
            self.splitDockWidget(d["history"], d["timeline"], Qt.Orientation.Vertical)
            self.splitDockWidget(d["history"], d["tune"], Qt.Orientation.Horizontal)
        for key, dock in d.items():
            dock.setVisible(key not in hidden)
        if compact:
            d["plots"].raise_()
        if left_tabs:  # the run settings in front (again once shown: a window shown later brings up the first tab)
            d["run"].raise_()
            QTimer.singleShot(0, lambda: self.left_tabs and d["run"].raise_())
        self.compact, self.left_tabs = compact, left_tabs
        self.default_sizes()
        QTimer.singleShot(0, self.default_sizes)  # again once the layout has the docks where they now are

    def wants_compact(self, size: QSize) -> bool:
        """The compact arrangement for a window of this size: narrower or lower than COMPACT_WIDTH x COMPACT_HEIGHT,
        or than the wide arrangement's minimum (its panels' minimum sizes, which the fonts and devices change) with a
        little room: a wide window cannot be made smaller than its minimum, so the switch comes just above it."""
        wide = self.wide_minimum
        return (size.width() < max(COMPACT_WIDTH, wide.width() + SWITCH_ROOM)
                or size.height() < max(COMPACT_HEIGHT, wide.height() + SWITCH_ROOM))  # fmt: skip

    def wants_left_tabs(self, size: QSize) -> bool:
        """Whether a wide window of this size is too low for the devices (every row) above the run panel (every
        setting, the prompts at their least height) over the bottom row at its least: then they are tabs of the left
        column."""
        return size.height() - self._bars() - BOTTOM_LEAST < self._left_need()

    def _left_need(self) -> int:
        """The height the left column needs for the devices' rows above every run setting (and their title bars)."""
        run = self.run_panel
        settings = run.settings_area.widget()
        run_whole = (run.minimumSizeHint().height() - run.settings_area.minimumSizeHint().height()
                     + settings.minimumSizeHint().height())  # fmt: skip
        return self.devices.sizeHint().height() + run_whole + 2 * DOCK_TITLE + DOCK_SEPARATORS

    def _bars(self) -> int:
        return sum(bar.height() for bar in (self.menuBar(), self.statusBar(), *self.findChildren(QToolBar)))

    def _bottom_height(self) -> int:
        """The wide arrangement's bottom row (plots, history, Tune, timeline): less than half the height the docks
        share (the run settings and the editor keep their room), less again where the devices and the run settings
        above it want the room, but what the plots need (BOTTOM_LEAST): whole from a 768-pixel screen on."""
        docks = self.height() - self._bars()
        share = min(470, max(BOTTOM_LEAST, docks * 45 // 100))
        return share if self.left_tabs else max(BOTTOM_LEAST, min(share, docks - self._left_need()))

    @Slot()
    def _fit_left_column(self) -> None:
        """The devices' rows changed (another model, a runtime more or less): the left column as tabs or one above the
        other, whichever the window's height has room for, at their default sizes."""
        if self.compact is False:
            if self.wants_left_tabs(self.size()) != self.left_tabs:
                self.arrange(False)
            else:
                self.default_sizes()

    def set_size(self, size: QSize) -> None:
        """Resize the window to `size` (`--size WxH`, a first launch's size), in the arrangement for that size first:
        the other one's minimum would keep it larger; the docks take their default sizes for it once the window has
        it (a window manager may give it later)."""
        self.arrange(self.wants_compact(size), size)
        self._pending_size = None if self.size() == size else size
        self.resize(size)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if self.compact is False:
            self.wide_minimum = self.minimumSizeHint()
        compact = self.wants_compact(event.size())
        if compact != self.compact or (not compact and self.wants_left_tabs(event.size()) != self.left_tabs):
            self.arrange(compact, event.size())
        elif event.size() == self._pending_size:
            QTimer.singleShot(0, self.default_sizes)  # arranged for this size while the window had another
        if event.size() == self._pending_size:
            self._pending_size = None

    def default_sizes(self) -> None:
        docks, H, V = self.docks, Qt.Orientation.Horizontal, Qt.Orientation.Vertical
        if self.compact:
            self.resizeDocks([docks["run"]], [280], H)
            self.resizeDocks([docks["plots"]], [320], V)
            return
        # The editor the room the side columns leave; the bottom row less than half the height the docks share (the
        # run settings and the editor keep their room), but what the plots need. The devices' column their table's
        # width where the window has room (_devices_width), and their rows' height (the table is as tall as they are);
        # the run settings whole below where there is room
        routing = 360 if self.width() >= 1366 else 340  # a narrower window: the run history's columns the room
        self.resizeDocks([docks["devices"], docks["routing"]], [self._devices_width(), routing], H)
        if not self.left_tabs:  # the devices their rows' height, the run settings the rest of the column
            devices = self.devices.sizeHint().height() + DOCK_TITLE
            column = self.height() - self._bars() - self._bottom_height()
            self.resizeDocks([docks["devices"], docks["run"]], [max(150, devices), max(150, column - devices)], V)
        bottom = self._bottom_height()
        timeline = max(140, bottom * 170 // 470)  # its lanes and axis whole, however low the window
        self.resizeDocks([docks["history"], docks["timeline"]], [bottom - timeline, timeline], V)
        # the Tune panel its controls' width (about 340 px); the history what a wide window has beyond them (its
        # placements are elided first)
        plots = 480 if self.width() < 1800 else 600  # a wide window: room for more runs' hashes
        row = self.width() - docks["routing"].width() - 24
        judging = self.history.judging_width() + DOCK_FRAME  # a run's speed, acceptance and hash whole
        history = max(320, judging, row - plots - 380)
        tune = 380
        if plots + history + tune > row:  # a narrow window: Tune its least width, the plots what is left
            tune = max(self.docks["tune"].minimumSizeHint().width(), min(tune, row - history - PLOTS_LEAST))
            plots = max(PLOTS_LEAST, row - history - tune)
        self.resizeDocks([docks["plots"], docks["history"], docks["tune"]], [plots, history, tune], H)

    def _devices_width(self) -> int:
        """The devices' column: their table whole where the window has room for it (a third of it, or up to 40 % where
        the editor keeps EDITOR_ROOM beside the routing column), and 28 % of a wide window (the run settings below
        it)."""
        width = self.width()
        room = max(width // 3, min(width * 40 // 100, width - 360 - EDITOR_ROOM))
        return min(max(self.devices.table_width() + DOCK_MARGINS, min(560, width * 28 // 100)), room)

    @Slot(int)
    def _devices_widened(self, _width: int) -> None:
        """The devices' table grew (a device's figures are longer now): its column widened to show it whole, in the
        wide arrangement, as far as _devices_width allows."""
        dock = self.docks["devices"]
        if self.compact is False and dock.isVisible() and dock.width() < self._devices_width():
            self.resizeDocks([dock], [self._devices_width()], Qt.Orientation.Horizontal)

    def reset_layout(self) -> None:
        for dock in self.docks.values():
            dock.show()
        self.arrange(self.wants_compact(self.size()))

    def confirm_discard(self) -> bool:
        """True when there are no unsaved placement changes, or the user saved or discarded them."""
        if not self.state.dirty:
            return True
        answer = QMessageBox.warning(
            self,
            "Unsaved placement",
            "The placement has changes that are not saved. Save them first?",
            QMessageBox.StandardButton.Save | QMessageBox.StandardButton.Discard | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Save,
        )
        if answer == QMessageBox.StandardButton.Save:
            return self.save()
        return answer == QMessageBox.StandardButton.Discard

    def closeEvent(self, event: QCloseEvent) -> None:
        if not self.confirm_discard():
            event.ignore()
            return
        self.settings.setValue("geometry", self.saveGeometry())
        self.settings.setValue("window_state", self.saveState(LAYOUT_VERSION))
        rect = self.normalGeometry() if self.isMaximized() or self.isFullScreen() else self.geometry()
        self.settings.setValue("window_rect", f"{rect.x()},{rect.y()},{rect.width()},{rect.height()}")
        self.settings.setValue("compact", "true" if self.compact else "false")
        closed = [key for key, dock in self.docks.items() if not dock.toggleViewAction().isChecked()]
        self.settings.setValue("hidden_docks", ",".join(closed))
        self.settings.sync()
        self.state.shutdown()
        event.accept()
