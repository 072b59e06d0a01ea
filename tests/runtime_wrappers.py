"""A bundled runtime module as it is, with parts of its table replaced: the same devices and kernels under a report or
an extension list that another module would give (a plain module: conftest names clash between test folders)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from engine.core.native import core_location

NATIVE_INCLUDE = Path(__file__).resolve().parent.parent / "native" / "include"

WRAPPER = r"""
#include <dlfcn.h>
#include "eb_runtime.h"
static eb_runtime_table table;
%(declarations)s
EB_EXPORT const eb_runtime_table *eb_runtime_module(void) {
    void *lib = dlopen("%(real)s", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return NULL;
    eb_runtime_entry_fn entry = (eb_runtime_entry_fn)dlsym(lib, EB_RUNTIME_ENTRY);
    if (!entry || !entry()) return NULL;
    table = *entry();
    %(patch)s
    return &table;
}
"""


def wrapped_module(tmp_path: Path, declarations: str, patch: str, runtime: str = "hostsim") -> str:
    """The path of a module built here that loads the bundled `runtime` module and hands out its table after `patch`
    (C statements on `table`, with `declarations` at file scope)."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler (cc) to build a test module (run tests/setup.sh)")
    real = Path(core_location()) / f"expertbench_rt_{runtime}.so"
    src = tmp_path / f"{runtime}_wrapper.c"
    src.write_text(WRAPPER % {"declarations": declarations, "real": real, "patch": patch})
    out = tmp_path / f"{runtime}_wrapper.so"
    subprocess.run([cc, "-shared", "-fPIC", f"-I{NATIVE_INCLUDE}", "-o", str(out), str(src), "-ldl"], check=True)
    return str(out)
