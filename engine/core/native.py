"""The cffi binding of the native core: ffi, lib, and check() turning a status into an exception."""

from __future__ import annotations

from .errors import STATUS_ERRORS, EngineError

try:
    from .._native import ffi, lib
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise ImportError(
        "the native core (engine._native) is not built: install the project with `pip install -e .`"
    ) from exc


# The runtime-module ABI the core was built against (for messages and tests).
RUNTIME_ABI_VERSION = lib.eb_runtime_abi_version()


def last_error() -> str:
    return ffi.string(lib.eb_last_error()).decode("utf-8", "replace")


def check(status: int) -> None:
    """Raise the EngineError subclass for a failed native call, with the core's message."""
    if status != 0:
        raise STATUS_ERRORS.get(status, EngineError)(last_error())


def text(chars) -> str:
    return ffi.string(chars).decode("utf-8", "replace")


def core_location() -> str:
    buf = ffi.new("char[]", 4096)
    check(lib.eb_core_location(buf, len(buf)))
    return text(buf)
