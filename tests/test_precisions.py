"""Which activation precisions a device runs: every module lists them (eb_rt_device_info.precisions, DeviceInfo), and
the core refuses a step in a precision that the primary or an expert's owner does not run, naming the device and what it
does there, instead of letting that device read the activations in the precision it has (another result under the
requested one's name).

A device without q8 kernels is made here from the hostsim module: a small module (built by the test) that forwards
hostsim's table under the name "noq8" and leaves q8 out of its devices' precisions.
"""

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.core.errors import UnsupportedError
from engine.core.native import core_location
from engine.model import Engine

GGUF = FIXTURES / "qwen3moe-gguf" / "model-q4_k_m.gguf"
INCLUDE = Path(__file__).resolve().parent.parent / "native" / "include"

SHIM = r"""
#include <dlfcn.h>

#include "eb_runtime.h"

static eb_runtime_table table;
static int (*inner_info)(void *, int, eb_rt_device_info *, char *, size_t);

static int info_f32_only(void *rt, int dev, eb_rt_device_info *info, char *err, size_t errlen) {
    int st = inner_info(rt, dev, info, err, errlen);
    info->precisions &= 1u << EB_PRECISION_F32;
    return st;
}

EB_EXPORT const eb_runtime_table *eb_runtime_module(void) {
    void *h = dlopen(INNER, RTLD_NOW | RTLD_LOCAL);
    if (!h) return 0;
    const eb_runtime_table *(*entry)(void) = (const eb_runtime_table *(*)(void))dlsym(h, EB_RUNTIME_ENTRY);
    if (!entry || !entry()) return 0;
    table = *entry();
    table.name = "noq8";
    inner_info = table.device_info;
    table.device_info = info_f32_only;
    return &table;
}
"""


@pytest.fixture(scope="module")
def noq8(tmp_path_factory) -> str:
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler (cc) to build the test module (run tests/setup.sh)")
    folder = tmp_path_factory.mktemp("noq8")
    src, out = folder / "noq8.c", folder / "expertbench_rt_noq8.so"
    src.write_text(SHIM)
    inner = Path(core_location()) / "expertbench_rt_hostsim.so"
    subprocess.run([cc, "-shared", "-fPIC", f"-I{INCLUDE}", f'-DINNER="{inner}"', "-o", str(out), str(src), "-ldl"],
                   check=True)  # fmt: skip
    return str(out)


def test_every_cpu_module_device_runs_both_precisions():
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2) as eng:
        assert {d.name: d.precisions for d in eng.devices} == {
            "cpu:0": ("f32", "q8"), "cpu:1": ("f32", "q8"), "hostsim:0": ("f32", "q8")
        }  # fmt: skip


def logits(model, precision, n=3):
    with model.context(16) as ctx:
        ctx.precision = precision
        return np.concatenate([ctx.prefill([1, 2, 3]), *[ctx.decode([t]) for t in range(4, 4 + n)]])


def test_q8_on_an_expert_owner_without_it_is_refused_by_name(noq8):
    with Engine(runtimes=("cpu", "noq8"), module_paths={"noq8": noq8}) as eng:
        assert {d.name: d.precisions for d in eng.devices} == {"cpu:0": ("f32", "q8"), "noq8:0": ("f32",)}
        with eng.load(GGUF) as model:
            q8_cpu = logits(model, "q8")
            model.set_placement("*=cpu:0; 0.1-3=noq8:0")
            f32 = logits(model, "f32")  # f32 runs there
            assert np.isfinite(f32).all() and not np.array_equal(f32, q8_cpu)
            want = (r"precision q8: noq8:0, the owner of expert 1 of layer 0, does not run it \(its kernels run f32\); "
                    r"set another precision or place those experts elsewhere")  # fmt: skip
            with model.context(16) as ctx, pytest.raises(UnsupportedError, match=want):
                ctx.precision = "q8"
            # a context already in q8 when the experts move there: its next step says so, and runs once they are back
            with model.context(16) as ctx:
                model.set_placement("*=cpu:0")
                ctx.precision = "q8"
                first = ctx.prefill([1, 2, 3])
                model.set_placement("*=cpu:0; 1.0=noq8:0")
                with pytest.raises(UnsupportedError, match="noq8:0, the owner of expert 0 of layer 1"):
                    ctx.decode([4])
                assert ctx.precision == "q8" and ctx.position == 3
                model.set_placement("*=cpu:0")
                assert np.array_equal(np.concatenate([first, ctx.decode([4])]), q8_cpu[:4])


def test_q8_on_a_primary_without_it_is_refused_by_name(noq8):
    with Engine(runtimes=("cpu", "noq8"), module_paths={"noq8": noq8}) as eng, eng.load(GGUF, device="noq8:0") as model:
        assert np.isfinite(logits(model, "f32")).all()
        with model.context(16) as ctx, pytest.raises(UnsupportedError, match="noq8:0, the primary, does not run"):
            ctx.precision = "q8"
        assert ctx.precision == "f32"
