"""Exceptions raised by the engine. Every native failure becomes an EngineError subclass carrying the core's text."""


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class ArgumentError(EngineError, ValueError):
    """A bad value passed by the caller."""


class CheckpointError(EngineError):
    """A model folder, file or tensor is missing, damaged or of the wrong shape."""


class UnsupportedError(EngineError):
    """Valid input, but not something this engine runs (architecture, dtype, option)."""


class RangeError(EngineError, IndexError):
    """An index, token id or length out of range."""


class ModuleLoadError(EngineError):
    """A runtime module failed to load, has the wrong ABI, or found no device."""


class DeviceError(EngineError):
    """A device reported an error."""


class StateError(EngineError):
    """The call is not valid in the object's current state (closed, already loaded, ...)."""


class OutOfMemoryError(EngineError, MemoryError):
    """An allocation failed."""


class NumericError(EngineError, ArithmeticError):
    """A step's numbers are not finite (NaN or inf logits): no token is chosen from them."""


# eb_status codes (native/include/expertbench.h) to exception classes.
STATUS_ERRORS: dict[int, type[EngineError]] = {
    1: ArgumentError,
    2: CheckpointError,
    3: CheckpointError,
    4: UnsupportedError,
    5: RangeError,
    6: ModuleLoadError,
    7: OutOfMemoryError,
    8: DeviceError,
    9: StateError,
    10: NumericError,
}
