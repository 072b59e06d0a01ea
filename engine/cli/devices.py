"""`expertbench devices`: the runtimes and devices this build can load."""

from __future__ import annotations

import argparse
import json

from .common import engine_args, make_engine


def add_parser(sub) -> argparse.ArgumentParser:
    dev = sub.add_parser("devices", help="list runtimes and devices")
    dev.add_argument("--json", action="store_true")
    engine_args(dev)
    dev.set_defaults(func=cmd_devices)
    return dev


def cmd_devices(args) -> int:
    """Every runtime this build has, loaded side by side; one that cannot run here is listed with its reason."""
    if not args.runtime:
        args.runtime = ["hostsim", "cuda", "hip"]
    with make_engine(args, strict=False) as eng:
        runtimes = eng.runtimes
        devices = eng.devices
        missing = dict(eng.load_errors)
    if args.json:
        print(json.dumps({"runtimes": [r.__dict__ for r in runtimes], "devices": [d.__dict__ for d in devices],
                          "unavailable": missing}, indent=2))  # fmt: skip
        return 0
    gib = 1 << 30
    for r in runtimes:
        ext = f", extensions {' '.join(r.extensions)}" if r.extensions else ""
        kernels = f"{r.kernel_variant} kernels, ABI {r.abi_version}{ext}"
        print(f"runtime {r.name}: {r.n_devices} device(s), {kernels}, {r.path}")
        for d in devices:
            if d.name.split(":")[0] == r.name:
                threads = f"{d.threads} threads, " if d.threads else ""
                print(f"  {d.name:10s} {d.kind:4s} {d.description} - {threads}"
                      f"{d.memory_free / gib:.1f} of {d.memory_total / gib:.1f} GiB free, "
                      f"precisions {', '.join(d.precisions) or 'none'}")  # fmt: skip
    for name, reason in missing.items():
        print(f"runtime {name}: unavailable - {reason}")
    return 0
