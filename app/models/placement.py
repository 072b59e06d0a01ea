"""The placement as the user edits it: moves and whole replacements with undo and redo, the preview while a drag
hovers over a device, the expert bytes each device holds, and whether it differs from the saved one.

Qt-free: a listener is a plain callable (`on("changed", fn)`); a refused edit is a Refusal (why, and the text the
window shows), never a matched string.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.placement.placement import Placement, PlacementRefused, check_fits, device_bytes, moved, overflow

from .events import Listeners, Refusal

EVENTS = ("changed", "preview")  # changed: the edited placement (and so undo, redo, dirty); preview: a hover's bytes
# Why an edit is refused (Refusal.reason): 'invalid-move' when the move names no expert, a dense layer or an unknown
# device; 'overflow' when a device would hold more than its room
REFUSALS = ("no-model", "unchanged", "unknown-device", "invalid-move", "overflow")


@dataclass
class Edit:
    label: str
    before: Placement
    after: Placement


@dataclass
class PlacementEdits:
    """The edited placement of the loaded model. bytes_of and rooms (engine.placement.placement.ExpertRoom per
    device) come with the model and the devices (reset, set_rooms). bytes_of(layer): one expert's bytes there."""

    placement: Placement | None = None
    saved: Placement | None = None  # as the profile file has it (dirty: the edited one differs)
    device_names: list[str] = field(default_factory=list)
    rooms: dict = field(default_factory=dict)
    num_experts: int = 0
    bytes_of: Callable[[int], int] | None = None  # one expert's bytes in a layer
    used_bytes: dict[str, int] = field(default_factory=dict)  # under the edited placement
    preview: dict[str, int] | None = None  # under the hovered move (None: no hover)
    preview_device: str | None = None
    preview_ok: bool = True
    undo_stack: list[Edit] = field(default_factory=list)
    redo_stack: list[Edit] = field(default_factory=list)
    _preview_key: tuple | None = None  # the hover the preview shows, and what preview_move answered
    _listeners: Listeners = field(default_factory=lambda: Listeners(EVENTS))

    def on(self, event: str, fn: Callable[[], None]) -> None:
        self._listeners.on(event, fn)

    def _emit(self, event: str) -> None:
        self._listeners.emit(event)

    # ---- the model and the devices ----------------------------------------------------------------------

    def reset(self, placement: Placement | None, bytes_of=None, num_experts: int = 0) -> None:
        """A new model (None: none): its placement as loaded, saved as is; no undo history."""
        self.bytes_of, self.num_experts = bytes_of, num_experts
        self.undo_stack.clear()
        self.redo_stack.clear()
        self.saved = None if placement is None else placement.copy()
        self.set(None if placement is None else placement.copy())

    def set(self, placement: Placement | None) -> None:
        """The edited placement replaced outside the undo history (the engine refused the edits since `placement`);
        the bytes per device counted once here, not on each repaint."""
        self.placement = placement
        self.used_bytes = self.bytes_on(placement)
        self._preview_key = None

    def set_rooms(self, device_names: list[str], rooms: dict) -> None:
        self.device_names, self.rooms = list(device_names), rooms
        self.used_bytes = self.bytes_on(self.placement)
        self._preview_key = None  # the room changed: a hover over the same device is judged again

    def bytes_on(self, placement: Placement | None, device_names: list[str] | None = None) -> dict[str, int]:
        """Expert bytes each device (of device_names, else the model's devices) holds under a placement (the
        engine's figures: engine.placement.strategy)."""
        names = self.device_names if device_names is None else device_names
        if self.bytes_of is None:
            return dict.fromkeys(names, 0)
        return device_bytes(placement, self.bytes_of, names)

    @property
    def dirty(self) -> bool:
        return self.placement is not None and self.placement != self.saved

    # ---- editing ----------------------------------------------------------------------------------------

    def _moved(self, moves: dict[int, list[int]], device: str) -> Placement | Refusal:
        if self.placement is None or self.bytes_of is None:
            return Refusal("no-model", "no model is loaded")
        try:
            return moved(self.placement, moves, device, self.device_names)
        except PlacementRefused as exc:
            return Refusal("invalid-move", str(exc))

    def preview_move(self, moves: dict[int, list[int]], device: str) -> bool:
        """What the bars would read after a move (while a drag hovers); True when it would fit. A drag reports every
        mouse move: the same hover as last time is answered without counting again."""
        key = (device, tuple((layer, tuple(experts)) for layer, experts in sorted(moves.items())))
        if self._preview_key is not None and self._preview_key[0] == key:
            return self._preview_key[1]
        new = self._moved(moves, device)
        if isinstance(new, Refusal):
            self.clear_preview()
            ok = False
        else:
            self.preview = self.bytes_on(new)
            self.preview_device = device
            self.preview_ok = ok = not overflow(self.used_bytes, self.preview, self.rooms)
            self._emit("preview")
        self._preview_key = key, ok
        return ok

    def clear_preview(self) -> None:
        self._preview_key = None
        if self.preview is not None:
            self.preview = self.preview_device = None
            self.preview_ok = True
            self._emit("preview")

    def move(self, moves: dict[int, list[int]], device: str, label: str | None = None) -> str | Refusal:
        """Move experts ({layer: [expert, ...]}) to a device: the edit's label, or the Refusal (a move that would
        overflow a device, or names what the model does not have)."""
        self.clear_preview()
        new = self._moved(moves, device)
        if isinstance(new, Refusal):
            return new
        try:
            check_fits(self.placement, new, self.bytes_of, self.rooms, "move")
        except PlacementRefused as exc:
            return Refusal("overflow", str(exc))
        if label is None:
            whole = [layer for layer, ex in moves.items() if len(ex) == self.num_experts]
            if len(moves) == len(whole):
                label = f"move layer{'s' if len(whole) > 1 else ''} {', '.join(map(str, sorted(whole)))} to {device}"
            else:
                n = sum(len(ex) for ex in moves.values())
                label = f"move {n} expert{'s' if n > 1 else ''} to {device}"
        self._commit(new, label)
        return label

    def replace(self, placement: Placement, label: str = "set placement") -> str | Refusal:
        """Replace the whole placement (a strategy, a file): the label, or the Refusal, as for a move."""
        if self.placement is None:
            return Refusal("no-model", "No model is loaded")
        if placement == self.placement:
            return Refusal("unchanged", "The placement is already so")
        unknown = sorted(set(placement.devices()) - set(self.device_names))
        if unknown:
            return Refusal("unknown-device", f"the placement names {', '.join(unknown)}, which this engine does not "
                                             f"have (devices: {', '.join(self.device_names)})")  # fmt: skip
        try:
            check_fits(self.placement, placement, self.bytes_of, self.rooms)
        except PlacementRefused as exc:
            return Refusal("overflow", str(exc))
        self._commit(placement.copy(), label)
        return label

    def _commit(self, new: Placement, label: str) -> None:
        self.undo_stack.append(Edit(label, self.placement.copy(), new.copy()))
        self.redo_stack.clear()
        self._edit(new)

    def _edit(self, new: Placement) -> None:
        self.set(new)
        self._emit("changed")

    @property
    def undo_text(self) -> str:
        return self.undo_stack[-1].label if self.undo_stack else ""

    @property
    def redo_text(self) -> str:
        return self.redo_stack[-1].label if self.redo_stack else ""

    def undo(self) -> bool:
        if not self.undo_stack:
            return False
        edit = self.undo_stack.pop()
        self.redo_stack.append(edit)
        self._edit(edit.before.copy())
        return True

    def redo(self) -> bool:
        if not self.redo_stack:
            return False
        edit = self.redo_stack.pop()
        self.undo_stack.append(edit)
        self._edit(edit.after.copy())
        return True

    def refused_since(self, applied: Placement) -> None:
        """The engine kept `applied` and refused the edits after it: show that one again and forget them (no event:
        the caller says what happened)."""
        while self.undo_stack and self.undo_stack[-1].after != applied:
            self.undo_stack.pop()
        self.redo_stack.clear()
        self.set(applied.copy())
