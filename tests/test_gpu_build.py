"""The cuda and hip modules compile without a warning (the `build` lane): CI has no GPU, so this is where a kernel
change meets both compilers before the GPU machine runs it. One architecture each (sm_90; gfx90a, whose 64-lane
wavefronts the kernels' 32-lane groups must also serve), with the flags setup.py gives them."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.build

NATIVE = Path(__file__).resolve().parent.parent / "native"
SOURCE = NATIVE / "runtime" / "gpu" / "gpu_runtime.cu"


def nvcc() -> str | None:
    return shutil.which("nvcc") or next((p for p in ["/usr/local/cuda/bin/nvcc"] if Path(p).exists()), None)


def compile_quietly(cmd: list[str], env: dict | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=1800)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "warning" not in output.lower(), output[-6000:]


def test_cuda_module_compiles_without_warnings(tmp_path):
    tool = nvcc()
    if tool is None:
        pytest.skip("nvcc is not installed on this machine")
    compile_quietly(
        [tool, "-O3", "-std=c++20", "-shared", "-Xcompiler", "-fPIC,-fvisibility=hidden,-Wall,-Wextra,-Werror",
         "-gencode=arch=compute_90,code=sm_90", f"-I{NATIVE / 'include'}", "-o", str(tmp_path / "cuda.so"),
         str(SOURCE)]
    )  # fmt: skip


def test_hip_module_compiles_without_warnings(tmp_path):
    tool = shutil.which("hipcc")
    if tool is None:
        pytest.skip("hipcc is not installed on this machine")
    compile_quietly(
        [tool, "-O3", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror",
         "-DEB_GPU_HIP", "--offload-arch=gfx90a", f"-I{NATIVE / 'include'}", "-o", str(tmp_path / "hip.so"),
         str(SOURCE)],
        {"HIP_PLATFORM": "amd"},
    )  # fmt: skip
