"""The benchmarks' C programs build without warnings and run on small inputs (their speeds are not checked here)."""

import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WARN = ["-Wall", "-Wextra", "-Werror"]

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="the benchmarks' C programs use x86 AVX2 intrinsics"
)


def build(out: Path, *sources: str, flags: tuple = (), libs: tuple = ()) -> Path:
    if shutil.which("cc") is None:
        pytest.fail("cc is needed to build the benchmarks (run tests/setup.sh)")
    cmd = ["cc", "-O2", *WARN, "-mavx2", "-mfma", "-pthread", *flags, *sources, *libs, "-o", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
    return out


def has_avx2() -> bool:
    return " avx2 " in Path("/proc/cpuinfo").read_text().replace("\n", " ")


def test_membw_reports_every_kernel(tmp_path):
    exe = build(tmp_path / "membw", "bench/membw/membw.c")
    proc = subprocess.run([str(exe), "--mib", "16", "--repeats", "1"], capture_output=True, text=True, check=True)
    for kernel in ("read", "copy", "triad", "read_ahead"):
        row = re.search(rf"^\| {kernel} \| ([0-9.]+) \| ([0-9.]+) \|$", proc.stdout, re.M)
        assert row, proc.stdout
        assert float(row.group(1)) > 0 and float(row.group(2)) > 0


@pytest.mark.skipif(not has_avx2(), reason="matmul_stream runs the AVX2 decode kernel, which this CPU lacks")
def test_matmul_stream_runs_the_engine_kernel(tmp_path):
    flags = ("-ffp-contract=off", "-mf16c", "-Inative/include", "-Inative/runtime/cpu")
    sources = ("bench/membw/matmul_stream.c", "native/runtime/cpu/cpu_kernels_avx2.c",
               "native/runtime/cpu/cpu_kernels_portable.c")  # fmt: skip
    exe = build(tmp_path / "matmul_stream", *sources, flags=flags)
    for dtype in ("bf16", "f16", "f32"):
        proc = subprocess.run([str(exe), "--dtype", dtype, "--mib", "8", "--repeats", "1"], capture_output=True,
                              text=True, check=True)  # fmt: skip
        assert re.search(rf"^\d+ matrices of 512x1024 {dtype} ", proc.stdout, re.M), proc.stdout
        assert re.search(r"^\| 1 \| [0-9.]+ \| [0-9.]+ \| \d+% \|$", proc.stdout, re.M), proc.stdout
    one = subprocess.run([str(exe), "--mib", "8", "--repeats", "1", "--threads", "1"], capture_output=True, text=True,
                         check=True)  # fmt: skip
    assert len(re.findall(r"^\| \d+ \| ", one.stdout, re.M)) == 1, one.stdout  # the one-thread row alone
    for args in (["--dtype", "int4"], ["--threads", "-1"]):
        bad = subprocess.run([str(exe), *args], capture_output=True, text=True)
        assert bad.returncode == 2 and "usage:" in bad.stderr, args
    too_small = subprocess.run([str(exe), "--mib", "1", "--rows", "4096", "--cols", "4096"], capture_output=True,
                               text=True)  # fmt: skip
    assert too_small.returncode == 2 and "holds no 4096x4096 matrix" in too_small.stderr


def test_decode_products_runs_through_the_cpu_module(tmp_path):
    from engine.model import Engine

    with Engine() as eng:
        module = eng.runtimes[0].path
    source = "bench/membw/decode_products.c"
    exe = build(tmp_path / "decode_products", source, flags=("-Inative/include",), libs=("-ldl",))
    proc = subprocess.run([str(exe), module, "--dtype", "bf16", "--tokens", "2"], capture_output=True, text=True,
                          check=True)  # fmt: skip
    row = re.search(r"^\| 352 \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| \d+% \|$", proc.stdout, re.M)
    assert row, proc.stdout  # the bench demo target's 352 MB of weights per token
    assert all(float(v) > 0 for v in row.groups())
    for args in ([module, "--dtype", "f16"], [module, "--tokens", "0"], []):
        bad = subprocess.run([str(exe), *args], capture_output=True, text=True)
        assert bad.returncode == 2 and "usage:" in bad.stderr, args
    wrong = subprocess.run([str(exe), str(exe)], capture_output=True, text=True)
    assert wrong.returncode == 1 and "not a runtime module" in wrong.stderr
