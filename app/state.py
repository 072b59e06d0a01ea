"""The workbench state: the one object between the engine and the widgets.

Widgets read its plain fields (snapshots: devices, the placement being edited, bytes per device, run history)
and call its methods (intents: move these experts there, undo, start a run); it answers with signals. Engine
objects live on the engine thread only (`_EngineSide`), touched by tasks submitted to the EngineWorker; what
a task learns comes back as plain data and is stored here on the GUI thread.

What it stores is held by the Qt-free models of app/models (the placement edits, the devices, the run session, the
routing map, the calibrations); the state queues the engine's work for them and turns their events into its
signals, so the widgets listen to one object.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PySide6.QtCore import QObject, Signal

from engine.checkpoints.checkpoint import ModelConfig
from engine.checkpoints.demo import check_format, is_synthetic
from engine.core.errors import EngineError
from engine.devices import DeviceSettings
from engine.model import WEIGHTS_MODES, DeviceInfo, Engine, Model
from engine.placement import strategy
from engine.placement.costmodel import Calibration, ModelShape, predict_tokens_per_second
from engine.placement.placement import Placement, format_bytes, model_bytes
from engine.placement.routing import RoutingStats, profile
from engine.profiles.devices import differences, engine_for_profile
from engine.profiles.profile import Profile, fingerprint, load
from engine.runs.history import RunRecord, RunSettings, now
from engine.runs.quality import is_fast, quality_cost
from engine.runs.run import DecodeRun, RunResult
from engine.session import calibrate_devices, judge_run, open_pair

from . import profiles
from .models.calibration import Calibrations
from .models.devices import Devices
from .models.events import Note, Refusal
from .models.placement import PlacementEdits
from .models.routing import RoutingMap
from .models.run_session import RunSession, RunTrace
from .worker import EngineWorker


def default_engine(cpu_devices: int = 0, runtimes: tuple[str, ...] | None = None) -> Engine:
    """The window's engine (engine.devices.DeviceSettings.window): cpu plus every GPU runtime that loads; with no
    accelerator at all, a simulated one (hostsim), so that there is a second device to place experts on."""
    return DeviceSettings.window(cpu_devices, runtimes).open()


PROFILE_TOKENS = 32  # greedy tokens generated after each prompt when profiling routing


def profile_routing(model: Model, prompts: list[str]) -> RoutingStats:
    """engine.placement.routing's profiling pass over text prompts (runs on the engine thread)."""
    return profile(model, [model.encode(p) for p in prompts], tokens_per_prompt=PROFILE_TOKENS)


@dataclass
class ModelSnapshot:
    """What the GUI knows about the loaded pair (plain data, safe to read on the GUI thread)."""

    target_path: str
    draft_path: str | None
    config: ModelConfig
    primary: str
    synthetic: bool
    weight_bytes: int  # every weight of the target (the engine's info["weight_bytes"])
    all_expert_bytes: int  # the weights of all its experts (the engine's info["expert_bytes"])
    placement: Placement
    devices: list[DeviceInfo]
    shape: ModelShape  # what the cost model and the strategies know of the target
    draft_weight_bytes: int = 0
    demo: str | None = None  # the demo pair's size, when that is what was loaded
    demo_format: str = "safetensors"  # and its files' format (engine.checkpoints.demo.DEMO_FORMATS)
    demo_quant: str | None = None  # and, as GGUF, their quantization (engine.checkpoints.demo.QUANTS)
    fingerprint: str | None = None  # engine.profiles.profile.fingerprint of the target (None: unreadable)
    draft_fingerprint: str | None = None
    weights: str = "map"  # how the engine holds the target's files (engine.model.WEIGHTS_MODES, never "auto")
    file_bytes: int = 0  # the target's files
    huge_page_bytes: int = 0  # of a copy, what the kernel put on huge pages
    has_next_token_module: bool = False  # the target's checkpoint holds an MTP layer (a draft of its own: "self")


@dataclass(frozen=True)
class _DemoPair:
    size: str
    with_draft: bool = True
    format: str = "safetensors"
    quant: str | None = None


def _load_pair(engine: Engine, target, draft, primary: str, weights: str, demo: _DemoPair | None = None
               ) -> tuple[Model, Model | None, ModelSnapshot]:  # fmt: skip
    """Load a target (and a draft) on an engine (the engine thread's work): the models and what the GUI may know of
    them. Nothing stays loaded when this fails."""
    if demo is not None:
        from engine.checkpoints.demo import ensure_demo_pair

        built = ensure_demo_pair(demo.size, format=demo.format, quant=demo.quant)
        target, draft = built.target, (built.draft if demo.with_draft else None)
    pair = open_pair(engine, target, draft, device=primary, weights=weights, experts_needed=True)
    new_target, new_draft = pair.target, pair.draft
    try:
        info = new_target.info
        snapshot = ModelSnapshot(
            target_path=str(target),
            draft_path=None if draft is None else str(draft),
            config=new_target.config,
            primary=primary,
            synthetic=is_synthetic(new_target.checkpoint),
            weight_bytes=info["weight_bytes"],
            all_expert_bytes=info["expert_bytes"],
            placement=new_target.placement,
            devices=engine.devices,
            shape=ModelShape.from_model(new_target),
            draft_weight_bytes=0 if new_draft is None else new_draft.info["weight_bytes"],
            demo=None if demo is None else demo.size,
            demo_format="safetensors" if demo is None else demo.format,
            demo_quant=None if demo is None else demo.quant,
            fingerprint=_fingerprint(new_target),
            draft_fingerprint=None if new_draft is None else _fingerprint(new_draft),
            weights=info["weights"],
            file_bytes=info["file_bytes"],
            huge_page_bytes=info["huge_page_bytes"],
            has_next_token_module=new_target.checkpoint.has_next_token_module,
        )
    except BaseException:
        pair.close()
        raise
    return new_target, new_draft, snapshot


class _EngineSide:
    """Engine objects; read and written by tasks on the engine thread only."""

    def __init__(self):
        self.engine: Engine | None = None
        self.target: Model | None = None
        self.draft: Model | None = None
        self.applied: Placement | None = None
        self.run: DecodeRun | None = None


def _fingerprint(model: Model) -> str | None:
    try:
        return fingerprint(model.checkpoint.folder)
    except EngineError:
        return None


def _held(model: str, name: str, doc: str, settable: bool = False) -> property:
    """A field of one of the state's models (app/models), read (and set, where settable) as the state's own."""

    def get(self):
        return getattr(getattr(self, model), name)

    def put(self, value):
        setattr(getattr(self, model), name, value)

    return property(get, put if settable else None, doc=doc)


class WorkbenchState(QObject):
    sigEngineChanged = Signal()  # devices, load errors (runtimes that did not load): Devices' "engine"
    sigDevicesChanged = Signal()  # memory snapshot refreshed: Devices' "memory"
    sigModelChanged = Signal()  # a target (and draft) loaded
    sigPlacementChanged = Signal()  # the placement being edited changed
    sigPreviewChanged = Signal()  # a drag hovers over a device: bytes it would give
    sigApplyingChanged = Signal(bool)
    sigPlacementApplied = Signal()  # the engine now has the edited placement
    sigUndoChanged = Signal()
    sigDirtyChanged = Signal(bool)
    sigPathChanged = Signal()
    sigMessage = Signal(str)  # a short note for the status bar (a refused drop, a saved file)
    sigRefused = Signal(str, str)  # an edit refused: its reason (app.models.placement.Refusal) and text
    sigError = Signal(str, str)  # title, text: an engine call failed; the window shows a dialog
    sigBusyChanged = Signal(str)  # what the engine thread is doing, "" when idle
    sigRunStarted = Signal()  # RunSession's "started"
    sigRunFinished = Signal(object)  # RunRecord (None: the run failed): RunSession's "finished"
    sigHistoryChanged = Signal()  # RunSession's "history"
    sigRoutingChanged = Signal()
    sigCalibrationChanged = Signal()  # measuring started or ended; the cost model's figures changed: Calibrations'

    # What the models hold, read as the state's own fields (the panels read these)
    devices = _held("hardware", "devices", "The engine's devices (DeviceInfo), as it listed them last")
    load_errors = _held("hardware", "load_errors", "The runtimes the engine could not load: runtime -> why")
    device_names = _held("hardware", "names", "The engine's devices' names")
    capacity = _held("hardware", "capacity", "Bytes of experts each device can hold for this model (free + held)")
    rooms = _held("edits", "rooms", "engine.placement.placement's ExpertRoom per device: free, held, reserve")
    saved_placement = _held("edits", "saved", "The placement as the profile file has it (dirty: the edited one "
                            "differs)", settable=True)  # fmt: skip
    used_bytes = _held("edits", "used_bytes", "Expert bytes on each device under the edited placement")
    preview = _held("edits", "preview", "Expert bytes on each device under the move a drag hovers (None: no hover)")
    preview_device = _held("edits", "preview_device", "The device a drag hovers")
    preview_ok = _held("edits", "preview_ok", "Whether the hovered move fits")
    undo_text = _held("edits", "undo_text", "The label of the edit undo undoes")
    redo_text = _held("edits", "redo_text", "The label of the edit redo redoes")
    dirty = _held("edits", "dirty", "Whether the edited placement differs from the saved one")
    running = _held("session", "running", "Whether a run decodes", settable=True)
    live = _held("session", "live", "What the live plots and the timeline read while a run decodes (app.live)")
    trace_runs = _held("session", "trace_runs", "Whether runs record the per-token trace (engine.core.trace; the "
                       "timeline turns it on while it is open)", settable=True)  # fmt: skip
    last_trace = _held("session", "last_trace", "The last run's RunTrace, when it was traced")
    runs = _held("session", "runs", "The loaded model's runs (engine.runs.history.History)")
    history = _held("session", "history", "The loaded model's runs, oldest first (those of earlier sessions too)")
    keep_history = _held("session", "keep_history", "Whether runs are kept across restarts (a model with a "
                         "fingerprint only)", settable=True)  # fmt: skip
    routing = _held("routing_map", "counts", "Hits [layers, experts] the map shows (None: none yet)")
    routing_stats = _held("routing_map", "stats", "The routing statistics (RoutingStats; None: none yet)")
    routing_tokens = _held("routing_map", "tokens", "Tokens per MoE layer the statistics count")
    routing_origin = _held("routing_map", "origin", "Where they come from (app.models.routing.ORIGINS)")
    routing_runs = _held("routing_map", "runs", "Which runs of the history they count (first, last), when they do")
    calibration = _held("calibrations", "figures", "The cost model's figures for the loaded model and devices (None "
                        "until measured)")  # fmt: skip
    calibrating = _held("calibrations", "measuring", "Whether the devices are being measured")

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.worker = EngineWorker(self)
        self.worker.sigBusyChanged.connect(self.sigBusyChanged)
        self.worker.sigTaskFailed.connect(lambda task, exc: self._fail(f"{task.label} failed", exc))
        self._side = _EngineSide()
        self._run_lock = threading.Lock()
        self._stop = threading.Event()
        # snapshots: the engine's devices, their memory and rooms (Qt-free: app/models), the loaded pair
        self.hardware = Devices()
        self.hardware.on("engine", self.sigEngineChanged.emit)
        self.hardware.on("memory", self._memory_refreshed)
        self.model: ModelSnapshot | None = None
        # the placement as edited, with undo, the drag's preview and the bytes per device (Qt-free: app/models)
        self.edits = PlacementEdits()
        self.edits.on("changed", self._placement_edited)
        self.edits.on("preview", self.sigPreviewChanged.emit)
        self.applied: Placement | None = None  # as the engine has it
        self._applies = 0  # apply tasks queued and not yet finished
        self._wanted: Placement | None = None
        self.profile_path: Path | None = None  # the profile file the placement was opened from or saved to
        self.profile: Profile | None = None  # that profile (what a save keeps from it: app.profiles)
        self.weights = "auto"  # how the next model opened is to be held (engine.model.WEIGHTS_MODES)
        # the runs: running, the live buffer, the trace, the loaded model's history (Qt-free: app/models)
        self.session = RunSession()
        self.session.on("started", self.sigRunStarted.emit)
        self.session.on("finished", self.sigRunFinished.emit)
        self.session.on("history", self.sigHistoryChanged.emit)
        self.session.on("note", self._noted)
        # the routing statistics the map shows, and what the engine's counters hold (Qt-free: app/models)
        self.routing_map = RoutingMap()
        self.routing_map.on_change(self.sigRoutingChanged.emit)
        # (model, prompts) -> RoutingStats or a hits array; replaceable (tests inject their own)
        self.routing_provider: Callable[[Model, list[str]], RoutingStats | np.ndarray] = profile_routing
        # the cost model's figures for the loaded model and devices (None until measured), and every set measured
        # (Qt-free: app/models)
        self.calibrations = Calibrations()
        self.calibrations.on("changed", self.sigCalibrationChanged.emit)
        # (model, device names) -> Calibration on the engine thread; replaceable (tests inject fixed figures)
        self.calibration_provider: Callable[[Model, list[str]], Calibration] = calibrate_devices

    # ---- engine and models -------------------------------------------------------------------------------

    def _fail(self, title: str, exc: BaseException) -> None:
        self.sigError.emit(title, str(exc) or type(exc).__name__)

    def _noted(self, note: Note) -> None:
        self.sigMessage.emit(note.text)

    @property
    def busy(self) -> bool:
        return self.worker.busy

    def open_engine(self, factory: Callable[[], Engine] = default_engine) -> None:
        """Create the engine (loading runtime modules) on the engine thread; closes a previous one."""
        side = self._side

        def task():
            if side.engine is not None:
                side.engine.close()
                side.engine = side.target = side.draft = None
            side.engine = factory()
            return side.engine.devices, dict(side.engine.load_errors)

        def done(result):
            self.model = self.applied = None
            self.edits.reset(None)
            self.hardware.opened(*result)  # sigEngineChanged
            self.sigModelChanged.emit()
            self.sigPlacementChanged.emit()

        self.worker.submit(task, done, lambda exc: self._fail("The engine could not start", exc), "starting engine")

    def load_models(self, target, draft=None, primary: str = "cpu:0", demo: str | None = None,
                    demo_draft: bool = True, demo_format: str = "safetensors", demo_quant: str | None = None
                    ) -> None:  # fmt: skip
        """Load a target (and a draft) on the engine thread; the previous pair stays loaded if this fails.

        demo: a demo size ("default") to build or find in the cache and load instead of target/draft, as
        safetensors folders (demo_format "safetensors", bf16) or GGUF files (demo_format "gguf", quantized as
        demo_quant: "q8_0", the default, or "mxfp4").
        """
        side, weights = self._side, self.weights
        if demo is not None:
            demo_quant = check_format(demo_format, demo_quant)  # ArgumentError here, before anything is queued

        def task():
            if side.engine is None:
                raise EngineError("the engine is not running")
            pair = _DemoPair(demo, demo_draft, demo_format, demo_quant) if demo is not None else None
            new_target, new_draft, snapshot = _load_pair(side.engine, target, draft, primary, weights, pair)
            for old in (side.target, side.draft):
                if old is not None:
                    old.close()
            side.target, side.draft = new_target, new_draft
            side.applied = snapshot.placement
            return snapshot

        if demo is None:
            label = f"loading {Path(str(target)).name}"
        else:
            label = "loading the demo model pair" + (f" (GGUF {demo_quant})" if demo_format == "gguf" else "")
        self.worker.submit(task, self._models_loaded, lambda exc: self._fail("The model could not be loaded", exc),
                           label)  # fmt: skip

    def _models_loaded(self, snapshot: ModelSnapshot) -> None:
        self.model = snapshot
        self.edits.reset(snapshot.placement, snapshot.shape.bytes_of, snapshot.config.num_experts)
        self.applied = snapshot.placement.copy()
        self._wanted = snapshot.placement.copy()
        self.profile_path = self.profile = None
        self.routing_map.clear()  # the previous model's routing no more; a model's counters start at zero
        self._set_devices(snapshot.devices)
        # its runs (sigHistoryChanged); the live plots and the timeline show the previous model's last run no more
        self._load_history()
        self.calibrations.select(self.calibration_key())
        self.sigModelChanged.emit()
        self.sigPlacementChanged.emit()
        self.sigUndoChanged.emit()
        self.sigDirtyChanged.emit(False)
        self.sigPathChanged.emit()
        self.sigRoutingChanged.emit()
        self.sigCalibrationChanged.emit()

    def _set_devices(self, devices: list[DeviceInfo]) -> None:
        """A memory snapshot: the rooms follow from the expert bytes the applied placement holds on each device."""
        names = [d.name for d in devices]
        self.hardware.refresh(devices, self.edits.bytes_on(self.applied, names) if self.applied is not None else {})

    def _memory_refreshed(self) -> None:
        self.edits.set_rooms(self.hardware.names, self.hardware.rooms)
        self.sigDevicesChanged.emit()

    # ---- bytes -------------------------------------------------------------------------------------------

    @property
    def placement(self) -> Placement | None:
        """The placement as edited (the engine applies it on its thread: `applied`)."""
        return self.edits.placement

    @placement.setter
    def placement(self, placement: Placement | None) -> None:
        self.edits.set(placement)

    def bytes_on(self, placement: Placement | None) -> dict[str, int]:
        """Expert bytes each device holds under a placement (the engine's figures: engine.placement.strategy)."""
        return self.edits.bytes_on(placement)

    def model_bytes_on(self, device: str) -> int:
        """Bytes of this model on a device: its experts there, plus every other weight on the primary."""
        m = self.model
        if m is None:
            return 0
        return model_bytes(device, m.primary, self.used_bytes.get(device, 0), m.weight_bytes, m.all_expert_bytes,
                           m.draft_weight_bytes)  # fmt: skip

    # ---- editing -----------------------------------------------------------------------------------------

    def preview_move(self, moves: dict[int, list[int]], device: str) -> bool:
        """Show what the bars would read after a move (while a drag hovers); True when it would fit."""
        return self.edits.preview_move(moves, device)

    def clear_preview(self) -> None:
        self.edits.clear_preview()

    def move(self, moves: dict[int, list[int]], device: str, label: str | None = None) -> bool:
        """Move experts ({layer: [expert, ...]}) to a device. Refused (False, with a message) when it would
        overflow a device; otherwise recorded for undo and applied to the engine on its thread."""
        done = self.edits.move(moves, device, label)
        return self._said(done, "Nothing moved: ")

    def set_placement(self, placement: Placement, label: str = "set placement") -> bool:
        """Replace the whole placement (a strategy, a file); refused like a move when it would overflow."""
        return self._said(self.edits.replace(placement, label))

    def _said(self, done: str | Refusal, prefix: str = "") -> bool:
        """An edit's outcome told: its label in the status bar, or its refusal (a dialog for an unknown device)."""
        if isinstance(done, Refusal):
            if done.reason == "unknown-device":
                self.sigError.emit("Unknown device", done.text)
            else:
                self.sigMessage.emit(prefix + done.text if done.reason in ("no-model", "invalid-move") else done.text)
            self.sigRefused.emit(done.reason, done.text)
            return False
        self.sigMessage.emit(done[0].upper() + done[1:])
        return True

    def _placement_edited(self) -> None:
        self.sigPlacementChanged.emit()
        self.sigUndoChanged.emit()
        self.sigDirtyChanged.emit(self.dirty)
        self._request_apply()

    def undo(self) -> None:
        self.edits.undo()

    def redo(self) -> None:
        self.edits.redo()

    # ---- applying ----------------------------------------------------------------------------------------

    @property
    def applying(self) -> bool:
        return self._applies > 0

    def _request_apply(self) -> None:
        """Queue an apply on the engine thread, in order with runs and other engine calls.

        Each queued task applies the latest edited placement when it runs (`_wanted`), so a burst of edits
        costs one engine call, and a run started after an edit always decodes with it.
        """
        if self.placement is None:
            return
        self._wanted = self.placement.copy()
        self._applies += 1
        if self._applies == 1:
            self.sigApplyingChanged.emit(True)
        side = self._side

        def task():
            wanted = self._wanted  # one reference read: the GUI thread only ever replaces it
            if side.target is None or wanted == side.applied:
                return None
            side.target.set_placement(wanted)
            side.applied = side.target.placement
            return side.applied, side.engine.devices

        def done(result):
            self._applies -= 1
            if result is not None:
                self.applied, devices = result
                self._set_devices(devices)
            if self._applies == 0:
                self.sigApplyingChanged.emit(False)
                self.sigPlacementApplied.emit()

        def failed(exc):
            # The engine kept its previous placement: show that one again, and forget the edits it refused.
            self._applies -= 1
            self.edits.refused_since(self.applied)
            self._wanted = self.applied.copy()
            if self._applies == 0:
                self.sigApplyingChanged.emit(False)
            self.sigPlacementChanged.emit()
            self.sigUndoChanged.emit()
            self.sigDirtyChanged.emit(self.dirty)
            self._fail("The engine refused the placement", exc)

        label = "applying placement (waits for the run to end)" if self.running else "applying placement"
        self.worker.submit(task, done, failed, label)

    # ---- files -------------------------------------------------------------------------------------------

    def save_profile(self, path: str | Path, settings: RunSettings | None = None) -> bool:
        """Write the placement, with the model, devices, run settings and routing, as a profile (engine.profiles)."""
        if self.placement is None or self.model is None:
            return False
        try:
            profile = profiles.build(path, self.model, self.placement, settings, self.routing_stats, self.history,
                                     self.profile)  # fmt: skip
            profile.save(path)
        except (EngineError, OSError) as exc:
            text = f"'{path}': {exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)
            self.sigError.emit("The profile could not be saved", text)
            return False
        self.profile = profile
        self.saved_placement = self.placement.copy()
        self.profile_path = Path(path)
        self.sigDirtyChanged.emit(False)
        self.sigPathChanged.emit()
        unchecked = "" if profile.expectations.output_sha256 else " (no run of these settings yet: `expertbench " \
            "regress --record` records what it must give)"  # fmt: skip
        self.sigMessage.emit(f"Saved {path}{unchecked}")
        return True

    def set_weights(self, mode: str) -> None:
        """How the next model opened is held (engine.model.WEIGHTS_MODES); the loaded pair stays as it is."""
        if mode not in WEIGHTS_MODES:
            raise ValueError(f"weights mode {mode!r}: expected one of {', '.join(WEIGHTS_MODES)}")
        if mode == self.weights:
            return
        self.weights = mode
        if self.model is not None:
            self.sigMessage.emit(f"Weights '{mode}' from the next model opened (the loaded one is held as "
                                 f"'{self.model.weights}')")  # fmt: skip

    def open_profile(self, path: str | Path) -> Profile | None:
        """Read a profile (engine.profiles.profile: file:line errors) and put its placement and routing in the editor.
        Refused, with the engine's error in a dialog, when it was made for another model or does not fit it.

        When the open engine lacks what the profile's `devices:` section asks for (a device, a memory cap, a thread
        count), the engine is made again with the profile's devices (engine.devices; the GPU runtimes loaded now
        stay) and the pair reloaded on it, then the placement applied; a devices entry this machine cannot provide
        is refused at its file:line, with a hint, and the open engine stays."""
        if self.model is None:
            self.sigMessage.emit("Open a model first")
            return None
        try:
            profile = load(path)
            placement = profiles.placement_for(profile, self.model)
            routing = profile.routing_stats()
        except EngineError as exc:
            self.sigError.emit("The profile could not be opened", str(exc))
            return None
        lacking = differences(profile, self.devices)
        if lacking:
            self._open_devices(profile, Path(path), placement, routing, lacking)
            return profile
        return profile if self._apply_profile(profile, Path(path), placement, routing) else None

    def _open_devices(self, profile: Profile, path: Path, placement: Placement, routing, lacking: list[str]) -> None:
        """Make the engine again with the profile's devices, reload the pair on it, then apply the profile."""
        m, side, weights = self.model, self._side, self.weights
        named = set(profile.device_specs)
        keep = tuple(sorted({d.name.partition(":")[0] for d in self.devices} - named - {"cpu", "hostsim"}))
        primary = profile.primary_device if profile.primary is not None else m.primary
        demo = _DemoPair(m.demo, m.draft_path is not None, m.demo_format, m.demo_quant) if m.demo else None

        def task():
            engine = engine_for_profile(profile, also=keep)  # ProfileError at the entry it cannot provide
            try:
                target, draft, snapshot = _load_pair(engine, m.target_path, m.draft_path, primary, weights, demo)
            except BaseException:
                engine.close()
                raise
            if side.engine is not None:
                side.engine.close()
            side.engine, side.target, side.draft = engine, target, draft
            side.applied = snapshot.placement
            return engine.devices, dict(engine.load_errors), snapshot

        def done(result):
            devices, load_errors, snapshot = result
            self.hardware.opened(devices, load_errors)  # sigEngineChanged
            self._models_loaded(snapshot)
            self.sigMessage.emit(f"Opened the devices {path.name} asks for ({'; '.join(lacking)})")
            self._apply_profile(profile, path, placement, routing)

        def failed(exc):
            self._fail(f"The devices {path.name} asks for are not available", exc)

        self.worker.submit(task, done, failed, f"opening the devices {path.name} asks for")

    def _apply_profile(self, profile: Profile, path: Path, placement: Placement, routing) -> bool:
        if placement != self.placement and not self.set_placement(placement, f"open {path.name}"):
            return False
        wanted = profile.run.weights
        if wanted not in (None, "auto") and wanted != self.model.weights:
            held = self.model.weights
            self.sigMessage.emit(f"The profile's run.weights is '{wanted}': `expertbench regress` loads the model so; "
                                 f"here it is held as '{held}' (the same bits; File > Hold weights as, then reopen "
                                 "the model, to match)")  # fmt: skip
        if routing is not None:
            try:
                self.set_routing(routing, "profile")
            except ValueError as exc:
                self.sigMessage.emit(f"The profile's routing statistics were not used: {exc}")
        self.profile = profile
        self.saved_placement = placement.copy()
        self.profile_path = path
        self.sigDirtyChanged.emit(self.dirty)
        self.sigPathChanged.emit()
        return True

    # ---- runs --------------------------------------------------------------------------------------------

    @property
    def has_draft(self) -> bool:
        return self.model is not None and self.model.draft_path is not None

    def submit_with_models(self, fn: Callable[[Model | None, Model | None], object], on_done=None, on_error=None,
                           label: str = "working") -> None:  # fmt: skip
        """Run fn(target, draft) on the engine thread, after what is queued there, with the loaded models (None where
        none is loaded); on_done(result) or on_error(exc) then run on the GUI thread. For engine work of a panel's
        own (the Tune panel's tuning): fn is the only code that may touch the models, and only while it runs."""
        side = self._side
        self.worker.submit(lambda: fn(side.target, side.draft), on_done, on_error, label)

    def start_run(self, settings: RunSettings) -> bool:
        """Start a decode run on the engine thread (after any pending placement); False if one is running."""
        side, stop, lock = self._side, self._stop, self._run_lock
        use_draft = settings.use_draft and self.has_draft
        started = now()
        predicted = self.predicted_tokens_per_second()  # the edited placement is the one the run decodes with
        m, runs, trace, live = self.model, self.runs, self.trace_runs, self.live

        def task():
            run = DecodeRun(side.target, side.draft if use_draft else None, prompts=list(settings.prompts),
                            tokens_per_prompt=settings.tokens, repeats=settings.repeats, q=settings.q,
                            mode=settings.mode, precision=settings.precision, kv=settings.kv,
                            on_event=live.append, trace=trace)  # fmt: skip
            with lock:
                side.run = run
            if stop.is_set():
                run.cancel()
            try:
                result = run.run()
            finally:
                with lock:
                    side.run = None
            # Why the output changed, if it did, while the model is at hand (the reference's logits re-computed where
            # its settings are the model's now): engine.session's judgement, as `expertbench run` reports it
            judged = judge_run(runs, result, settings.prompts, m.fingerprint or m.target_path, side.target,
                               run.prompt_ids)  # fmt: skip
            # The core counts every routed pair while decoding (since load or the last profiling pass); the quality
            # measurement below is not counted.
            routing = RoutingStats.from_model(side.target)
            cost = None
            fast = is_fast(settings.mode, settings.precision, kv=settings.kv)
            if fast and not result.cancelled and not stop.is_set():
                cost = quality_cost(side.target, prompts=list(settings.prompts), tokens=settings.tokens,
                                    mode=settings.mode, precision=settings.precision, fast_result=result,
                                    kv=settings.kv)  # fmt: skip
            return result, routing, judged.diagnosis, cost, (run.spans if trace else None)

        def done(result):
            gc.unfreeze()
            result, routing, diagnosis, cost, spans = result
            run_trace = None
            if spans is not None:
                meta = {"run": self.runs.next_index, "target": m.target_path, "draft": m.draft_path if use_draft
                        else None, "target_device": m.primary, "mode": settings.mode, "precision": settings.precision,
                        "placement": result.placement, "q": settings.q if use_draft else None}  # fmt: skip
                meta.update(trace_lost=result.trace_lost, trace_dropped=result.trace_dropped)
                run_trace = RunTrace(meta["run"], spans, meta, result.trace_lost, result.trace_dropped)
            record = self._record(result, settings, started, predicted, diagnosis, cost, run_trace)
            self._after_run(record.index, routing)

        def failed(exc):
            gc.unfreeze()
            self.session.failed()  # sigRunFinished(None)
            self._fail("The run failed", exc)

        def launch():
            # While the run decodes, the collector's full passes walk only what the run makes: a pass over every
            # object of the window (100 000 and more) holds the GIL for 50-100 ms, and the GUI thread would stall that
            # long. Frozen here, after everything before it that may raise; done or failed thaws them.
            stop.clear()
            gc.freeze()
            self.worker.submit(task, done, failed, "decoding")

        # refused (app.models.run_session.REFUSALS) while a run is under way or with no model; sigRunStarted
        return self.session.start(settings.total_tokens, self.model is not None, launch) is None

    def stop_run(self) -> None:
        """Cancel the run at its next step (thread-safe: no engine call here)."""
        self._stop.set()
        with self._run_lock:
            if self._side.run is not None:
                self._side.run.cancel()

    def _record(self, result: RunResult, settings: RunSettings, started: str, predicted: float | None,
                diagnosis=None, cost=None, trace: RunTrace | None = None) -> RunRecord:  # fmt: skip
        """The run in the history, with why its output changed (a Diagnosis) and its fast mode's quality cost (a
        QualityCost) where there are (app.models.run_session.RunSession.finish: sigHistoryChanged, sigRunFinished,
        the notes in the status bar)."""
        m = self.model
        record = RunRecord.of_run(result, settings, m.target_path, m.draft_path, started, predicted, m.fingerprint)
        record.diagnosis = None if diagnosis is None else diagnosis.to_dict()
        record.quality = None if cost is None else cost.to_dict()
        self.session.finish(record, trace)
        return record

    def clear_history(self) -> None:
        """Forget the loaded model's runs, in the user's data folder too."""
        self.session.clear_history()

    def _load_history(self) -> None:
        """The loaded model's runs kept from earlier sessions (engine.runs.history); a damaged one is skipped."""
        self.session.open(self.model.fingerprint if self.model is not None else None)

    # ---- routing -----------------------------------------------------------------------------------------

    def _routing_shape(self) -> tuple[int, int] | None:
        cfg = self.model.config if self.model else None
        return None if cfg is None else (cfg.num_layers, cfg.num_experts)

    def set_routing(self, counts: RoutingStats | np.ndarray | None, origin: str = "given",
                    runs: tuple[int, int] | None = None) -> None:  # fmt: skip
        """Per-layer, per-expert hit counts ([num_layers, num_experts]) for the heat map and the chips
        (app.models.routing.RoutingMap.set: a ValueError for another shape)."""
        top_k = self.model.config.top_k if self.model else 0
        self.routing_map.set(counts, self._routing_shape(), top_k, origin, runs)

    def _counted(self, runs: tuple[int, int] | None, profiled: bool) -> None:
        """What the engine's routing counters hold now: the runs (first, last) since they were reset or a profiling
        pass, and whether a profiling pass is in them. Calibrations never count (engine.placement.costmodel pauses the
        counting: Model.routing_paused)."""
        self.routing_map.counted(runs, profiled)

    def _after_run(self, index: int, routing: RoutingStats) -> None:
        self.routing_map.after_run(index, routing, self._routing_shape())

    def reset_routing(self) -> None:
        """Forget the routing statistics: the engine's counters (on the engine thread), then the map's."""
        if self.model is None:
            return
        side = self._side

        def done(_result):
            self._counted(None, False)
            self.set_routing(None)

        failed = lambda exc: self._fail("The routing statistics could not be reset", exc)  # noqa: E731
        self.worker.submit(lambda: side.target.reset_routing(), done, failed, "resetting routing")

    def profile_routing(self, prompts: list[str]) -> bool:
        """Count expert hits over prompts with the provider (engine.placement.routing's profiling pass unless replaced:
        it resets the engine's counters first, so runs before it no longer count)."""
        if self.model is None:
            self.sigMessage.emit("Open a model first")
            return False
        provider, side = self.routing_provider, self._side

        def done(stats):
            self._counted(None, True)
            self.set_routing(stats, "profiling")

        failed = lambda exc: self._fail("Routing could not be profiled", exc)  # noqa: E731
        self.worker.submit(lambda: provider(side.target, list(prompts)), done, failed, "profiling routing")
        return True

    def expert_heat(self) -> np.ndarray | None:
        """Each expert's hits relative to the hottest expert of its layer (0..1; computed when routing is set)."""
        return self.routing_map.heat

    # ---- cost model and strategies ----------------------------------------------------------------------

    def calibration_key(self) -> tuple | None:
        """What a calibration holds for: the model, its primary device and the engine's devices."""
        if self.model is None:
            return None
        return self.model.fingerprint or self.model.target_path, self.model.primary, tuple(self.device_names)

    def calibrate(self, then: Callable[[], None] | None = None) -> bool:
        """Have the cost model's figures for this model and these devices: measured once on the engine thread
        (sigCalibrationChanged when it starts and ends), then kept. `then` runs once they are there (at once
        when they already are); False when there is no model."""
        return self.calibrations.ensure(self.calibration_key(), then, self._measure) is None

    def _measure(self, key: tuple) -> None:
        """Queue the measurement of the devices for the model loaded now (its calibration key: key)."""
        provider, side, devices = self.calibration_provider, self._side, list(self.device_names)

        def done(calibration: Calibration):
            # another model may have been loaded meanwhile: the figures are kept for key, that one's measured if asked
            self.calibrations.measured(key, calibration, self.calibration_key())

        def failed(exc):
            self.calibrations.failed()
            self._fail("The devices could not be measured", exc)

        label = "measuring the devices for the cost model" + (" (after the run)" if self.running else "")
        self.worker.submit(lambda: provider(side.target, devices), done, failed, label)

    def predicted_tokens_per_second(self, placement: Placement | None = None) -> float | None:
        """The cost model's decode tokens/s for a placement (the edited one by default), weighted by the
        routing statistics when there are some; None until the devices are measured."""
        placement = placement or self.placement
        if self.calibration is None or self.model is None or placement is None:
            return None
        try:
            return predict_tokens_per_second(self.model.shape, placement, self.calibration, self.routing_stats)
        except EngineError:
            return None

    def apply_strategy(self, name: str, fast: str, fast_budget: int | None = None) -> bool:
        """Fill the editor with a strategy of engine.placement.strategy.STRATEGIES (one undoable edit), chosen by
        engine.placement.strategy.choose: the fast device holds at most fast_budget bytes of experts, every device at
        most its room for experts. Measures the devices first when that has not been done (the edit then comes when the
        measurement ends)."""
        if self.model is None:
            return False
        info = strategy.check_name(name)
        if info.ranks and self.routing_stats is None:
            self.sigMessage.emit(f"{info.title} needs routing statistics: profile routing or make a run first")
            return False
        if self.calibration is None:
            return self.calibrate(lambda: self.apply_strategy(name, fast, fast_budget))
        caps = {fast: fast_budget} if fast_budget is not None else None
        try:
            plan = strategy.choose(name, self.model.shape, self.device_names, self.model.primary, fast, self.rooms,
                                   self.calibration, self.routing_stats, caps)  # fmt: skip
        except EngineError as exc:
            self.sigMessage.emit(str(exc))
            return False
        budget = strategy.budgets_for(self.rooms, caps).get(fast)
        label = plan.strategy + ("" if budget is None else f", {fast} up to {format_bytes(budget)}")
        if not self.set_placement(plan.placement, label):
            return False
        if plan.notes:
            self.sigMessage.emit(f"{label[0].upper()}{label[1:]}: {'; '.join(plan.notes)}")
        return True

    # ---- shutdown ----------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Cancel any run, then close the engine on its thread and stop the thread."""
        self.stop_run()
        side = self._side

        def close():
            if side.engine is not None:
                side.engine.close()
            side.engine = side.target = side.draft = None

        self.worker.shutdown(close)
