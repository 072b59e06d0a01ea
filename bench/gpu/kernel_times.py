"""A few decode steps of a model with the GPU as primary and every expert on it, queued without graphs, for a
kernel profiler to time. Profile two runs that differ only in the number of decode steps and let
kernel_summary.py subtract them: what remains is the decode steps alone (no loading, no prefill).

    ncu --clock-control none --metrics gpu__time_duration.sum --csv python3 bench/gpu/kernel_times.py MODEL 2 > a.csv
    ncu ... python3 bench/gpu/kernel_times.py MODEL 6 > b.csv
    python3 bench/gpu/kernel_summary.py b.csv 4 a.csv

MODEL is a demo size (default bench) or a model folder or .gguf file; the second argument the decode steps (4); a
third, a cuda module file to use instead of the installed one (an A/B of two builds).
"""

import sys
from pathlib import Path

from engine.checkpoints.demo import DEMO_PROMPTS, SIZES, ensure_demo_pair
from engine.model import Engine

what = sys.argv[1] if len(sys.argv) > 1 else "bench"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
path = ensure_demo_pair(what).target if what in SIZES else Path(what)
module = {"cuda": sys.argv[3]} if len(sys.argv) > 3 else None
with Engine(runtimes=("cpu", "cuda"), module_paths=module) as eng, eng.load(path, device="cuda:0") as model:
    model.set_placement("*=cuda:0")
    with model.context(256) as ctx:
        ctx.graphs = False
        token = int(ctx.prefill(model.encode(DEMO_PROMPTS[0]), all_rows=False).argmax())
        for _ in range(steps):
            token = int(ctx.decode([token])[0].argmax())
