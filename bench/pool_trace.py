"""Where a CPU decode step's time goes: every pool run and work item of the cpu runtime, traced.

Builds the cpu runtime module once more with -DEB_POOL_TRACE (into a temporary folder; the installed module is
not touched), decodes --tokens steps with it on the demo target, and prints per step: the time in each kind of
pool run (the products, attention's parallel run), their GB/s of weights, the time between runs when only the
calling thread works (norms, RoPE, routing, the step's return), and how fast work items of each size stream.
The decode runs at the traced module's speed (a clock read per work item), within a percent or so of the normal
build's.

    python bench/pool_trace.py --size bench --dtype bf16 --tokens 64
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from engine.checkpoints.demo import DEMO_PROMPTS
from engine.model import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkpoints import demo_target  # noqa: E402
from measure import AVX2_FLAGS, AVX512_FLAGS, NATIVE, add_model_arguments, manifest, run_cc, write_report  # noqa: E402

ITEM_SIZES = ((64 << 10, "< 64 KiB"), (256 << 10, "64-256 KiB"), (1 << 20, "256 KiB-1 MiB"), (float("inf"), ">= 1 MiB"))
KINDS = {1: "parallel run (attention)", 2: "product", 3: "products together", 4: "experts' gate+up, silu"}
# the release build's flags (setup.py), and the trace
FLAGS = ["-std=c11", "-O2", "-fPIC", "-ffp-contract=off", "-fvisibility=hidden", "-DEB_POOL_TRACE", "-pthread",
         f"-I{NATIVE / 'include'}", f"-I{NATIVE / 'runtime/cpu'}"]  # fmt: skip


def build_traced_module(out_dir: Path, extra_flags: tuple = ()) -> Path:
    """The cpu runtime module with the pool trace compiled in."""
    objects = []
    sources = [(src, []) for src in manifest.paths("CPU_RUNTIME_SRC") + manifest.paths("CPU_KERNELS_SRC")]
    if platform.machine() in ("x86_64", "AMD64"):
        sources += [(src, AVX2_FLAGS) for src in manifest.paths("CPU_AVX2_SRC")]
        sources += [(src, AVX512_FLAGS) for src in manifest.paths("CPU_AVX512_SRC")]
    for src, extra in sources:
        obj = out_dir / f"{src.stem}.o"
        run_cc(["cc", *FLAGS, *extra, *extra_flags, "-c", str(src), "-o", str(obj)], "the traced module")
        objects.append(str(obj))
    module = out_dir / "expertbench_rt_cpu.so"
    run_cc(["cc", "-shared", "-pthread", *objects, "-lm", "-o", str(module)], "the traced module")
    return module


def read_trace(path: Path) -> tuple[list[dict], list[dict]]:
    runs, items = [], []
    for line in path.read_text().splitlines():
        f = line.split()
        if f[0] == "recorded":  # runs and items recorded, against the room the module had for them
            n_runs, run_room, n_items, item_room = map(int, f[1:5])
            if n_runs > run_room or n_items > item_room:
                raise RuntimeError(f"the trace overflowed ({n_runs} runs for {run_room}, {n_items} items for "
                                   f"{item_room}): trace fewer --tokens")  # fmt: skip
        elif f[0] == "run":
            runs.append({"kind": int(f[2]), "total": int(f[3]), "bytes": int(f[4]), "start": int(f[5]),
                         "driver_done": int(f[6]), "end": int(f[7])})  # fmt: skip
        elif f[0] == "item":
            items.append({"run": int(f[1]), "thread": int(f[2]), "begin": int(f[3]), "stop": int(f[4]),
                          "start": int(f[5]), "end": int(f[6])})  # fmt: skip
    return runs, items


def analyse(runs: list[dict], items: list[dict], t0: int, t1: int, steps: int) -> dict:
    """Per decode step, for the runs that started in [t0, t1]: time per kind of run, GB/s, the gaps before them."""
    index = [i for i, r in enumerate(runs) if t0 <= r["start"] <= t1 and r["end"] > 0]
    if not index:
        raise RuntimeError("the trace holds no pool run of the decode steps")
    groups: dict[tuple, dict] = defaultdict(
        lambda: {"runs": 0, "ns": 0, "gap_ns": 0, "bytes": 0, "driver_wait_ns": 0, "tail_ns": 0, "threads": 0}
    )
    last_end: dict[int, int] = {}  # per run: when its last work item ended
    busy_threads: dict[int, set] = defaultdict(set)
    for it in items:
        last_end[it["run"]] = max(last_end.get(it["run"], 0), it["end"])
        busy_threads[it["run"]].add(it["thread"])
    previous_end = t0
    for i in index:
        r = runs[i]
        g = groups[(r["kind"], r["total"], r["bytes"])]
        g["runs"] += 1
        g["ns"] += r["end"] - r["start"]
        g["gap_ns"] += max(0, r["start"] - previous_end)
        g["driver_wait_ns"] += r["end"] - r["driver_done"]
        g["tail_ns"] += max(0, r["end"] - last_end.get(i, r["end"]))
        g["threads"] += len(busy_threads.get(i, ()))
        g["bytes"] += r["bytes"]
        previous_end = r["end"]
    rows = []
    for (kind, total, nbytes), g in sorted(groups.items(), key=lambda kv: -kv[1]["ns"]):
        rows.append({"kind": KINDS.get(kind, str(kind)), "rows": total, "weight_bytes": nbytes,
                     "per_step": g["runs"] / steps, "us_per_step": g["ns"] / steps / 1e3,
                     "us_each": g["ns"] / g["runs"] / 1e3, "gbs": g["bytes"] / g["ns"] if g["ns"] else 0.0,
                     "gap_before_us_each": g["gap_ns"] / g["runs"] / 1e3,
                     "driver_waits_us_each": g["driver_wait_ns"] / g["runs"] / 1e3,
                     "after_last_item_us_each": g["tail_ns"] / g["runs"] / 1e3,
                     "threads_with_items": g["threads"] / g["runs"]})  # fmt: skip
    step_us = (t1 - t0) / steps / 1e3
    in_runs = sum(r["us_per_step"] for r in rows)
    # work items of the products, by size: how fast a thread streams an item of that many bytes
    chosen = set(index)
    buckets: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for it in items:
        r = runs[it["run"]] if 0 <= it["run"] < len(runs) else None
        if it["run"] not in chosen or not r or not r["bytes"] or r["total"] <= 0:
            continue
        nbytes = r["bytes"] * (it["stop"] - it["begin"]) // r["total"]
        label = next(name for limit, name in ITEM_SIZES if nbytes < limit)
        buckets[label].append((nbytes, it["end"] - it["start"]))
    item_rows = []
    for _, label in ITEM_SIZES:
        b = buckets.get(label)
        if b:
            ns = sum(d for _, d in b)
            item_rows.append({"items": label, "per_step": len(b) / steps, "share_of_item_time": ns,
                              "gbs_per_thread": sum(n for n, _ in b) / ns if ns else 0.0,
                              "median_gbs_per_thread": statistics.median(n / d for n, d in b if d > 0)})  # fmt: skip
    all_ns = sum(r["share_of_item_time"] for r in item_rows) or 1
    for r in item_rows:
        r["share_of_item_time"] /= all_ns
    return {"step_us": step_us, "in_runs_us": in_runs, "between_runs_us": step_us - in_runs, "runs": rows,
            "items": item_rows}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(ap)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--tokens", type=int, default=64, help="decode steps traced")
    ap.add_argument("--keep-trace", help="copy the raw trace (one line per run and per work item) here")
    args = ap.parse_args()
    if args.tokens < 2:
        ap.error(f"--tokens {args.tokens}: expected at least 2")
    with tempfile.TemporaryDirectory() as tmp:
        module = build_traced_module(Path(tmp))
        trace = Path(tmp) / "trace.txt"
        os.environ["EXPERTBENCH_POOL_TRACE"] = str(trace)
        # one cpu device (not one per NUMA node): the trace's runs are then those of one pool, one after another
        with Engine(cpu_devices=1, cpu_threads=args.threads, module_paths={"cpu": str(module)}) as eng:
            threads = eng.devices[0].threads
            model = eng.load(demo_target(args.size, args.dtype), weights=args.weights)
            prompt = model.encode(DEMO_PROMPTS[0])
            with model.context(len(prompt) + 2 * args.tokens + 2) as ctx:
                ctx.generate(prompt, args.tokens)  # warm: page cache, arenas
                ctx.truncate(0)
                ctx.prefill(prompt[:-1], all_rows=False)
                t0 = time.monotonic_ns()  # the trace's clock (CLOCK_MONOTONIC)
                ctx.generate(prompt[-1:], args.tokens)  # args.tokens one-token evaluations
                t1 = time.monotonic_ns()
        runs, items = read_trace(trace)  # written when the engine closed the module
        if args.keep_trace:
            shutil.copyfile(trace, args.keep_trace)
    report = analyse(runs, items, t0, t1, args.tokens)
    report.update({"command": " ".join(["python", *sys.argv]), "dtype": args.dtype, "threads": threads,
                   "tokens_per_second": 1e6 / report["step_us"]})  # fmt: skip
    print(f"{args.dtype}, {threads} threads: {report['tokens_per_second']:.1f} tok/s traced; per step "
          f"{report['step_us']:.0f} us, {report['in_runs_us']:.0f} in pool runs, {report['between_runs_us']:.0f} "
          "between them (the calling thread alone)")  # fmt: skip
    print("| pool run | rows | weight MB | per step | us each | us per step | GB/s | us before each (alone) "
          "| us the caller waits for the last worker | us from the last item's end to the run's "
          "| threads with items |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in report["runs"]:
        print(f"| {r['kind']} | {r['rows']} | {r['weight_bytes'] / 1e6:.2f} | {r['per_step']:.1f} | {r['us_each']:.1f} "
              f"| {r['us_per_step']:.0f} | {r['gbs']:.1f} | {r['gap_before_us_each']:.1f} "
              f"| {r['driver_waits_us_each']:.1f} | {r['after_last_item_us_each']:.1f} "
              f"| {r['threads_with_items']:.1f} |")  # fmt: skip
    print("\n| work items of products | per step | share of item time | GB/s per thread (all, median) |")
    print("| --- | --- | --- | --- |")
    for r in report["items"]:
        print(f"| {r['items']} | {r['per_step']:.1f} | {r['share_of_item_time']:.0%} | {r['gbs_per_thread']:.1f}, "
              f"{r['median_gbs_per_thread']:.1f} |")  # fmt: skip
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
