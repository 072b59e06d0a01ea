"""Writing a file so that a reader sees the old one or the whole new one, never a part (profiles, traces, the
window's exports)."""

from __future__ import annotations

import contextlib
import glob
import os
import stat
import tempfile
from pathlib import Path

from .errors import ArgumentError

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))  # fmt: skip


def output_problem(path: str | os.PathLike) -> str | None:
    """Why a file the tool writes may not go to path, or None: it exists (through any symbolic links) and is not a
    regular file. Replacing a device node or a FIFO with a regular file (as root, /dev/full) or blocking on one is
    never what a --trace, --out or -o meant."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot write '{path}': {exc.strerror or exc}"
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return f"cannot write '{path}': it is {kind}; expected a regular file or a path that does not exist yet"


def check_output(path: str | os.PathLike) -> None:
    """Raise ArgumentError where output_problem finds one (before long work whose result would go there)."""
    if (problem := output_problem(path)) is not None:
        raise ArgumentError(problem)


def atomic_write(path: str | os.PathLike, text: str) -> None:
    """Write text to path so that readers see the old file or the whole new one, never a part: a temp file in
    the same folder, fsync, os.replace, then fsync of the folder. On any failure the temp file is removed and
    the old file is untouched; a path that exists and is not a regular file is refused (output_problem). An existing
    file's permission bits are kept, a new file gets the ones the user's umask
    leaves of 0666 (as open() would give it; mkstemp's own are 0600). A symbolic link is written through (its
    target replaced, the link kept); temp files that a killed save left beside it are removed."""
    check_output(path)
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    folder = path.parent if str(path.parent) else Path(".")
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise ArgumentError(f"cannot write '{path}': {exc.strerror or exc}") from None
    _remove_stale_temps(folder, path.name)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    except OSError as exc:
        raise ArgumentError(f"cannot write '{path}': {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode if mode is not None else new_file_mode())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):  # a full disk, a folder gone read-only: the old file is as it was
            raise ArgumentError(f"cannot write '{path}': {exc.strerror or exc} (the file is unchanged)") from None
        raise
    with contextlib.suppress(OSError):  # the rename itself reaches the disk (not possible on every system)
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def new_file_mode() -> int:
    """0666 less the process's umask: what a file created with open() gets. Read from /proc where it says it, else
    by setting the umask and putting it back (the only portable way)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _remove_stale_temps(folder: Path, name: str) -> None:
    """The temp files of saves of `name` whose process is gone (a save killed before its rename)."""
    for tmp in folder.glob(f".{glob.escape(name)}.*.tmp"):
        pid = tmp.name[len(name) + 2 :].split(".", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)  # still running: its save is in progress
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                tmp.unlink()
        except (PermissionError, OverflowError):
            pass
