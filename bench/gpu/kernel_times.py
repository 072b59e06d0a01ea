"""A few decode steps of the demo model with the GPU as primary and every expert on it, queued without graphs,
for a kernel profiler to time (bench/gpu/run_on_device.sh kernels runs it under ncu and sums per kernel).

    ncu --clock-control none --metrics gpu__time_duration.sum --csv python3 bench/gpu/kernel_times.py
"""

import sys

from engine.demo import DEMO_PROMPTS, ensure_demo_pair
from engine.model import Engine

size = sys.argv[1] if len(sys.argv) > 1 else "bench"
with Engine(runtimes=("cpu", "cuda")) as eng, eng.load(ensure_demo_pair(size).target, device="cuda:0") as model:
    model.set_placement("*=cuda:0")
    with model.context(256) as ctx:
        ctx.graphs = False
        token = int(ctx.prefill(model.encode(DEMO_PROMPTS[0]), all_rows=False).argmax())
        for _ in range(4):
            token = int(ctx.decode([token])[0].argmax())
