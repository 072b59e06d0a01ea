"""cffi out-of-line API build of the core: the one public header, the core's C sources compiled in."""

import importlib.util
import os
import re
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "native"
HEADER = NATIVE / "include" / "expertbench.h"
# the core's sources: native/sources.mk (the Makefile includes it), read by file path as cffi runs this file alone
_spec = importlib.util.spec_from_file_location("native_manifest", NATIVE / "manifest.py")
manifest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(manifest)


def _cdef() -> str:
    text = HEADER.read_text()
    match = re.search(r"/\* EB_CDEF_BEGIN \*/(.*)/\* EB_CDEF_END \*/", text, re.S)
    if not match:
        raise RuntimeError(f"{HEADER}: EB_CDEF_BEGIN/EB_CDEF_END markers not found")
    return match.group(1)


# EXPERTBENCH_SANITIZE=address,undefined (or thread): the core built with those sanitizers, for running the Python
# tests against it (tests/test_native_c.py does, with the sanitizer's runtime preloaded into the interpreter).
SANITIZE = [f"-fsanitize={s}", "-fno-omit-frame-pointer"] if (s := os.environ.get("EXPERTBENCH_SANITIZE")) else []

ffibuilder = FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "engine._native",
    '#include "expertbench.h"',
    sources=[str(p.relative_to(ROOT)) for p in manifest.paths("CORE_SRC", NATIVE)],
    include_dirs=[str(NATIVE / "include"), str(NATIVE / "src")],
    # a header changed (the formats table, a struct) rebuilds the core, not only a changed source
    depends=sorted(str(p.relative_to(ROOT)) for d in ("include", "src") for p in (NATIVE / d).glob("*.h")),
    extra_compile_args=["-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-ffp-contract=off", *SANITIZE],
    extra_link_args=SANITIZE,
    libraries=["dl", "m", "pthread"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
