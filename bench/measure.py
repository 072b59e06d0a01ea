"""What the benchmarks share (decode.py, vs_llamacpp.py, the GPU ones): the same loops, arguments and reports."""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

from engine.model import WEIGHTS_MODES

BENCH = Path(__file__).resolve().parent
NATIVE = BENCH.parent / "native"

# The native source manifest (native/sources.mk, as the Makefile and setup.py read it): the cpu module's sources and
# the flags of its vector kernels.
_spec = importlib.util.spec_from_file_location("native_manifest", NATIVE / "manifest.py")
manifest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(manifest)
AVX2_FLAGS = manifest.flags("AVX2_FLAGS")
AVX512_FLAGS = manifest.flags("AVX512_FLAGS")

# The benchmarks' C programs (bench/membw/): sources, compiler flags, libraries. Their header comments give the
# same commands for running them by hand.
INCLUDES = [f"-I{NATIVE / 'include'}", f"-I{NATIVE / 'runtime/cpu'}"]
C_PROGRAMS = {
    "membw": ([BENCH / "membw/membw.c"], ["-mavx2", "-mfma", *INCLUDES], []),
    "matmul_stream": (
        [BENCH / "membw/matmul_stream.c", *manifest.paths("CPU_AVX2_SRC"), *manifest.paths("CPU_KERNELS_SRC")],
        ["-ffp-contract=off", *AVX2_FLAGS, f"-I{NATIVE / 'include'}", f"-I{NATIVE / 'runtime/cpu'}"],
        [],
    ),
    "readpass": ([BENCH / "membw/readpass.c"], ["-mavx2", *INCLUDES], []),
    "decode_products": (
        [BENCH / "membw/decode_products.c"],
        ["-mavx2", f"-I{NATIVE / 'include'}", f"-I{NATIVE / 'runtime/cpu'}"],
        ["-ldl"],
    ),
    "q8_products": ([BENCH / "membw/q8_products.c"], [f"-I{NATIVE / 'include'}"], ["-ldl"]),
}  # fmt: skip


def run_cc(cmd: list[str], what: str) -> None:
    """Run a compiler command; a failure raises with the command and the compiler's messages."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building {what} failed:\n{' '.join(cmd)}\n{proc.stderr}")


def build_c(name: str, out_dir: Path, extra_flags: tuple = ()) -> Path:
    """Compile one of C_PROGRAMS into out_dir."""
    sources, flags, libs = C_PROGRAMS[name]
    exe = Path(out_dir) / name
    run_cc(["cc", "-O2", "-pthread", *flags, *extra_flags, *map(str, sources), *libs, "-o", str(exe)], name)
    return exe


def cpu_has_avx2_kernels() -> bool:
    """Whether this CPU runs the engine's AVX2 kernels (x86 with AVX2, FMA and F16C), which matmul_stream needs."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return {"avx2", "fma", "f16c"} <= flags


def prefill_ids(vocab_size: int, n: int) -> list[int]:
    """A fixed pseudo-random prompt (seed 0), the same for every engine measured."""
    return np.random.default_rng(0).integers(0, vocab_size, n).tolist()


def decode_speed(model, prompt, tokens: int, repeats: int, warm: bool = True,
                 precision: str = "f32") -> tuple[list[float], list[int]]:  # fmt: skip
    """Greedy decode tokens/s of each repeat (after one warm-up run, page cache and arenas, unless warm is False:
    the caller warmed them) and the last run's ids."""
    speeds, ids = [], []
    with model.context(len(prompt) + tokens + 1) as ctx:
        ctx.precision = precision
        for _ in range(repeats + int(warm)):
            ctx.truncate(0)
            res = ctx.generate(prompt, tokens)
            speeds.append(res.decode_tokens_per_second)
            ids = res.ids
    return speeds[int(warm) :], ids


def prefill_speed(model, prompt: list[int], repeats: int, precision: str = "f32") -> list[float]:
    """Prefill tokens/s of each repeat (the last position's logits only, as generation needs)."""
    out = []
    with model.context(len(prompt) + 1) as ctx:
        ctx.precision = precision
        for _ in range(repeats):
            ctx.truncate(0)
            t0 = time.perf_counter()
            ctx.prefill(prompt, all_rows=False)
            out.append(len(prompt) / (time.perf_counter() - t0))
    return out


def greedy_decode(model, prompt_ids, n_tokens: int, graphs: bool = True):
    """Greedy ids, every step's logits and the decode seconds (prefill excluded), with the model's counters just
    before and after the decode steps (for per-token figures of those steps alone)."""
    with model.context(len(prompt_ids) + n_tokens + 1) as ctx:
        ctx.graphs = graphs
        last = ctx.prefill(prompt_ids, all_rows=False)
        ids, rows = [int(np.argmax(last))], [last]
        before = model.counters()
        t0 = time.perf_counter()
        while len(ids) < n_tokens:
            row = ctx.decode([ids[-1]])[0]
            rows.append(row)
            ids.append(int(np.argmax(row)))
        seconds = time.perf_counter() - t0
        after = model.counters()
    return ids, np.stack(rows), seconds, before, after


def add_weights_argument(ap: argparse.ArgumentParser) -> None:
    """--weights: how the engine holds the checkpoint's files (Engine.load's weights)."""
    ap.add_argument("--weights", choices=tuple(WEIGHTS_MODES), default="auto",
                    help="copied onto huge pages, mapped, or auto: copied where huge pages are enabled and the "
                    "files take at most half of the memory available")  # fmt: skip


def add_gpu_arguments(ap: argparse.ArgumentParser) -> None:
    """The arguments of the GPU benchmarks (gpu_split.py, gpu_primary.py)."""
    add_model_arguments(ap)
    ap.add_argument("--model", help="model folder (default: the demo target of --size)")
    ap.add_argument("--gpu", default="cuda:0")


def write_report(path: str | None, report: dict) -> None:
    """The benchmark's JSON report, when --json asked for one."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=2))


def at_least(minimum: int):
    """An argparse type: a whole number of at least minimum."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value}: expected at least {minimum}")
        return value

    return parse


def add_model_arguments(ap: argparse.ArgumentParser, threads_default: int = 0, weights: bool = True) -> None:
    """What every CPU benchmark of the demo model takes: its size, the worker threads, the JSON report, and (unless
    the script compares the ways itself) how the engine holds the files."""
    ap.add_argument("--size", default="bench", help="demo model size (default, bench)")
    ap.add_argument("--threads", type=int, default=threads_default, help="worker threads (0: all cores)")
    ap.add_argument("--json", help="write the report here")
    if weights:
        add_weights_argument(ap)


def add_common_arguments(ap: argparse.ArgumentParser, threads_default: int) -> None:
    """The arguments every CPU speed benchmark takes, with the same defaults."""
    add_model_arguments(ap, threads_default)
    ap.add_argument("--dtypes", nargs="*", default=["bf16", "f32"])
    ap.add_argument("--tokens", type=int, default=64, help="decode steps per run")
    ap.add_argument("--prefill", type=int, default=512, help="prompt length for the prefill measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=at_least(1), default=1,
                    help="measure this many times, interleaving what is compared (a shared machine's speed drifts "
                    "over minutes); the ratios reported are the medians of the rounds' (default 1)")  # fmt: skip
