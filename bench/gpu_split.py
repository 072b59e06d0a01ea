"""Decode speed with 0, 25, 50, 75 and 100 % of the expert layers on a GPU, CPU primary, reference mode.

For each split: greedy-decode the same tokens as the CPU-only run (checked: the ids must be identical), the largest
logits difference from the CPU-only run, and decode tokens/s (median of --repeats). Writes a JSON report and
prints a Markdown table. Run on a machine with the cuda (or hip) module built:

    python bench/gpu_split.py --size bench --tokens 64 --repeats 3 --json bench/results/gpu_split.json
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

import numpy as np
from measure import add_gpu_arguments, greedy_decode, write_report

from engine.checkpoints.demo import DEMO_PROMPTS, ensure_demo_pair
from engine.model import Engine
from engine.placement.costmodel import ModelShape


def decode(model, prompt_ids, n_tokens, gpu=None, gpu_decode=None):
    """Greedy ids, every step's logits, and decode seconds (prefill excluded). gpu_decode accumulates the GPU's
    (rows, busy seconds) over the decode steps alone."""
    ids, rows, seconds, before, after = greedy_decode(model, prompt_ids, n_tokens)
    if gpu_decode is not None:
        b, a = before["devices"].get(gpu, {}), after["devices"].get(gpu, {})
        gpu_decode += np.array([a.get("rows", 0) - b.get("rows", 0),
                                a.get("busy_seconds", 0.0) - b.get("busy_seconds", 0.0)])  # fmt: skip
    return ids, rows, seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_gpu_arguments(ap)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model_dir = Path(args.model) if args.model else ensure_demo_pair(args.size).target
    runtime = args.gpu.split(":")[0]
    with Engine(runtimes=("cpu", runtime), cpu_threads=args.threads) as eng:
        model = eng.load(model_dir, weights=args.weights)
        prompt = model.encode(DEMO_PROMPTS[0])
        moe = model.config.moe_layers
        info = {d.name: d.description for d in eng.devices}
        rows = []
        base_ids = base_logits = None
        for percent in (0, 25, 50, 75, 100):
            k = round(len(moe) * percent / 100)
            rules = "; ".join(f"{layer}={args.gpu}" for layer in moe[:k])
            model.set_placement(f"*=cpu:0; {rules}" if rules else "*=cpu:0")
            decode(model, prompt, 8)  # warm up: arenas, weights in cache
            speeds, ids = [], None
            gpu_decode = np.zeros(2)
            for _ in range(args.repeats):
                ids, logits, seconds = decode(model, prompt, args.tokens, args.gpu, gpu_decode)
                speeds.append((len(ids) - 1) / seconds)
            # GPU-side efficiency while decoding: each routed pair reads one expert's weights, in the model's dtype
            expert_bytes = ModelShape.from_model(model).expert_bytes
            gpu_rows, gpu_busy = gpu_decode
            positions = args.repeats * (args.tokens - 1)
            gpu_gbs = gpu_rows * expert_bytes / gpu_busy / 1e9 if gpu_busy > 0 else 0.0
            if base_ids is None:
                base_ids, base_logits = ids, logits
            rows.append({
                "gpu_layers": k, "percent": percent, "placement": model.placement.describe(),
                "decode_tokens_per_second": statistics.median(speeds), "min": min(speeds), "max": max(speeds),
                "tokens_identical_to_cpu": ids == base_ids,
                "max_abs_logit_diff": float(np.abs(logits - base_logits).max()),
                "max_rel_logit_diff": float((np.linalg.norm(logits - base_logits, axis=1)
                                             / np.linalg.norm(base_logits, axis=1)).max()),
                "gpu_busy_seconds_per_position": gpu_busy / positions,
                "gpu_expert_weight_gbs": gpu_gbs,
                "counters": model.counters()["devices"],
            })  # fmt: skip
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": str(model_dir),
        "devices": info,
        "host": platform.node(),
        "cpu_threads": args.threads or os.cpu_count(),
        "tokens": args.tokens,
        "repeats": args.repeats,
        "results": rows,
    }
    print(f"| {args.gpu} expert layers | decode tok/s (median, min-max) | ids == CPU-only | max abs logit diff "
          "| GPU expert GB/s while busy |")  # fmt: skip
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        speed = f"{r['decode_tokens_per_second']:.1f} ({r['min']:.1f}-{r['max']:.1f})"
        same, diff = r["tokens_identical_to_cpu"], r["max_abs_logit_diff"]
        gbs = r["gpu_expert_weight_gbs"]
        print(f"| {r['gpu_layers']}/{len(moe)} ({r['percent']} %) | {speed} | {same} | {diff:.2e} | {gbs:.0f} |")
    write_report(args.json, report)
    return 0 if all(r["tokens_identical_to_cpu"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
