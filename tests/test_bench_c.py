"""The benchmarks' C programs build without warnings and run on small inputs (their speeds are not checked here)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.model import Engine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from measure import build_c, cpu_has_avx2_kernels  # noqa: E402

pytestmark = [
    pytest.mark.bench,
    pytest.mark.skipif(
        not cpu_has_avx2_kernels(), reason="the benchmarks' C programs need x86 with AVX2, FMA and F16C"
    ),
]


def build(name: str, out_dir: Path) -> Path:
    if shutil.which("cc") is None:
        pytest.fail("cc is needed to build the benchmarks (run tests/setup.sh)")
    return build_c(name, out_dir, extra_flags=("-Wall", "-Wextra", "-Werror"))


def run(*cmd, code: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    assert proc.returncode == code, (cmd, proc.stdout, proc.stderr)
    return proc


def test_membw_reports_every_kernel(tmp_path):
    out = run(build("membw", tmp_path), "--mib", "16", "--repeats", "1").stdout
    for kernel in ("read", "copy", "triad", "read_ahead", "read_huge", "copy_huge", "triad_huge", "read_ahead_huge"):
        row = re.search(rf"^\| {kernel} \| ([0-9.]+) \| ([0-9.]+) \|$", out, re.M)
        assert row, out
        assert float(row.group(1)) > 0 and float(row.group(2)) > 0
    huge = re.search(r"^huge pages: (\d+) of 48 MiB of the \*_huge arrays, (\d+) MiB of the others$", out, re.M)
    assert huge, out
    assert int(huge.group(2)) == 0, out  # the 4 KiB arrays are advised against huge pages, and get none
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if thp.exists() and re.search(r"\[(always|madvise)\]", thp.read_text()):
        assert int(huge.group(1)) > 0, out  # where the kernel offers huge pages, the *_huge arrays get some


def test_matmul_stream_runs_the_engine_kernel(tmp_path):
    exe = build("matmul_stream", tmp_path)
    for dtype in ("bf16", "f16", "f32"):
        out = run(exe, "--dtype", dtype, "--mib", "8", "--repeats", "1").stdout
        assert re.search(rf"^\d+ matrices of 512x1024 {dtype} ", out, re.M), out
        assert re.search(r"^\| 1 \| [0-9.]+ \| [0-9.]+ \| \d+% \|$", out, re.M), out
    one = run(exe, "--mib", "8", "--repeats", "1", "--threads", "1").stdout
    assert len(re.findall(r"^\| \d+ \| ", one, re.M)) == 1, one  # the one-thread row alone
    for args in (["--dtype", "int4"], ["--threads", "-1"], ["--bogus", "--dtype", "bf16"]):
        assert "usage:" in run(exe, *args, code=2).stderr, args
    assert "holds no 4096x4096 matrix" in run(exe, "--mib", "1", "--rows", "4096", "--cols", "4096", code=2).stderr


def test_decode_products_runs_through_the_cpu_module(tmp_path):
    with Engine() as eng:
        module = eng.runtimes[0].path
    exe = build("decode_products", tmp_path)
    out = run(exe, module, "--dtype", "bf16", "--tokens", "2").stdout
    row = re.search(r"^\| 352 \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| \d+% \|$", out, re.M)
    assert row, out  # the bench demo target's 352 MB of weights per token
    assert all(float(v) > 0 for v in row.groups())
    for args in (
        [module, "--dtype", "tq1_0"],  # a format the core does not have
        [module, "--precision", "q4"],
        [module, "--tokens", "0"],
        [module, "--bogus"],
        [],
    ):
        assert "usage:" in run(exe, *args, code=2).stderr, args
    assert "not a runtime module" in run(exe, exe, code=1).stderr


def test_readpass_answers_each_request_in_turn(tmp_path):
    exe = build("readpass", tmp_path)
    proc = subprocess.run([str(exe), "--mib", "8", "--threads", "2"], input="16777216\n50000000\n1\n",
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3, proc.stdout  # one answer per request, a tiny request still one whole sweep
    for line in lines:  # plain, ahead, copy and triad GB/s, then the round trip in ns (0 with one CPU)
        *gbs, round_trip = map(float, line.split())
        assert len(gbs) == 4 and all(v > 0 for v in gbs), proc.stdout
        assert round_trip > 0 or len(os.sched_getaffinity(0)) == 1, proc.stdout
    one = min(os.sched_getaffinity(0))
    one_cpu = subprocess.run([str(exe), "--mib", "1"], input="1\n", capture_output=True, text=True,
                             preexec_fn=lambda: os.sched_setaffinity(0, {one}))  # fmt: skip
    assert one_cpu.returncode == 0 and one_cpu.stdout.split()[4] == "0", one_cpu
    for request in ("many\n", "-5\n", "0\n", "nan\n", "inf\n", "12abc\n", "1e19\n"):
        bad = subprocess.run([str(exe), "--mib", "1"], input=request, capture_output=True, text=True)
        assert bad.returncode == 2 and "expected a positive byte count per line" in bad.stderr, request
        assert request.strip() in bad.stderr, bad.stderr  # the message names what it got
    for mib in ("0", "-5", "4x", "99999999999"):
        err = run(exe, "--mib", mib, code=2).stderr
        assert f"--mib must be a whole number of MiB from 1 to 16777216, got '{mib}'" in err, err
    for threads in ("0", "65"):
        assert f"--threads must be 1 to 64, got {threads}" in run(exe, "--threads", threads, code=2).stderr
    assert "usage:" in run(exe, "--bogus", code=2).stderr


def test_sustained_read_talks_to_readpass(tmp_path):
    from decode import SustainedRead

    with SustainedRead(build("readpass", tmp_path), 4 << 20, threads=2) as reader:
        sample = reader.read(8 << 20)
        assert sample["read"] > 0 and sample["stream"] > 0
        assert sample["round_trip_ns"] > 0 or len(os.sched_getaffinity(0)) == 1, sample
        assert reader.read(1)["read"] > 0
    assert reader.proc.returncode == 0  # closed at the end of its input


def test_q8_products_times_both_kernel_sets(tmp_path):
    with Engine() as eng:
        module = eng.runtimes[0].path
    exe = build("q8_products", tmp_path)
    out = run(exe, module, "q4_k,iq2_xxs", "2").stdout
    rows = re.findall(r"^(\S+)\s+(\S+)\s+2 tokens\s+([0-9.]+) us\s+([0-9.]+) ns per 256 values per token$", out, re.M)
    assert [r[0] for r in rows] == ["Q4_K", "Q4_K", "IQ2_XXS", "IQ2_XXS"], out
    assert rows[0][1] == "avx2+fma+f16c" and all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows), out
    for args in ([module, "tq1_0"], [module, "f32"], [module, "q4_k", "0"], [module]):
        assert run(exe, *args, code=2).stderr, args
