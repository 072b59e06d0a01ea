"""Sum ncu's CSV (gpu__time_duration per launch) by kernel: launches, total and mean microseconds."""

import csv
import sys
from collections import defaultdict

with open(sys.argv[1]) as f:
    rows = list(csv.DictReader(line for line in f if line.startswith('"')))
total, count = defaultdict(float), defaultdict(int)
for r in rows:
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r["Metric Unit"]]
    name = r["Kernel Name"].split("(")[0]
    total[name] += float(r["Metric Value"].replace(",", "")) * scale
    count[name] += 1
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1
print(f"| kernel | launches per step | us per step | us per launch |  ({steps} steps)")
for name in sorted(total, key=total.get, reverse=True):
    print(f"| {name} | {count[name] / steps:.0f} | {total[name] / steps:.1f} | {total[name] / count[name]:.2f} |")
print(f"| all | {sum(count.values()) / steps:.0f} | {sum(total.values()) / steps:.1f} | |")
