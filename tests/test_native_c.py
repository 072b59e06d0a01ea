"""The native tests (native/tests/test_native.c, and test_gpu_formats.cpp: the GPU modules' block readers run on the
host), built with -Wall -Wextra -Werror: plain (the `build` lane),
ASan+UBSan and TSan, and the Python suites against a sanitized core (the `sanitize` lane)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parent.parent / "native"


def run_make(target: str, build: Path) -> str:
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.fail("make and cc are needed to build the native tests (run tests/setup.sh)")
    proc = subprocess.run(
        ["make", "-C", str(NATIVE), target, f"BUILD={build}", f"ASAN_BUILD={build}", f"TSAN_BUILD={build}"],
        capture_output=True,
        text=True,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    return output


@pytest.mark.build
def test_native_tests_pass_without_warnings(tmp_path):
    out = run_make("test", tmp_path / "build")
    assert "warning:" not in out
    assert ", 0 failed" in out
    assert "formats, ok" in out  # test_gpu_formats: every GPU block reader gives the core's values


@pytest.mark.sanitize
def test_native_tests_clean_under_address_and_undefined_sanitizers(tmp_path):
    out = run_make("sanitize", tmp_path / "build-asan")
    assert "runtime error" not in out and "AddressSanitizer" not in out
    assert ", 0 failed" in out and "formats, ok" in out


@pytest.mark.sanitize
def test_native_tests_clean_under_thread_sanitizer(tmp_path):
    out = run_make("tsan", tmp_path / "build-tsan")
    assert "ThreadSanitizer" not in out
    assert ", 0 failed" in out and "formats, ok" in out


ROOT = NATIVE.parent
SANITIZED_TESTS = {
    # the fuzz suites (GGUF files that read are loaded and run), the mapped-file guard, DeepSeek-V4's own operations
    # (its compressors' state across batches and roll backs, its released layout packed at load), a queued primary's
    # order and failure paths, and the races against the core built with ASan + UBSan ...
    "address,undefined": [
        "tests/test_deepseek_v4.py",
        "tests/test_deepseek_v4_released.py",
        "tests/test_queued_primary.py",
        "tests/test_fuzz.py",
        "tests/test_gguf_fuzz.py",
        "tests/test_mapped_files.py",
        "tests/test_concurrency.py",
    ],
    # ... and the races (close, set_placement and decode from two threads) against the core built with TSan
    "thread": ["tests/test_concurrency.py"],
}
RUNTIMES = {"address,undefined": ["libasan.so", "libubsan.so"], "thread": ["libtsan.so"]}


@pytest.mark.sanitize
@pytest.mark.parametrize("sanitizers", list(SANITIZED_TESTS))
def test_python_suites_against_a_sanitized_core(tmp_path, sanitizers):
    """The engine package beside a core and cpu runtime built with the sanitizers (EXPERTBENCH_SANITIZE), the
    sanitizer's runtime preloaded into this interpreter; a report stops the run (halt_on_error) and fails here."""
    out = tmp_path / "site"
    for f in (ROOT / "engine").rglob("*.py"):  # the package and its subpackages, without the installed modules
        (out / f.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, out / f.relative_to(ROOT))
    env = {**os.environ, "EXPERTBENCH_NO_GPU": "1", "EXPERTBENCH_SANITIZE": sanitizers}
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(out), "--build-temp", str(tmp_path / "o")],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert build.returncode == 0, (build.stdout + build.stderr)[-4000:]
    preload = []
    for lib in RUNTIMES[sanitizers]:
        found = subprocess.run(["cc", f"-print-file-name={lib}"], capture_output=True, text=True).stdout.strip()
        if not Path(found).is_file():
            pytest.fail(f"{lib} is not installed: the compiler's sanitizer runtime is needed")
        preload.append(found)
    report = tmp_path / "report"
    env = {**os.environ, "LD_PRELOAD": " ".join(preload), "PYTHONPATH": str(out),
           "ASAN_OPTIONS": f"detect_leaks=0:handle_segv=0:log_path={report}",
           "UBSAN_OPTIONS": f"halt_on_error=1:print_stacktrace=1:log_path={report}",
           "TSAN_OPTIONS": f"halt_on_error=1:log_path={report}"}  # fmt: skip
    check = "import engine, sys; sys.exit(0 if engine.__file__.startswith(sys.argv[1]) else 3)"
    assert subprocess.run([sys.executable, "-c", check, str(out)], cwd=out, env=env).returncode == 0
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
         *(str(ROOT / t) for t in SANITIZED_TESTS[sanitizers])],
        cwd=out, env=env, capture_output=True, text=True,
    )  # fmt: skip
    reports = "".join(p.read_text() for p in tmp_path.glob("report*"))
    assert proc.returncode == 0 and not reports, proc.stdout[-3000:] + proc.stderr[-3000:] + reports[-4000:]
    assert " passed" in proc.stdout
