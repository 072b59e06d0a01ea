"""Routing heat map (layers by experts) and the placement strategies.

The counts come from `state.routing`, filled by a profiling pass (engine.routing.profile over the run
panel's prompts) and refreshed after every run (the core keeps counting while it decodes). The strategies that
need them are shown disabled until the engine's strategies land.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import (
    QComboBox,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from engine.errors import EngineError

from . import strategies, theme
from .state import WorkbenchState


class HeatMap(pg.PlotWidget):
    """Hit counts as an image: experts across, layers down (layer 0 on top)."""

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

    def set_counts(self, counts: np.ndarray | None, shape: tuple[int, int] | None, note: str = "") -> None:
        """counts: [layers, experts] hit counts, or None to show `note` over an empty grid of `shape`."""
        self.counts = None if counts is None else np.asarray(counts, dtype=np.float64)
        layers, experts = shape if shape is not None else (1, 1)
        if self.counts is not None:
            self.image.setImage(self.counts, levels=(0, max(1.0, float(self.counts.max()))))
            self.image.setVisible(True)
            self.note.setText("")
        else:
            self.image.setImage(np.zeros((layers, experts)), levels=(0, 1))
            self.image.setVisible(False)
            self.note.setText(note)
            self.note.setPos(experts / 2, layers / 2)
        self.image.setRect(0, 0, experts, layers)
        for axis, n in (("bottom", experts), ("left", layers)):
            step = max(1, int(np.ceil(n / 8)))
            self.getAxis(axis).setTicks([[(i + 0.5, str(i)) for i in range(0, n, step)], []])
        self.setXRange(0, experts, padding=0.02)
        self.setYRange(0, layers, padding=0.02)


class RoutingPanel(QWidget):
    def __init__(self, state: WorkbenchState, prompts_source=None, parent=None):
        super().__init__(parent)
        self.state = state
        self.prompts_source = prompts_source  # callable returning the run panel's prompts
        outer = QVBoxLayout(self)
        outer.setContentsMargins(8, 4, 8, 8)
        outer.setSpacing(8)
        top = QHBoxLayout()
        self.profile_button = QPushButton(theme.icon("profile"), "Profile routing")
        self.profile_button.clicked.connect(self.profile)
        top.addWidget(self.profile_button)
        top.addStretch(1)
        outer.addLayout(top)
        self.heatmap = HeatMap()
        outer.addWidget(self.heatmap, 1)
        box = QGroupBox("Strategies")
        grid = QGridLayout(box)
        grid.setHorizontalSpacing(6)
        grid.setVerticalSpacing(6)
        self.single_button = QPushButton(theme.icon("single"), "All on")
        self.single_button.setToolTip("Every expert of every MoE layer on the chosen device")
        self.single_button.clicked.connect(self.all_on)
        self.device_combo = QComboBox()
        self.uniform_button = QPushButton(theme.icon("uniform"), "Uniform split")
        self.uniform_button.setToolTip("MoE layers in equal contiguous blocks, one block per device")
        self.uniform_button.clicked.connect(self.uniform)
        grid.addWidget(self.single_button, 0, 0)
        grid.addWidget(self.device_combo, 0, 1)
        grid.addWidget(self.uniform_button, 1, 0, 1, 2)
        self.routing_buttons = []
        for i, (name, what) in enumerate((("Cold layers", "whole cold layers off the fast device"),
                                          ("Hot first", "hot experts first, under a memory budget"),
                                          ("Critical path", "balance max(t_main, t_peer)"))):  # fmt: skip
            b = QPushButton(name)
            b.setEnabled(False)
            b.setToolTip(f"{name}: {what}. It {strategies.NEEDS_ROUTING}.")
            grid.addWidget(b, 2 + i // 2, i % 2)
            self.routing_buttons.append(b)
        self.predicted = QLabel("Predicted: - tokens/s")
        self.predicted.setObjectName("muted")
        self.predicted.setToolTip("Predictions need measured device rates (the engine's cost model, issue 7)")
        grid.addWidget(self.predicted, 3, 1, Qt.AlignmentFlag.AlignRight)
        outer.addWidget(box)
        for sig in (state.sigModelChanged, state.sigRoutingChanged, state.sigEngineChanged):
            sig.connect(self.refresh)
        self.refresh()

    @Slot()
    def refresh(self) -> None:
        m = self.state.model
        has_model = m is not None
        self.device_combo.clear()
        self.device_combo.addItems(self.state.device_names)
        if has_model:
            self.device_combo.setCurrentText(m.primary)
        self.single_button.setEnabled(has_model)
        self.uniform_button.setEnabled(has_model and len(self.state.devices) > 1)
        can_profile = has_model and self.state.routing_provider is not None
        self.profile_button.setEnabled(can_profile)
        self.profile_button.setToolTip(
            "Decode the run panel's prompts and count which experts each layer's router picks"
            if can_profile
            else "Open a model first"
        )
        shape = (m.config.num_layers, m.config.num_experts) if has_model else None
        if self.state.routing is not None:
            self.heatmap.set_counts(self.state.routing, shape)
        else:
            note = "No routing statistics yet:\nProfile routing or a run fills this map"
            self.heatmap.set_counts(None, shape, note if has_model else "No model loaded")

    @Slot()
    def profile(self) -> None:
        prompts = self.prompts_source() if self.prompts_source else []
        self.state.profile_routing(prompts)

    @Slot()
    def all_on(self) -> None:
        device = self.device_combo.currentText()
        if self.state.model and device:
            self.state.set_placement(strategies.all_on(self.state.model.config, device), f"all experts on {device}")

    @Slot()
    def uniform(self) -> None:
        if self.state.model is None:
            return
        try:
            placement = strategies.uniform_split(self.state.model.config, self.state.device_names)
        except (ValueError, EngineError) as exc:
            self.state.sigMessage.emit(str(exc))
            return
        self.state.set_placement(placement, "uniform split")
