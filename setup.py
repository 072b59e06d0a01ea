"""Build glue: setuptools refuses cffi_modules in pyproject.toml, and the CPU runtime module is a separate
shared library that must land next to the core (the cffi extension), where the core looks for it."""

import importlib.util
import os
import platform
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

NATIVE = Path("native")
# the source lists: native/sources.mk, read through native/manifest.py (the Makefile includes the same file)
_spec = importlib.util.spec_from_file_location("native_manifest", NATIVE / "manifest.py")
manifest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(manifest)
CFLAGS = ["-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-fPIC", "-ffp-contract=off", "-fvisibility=hidden"]
# the cpu runtime modules built with sanitizers too (see engine/_build_native.py)
SANITIZE = [f"-fsanitize={s}", "-fno-omit-frame-pointer"] if (s := os.environ.get("EXPERTBENCH_SANITIZE")) else []


class BuildWithRuntimes(build_ext):
    """Build the cffi core, then each runtime module beside it."""

    def run(self):
        super().run()
        core = Path(self.get_ext_fullpath("engine._native"))
        self.build_cpu_runtime(core.parent, "cpu", [])
        # The cpu sources again as an isolated runtime whose devices act like a discrete accelerator.
        self.build_cpu_runtime(core.parent, "hostsim", [("EB_CPU_HOSTSIM", "1")])
        if os.environ.get("EXPERTBENCH_NO_GPU") != "1":
            self.build_gpu_runtimes(core.parent)

    def build_gpu_runtimes(self, out_dir: Path):
        """The cuda and hip modules from one source, each where its compiler exists, compiled side by side."""
        (source,) = map(str, manifest.paths("GPU_SRC", NATIVE))
        common = ["-O3", "-std=c++20", "-shared", f"-I{NATIVE / 'include'}"]
        jobs: list[tuple[list[str], dict | None]] = []
        nvcc = shutil.which("nvcc") or next((p for p in ["/usr/local/cuda/bin/nvcc"] if Path(p).exists()), None)
        if nvcc:
            archs = os.environ.get("EXPERTBENCH_CUDA_ARCHS", "80 86 89 90").split()
            gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
            gencode.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
            flags = ["-Xcompiler", "-fPIC,-fvisibility=hidden,-Wall,-Wextra"]
            jobs.append(
                ([nvcc, *common, *flags, *gencode, "-o", str(out_dir / "expertbench_rt_cuda.so"), source], None)
            )
        platform_ = os.environ.get("EXPERTBENCH_HIP_PLATFORM", "amd")
        if platform_ not in ("amd", "nvidia"):
            raise SystemExit(f"EXPERTBENCH_HIP_PLATFORM={platform_!r}: expected 'amd' (hipcc) or 'nvidia' (nvcc)")
        hip_out = str(out_dir / "expertbench_rt_hip.so")
        hipcc = shutil.which("hipcc")
        if platform_ == "nvidia" and nvcc:  # the hip module for the NVIDIA platform: gpu_platform.h says why nvcc
            jobs.append(([nvcc, *common, *flags, "-DEB_GPU_HIP_ON_CUDA", *gencode, "-o", hip_out, source], None))
        elif platform_ == "amd" and hipcc:
            archs = os.environ.get("EXPERTBENCH_HIP_ARCHS", "gfx906 gfx908 gfx90a gfx1030").split()
            flags = ["-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-DEB_GPU_HIP"]
            flags += [f"--offload-arch={a}" for a in archs]
            jobs.append(([hipcc, *common, *flags, "-o", hip_out, source], {"HIP_PLATFORM": "amd"}))
        self._compile_gpu(jobs)

    def _compile_gpu(self, jobs: list[tuple[list[str], dict | None]]):
        """Run the GPU modules' compilers at once (each compiles one translation unit on one core). A module that
        fails to build is left out with a warning: the CPU engine still installs, and the runtime then reports the
        module as missing (tests fail where the compiler exists but the module does not)."""
        running = []
        for cmd, env in jobs:
            print(" ".join(cmd))
            Path(cmd[-2]).unlink(missing_ok=True)  # never leave an older build in place of a failed one
            try:
                running.append((cmd, subprocess.Popen(cmd, env={**os.environ, **(env or {})})))
            except OSError as exc:
                self._gpu_failed(cmd, exc)
        for cmd, proc in running:
            if proc.wait() != 0:
                self._gpu_failed(cmd, f"exit status {proc.returncode}")

    @staticmethod
    def _gpu_failed(cmd: list[str], why) -> None:
        print(f"warning: {Path(cmd[0]).name} could not build {Path(cmd[-2]).name}: {why}; set EXPERTBENCH_NO_GPU=1 "
              "to skip GPU modules")  # fmt: skip

    def build_cpu_runtime(self, out_dir: Path, name: str, macros: list):
        cc = self.compiler
        include = [str(NATIVE / "include"), str(NATIVE / "runtime" / "cpu")]
        tmp = Path(self.build_temp) / f"rt_{name}"
        objects = cc.compile(
            [str(p) for p in manifest.paths("CPU_RUNTIME_SRC", NATIVE) + manifest.paths("CPU_KERNELS_SRC", NATIVE)],
            output_dir=str(tmp),
            include_dirs=include,
            macros=macros,
            extra_postargs=CFLAGS + SANITIZE,
        )
        if platform.machine() in ("x86_64", "AMD64"):
            for isa in ("AVX2", "AVX512"):
                objects += cc.compile(
                    [str(p) for p in manifest.paths(f"CPU_{isa}_SRC", NATIVE)],
                    output_dir=str(tmp),
                    include_dirs=include,
                    extra_postargs=[*CFLAGS, *SANITIZE, *manifest.flags(f"{isa}_FLAGS")],
                )
        out_dir.mkdir(parents=True, exist_ok=True)
        cc.link_shared_object(
            objects,
            str(out_dir / f"expertbench_rt_{name}.so"),
            libraries=["pthread", "m"],
            extra_postargs=["-shared", *SANITIZE],
        )


setup(cffi_modules=["engine/_build_native.py:ffibuilder"], cmdclass={"build_ext": BuildWithRuntimes})
