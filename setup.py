"""Build glue: setuptools refuses cffi_modules in pyproject.toml, and the CPU runtime module is a separate
shared library that must land next to the core (the cffi extension), where the core looks for it."""

import platform
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

NATIVE = Path("native")
CFLAGS = ["-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-fPIC", "-ffp-contract=off", "-fvisibility=hidden"]


class BuildWithRuntimes(build_ext):
    """Build the cffi core, then each runtime module beside it."""

    def run(self):
        super().run()
        core = Path(self.get_ext_fullpath("engine._native"))
        self.build_cpu_runtime(core.parent, "cpu", [])
        # The cpu sources again as an isolated runtime whose devices act like a discrete accelerator.
        self.build_cpu_runtime(core.parent, "hostsim", [("EB_CPU_HOSTSIM", "1")])

    def build_cpu_runtime(self, out_dir: Path, name: str, macros: list):
        cc = self.compiler
        include = [str(NATIVE / "include"), str(NATIVE / "runtime" / "cpu")]
        tmp = Path(self.build_temp) / f"rt_{name}"
        objects = cc.compile(
            [str(NATIVE / "runtime/cpu/cpu_runtime.c"), str(NATIVE / "runtime/cpu/cpu_kernels_portable.c")],
            output_dir=str(tmp),
            include_dirs=include,
            macros=macros,
            extra_postargs=CFLAGS,
        )
        if platform.machine() in ("x86_64", "AMD64"):
            objects += cc.compile(
                [str(NATIVE / "runtime/cpu/cpu_kernels_avx2.c")],
                output_dir=str(tmp),
                include_dirs=include,
                extra_postargs=[*CFLAGS, "-mavx2", "-mfma", "-mf16c"],
            )
        out_dir.mkdir(parents=True, exist_ok=True)
        cc.link_shared_object(
            objects, str(out_dir / f"expertbench_rt_{name}.so"), libraries=["pthread", "m"], extra_postargs=["-shared"]
        )


setup(cffi_modules=["engine/_build_native.py:ffibuilder"], cmdclass={"build_ext": BuildWithRuntimes})
