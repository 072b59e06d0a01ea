"""Decode speed with the GPU as the primary device: attention, router, norms and the KV cache on the GPU.

Placements: every expert on the GPU (one-token steps replayed from a recorded graph, and queued anew for
comparison), the first half of the expert layers on the CPU, every expert on the CPU. For each: greedy ids
against a CPU-only run (must be identical), decode tokens/s (median of --repeats after a warm-up), host round
trips per token, and for the all-GPU placement the weight bytes read per token over the step time against the
GPU's measured memory read ceiling (--hbm-gbs, from bench/gpu/hbm_read.cu in the same session).

    python bench/gpu_primary.py --size bench --tokens 128 --repeats 5 --hbm-gbs 4400 --json out.json
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


def decode(model, prompt_ids, n_tokens, graphs=True):
    """Greedy ids, the logits of every step, decode seconds and the counters' changes over the decode steps."""
    ids, rows, seconds, before, after = greedy_decode(model, prompt_ids, n_tokens, graphs)
    delta = {k: after[k] - before[k] for k in ("host_round_trips", "graph_launches", "layer_steps")}
    gpu = model.device if not model.device.startswith("cpu:") else None
    if gpu:  # the GPU's busy time: from the first to the last piece of queued work of each synchronized stretch
        delta["gpu_busy_seconds"] = after["devices"][gpu]["busy_seconds"] - before["devices"][gpu]["busy_seconds"]
    return ids, rows, seconds, delta


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_gpu_arguments(ap)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hbm-gbs", type=float, default=0.0, help="the GPU's measured memory read ceiling, GB/s")
    args = ap.parse_args()
    model_dir = Path(args.model) if args.model else ensure_demo_pair(args.size).target
    runtime = args.gpu.split(":")[0]
    with Engine(runtimes=("cpu", runtime), cpu_threads=args.threads) as eng:
        cpu = eng.load(model_dir, weights=args.weights)
        prompt = cpu.encode(DEMO_PROMPTS[0])
        base_ids, base_logits, cpu_seconds, _ = decode(cpu, prompt, args.tokens)
        cpu_tps = (len(base_ids) - 1) / cpu_seconds
        cpu.close()
        model = eng.load(model_dir, device=args.gpu, weights=args.weights)
        moe = model.config.moe_layers
        half = "; ".join(f"{layer}=cpu:0" for layer in moe[: len(moe) // 2])
        configs = [
            ("every expert on the GPU, graphs", f"*={args.gpu}", True),
            ("every expert on the GPU, no graphs", f"*={args.gpu}", False),
            (f"first {len(moe) // 2} of {len(moe)} expert layers on cpu:0", f"*={args.gpu}; {half}", True),
            ("every expert on cpu:0", "*=cpu:0", True),
        ]
        bytes_per_token = model.info["bytes_per_token"]
        rows = []
        for name, placement, graphs in configs:
            model.set_placement(placement)
            decode(model, prompt, 16, graphs)  # warm up: graph recording, clocks
            speeds, ids, logits, delta = [], None, None, None
            for _ in range(args.repeats):
                ids, logits, seconds, delta = decode(model, prompt, args.tokens, graphs)
                speeds.append((len(ids) - 1) / seconds)
            steps = args.tokens - 1
            on_cpu = any(owner == "cpu:0" for layer in model.placement.owners for owner in layer)
            tps = statistics.median(speeds)
            gbs = bytes_per_token * tps / 1e9
            rows.append({
                "placement": name, "text": model.placement.describe(), "graphs": graphs,
                "decode_tokens_per_second": tps, "min": min(speeds), "max": max(speeds),
                "tokens_identical_to_cpu": ids == base_ids,
                "max_abs_logit_diff": float(np.abs(logits - base_logits).max()),
                "host_round_trips_per_token": delta["host_round_trips"] / steps,
                "graph_launches_per_token": delta["graph_launches"] / steps,
                "gpu_busy_ms_per_token": 1e3 * delta["gpu_busy_seconds"] / steps,
                "weight_gbs": gbs,
                # of the HBM ceiling only where the GPU reads every weight: otherwise the CPU reads some of them
                "fraction_of_hbm_read_ceiling": gbs / args.hbm_gbs if args.hbm_gbs and not on_cpu else None,
            })  # fmt: skip
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": str(model_dir),
        "host": platform.node(),
        "cpu_threads": args.threads or os.cpu_count(),
        "bytes_per_token": bytes_per_token,
        "hbm_read_gbs": args.hbm_gbs,
        "cpu_only_decode_tokens_per_second": cpu_tps,
        "results": rows,
    }
    print(f"CPU only: {cpu_tps:.1f} tok/s; weights read per token {bytes_per_token / 1e6:.1f} MB; "
          f"HBM read ceiling {args.hbm_gbs:.0f} GB/s")  # fmt: skip
    print(f"| primary {args.gpu}, placement | decode tok/s (median, min-max) | ids == CPU | max abs logit diff "
          "| host round trips / token | GPU busy ms / token | weight GB/s (of ceiling) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        speed = f"{r['decode_tokens_per_second']:.1f} ({r['min']:.1f}-{r['max']:.1f})"
        frac = f" ({100 * r['fraction_of_hbm_read_ceiling']:.1f} %)" if r["fraction_of_hbm_read_ceiling"] else ""
        print(f"| {r['placement']} | {speed} | {r['tokens_identical_to_cpu']} | {r['max_abs_logit_diff']:.2e} "
              f"| {r['host_round_trips_per_token']:.1f} | {r['gpu_busy_ms_per_token']:.3f} "
              f"| {r['weight_gbs']:.0f}{frac} |")  # fmt: skip
    write_report(args.json, report)
    return 0 if all(r["tokens_identical_to_cpu"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
