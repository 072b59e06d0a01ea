"""Routing heat map (layers by experts) and the placement strategies.

The counts come from `state.routing`, filled by a profiling pass (engine.placement.routing.profile over the run
panel's prompts) and refreshed after every run (the core keeps counting while it decodes). The strategies
(app.strategies over engine.placement.strategy) fill the editor as one undoable edit; the ones that rank experts stay
disabled until there are counts. The predicted tokens/s is the cost model's for the placement in the editor,
once the devices are measured (on the engine thread, once per model and device set).
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import (
    QBoxLayout,
    QComboBox,
    QGraphicsRectItem,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.core.errors import EngineError

from . import actions, strategies, theme
from .scrolling import FitsItsHeight
from .state import WorkbenchState, format_bytes


class HeatMap(pg.PlotWidget):
    """Hit counts as an image: experts across, layers down (layer 0 on top), a colour bar of the counts, and the
    value under the pointer (sigHover: its description, '' off the map)."""

    sigHover = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setMenuEnabled(False)
        self.setMouseEnabled(x=False, y=False)
        self.hideButtons()
        self.setLabel("bottom", "expert")
        self.setLabel("left", "layer")
        self.getPlotItem().invertY(True)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.image.setColorMap(pg.colormap.get("inferno"))
        self.addItem(self.image)
        self.note = pg.TextItem("", color=theme.colors()["muted"], anchor=(0.5, 0.5))
        self.addItem(self.note)
        self.setMinimumHeight(110)
        self.counts: np.ndarray | None = None
        self.dense: set[int] = set()  # layers without experts: no routing to show (DeepSeek's leading dense layers)
        self._dense_items: list = []
        self.colorbar = pg.ColorBarItem(values=(0, 1), colorMap=pg.colormap.get("inferno"), label="hits",
                                        interactive=False, width=10)  # fmt: skip
        self.colorbar.setImageItem(self.image, insert_in=self.getPlotItem())
        self.scene().sigMouseMoved.connect(self._hovered)

    def describe(self, x: float, y: float) -> str:
        """What the map shows at data coordinates (x: expert, y: layer): the hits and the share of the layer's."""
        if self.counts is None:
            return ""
        layers, experts = self.counts.shape
        e, layer = int(np.floor(x)), int(np.floor(y))
        if not (0 <= e < experts and 0 <= layer < layers):
            return ""
        if layer in self.dense:
            return f"layer {layer}: a dense layer, no experts to route"
        hits, total = self.counts[layer, e], self.counts[layer].sum()
        share = f"{100 * hits / total:.1f} % of the layer's selections" if total > 0 else "the layer routed nothing"
        return f"layer {layer}, expert {e}: {int(hits)} hits, {share}"

    def _hovered(self, pos) -> None:
        point = self.getPlotItem().vb.mapSceneToView(pos)
        text = self.describe(point.x(), point.y())
        self.setToolTip(text)
        self.sigHover.emit(text)

    def set_counts(self, counts: np.ndarray | None, shape: tuple[int, int] | None, note: str = "",
                   dense: tuple[int, ...] = ()) -> None:  # fmt: skip
        """counts: [layers, experts] hit counts, or None to show `note` over an empty grid of `shape`; dense: the
        layers that route nothing, each drawn as a labelled band (not a row of zero hits)."""
        self.counts = None if counts is None else np.asarray(counts, dtype=np.float64)
        layers, experts = shape if shape is not None else (1, 1)
        self._mark_dense(set(dense) if self.counts is not None else set(), experts)
        if self.counts is not None:
            top = max(1.0, float(self.counts.max()))
            self.image.setImage(self.counts, levels=(0, top))
            self.colorbar.setLevels((0, top))
            self.image.setVisible(True)
            self.note.setText("")
        else:
            self.image.setImage(np.zeros((layers, experts)), levels=(0, 1))
            self.colorbar.setLevels((0, 1))  # no counts: the previous model's scale goes with them
            self.image.setVisible(False)
            self.note.setText(note)
            self.note.setPos(experts / 2, layers / 2)
        self.image.setRect(0, 0, experts, layers)
        for axis, n in (("bottom", experts), ("left", layers)):
            step = max(1, int(np.ceil(n / 8)))
            self.getAxis(axis).setTicks([[(i + 0.5, str(i)) for i in range(0, n, step)], []])
        self.setXRange(0, experts, padding=0.02)
        self.setYRange(0, layers, padding=0.02)

    def _mark_dense(self, dense: set[int], experts: int) -> None:
        for item in self._dense_items:
            self.removeItem(item)
        self._dense_items.clear()
        self.dense = dense
        c = theme.colors()
        for layer in sorted(dense):
            band = QGraphicsRectItem(0, layer, experts, 1)
            band.setBrush(pg.mkBrush(c["alt"]))
            band.setPen(pg.mkPen(None))
            band.setZValue(5)
            label = pg.TextItem("dense layer", color=c["muted"], anchor=(0.5, 0.5))
            label.setPos(experts / 2, layer + 0.5)
            label.setZValue(6)
            for item in (band, label):
                self.addItem(item)
                self._dense_items.append(item)


class RoutingPanel(FitsItsHeight, QWidget):
    def __init__(self, state: WorkbenchState, prompts_source=None, parent=None):
        super().__init__(parent)
        self.state = state
        self.prompts_source = prompts_source  # callable returning the run panel's prompts
        # The map and the strategies one above the other, or side by side in a wide, low dock (the compact
        # arrangement's tab below the editor).
        self.body = QBoxLayout(QBoxLayout.Direction.TopToBottom, self)
        self.body.setContentsMargins(8, 4, 8, 8)
        self.body.setSpacing(8)
        outer = QVBoxLayout()
        outer.setSpacing(8)
        self.body.addLayout(outer, 1)
        top = QHBoxLayout()
        self.profile_button = QPushButton(theme.icon("profile"), "Profile routing")
        actions.connect(self.profile_button.clicked, self.profile, "Profiling routing", parent=self)
        top.addWidget(self.profile_button)
        self.reset_button = QPushButton("Reset")
        self.reset_button.setToolTip("Forget the routing statistics counted so far (the engine's counters too)")
        actions.connect(self.reset_button.clicked, self.state.reset_routing, "Resetting the routing", parent=self)
        top.addWidget(self.reset_button)
        top.addStretch(1)
        outer.addLayout(top)
        self.heatmap = HeatMap()
        outer.addWidget(self.heatmap, 1)
        self.caption = QLabel()
        self.caption.setObjectName("muted")
        self.caption.setWordWrap(True)
        self.caption.setMinimumWidth(120)
        self.heatmap.sigHover.connect(lambda text: self.caption.setText(text or self._caption()))
        outer.addWidget(self.caption)
        self._runs: list[int] = []  # the runs whose decodes the counts hold (since the model was loaded or reset)
        box = QGroupBox("Strategies")
        grid = QGridLayout(box)
        grid.setHorizontalSpacing(6)
        grid.setVerticalSpacing(6)
        self.single_button = QPushButton(theme.icon("single"), "All on")
        self.single_button.setToolTip("Every expert of every MoE layer on the chosen device")
        actions.connect(self.single_button.clicked, self.all_on, "All on", parent=self)
        self.device_combo = QComboBox()
        self.device_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.uniform_button = QPushButton(theme.icon("uniform"), "Uniform split")
        self.uniform_button.setToolTip("MoE layers in equal contiguous blocks, one block per device")
        actions.connect(self.uniform_button.clicked, self.uniform, "Uniform split", parent=self)
        grid.addWidget(self.single_button, 0, 0)
        grid.addWidget(self.device_combo, 0, 1)
        grid.addWidget(self.uniform_button, 1, 0, 1, 2)
        fast_row = QHBoxLayout()
        fast_row.setSpacing(6)
        fast_label = QLabel("Fast device")
        self.fast_combo = QComboBox()
        self.fast_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)  # never "hostsim:"
        self.fast_combo.setToolTip("The device the strategies below fill first")
        self._fast_chosen = ""  # the user's pick, kept while that device exists; else _default_fast()
        self.fast_combo.activated.connect(lambda _i: setattr(self, "_fast_chosen", self.fast_combo.currentText()))
        self.budget = QSpinBox()
        self.budget.setRange(1, 100)
        self.budget.setValue(100)
        self.budget.setSuffix(" %")
        self.budget.valueChanged.connect(self._budget_tip)
        self.fast_combo.currentTextChanged.connect(self._budget_tip)
        fast_row.addWidget(fast_label)
        fast_row.addWidget(self.fast_combo, 1)
        fast_row.addWidget(QLabel("holds ≤"))
        fast_row.addWidget(self.budget)
        grid.addLayout(fast_row, 2, 0, 1, 2)
        self.routing_buttons: dict[str, QPushButton] = {}
        for i, (name, (text, _what, _routed)) in enumerate(strategies.STRATEGIES.items()):
            b = QPushButton(text)
            actions.connect(b.clicked, lambda n=name: self.apply(n), text, parent=self)
            grid.addWidget(b, 3 + i // 2, i % 2)
            self.routing_buttons[name] = b
        predicted = QHBoxLayout()
        predicted.setSpacing(6)
        self.measuring = QProgressBar()
        self.measuring.setRange(0, 0)
        self.measuring.setFixedSize(48, 10)
        self.measuring.setTextVisible(False)
        self.measuring.hide()
        self.predicted = QLabel()
        self.predicted.setObjectName("muted")
        predicted.addStretch(1)
        predicted.addWidget(self.measuring)
        predicted.addWidget(self.predicted)
        grid.addLayout(predicted, 4, 1)
        self.body.addWidget(box)
        self.strategies_box = box
        state.sigModelChanged.connect(self._runs.clear)
        state.sigRunFinished.connect(self._run_finished)
        for sig in (state.sigModelChanged, state.sigRoutingChanged, state.sigEngineChanged,
                    state.sigCalibrationChanged):  # fmt: skip
            sig.connect(self.refresh)
        state.sigPlacementChanged.connect(self._show_prediction)
        self.refresh()

    @Slot()
    def refresh(self) -> None:
        s = self.state
        m = s.model
        has_model = m is not None
        names = s.device_names
        keep = self.device_combo.currentText()
        fast = self._fast_chosen if self._fast_chosen in names else self._default_fast()
        for combo, current in ((self.device_combo, keep if keep in names else m.primary if m else ""),
                               (self.fast_combo, fast)):  # fmt: skip
            combo.blockSignals(True)
            combo.clear()
            combo.addItems(names)
            combo.setCurrentText(current)
            combo.blockSignals(False)
        self.single_button.setEnabled(has_model)
        self.uniform_button.setEnabled(has_model and len(names) > 1)
        self.profile_button.setEnabled(has_model)
        self.profile_button.setToolTip(
            "Decode the run panel's prompts and count which experts each layer's router picks"
            if has_model
            else "Open a model first"
        )
        shape = (m.config.num_layers, m.config.num_experts) if has_model else None
        self.reset_button.setEnabled(has_model and s.routing is not None)
        self.caption.setText(self._caption())
        if s.routing is not None:
            dense = tuple(layer for layer in range(m.config.num_layers) if not m.config.is_moe_layer(layer))
            self.heatmap.set_counts(s.routing, shape, dense=dense)
        else:
            note = "No routing statistics yet:\nProfile routing or a run fills this map"
            self.heatmap.set_counts(None, shape, note if has_model else "No model loaded")
        for name, button in self.routing_buttons.items():
            text, what, routed = strategies.STRATEGIES[name]
            if not has_model:
                why = "Open a model first."
            elif len(names) < 2:
                why = "It needs a second device."
            elif routed and s.routing is None:
                why = "Profile routing (or make a run) first: it ranks the experts by how often the router picks them."
            elif s.calibrating:
                why = "Measuring the devices…"
            else:
                why = ""
            button.setEnabled(not why)
            measure = "" if s.calibration is not None else " The first use measures the devices (once per model)."
            button.setToolTip(f"{text}: {what}.{measure}" + (f"\n{why}" if why else ""))
        self.fast_combo.setEnabled(has_model and len(names) > 1)
        self.budget.setEnabled(has_model and len(names) > 1)
        self.measuring.setVisible(s.calibrating)
        self._budget_tip()
        self._show_prediction()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        size = event.size()
        wide = size.width() > 1.6 * size.height() and size.width() >= 560
        direction = QBoxLayout.Direction.LeftToRight if wide else QBoxLayout.Direction.TopToBottom
        if self.body.direction() != direction:
            self.body.setDirection(direction)

    @Slot(object)
    def _run_finished(self, record) -> None:
        if record is not None:
            self._runs.append(record.index)

    def routed_runs(self) -> tuple[int, int] | None:
        """The runs (first, last) whose decodes the counts hold: the state's own account when it keeps one
        (routing_runs), else the runs finished since the model was loaded or the counts were reset."""
        if hasattr(self.state, "routing_runs"):
            return self.state.routing_runs
        return (min(self._runs), max(self._runs)) if self._runs else None

    def _caption(self) -> str:
        """What the map counts: the tokens each MoE layer routed (profiling passes and runs; measurements of the
        devices never count) since the model was loaded or the counts were reset, and over which runs."""
        stats = self.state.routing_stats
        if stats is None:
            self._runs.clear()  # reset (or never counted): the next counts start with the next run
            return ""
        tokens = getattr(self.state, "routing_tokens", None) or max((int(t) for t in stats.tokens), default=0)
        origin = getattr(self.state, "routing_origin", None)
        runs = self.routed_runs()
        if runs is not None:
            first, last = runs
            over = f"over run {first}" if first == last else f"over runs {first}-{last}"
            if origin == "profiling and runs":
                over = "from profiling and " + over.removeprefix("over ")
        else:
            over = {"profile": "from the profile opened", "given": "as given"}.get(origin or "", "from profiling")
        return (f"Hits of {tokens} tokens per MoE layer (top-{stats.top_k}) {over}, since the model was loaded or "
                "the counts were reset; device measurements do not count. Hover for a value.")  # fmt: skip

    def _default_fast(self) -> str:
        """An accelerator if there is one, else a device other than the primary, else the primary."""
        m, devices = self.state.model, self.state.devices
        if not devices or m is None:
            return ""
        gpus = [d.name for d in devices if theme.device_kind(d.name, d.kind) == "gpu"]
        others = [d.name for d in devices if d.name != m.primary]
        return (gpus or others or [devices[0].name])[0]

    def fast_budget(self) -> int | None:
        """Bytes of experts the fast device may hold: the budget's share of the model's experts."""
        m = self.state.model
        return None if m is None else self.budget.value() * m.shape.total_bytes // 100

    @Slot()
    def _budget_tip(self) -> None:
        m, fast = self.state.model, self.fast_combo.currentText()
        if m is None or not fast:
            self.budget.setToolTip("The share of the model's experts the fast device may hold")
            return
        room = self.state.capacity.get(fast, 0)
        self.budget.setToolTip(f"{fast} holds at most {self.budget.value()} % of the model's experts "
                               f"({format_bytes(self.fast_budget())} of {format_bytes(m.shape.total_bytes)}), "
                               f"and never more than it has room for ({format_bytes(room)})")  # fmt: skip

    @Slot()
    def _show_prediction(self) -> None:
        s = self.state
        if s.calibrating:
            self.predicted.setText("measuring devices…")
            self.predicted.setToolTip("The cost model measures each device once for this model (a few short decodes "
                                      "on the engine thread)")  # fmt: skip
            return
        rate = s.predicted_tokens_per_second()
        if rate is None:
            self.predicted.setText("Predicted: - tokens/s")
            self.predicted.setToolTip("A strategy measures the devices first; then the cost model predicts the "
                                      "decode speed of every placement in the editor")  # fmt: skip
            return
        self.predicted.setText(f"Predicted: {rate:.1f} tokens/s")
        routing = "weighted by the routing statistics" if s.routing_stats is not None else "every expert equally used"
        self.predicted.setToolTip(f"The cost model's decode speed for the placement in the editor: target only, one "
                                  f"token per step, {routing}; from device rates measured once for this model "
                                  f"({', '.join(s.calibration.devices)})")  # fmt: skip

    @Slot()
    def profile(self) -> None:
        prompts = self.prompts_source() if self.prompts_source else []
        self.state.profile_routing(prompts)

    def apply(self, name: str) -> None:
        fast = self.fast_combo.currentText()
        if self.state.model is not None and fast:
            self.state.apply_strategy(name, fast, self.fast_budget())

    @Slot()
    def all_on(self) -> None:
        device = self.device_combo.currentText()
        if self.state.model and device:
            self.state.set_placement(strategies.all_on(self.state.model.shape, device), f"all experts on {device}")

    @Slot()
    def uniform(self) -> None:
        if self.state.model is None:
            return
        try:
            placement = strategies.uniform_split(self.state.model.shape, self.state.device_names)
        except EngineError as exc:
            self.state.sigMessage.emit(str(exc))
            return
        self.state.set_placement(placement, "uniform split")
