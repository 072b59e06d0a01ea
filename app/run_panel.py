"""The run panel: target and draft, q, reduction mode, KV cache, precision, tokens, repeats, prompts; Start and
Stop."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QTimer, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.checkpoints.demo import DEMO_PROMPTS, quant_formats
from engine.core.errors import ArgumentError
from engine.families import family
from engine.profiles.profile import DEFAULT_REPEATS, Profile
from engine.runs.run import KV_CACHES, PRECISIONS, REDUCTION_MODES
from engine.runs.speculative import MAX_DRAFT_TOKENS
from engine.runs.workload import read_prompt_file
from engine.session import SELF_DRAFT

from . import actions, theme
from .scrolling import FitsItsHeight, Scrolling
from .state import RunSettings, WorkbenchState

MODE_TEXT = {"reference": "reference (identical outputs)", "owner_local": "owner-local (faster sums)"}
SETTINGS_MIN_HEIGHT = 72  # the run settings' least height before they scroll: two or three rows
PRECISION_TEXT = {"f32": "f32 (the reference)", "q8": "q8 (not the reference)"}
PRECISION_TIP = (
    "How activations meet quantized weights (GGUF Q8_0, Q4_K, Q5_K, Q6_K, MXFP4).\n"
    "f32: exactly dequantized weights, f32 sums: the reference, identical on any placement.\n"
    "q8: activations quantized to int8 per block, integer products, as llama.cpp's CPU kernels: faster and "
    "deterministic, but not the reference: other logits, so its outputs may differ (its runs are compared "
    "with q8 runs only).\n"
    "Float weights are read in f32 either way."
)
KV_TIP = (
    "The KV cache's format.\n"
    "f32: the reference.\n"
    "f16, bf16: half the cache's bytes, each key and value rounded when stored: not the reference, its outputs may "
    "differ (its runs are compared with runs of the same cache; its quality cost is measured). DeepSeek-V3 and V4 "
    "and GPU primaries keep f32."
)


def _name(folder: str) -> str:
    """A model folder (or GGUF file) as a person calls it (the demo pair's are called target/ and draft/, or
    target.gguf and draft.gguf: their cache folder names the pair)."""
    path = Path(folder)
    demo = path.name in ("target", "draft", "target.gguf", "draft.gguf")
    return f"{path.parent.name}/{path.name}" if demo else path.name


class _Settings(FitsItsHeight, QWidget):
    """The run settings, in their scroll area: the height the panel has, no more than their wrapped text needs."""


class RunPanel(QWidget):
    def __init__(self, state: WorkbenchState, parent=None):
        super().__init__(parent)
        self.state = state
        outer = QVBoxLayout(self)
        outer.setContentsMargins(10, 4, 10, 8)
        outer.setSpacing(6)
        # The settings scroll where the panel is short (a 768-pixel screen); Start, Stop and the progress below them
        # stay in view whatever its height.
        settings = _Settings()
        inner = QVBoxLayout(settings)
        inner.setContentsMargins(0, 0, 0, 0)
        inner.setSpacing(6)
        form = QFormLayout()
        form.setHorizontalSpacing(10)
        form.setVerticalSpacing(4)
        self.target_label = QLabel("-")
        self.target_label.setWordWrap(True)
        self.draft_check = QCheckBox("-")
        self.draft_check.setChecked(True)
        self.draft_check.setToolTip("Speculative decoding with this draft; unchecked: target-only greedy decoding")
        form.addRow("Target", self.target_label)
        form.addRow("Draft", self.draft_check)
        self.q = QSpinBox()
        self.q.setRange(1, MAX_DRAFT_TOKENS)
        self.q.setValue(2)
        self.q.setToolTip("Draft tokens proposed per step, verified by the target in one pass")
        self.mode = QComboBox()
        for mode in REDUCTION_MODES:
            self.mode.addItem(MODE_TEXT.get(mode, mode), mode)
        self.precision = QComboBox()
        for precision in PRECISIONS:
            self.precision.addItem(PRECISION_TEXT.get(precision, precision), precision)
        self.precision.setToolTip(PRECISION_TIP)
        self.kv = QComboBox()
        for kv in KV_CACHES:
            self.kv.addItem(kv, kv)
        self.kv.setToolTip(KV_TIP)
        for combo in (self.mode, self.precision):  # they may show less than their longest text in a narrow panel
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(10)
        self.tokens = QSpinBox()
        self.tokens.setRange(1, 4096)
        self.tokens.setValue(64)
        self.tokens.setSuffix(" per prompt")
        self.repeats = QSpinBox()
        self.repeats.setRange(1, 1000)
        self.repeats.setValue(DEFAULT_REPEATS)
        self.repeats.setSuffix(" ×")
        self.repeats.setToolTip("Passes over the prompts: the history and the plots show the median tokens/s, with "
                                "the slowest and the fastest pass")  # fmt: skip
        # One setting a row, but q and Repeats (two short numbers) side by side: the panel stays narrow enough for the
        # compact arrangement's left column, and low enough for a 768-pixel screen's.
        counts = QHBoxLayout()
        counts.setSpacing(10)
        counts.addWidget(self.q, 1)
        repeats_label = QLabel("Repeats")
        repeats_label.setBuddy(self.repeats)
        counts.addWidget(repeats_label)
        counts.addWidget(self.repeats, 1)
        form.addRow("q", counts)
        mode_row = QHBoxLayout()  # the mode and the cache's format (three short words) side by side
        mode_row.setSpacing(10)
        mode_row.addWidget(self.mode, 1)
        kv_label = QLabel("KV")
        kv_label.setBuddy(self.kv)
        kv_label.setToolTip(KV_TIP)
        mode_row.addWidget(kv_label)
        mode_row.addWidget(self.kv)
        form.addRow("Mode", mode_row)
        form.addRow("Precision", self.precision)
        form.addRow("Tokens", self.tokens)
        inner.addLayout(form)
        prompts_label = QLabel("Prompts (one per line)")
        prompts_label.setObjectName("muted")
        prompts_row = QHBoxLayout()
        prompts_row.addWidget(prompts_label, 1)
        self.load_prompts_button = QPushButton("Load…")
        self.load_prompts_button.setToolTip(
            'Prompts from a file: UTF-8 text, one prompt per line, or JSON Lines with a "prompt" field (as '
            "`expertbench run --prompt-file` reads them)"
        )
        actions.connect(self.load_prompts_button.clicked, self.load_prompts, "Loading prompts", parent=self)
        prompts_row.addWidget(self.load_prompts_button)
        inner.addLayout(prompts_row)
        self.prompts = QPlainTextEdit("\n".join(DEMO_PROMPTS))
        # a line at least: the list scrolls in itself before the settings do (a 720-pixel screen)
        self.prompts.setMinimumHeight(self.prompts.fontMetrics().lineSpacing() + 8)
        inner.addWidget(self.prompts, 1)
        # as wide as the settings (never a sideways scroll), as short as a few of their rows
        self.settings_area = Scrolling(settings, sideways=False, min_height=SETTINGS_MIN_HEIGHT)
        outer.addWidget(self.settings_area, 1)
        buttons = QHBoxLayout()
        buttons.setSpacing(6)
        self.start_button = QPushButton(theme.icon("start"), "Start")
        self.start_button.setDefault(True)
        self.stop_button = QPushButton(theme.icon("stop"), "Stop")
        self.stop_button.setEnabled(False)
        actions.connect(self.start_button.clicked, self.start, "Starting the run", parent=self)
        actions.connect(self.stop_button.clicked, state.stop_run, "Stop", parent=self)
        buttons.addWidget(self.start_button, 1)
        buttons.addWidget(self.stop_button, 1)
        outer.addLayout(buttons)
        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        self.progress.setFormat("idle")
        self.progress.setValue(0)
        outer.addWidget(self.progress)
        self.timer = QTimer(self)
        self.timer.setInterval(100)
        self.timer.timeout.connect(self._tick)
        state.sigModelChanged.connect(self._model_changed)
        state.sigRunStarted.connect(self._run_started)
        state.sigRunFinished.connect(self._run_finished)
        self._model_changed()

    def load_prompts(self, path: str | None = None) -> bool:
        """Replace the prompts with a file's (a dialog asks which when no path is given): text, one a line, or JSON
        Lines; a file that cannot be read, or a prompt holding a line break (one a line here), is said in a dialog
        and the prompts stay as they were."""
        if not path:
            path, _ = QFileDialog.getOpenFileName(self, "Load prompts", "", "Prompts (*.txt *.jsonl);;All files (*)")
            if not path:
                return False
        try:
            prompts = read_prompt_file(path)
        except ArgumentError as exc:
            QMessageBox.warning(self, "Load prompts", str(exc))
            return False
        broken = next((i for i, p in enumerate(prompts) if "\n" in p or "\r" in p), None)
        if broken is not None:
            QMessageBox.warning(self, "Load prompts", f"{path}: prompt {broken + 1} holds a line break, and the list "
                                "here is one prompt a line: run it with `expertbench run --prompt-file`")  # fmt: skip
            return False
        self.prompts.setPlainText("\n".join(prompts))
        self.state.sigMessage.emit(f"{len(prompts)} prompts from {Path(path).name}")
        return True

    def settings(self) -> RunSettings:
        prompts = [line.strip() for line in self.prompts.toPlainText().splitlines() if line.strip()]
        return RunSettings(prompts=prompts, tokens=self.tokens.value(), repeats=self.repeats.value(),
                           q=self.q.value(), mode=self.mode.currentData(),
                           use_draft=self.draft_check.isChecked(),
                           precision=self.precision.currentData(), kv=self.kv.currentData())  # fmt: skip

    def apply_profile(self, profile: Profile) -> None:
        """Take a profile's run settings (engine.profiles.profile's defaults where it gives none)."""
        run = profile.run.resolved()
        prompts = run["prompts"]
        if all(isinstance(p, str) and "\n" not in p for p in prompts):
            self.prompts.setPlainText("\n".join(prompts))
        else:
            self.state.sigMessage.emit("The profile's prompts are token ids: the prompts here stay as they are")
        self.tokens.setValue(run["tokens_per_prompt"])
        self.repeats.setValue(run["repeats"])
        self.q.setValue(run["q"])
        for combo, value in ((self.mode, run["mode"]), (self.precision, run["precision"]), (self.kv, run["kv"])):
            index = combo.findData(value)
            if index >= 0:
                combo.setCurrentIndex(index)
        if self.state.has_draft:
            self.draft_check.setChecked(profile.draft is not None)

    @Slot()
    def start(self) -> None:
        settings = self.settings()
        if not settings.prompts:
            self.state.sigMessage.emit("Type at least one prompt")
            return
        self.state.start_run(settings)

    @Slot()
    def _model_changed(self) -> None:
        m = self.state.model
        has = m is not None
        self.start_button.setEnabled(has and not self.state.running)
        if not self.state.running:  # the previous model's "done: N tokens" is no news about this one
            self.progress.setRange(0, 100)
            self.progress.setValue(0)
            self.progress.setFormat("idle")
        if not has:
            self.target_label.setText("no model loaded")
            self.draft_check.setText("none")
            self.draft_check.setEnabled(False)
            return
        warn = theme.colors()["warn"]
        quantized = "" if m.demo_quant is None else f"; quantized: {quant_formats(m.demo_quant)}"
        note = f"synthetic demo: random weights, its text is noise{quantized}"
        synthetic = f"<br><span style='color:{warn}'>{note}</span>"
        kind = f" <span style='color:{theme.colors()['muted']}'>({family(m.config.architecture).title})</span>"
        self.target_label.setText(_name(m.target_path) + kind + (synthetic if m.synthetic else ""))
        self.target_label.setToolTip(m.target_path)
        self.draft_check.setEnabled(m.draft_path is not None)
        own = m.draft_path == SELF_DRAFT
        name = "its own MTP layer" if own else None if m.draft_path is None else _name(m.draft_path)
        self.draft_check.setText("none (target only)" if name is None else name)
        self.draft_check.setToolTip("The target checkpoint's multi-token-prediction layer" if own else
                                    m.draft_path or "Open a draft folder from the File menu")  # fmt: skip
        self.tokens.setMaximum(max(1, m.config.max_position_embeddings - 64))

    @Slot()
    def _run_started(self) -> None:
        self.start_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.progress.setRange(0, max(1, self.state.live.progress[1]))
        self.progress.setValue(0)
        self.progress.setFormat("starting…")
        self.timer.start()

    @Slot(object)
    def _run_finished(self, record) -> None:
        self.timer.stop()
        self._tick()
        self.start_button.setEnabled(self.state.model is not None)
        self.stop_button.setEnabled(False)
        if record is None:
            self.progress.setFormat("failed")
        elif record.cancelled:
            self.progress.setFormat("stopped at %v of %m tokens")
        else:
            self.progress.setValue(self.progress.maximum())
            self.progress.setFormat("done: %m tokens")

    @Slot()
    def _tick(self) -> None:
        done, total = self.state.live.progress
        self.progress.setMaximum(max(1, total))
        self.progress.setValue(min(done, max(1, total)))
        if self.state.running:
            self.progress.setFormat("%v / %m tokens")
