"""expertbench regress: replay profiles headless and judge their hashes, acceptance and speed."""

from __future__ import annotations

import argparse
import json
import sys

from ..core.errors import ArgumentError
from ..core.files import atomic_write, check_output
from ..profiles.profile import ProfileError
from ..profiles.regress import DEFAULT_SPEED_SLACK, run


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "regress",
        help="replay profiles headless and check their hashes, acceptance and speed (exit 1 on a regression)",
        description="Runs each profile's decode runs (and each baseline profile they name, in the same "
        "invocation) and checks: every repeat gives the same output hashes, equal to the recorded ones; draft "
        "acceptance at least the minimum; decode tokens/s over the baseline's at least the minimum ratio. "
        "Exit 0 all held, 1 a regression, 2 bad input.",
    )
    p.add_argument("profiles", nargs="+", metavar="PROFILE", help="profile files (YAML; see profiles/README.md)")
    p.add_argument("--record", action="store_true", help="write the measured expectations into the profiles")
    p.add_argument(
        "--speed-slack",
        type=float,
        default=DEFAULT_SPEED_SLACK,
        metavar="F",
        help=f"with --record: min_ratio = measured ratio x (1 - F) (default {DEFAULT_SPEED_SLACK})",
    )
    p.add_argument("--portable", action="store_true", help="use the portable C kernels instead of AVX2")
    p.add_argument("--no-check-weights", dest="check_weights", action="store_false",
                   help="load the models without checking that every weight is a number (see run --help)")  # fmt: skip
    p.add_argument("--report-json", metavar="FILE", help="write a JSON report here")
    p.add_argument("--junit", metavar="FILE", help="write a JUnit XML report here")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    p.set_defaults(func=cmd_regress)
    return p


def cmd_regress(args) -> int:
    if not 0 <= args.speed_slack < 1:
        raise ProfileError(f"--speed-slack {args.speed_slack}: expected 0 <= F < 1")
    for path in (args.report_json, args.junit):  # before the runs, not after them
        if path:
            check_output(path)
    report = run(args.profiles, record=args.record, speed_slack=args.speed_slack, portable=args.portable,
                 check_weights=args.check_weights)  # fmt: skip
    data = report.to_dict()
    for path, text in ((args.report_json, lambda: json.dumps(data, indent=2) + "\n"), (args.junit, report.to_junit)):
        if path:
            try:
                atomic_write(path, text())
            except ArgumentError as exc:
                print(f"expertbench: error: {exc}", file=sys.stderr)
                return 2
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        sys.stdout.write(report.table())
    for o in report.outcomes:
        if o.error is not None:
            print(f"expertbench: error: {o.error}", file=sys.stderr)
    return report.exit_code
