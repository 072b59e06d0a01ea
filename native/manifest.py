"""Reads native/sources.mk, the one list of the native sources, for setup.py, engine/_build_native.py and bench/.

Loaded by file path (setup.py and cffi's build script run before any package is importable):

    spec = importlib.util.spec_from_file_location("native_manifest", ROOT / "native" / "manifest.py")
"""

from pathlib import Path

NATIVE = Path(__file__).resolve().parent
MANIFEST = NATIVE / "sources.mk"


def read(path: Path = MANIFEST) -> dict[str, list[str]]:
    """Every `NAME = words` of the manifest (backslash continuations joined), as NAME -> words."""
    text = path.read_text().replace("\\\n", " ")
    out: dict[str, list[str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip().isidentifier():
            raise ValueError(f"{path}:{number}: expected `NAME = words`, got {line!r}")
        out[name.strip()] = value.split()
    return out


def paths(name: str, root: Path = NATIVE) -> list[Path]:
    """The files of one manifest entry (CORE_SRC, CPU_SRC, ...), as paths under root (native/ by default)."""
    entries = read()
    if name not in entries:
        raise KeyError(f"{MANIFEST}: no entry {name} (it has {', '.join(entries)})")
    return [root / p for p in entries[name]]


def flags(name: str) -> list[str]:
    """A flags entry of the manifest (AVX2_FLAGS, AVX512_FLAGS)."""
    return read()[name]
