"""Two builds of the GPU module side by side in one process: decode tokens/s of each, in turns (A B A B ...), on
one checkpoint, and whether every step's logits are the same bits under both (a kernel change that keeps each
product's arithmetic must give them). Placements: every expert on the GPU (graphs), and half of every layer's
experts on cpu:0 (the down products' combine with the CPU's outputs).

    python bench/gpu/ab_modules.py --model DIR --module A=/tmp/a.so --module B=/tmp/b.so --tokens 128 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import decode_speed, greedy_decode, write_report  # noqa: E402

from engine.checkpoints.checkpoint import Checkpoint  # noqa: E402
from engine.checkpoints.demo import DEMO_PROMPTS  # noqa: E402
from engine.model import Engine  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="checkpoint folder or GGUF file")
    ap.add_argument("--module", action="append", required=True, help="NAME=FILE of a cuda module build (two)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--runtime", default="cuda", help="the runtime the builds are of (its device 0 the primary)")
    ap.add_argument("--json")
    args = ap.parse_args()
    builds = dict(item.split("=", 1) for item in args.module)
    ck = Checkpoint.open(args.model)
    prompt = ck.tokenizer.encode(DEMO_PROMPTS[0], add_special_tokens=False).ids
    gpu = f"{args.runtime}:0"
    half = f"*={gpu}; *.0-{ck.config.num_experts // 2 - 1}=cpu:0"
    placements = {f"every expert on {gpu}": f"*={gpu}", "half of every layer's experts on cpu:0": half}
    speeds = {(b, p): [] for b in builds for p in placements}
    logits = {}
    for r in range(args.rounds):
        for name, path in builds.items():
            with (
                Engine(
                    runtimes=("cpu", args.runtime), module_paths={args.runtime: path}, cpu_threads=args.threads
                ) as eng,
                eng.load(ck, device=gpu) as m,
            ):
                for label, placement in placements.items():
                    m.set_placement(placement)
                    if r == 0:
                        logits[name, label] = greedy_decode(m, prompt, args.tokens)[1]
                    s, _ = decode_speed(m, prompt, args.tokens, args.repeats)
                    speeds[name, label] += s
                    print(f"round {r} {name} | {label} | {statistics.median(s):.1f} tok/s", flush=True)
    a, b = list(builds)[:2]
    report = {"model": str(args.model), "tokens": args.tokens, "rows": []}
    for label in placements:
        same = bool(np.array_equal(logits[a, label], logits[b, label]))
        diff = float(np.max(np.abs(logits[a, label] - logits[b, label])))
        ma, mb = statistics.median(speeds[a, label]), statistics.median(speeds[b, label])
        print(f"| {label} | {a} {ma:.1f} | {b} {mb:.1f} | {b}/{a} {mb / ma:.3f} | logits the same bits: {same} "
              f"(max abs difference {diff:.3g}) |")  # fmt: skip
        report["rows"].append({"placement": label, a: speeds[a, label], b: speeds[b, label], "same_bits": same})
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
