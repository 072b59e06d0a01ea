"""What holding a checkpoint's files on huge pages buys over mapping them, on this machine, in one run.

Loads the demo target twice in one engine, once with weights="map" (the files memory-mapped: 4 KiB pages of the
page cache) and once with weights="copy" (read into private memory advised for transparent huge pages), then
decodes with each in turn, --rounds times, alternating which goes first (a shared machine's memory speed drifts
over minutes). Both must choose the same tokens. Prints each round's tokens/s and the copy/map ratio, their median,
the load times and how much of the copy the kernel put on huge pages.

    python bench/weights_ab.py --size bench --dtypes bf16 f32 --rounds 6 --json bench/results/weights_ab.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from engine.checkpoints.demo import DEMO_PROMPTS
from engine.model import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkpoints import demo_target  # noqa: E402
from measure import add_model_arguments, decode_speed, write_report  # noqa: E402

MODES = ("map", "copy")


def compare(dtype: str, args) -> dict:
    path = demo_target(args.size, dtype)
    with Engine(cpu_threads=args.threads) as eng:
        models, load_seconds = {}, {}
        for mode in MODES:
            t0 = time.perf_counter()
            models[mode] = eng.load(path, weights=mode)
            load_seconds[mode] = time.perf_counter() - t0
        prompt = models["map"].encode(DEMO_PROMPTS[0])
        for mode in MODES:  # page cache, arenas and the copy's pages touched once before any timing
            decode_speed(models[mode], prompt, args.tokens, 0)
        rounds, ids = [], {}
        for r in range(args.rounds):
            got = {}
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                speeds, ids[mode] = decode_speed(models[mode], prompt, args.tokens, args.repeats, warm=False)
                got[mode] = statistics.median(speeds)
            if ids["map"] != ids["copy"]:
                raise SystemExit(f"{dtype}: the copied weights chose other tokens than the mapped ones")
            rounds.append(got)
        info = models["copy"].info
        return {"dtype": dtype, "model": str(path), "threads": eng.devices[0].threads,
                "copy_held_as": info["weights"], "file_bytes": info["file_bytes"],
                "huge_page_bytes": info["huge_page_bytes"], "load_seconds": load_seconds, "rounds": rounds,
                "round_ratios": [g["copy"] / g["map"] for g in rounds],
                "ratio": statistics.median(g["copy"] / g["map"] for g in rounds)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(ap, weights=False)  # it loads both ways itself
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "f32"])
    ap.add_argument("--tokens", type=int, default=64, help="decode steps per run")
    ap.add_argument("--repeats", type=int, default=3, help="decodes per mode per round (their median is taken)")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    rows = [compare(dtype, args) for dtype in args.dtypes]
    print(f"transparent huge pages: {thp.read_text().strip() if thp.exists() else 'not available'}")
    print("| dtype | threads | map tok/s (per round) | copy tok/s (per round) | copy / map, median (per round) "
          "| load map / copy s | copy on huge pages |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        each = {m: ", ".join(f"{g[m]:.1f}" for g in r["rounds"]) for m in MODES}
        ratios = ", ".join(f"{v:.3f}" for v in r["round_ratios"])
        print(f"| {r['dtype']} | {r['threads']} | {each['map']} | {each['copy']} | {r['ratio']:.3f} ({ratios}) "
              f"| {r['load_seconds']['map']:.2f} / {r['load_seconds']['copy']:.2f} "
              f"| {r['huge_page_bytes'] / 2**20:.0f} of {r['file_bytes'] / 2**20:.0f} MiB |")  # fmt: skip
    write_report(args.json, {"command": " ".join(["python", *sys.argv]), "cores": os.cpu_count(), "results": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
