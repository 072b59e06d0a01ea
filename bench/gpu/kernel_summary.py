"""Sum ncu's CSV (gpu__time_duration per launch) by kernel: launches, total and mean microseconds per step.

    python3 bench/gpu/kernel_summary.py RUN.csv STEPS [BASE.csv]

With BASE.csv (the same program with fewer decode steps), BASE's launches are subtracted from RUN's kernel by
kernel, so that the table holds the STEPS extra decode steps alone; without it, RUN's launches are divided by STEPS.
"""

import csv
import sys
from collections import defaultdict


def per_kernel(path: str) -> tuple[dict, dict]:
    with open(path) as f:
        rows = list(csv.DictReader(line for line in f if line.startswith('"')))
    total, count = defaultdict(float), defaultdict(int)
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r["Metric Unit"]]
        name = r["Kernel Name"].split("(")[0]
        total[name] += float(r["Metric Value"].replace(",", "")) * scale
        count[name] += 1
    return total, count


total, count = per_kernel(sys.argv[1])
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1
if len(sys.argv) > 3:
    base_total, base_count = per_kernel(sys.argv[3])
    for name in base_total:
        total[name] -= base_total[name]
        count[name] -= base_count[name]
    for name in [n for n in total if count[n] <= 0]:
        del total[name], count[name]
all_us = sum(total.values())
print(f"| kernel | launches per step | us per step | share | us per launch |  ({steps} steps)")
for name in sorted(total, key=total.get, reverse=True):
    print(
        f"| {name} | {count[name] / steps:.0f} | {total[name] / steps:.1f} | {100 * total[name] / all_us:.1f} % "
        f"| {total[name] / count[name]:.2f} |"
    )
print(f"| all | {sum(count.values()) / steps:.0f} | {all_us / steps:.1f} | 100 % | |")
