"""The quality cost of every fast mode beside its speed, on the demo pair: owner_local sums over a split placement,
the q8 activation precision (on the Q8_0 GGUF demo), and every experts-per-token count below the model's own.

Each fast mode against the reference mode (f32, the model's own experts per token), target only, on the demo
prompts (engine.runs.quality.quality_cost): greedy agreement, mean and largest KL of the next-token distributions, the
first token where the outputs part; and decode tokens/s of both (median of --repeats passes) with their ratio.
Prints a Markdown table and writes a JSON report:

    python bench/quality_cost.py --tokens 64 --repeats 3 --json bench/results/quality_cost.json
    python bench/quality_cost.py --primary cuda:0 --peer cpu:0 --runtime cuda      # owner_local with a GPU primary
"""

from __future__ import annotations

import argparse
import platform
import sys

from measure import write_report

from engine.checkpoints.demo import ensure_demo_pair
from engine.model import Engine
from engine.runs.quality import quality_cost
from engine.runs.run import DecodeRun


def measure(reference, fast, label: str, devices: str, tokens: int, repeats: int, **settings) -> dict:
    """One fast mode: its own run and the reference's (speeds, both on the fast mode's placement when it names one,
    so that the speed ratio is the mode's alone), then the quality cost from those runs."""
    placement = settings.get("placement")
    ref = DecodeRun(reference, tokens_per_prompt=tokens, repeats=repeats, placement=placement).run()
    run = DecodeRun(fast, tokens_per_prompt=tokens, repeats=repeats, **settings).run()
    mode, precision = settings.get("mode", "reference"), settings.get("precision", "f32")
    cost = quality_cost(reference, fast, tokens=tokens, mode=mode, precision=precision, reference_result=ref,
                        fast_result=run, top_k=settings.get("top_k"))  # fmt: skip
    return {"fast_mode": label, "devices": devices, "placement": run.placement,
            "reference_tokens_per_second": ref.decode_tokens_per_second,
            "decode_tokens_per_second": run.decode_tokens_per_second,
            "speed_ratio": run.decode_tokens_per_second / ref.decode_tokens_per_second,
            **{**cost.to_dict(), "fast_mode": label}}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="default", help="demo size (default: default)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per prompt (default 64)")
    ap.add_argument("--repeats", type=int, default=3, help="passes over the prompts for the speeds (default 3)")
    ap.add_argument("--primary", default="cpu:0", help="the target's device (default cpu:0)")
    ap.add_argument("--peer", default="cpu:1", help="owner_local's second owner (default cpu:1)")
    ap.add_argument("--runtime", action="append", default=[], help="load this runtime too (cuda, hip, hostsim)")
    ap.add_argument("--json", help="write the JSON report here")
    args = ap.parse_args()
    rows = []
    pair = ensure_demo_pair(args.size)
    cpu_devices = 2 if "cpu:1" in (args.primary, args.peer) else 0
    with Engine(runtimes=("cpu", *args.runtime), cpu_devices=cpu_devices) as eng:
        target = eng.load(pair.target, device=args.primary)
        target.set_placement(f"*={args.primary}")
        half = target.config.num_layers // 2
        devices = f"{args.primary} + {args.peer}"
        rows.append(measure(target, target, "owner_local", devices, args.tokens, args.repeats, mode="owner_local",
                            placement=f"*={args.primary}; 0-{half - 1}={args.peer}"))  # fmt: skip
        target.set_placement(f"*={args.primary}")
        for k in range(target.config.top_k - 1, 0, -1):  # the target's own contexts, decoding with fewer experts
            rows.append(measure(target, target, f"top-{k} of {target.config.top_k}", args.primary, args.tokens,
                                args.repeats, top_k=k))  # fmt: skip
    if args.primary.startswith("cpu"):  # measured on the CPU: a GPU's q8 products are its bits (the same cost)
        quantized = ensure_demo_pair(args.size, format="gguf", quant="q8_0")
        with Engine() as eng:
            target = eng.load(quantized.target)
            rows.append(measure(target, target, "q8 (Q8_0 weights)", "cpu:0", args.tokens, args.repeats,
                                precision="q8"))  # fmt: skip
    print("| fast mode | devices | greedy agreement | mean KL (nats) | max KL | first divergence | decode tok/s "
          "(reference) | speed |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for r in rows:
        first = "none" if r["first_divergence"] is None else f"token {r['first_divergence']}"
        print(f"| {r['fast_mode']} | {r['devices']} | {100 * r['agreement']:.1f} % | {r['mean_kl']:.3g} | "
              f"{r['max_kl']:.3g} | {first} | {r['decode_tokens_per_second']:.1f} "
              f"({r['reference_tokens_per_second']:.1f}) | {r['speed_ratio']:.2f}x |")  # fmt: skip
    write_report(args.json, {"machine": platform.node(), "size": args.size, "tokens_per_prompt": args.tokens,
                             "repeats": args.repeats, "rows": rows})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
