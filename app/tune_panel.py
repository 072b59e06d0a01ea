"""The Tune panel: engine.tune's measured search on the loaded pair, its Pareto front, and a point to keep.

Start runs the tuning on the engine thread (WorkbenchState.submit_with_models: other engine work waits for it);
its progress comes back as queued signals carrying plain data, so the GUI thread never reads an object the engine
thread is still filling. Cancel stops it before the next measurement (the run under way at its next step); what was
measured is still shown. The scatter shows every measured point (grey; a cross where the KL limit excluded it) and
the front (bytes on the fast device across, decode tokens/s up; a point whose output differs from one device's is
red); hovering a mark says what it is.
Apply puts the selected point's placement in the editor as one undoable edit; Save as profile writes it with its
q, its mode, the prompts and tokens it was measured with, and the hashes it gave.

"also owner_local" measures every placement in owner_local mode too (TuneSettings.modes, as `tune --modes
reference,owner_local`); its outputs change with the placement, so they are judged by their mean KL against the
reference mode, not by hashes: a KL limit excludes the points over it (engine.tune.bench.KLConstraint, as `--max-kl`),
and they are listed below the front with the reason the command prints.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtGui import QValidator
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine import tune
from engine.checkpoints.demo import DEMO_PROMPTS
from engine.core.errors import EngineError
from engine.placement.placement import MIB, Placement
from engine.placement.strategy import default_fast
from engine.profiles.expectations import min_accept_rate
from engine.runs.history import RunSettings
from engine.runs.quality import KLLimit
from engine.runs.speculative import MAX_DRAFT_TOKENS

from . import actions, profiles
from .scrolling import FitsItsHeight
from .state import WorkbenchState, format_bytes

MEASURED_BRUSH, FRONT_BRUSH, DIFFERS_BRUSH = (150, 150, 150, 120), (40, 120, 220), (220, 50, 50)
FAST_MODE = "owner_local"  # the mode "also owner_local" adds to the reference mode
NO_KL_LIMIT = -1.0  # the KL box's "no limit" (below any limit it takes)
KL_STEPS = (NO_KL_LIMIT, 0.0, *(10.0**e for e in range(-9, 3)))  # its arrows go a decade at a time


class KLLimitBox(QDoubleSpinBox):
    """The most mean KL (nats) an owner_local point may have, or "no limit": numbers of any scale (1e-06), typed or a
    decade per arrow step; nothing negative, nothing over the maximum."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setDecimals(12)  # a value's own digits are shown (textFromValue), not 12 of them
        self.setRange(NO_KL_LIMIT, 100.0)
        self.setSpecialValueText("no limit")
        self.setSuffix(" nats")
        self.setValue(NO_KL_LIMIT)

    def limit(self) -> float | None:
        return None if self.value() < 0 else self.value()

    def textFromValue(self, value: float) -> str:
        return f"{value:g}"

    def valueFromText(self, text: str) -> float:
        try:
            return float(text.removesuffix(self.suffix()).strip())
        except ValueError:
            return NO_KL_LIMIT

    def validate(self, text: str, pos: int) -> QValidator.State:
        t = text.removesuffix(self.suffix()).strip()
        if t == self.specialValueText():
            return QValidator.State.Acceptable
        try:
            value = float(t)
        except ValueError:  # a number being typed ('', '.', '1e-') may go on; anything else may not
            partial = t in ("", ".") or (t[-1:] in "eE-" and t.rstrip("eE-")[-1:].isdigit())
            return QValidator.State.Intermediate if partial else QValidator.State.Invalid
        return QValidator.State.Acceptable if 0 <= value <= self.maximum() else QValidator.State.Invalid

    def stepBy(self, steps: int) -> None:
        value = self.value()
        apart = lambda v: not math.isclose(v, value, rel_tol=1e-6)  # noqa: E731
        above = [v for v in KL_STEPS if value < v <= self.maximum() and apart(v)]
        below = [v for v in KL_STEPS if v < value and apart(v)]
        for _ in range(abs(steps)):
            if steps > 0 and above:
                value = above.pop(0)
            elif steps < 0 and below:
                value = below.pop()
        self.setValue(value)


@dataclass(frozen=True)
class TunedPoint:
    """A measured point as the GUI keeps it (plain data, copied on the engine thread)."""

    placement: Placement
    q: int | None
    origin: str
    speed: float
    low: float
    high: float
    fast_bytes: int
    same: bool
    output_sha256: tuple[str, ...]
    tokens: int
    repeats: int
    accept_rate: float | None
    mode: str = "reference"
    mean_kl: float | None = None  # nats against the reference mode (an owner_local point, where a limit measured it)
    excluded: str | None = None  # why the KL limit keeps it off the front (as `tune` prints it)

    @classmethod
    def of(cls, p: tune.Point, fast: str, quality=None) -> TunedPoint:
        """quality(point) -> its measured engine.runs.quality.QualityCost or None
        (engine.tune.bench.KLConstraint.cost)."""
        lo, hi = p.spread
        m = p.last
        cost = None if quality is None else quality(p)
        return cls(p.candidate.placement.copy(), p.candidate.q, p.candidate.origin, p.speed, lo, hi, p.fast_bytes(fast),
                   p.same_as_reference, tuple(m.output_sha256), m.tokens, m.repeats, m.accept_rate, p.candidate.mode,
                   None if cost is None else cost.mean_kl, p.excluded)  # fmt: skip

    @property
    def key(self) -> tuple[str, int | None, str]:
        return self.placement.describe(), self.q, self.mode

    @property
    def flagged(self) -> bool:
        """A reference-mode point whose output is not one device's (owner_local's output may differ: its KL says)."""
        return self.mode == "reference" and not self.same

    @property
    def quality(self) -> str:
        """How its output was judged, in a word or two: 'same' or 'DIFFERS' (its hashes), 'KL 3e-07' (owner_local)."""
        if self.mode == "reference":
            return "same" if self.same else "DIFFERS"
        return "KL -" if self.mean_kl is None else f"KL {self.mean_kl:.2g}"

    def describe(self) -> str:
        q = "no draft" if self.q is None else f"q {self.q}"
        if self.mode == "reference":
            same = "same output as one device" if self.same else "output DIFFERS from one device"
        elif self.mean_kl is None:
            same = "its own output (no KL limit: KL not measured)"
        else:
            same = f"its own output, mean KL {self.mean_kl:.3g} nats against the reference mode"
        excluded = f"\nEXCLUDED: {self.excluded}" if self.excluded else ""
        return (f"{self.speed:.1f} tokens/s ({self.low:.1f}-{self.high:.1f}), {q}, {self.mode}, "
                f"{format_bytes(self.fast_bytes)} on the fast device, {same}\n{self.origin}: "
                f"{self.placement.describe()}{excluded}")  # fmt: skip


class FitsItsHeightWidget(FitsItsHeight, QWidget):
    """The results below the settings: their least height for their width in their scroll area (FitsItsHeight)."""


class _Relay(QObject):
    """Lives on the GUI thread: the engine thread emits, the panel's slots run here (queued)."""

    sigProgress = Signal(object)  # (engine.tune.Progress less its point, TunedPoint or None)


class TunePanel(FitsItsHeight, QWidget):
    sigFrontChanged = Signal()  # the scatter and the list show new points

    def __init__(self, state: WorkbenchState, settings_source=None, parent=None):
        super().__init__(parent)
        self.state = state
        self.settings_source = settings_source  # () -> RunSettings: the run panel's prompts
        self.tuning: tune.Tuning | None = None
        self._lock = threading.Lock()
        self.running = False
        self.cancel_asked = False
        self.measured: list[TunedPoint] = []
        self.front: list[TunedPoint] = []
        self.fast: str | None = None
        self.prompts: list[str] = list(DEMO_PROMPTS)
        self.last_message = ""
        self._relay = _Relay()
        self._relay.sigProgress.connect(self._progress)

        form = QGridLayout()
        self.time_budget = QSpinBox()
        self.time_budget.setRange(5, 3600)
        self.time_budget.setValue(60)
        self.time_budget.setSuffix(" s")
        self.time_budget.setToolTip("Seconds to spend measuring, the calibration included")
        self.q = QComboBox()
        lo, hi = tune.AUTO_Q[0], tune.AUTO_Q[-1]
        auto = f"{lo}-{hi}" if tuple(range(lo, hi + 1)) == tune.AUTO_Q else ", ".join(map(str, tune.AUTO_Q))
        self.q.addItem(f"auto ({auto})", tune.AUTO_Q)
        for q in range(1, MAX_DRAFT_TOKENS + 1):
            self.q.addItem(str(q), (q,))
        self.q.setToolTip(f"Draft lengths to search (none without a draft); auto: {', '.join(map(str, tune.AUTO_Q))}")
        self.fast_device = QComboBox()
        self.fast_device.setToolTip("The device whose bytes the front counts, and whose budget is below")
        self.budget = QDoubleSpinBox()
        self.budget.setRange(0, 1 << 20)
        self.budget.setDecimals(1)
        self.budget.setSuffix(" MiB")
        self.budget.setSpecialValueText("its room")
        self.budget.setToolTip("The most experts the fast device may hold (0: its room: free memory plus this model's "
                               "experts there, less a tenth for staging)")  # fmt: skip
        self.owner_local = QCheckBox(f"also {FAST_MODE}")
        self.owner_local.setToolTip(f"Fast, not bit-exact. Measure every placement in the {FAST_MODE} reduction "
                                    f"mode too (tune --modes reference,{FAST_MODE}): each device pre-sums its own "
                                    "experts' outputs, so fewer bytes come back from a peer per token, but the sums "
                                    "are added in another order and the output changes with the placement. "
                                    f"{FAST_MODE} points are therefore judged by their mean KL divergence against the "
                                    "reference mode, not by output hashes")  # fmt: skip
        self.max_kl = KLLimitBox()
        self.max_kl.setEnabled(False)
        self.max_kl.setToolTip(f"The most mean KL divergence, in nats, of an {FAST_MODE} point's next-token "
                               "distributions against the reference mode (tune --max-kl; measured once per placement, "
                               f"{tune.QUALITY_TOKENS} tokens per prompt). Points over it are excluded: kept off the "
                               "front and out of the choice, listed below it with their KL. No limit: nothing is "
                               "measured or excluded")  # fmt: skip
        self.owner_local.toggled.connect(self.max_kl.setEnabled)
        # as narrow as their text, not their widest value: the panel fits beside the plots on a 1280-pixel screen
        for box in (self.time_budget, self.budget, self.max_kl):
            box.setSizePolicy(QSizePolicy.Policy.Preferred, box.sizePolicy().verticalPolicy())
        for box in (self.q, self.fast_device):  # their text elided before the panel pushes the run history aside
            box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            box.setMinimumContentsLength(3)
        for row, pairs in enumerate(((("Time", self.time_budget), ("q", self.q)),
                                     (("Fast", self.fast_device), ("budget", self.budget)))):  # fmt: skip
            for col, (label, widget) in enumerate(pairs):
                form.addWidget(QLabel(label), row, 2 * col)
                form.addWidget(widget, row, 2 * col + 1)
        # the mode and its limit on one row: every setting in view below Tune and Cancel in a 720-pixel window
        form.addWidget(self.owner_local, 2, 0, 1, 2)
        form.addWidget(QLabel("KL ≤"), 2, 2)
        form.addWidget(self.max_kl, 2, 3)
        form.setColumnStretch(1, 1)
        form.setColumnStretch(3, 1)
        form.setVerticalSpacing(3)

        self.start_button = QPushButton("Tune")
        self.start_button.setToolTip("Measure placements and draft lengths by successive halving (engine.tune)")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        buttons = QHBoxLayout()
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.progress, 1)
        self.status = QLabel("Not tuned yet")
        self.status.setWordWrap(True)
        self.why = QLabel()  # why the chosen point is not the fastest listed, when it is not
        self.why.setObjectName("muted")
        self.why.setWordWrap(True)
        self.why.hide()

        self.plot = pg.PlotWidget()
        self.plot.setLabel("bottom", "experts on the fast device (MiB)")
        self.plot.setLabel("left", "decode tokens/s")
        self.plot.setMinimumHeight(120)
        self.measured_marks = pg.ScatterPlotItem(size=7, pen=None, brush=pg.mkBrush(*MEASURED_BRUSH), hoverable=True,
                                                 tip=lambda x, y, data: data)  # fmt: skip
        self.front_marks = pg.ScatterPlotItem(size=11, hoverable=True, tip=lambda x, y, data: data)
        self.front_line = pg.PlotDataItem(pen=pg.mkPen(FRONT_BRUSH, width=1))
        for item in (self.measured_marks, self.front_line, self.front_marks):
            self.plot.addItem(item)
        self.front_marks.sigClicked.connect(self._clicked)

        self.front_list = QListWidget()
        self.front_list.setToolTip("The measured front, fewest bytes on the fast device first; below it the points "
                                   "the KL limit excluded, and why")  # fmt: skip
        self.front_list.setMaximumHeight(90)
        self.apply_button = QPushButton("Apply")
        self.apply_button.setToolTip("Put the selected point's placement in the editor (Edit > Undo takes it back)")
        self.save_button = QPushButton("Save as profile…")
        self.save_button.setToolTip("Write the selected point as a profile: placement, q, prompts, tokens and the "
                                    "output hashes it gave (expertbench regress replays it)")  # fmt: skip
        keep = QHBoxLayout()
        keep.addWidget(self.apply_button)
        keep.addWidget(self.save_button)

        # What it found (status, front, keep) scrolls on its own below the controls: a low panel shows Tune, Cancel
        # and every setting, and a scroll of the results brings the front into view without hiding them.
        results = FitsItsHeightWidget()
        shown = QVBoxLayout(results)
        shown.setContentsMargins(0, 0, 0, 0)
        shown.addWidget(self.status)
        shown.addWidget(self.why)
        shown.addWidget(self.plot, 1)
        shown.addWidget(self.front_list)
        shown.addLayout(keep)
        self.results_area = QScrollArea()
        self.results_area.setWidget(results)
        self.results_area.setWidgetResizable(True)
        self.results_area.setFrameShape(QFrame.Shape.NoFrame)
        self.results_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.results_area.setMinimumHeight(self.status.fontMetrics().lineSpacing() + 4)  # the status's first line

        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 2, 8, 2)
        layout.setSpacing(3)
        layout.addLayout(buttons)  # first: Tune and Cancel in view however low the panel
        layout.addLayout(form)
        layout.addWidget(self.results_area, 1)

        actions.connect(self.start_button.clicked, self.start, "Tuning", recover=self._update_buttons, parent=self)
        actions.connect(self.cancel_button.clicked, self.cancel, "Cancel", recover=self._update_buttons, parent=self)
        actions.connect(self.apply_button.clicked, self.apply_selected, "Apply", parent=self)
        actions.connect(self.save_button.clicked, self.save_selected, "Saving the tuned point", parent=self)
        self.front_list.currentRowChanged.connect(lambda _row: self._update_buttons())
        state.sigModelChanged.connect(self._model_changed)
        state.sigEngineChanged.connect(self._model_changed)
        self._model_changed()

    # ---- state -------------------------------------------------------------------------------------------

    @Slot()
    def _model_changed(self) -> None:
        """The devices of the engine and the model opened: the points measured on the previous ones are gone (their
        placements are that model's)."""
        s = self.state
        if not self.running:
            self.measured, self.front = [], []
            self.status.setText("Not tuned yet")
            self.why.hide()
            self.progress.setRange(0, 1)
            self.progress.setValue(0)
            self._show()
        self.fast_device.clear()
        self.fast_device.addItems([d.name for d in s.devices])
        if s.model is not None and s.devices:  # as `expertbench plan` and `tune` pick it
            self.fast_device.setCurrentText(default_fast(s.devices, s.model.primary))
        self._update_buttons()

    def _update_buttons(self) -> None:
        has = self.state.model is not None and len(self.state.devices) > 1
        self.start_button.setEnabled(has and not self.running)
        self.cancel_button.setEnabled(self.running)
        chosen = self.selected() is not None
        self.apply_button.setEnabled(chosen and not self.running)
        self.save_button.setEnabled(chosen and not self.running)

    def tune_settings(self) -> tune.TuneSettings:
        fast = self.fast_device.currentText() or None
        caps = {fast: int(self.budget.value() * MIB)} if fast and self.budget.value() > 0 else {}
        prompts = list(self.settings_source().prompts) if self.settings_source is not None else list(DEMO_PROMPTS)
        modes = tune.parse_modes(f"reference,{FAST_MODE}" if self.owner_local.isChecked() else "reference")
        return tune.TuneSettings(fast=fast, caps=caps, qs=self.q.currentData(), modes=modes,
                                 time_budget=self.time_budget.value(), prompts=prompts or list(DEMO_PROMPTS),
                                 routing=self.state.routing_stats, calibration=self.state.calibration)  # fmt: skip

    def kl_limit(self) -> float | None:
        """The --max-kl the panel asks for: None with no limit, or when only the reference mode is searched (it costs
        nothing: there is nothing to exclude)."""
        return self.max_kl.limit() if self.owner_local.isChecked() else None

    # ---- running -----------------------------------------------------------------------------------------

    @Slot()
    def start(self, settings: tune.TuneSettings | None = None, max_kl: float | None = None) -> bool:
        """Tune on the engine thread (after what is queued there); False when there is nothing to tune or a tuning
        runs. settings and max_kl (the --max-kl in nats; None: no limit): the panel's when settings is None."""
        if self.running or self.state.model is None:
            return False
        if settings is None:
            settings, max_kl = self.tune_settings(), self.kl_limit()
        use_draft = self.state.has_draft
        relay, lock = self._relay, self._lock

        def task(target, draft):
            constraints, quality = [], None
            if max_kl is not None:  # as `tune --max-kl` builds it
                limit = KLLimit.for_model(max_kl, target, prompts=settings.prompts, tokens=tune.QUALITY_TOKENS)
                kl = tune.KLConstraint(limit, target.device)
                constraints, quality = [kl], kl.cost

            def progress(p: tune.Progress) -> None:  # engine thread: copy, then emit
                point = None if p.point is None else TunedPoint.of(p.point, self.fast or "", quality)
                relay.sigProgress.emit((replace(p, point=None), point))

            tuning = tune.Tuning(target, draft if use_draft else None, settings, on_progress=progress,
                                 constraints=constraints)  # fmt: skip
            with lock:
                self.tuning = tuning
                if self.cancel_asked:
                    tuning.cancel()
            try:
                result = tuning.run()
            finally:
                with lock:
                    self.tuning = None
            s = result.search
            kept = lambda points: [TunedPoint.of(p, s.fast, quality) for p in points]  # noqa: E731
            return kept(s.points), kept(s.front), s.fast, tune.report(result, quality)

        self.running, self.cancel_asked = True, False
        try:
            self.measured, self.front, self.fast = [], [], settings.fast
            self.prompts = list(settings.prompts or DEMO_PROMPTS)
            self._show()
            self.status.setText("Waiting for the engine…")
            self.why.hide()
            self._update_buttons()
            self.state.submit_with_models(task, self._finished, self._failed, "tuning")
        except BaseException:  # nothing was queued: the panel stays ready for the next try
            self.running = False
            self.status.setText("Not tuned: the tuning could not start")
            self._update_buttons()
            raise
        return True

    @Slot()
    def cancel(self) -> None:
        """Stop before the next measurement (thread-safe: no engine call here)."""
        with self._lock:
            self.cancel_asked = True
            if self.tuning is not None:
                self.tuning.cancel()

    @Slot(object)
    def _progress(self, item) -> None:
        p, point = item
        self.progress.setRange(0, max(p.total, 1))
        self.progress.setValue(min(p.done, max(p.total, 1)))
        best = f", best {p.best:.1f} tokens/s" if p.best else ""
        if p.phase == "measuring":
            text = f"Rung {p.rung + 1} of {p.rungs}: {p.done} of {p.total} measured{best} ({p.elapsed:.0f} of " \
                   f"{p.budget:.0f} s)"  # fmt: skip
        else:
            text = f"{p.message[:1].upper()}{p.message[1:]}…" if p.message else p.phase
        self.status.setText(text)
        self.last_message = text
        if point is not None:
            self.measured = [m for m in self.measured if m.key != point.key] + [point]
            self.front = tune.front_of([m for m in self.measured if m.excluded is None], lambda p: p.speed,
                                       lambda p: p.fast_bytes)  # fmt: skip
            self._show()

    def _finished(self, result) -> None:
        self.measured, self.front, self.fast, doc = result
        self.running = False
        differ = len(doc["differing"])
        state = "cancelled: what was measured" if doc["cancelled"] else "done"
        note = f"; {differ} point{'s' if differ > 1 else ''} DIFFER from one device's output" if differ else ""
        if doc["excluded"]:
            note += f"; {len(doc['excluded'])} excluded by the KL limit"
        self.status.setText(f"Tuning {state}: {doc['measurements']} measurements of {doc['candidates']} candidates in "
                            f"{doc['seconds']:.0f} s, {len(self.front)} on the front{note}")  # fmt: skip
        why = doc.get("why_chosen")  # the choice is not the fastest point listed: why (the report's 'why' line)
        self.why.setText(f"Chosen, not the fastest listed: {why}" if why else "")
        self.why.setVisible(bool(why))
        self.progress.setRange(0, 1)
        self.progress.setValue(1)
        self._show()
        chosen = doc["chosen"]
        rows = [i for i, p in enumerate(self.front)
                if chosen is not None and p.key == (chosen["placement"], chosen["q"], chosen["mode"])]  # fmt: skip
        if self.front:  # the tuner's choice where it is on the front, else the fastest
            self.front_list.setCurrentRow(rows[0] if rows else len(self.front) - 1)
        self._update_buttons()
        self.state.sigMessage.emit(self.status.text())

    def _failed(self, exc: BaseException) -> None:
        self.running = False
        self.status.setText(f"Tuning failed: {exc}")
        self._update_buttons()
        if isinstance(exc, EngineError):  # bad input (a budget that holds nothing): said where the user looks
            self.state.sigMessage.emit(f"Tuning failed: {exc}")
        else:
            self.state.sigError.emit("Tuning failed", str(exc) or type(exc).__name__)

    # ---- showing -----------------------------------------------------------------------------------------

    def _show(self) -> None:
        mib = lambda p: p.fast_bytes / MIB  # noqa: E731
        finite = [p for p in self.measured if math.isfinite(p.speed)]
        self.measured_marks.setData(x=[mib(p) for p in finite], y=[p.speed for p in finite],
                                    symbol=["x" if p.excluded else "o" for p in finite],
                                    data=[p.describe() for p in finite])  # fmt: skip
        brushes = [pg.mkBrush(*(DIFFERS_BRUSH if p.flagged else FRONT_BRUSH)) for p in self.front]
        self.front_marks.setData(x=[mib(p) for p in self.front], y=[p.speed for p in self.front], brush=brushes,
                                 data=[p.describe() for p in self.front])  # fmt: skip
        self.front_line.setData([mib(p) for p in self.front], [p.speed for p in self.front])
        row = self.front_list.currentRow()
        self.front_list.clear()
        mixed = any(p.mode != "reference" for p in self.measured)  # the mode said where there is a choice
        for p in self.front:
            q = "-" if p.q is None else p.q
            mode = f"{p.mode}  " if mixed else ""
            self.front_list.addItem(f"{p.speed:8.1f} tok/s  q {q}  {format_bytes(p.fast_bytes):>10}  {mode}"
                                    f"{p.quality}  {p.origin}")  # fmt: skip
            self.front_list.item(self.front_list.count() - 1).setToolTip(p.describe())
        for p in (p for p in self.measured if p.excluded):  # below the front, as `tune` lists them; not to be chosen
            q = "-" if p.q is None else p.q
            self.front_list.addItem(f"excluded  {p.mode}, q {q}, {p.origin}: {p.excluded}")
            item = self.front_list.item(self.front_list.count() - 1)
            item.setToolTip(p.describe())
            item.setFlags(Qt.ItemFlag.ItemIsEnabled)
            item.setForeground(self.palette().placeholderText())
        if 0 <= row < len(self.front):
            self.front_list.setCurrentRow(row)
        self.sigFrontChanged.emit()

    def _clicked(self, _item, points, _ev=None) -> None:
        if points:
            x, y = points[0].pos().x(), points[0].pos().y()
            for i, p in enumerate(self.front):
                if math.isclose(p.fast_bytes / MIB, x) and math.isclose(p.speed, y):
                    self.front_list.setCurrentRow(i)

    def selected(self) -> TunedPoint | None:
        row = self.front_list.currentRow()
        return self.front[row] if 0 <= row < len(self.front) else None

    # ---- keeping a point ---------------------------------------------------------------------------------

    @Slot()
    def apply_selected(self) -> bool:
        """The selected point's placement in the editor: one undoable edit (the run panel's q stays as it is)."""
        p = self.selected()
        if p is None:
            return False
        q = "no draft" if p.q is None else f"q {p.q}"
        mode = "" if p.mode == "reference" else f", {p.mode}"
        return self.state.set_placement(p.placement, f"tuned placement ({p.origin}; measured with {q}{mode})")

    def profile_for(self, point: TunedPoint, path: str | Path):
        """The profile of a point (app.profiles.build, checked as the window's saves are), its run settings those it
        was measured with (its mode among them, as `tune --out` writes it) and its expectations the hashes and
        acceptance it gave."""
        use_draft = point.q is not None
        settings = RunSettings(prompts=list(self.prompts), tokens=point.tokens, repeats=point.repeats,
                               q=point.q or 2, mode=point.mode, use_draft=use_draft)  # fmt: skip
        profile = profiles.build(path, self.state.model, point.placement, settings, self.state.routing_stats,
                                 self.state.history, self.state.profile)  # fmt: skip
        profile.expectations.output_sha256 = list(point.output_sha256)
        accept = point.accept_rate
        profile.expectations.min_accept_rate = min_accept_rate(accept) if use_draft and accept is not None else None
        return profile

    @Slot()
    def save_selected(self, path: str | None = None) -> bool:
        p = self.selected()
        if p is None or self.state.model is None:
            return False
        if not path:
            path, _ = QFileDialog.getSaveFileName(self, "Save the tuned point as a profile", "tuned.yaml",
                                                  "Profile (*.yaml *.yml)")  # fmt: skip
            if not path:
                return False
            if not path.endswith((".yaml", ".yml")):
                path += ".yaml"
        try:
            self.profile_for(p, path).save(path)
        except (EngineError, OSError) as exc:
            text = f"'{path}': {exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)
            self.state.sigError.emit("The profile could not be saved", text)
            return False
        self.state.sigMessage.emit(f"Saved the tuned point to {path}")
        return True
