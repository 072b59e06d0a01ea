"""The native tests (native/tests/test_native.c), built with -Wall -Wextra -Werror: plain, ASan+UBSan, TSan."""

import shutil
import subprocess
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


def test_native_tests_pass_without_warnings(tmp_path):
    out = run_make("test", tmp_path / "build")
    assert "warning:" not in out
    assert ", 0 failed" in out


def test_native_tests_clean_under_address_and_undefined_sanitizers(tmp_path):
    out = run_make("sanitize", tmp_path / "build-asan")
    assert "runtime error" not in out and "AddressSanitizer" not in out
    assert ", 0 failed" in out


def test_native_tests_clean_under_thread_sanitizer(tmp_path):
    out = run_make("tsan", tmp_path / "build-tsan")
    assert "ThreadSanitizer" not in out
    assert ", 0 failed" in out
