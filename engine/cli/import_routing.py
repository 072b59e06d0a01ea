"""expertbench import-routing: another engine's routing statistics into a profile."""

from __future__ import annotations

from ..checkpoints.checkpoint import read_config
from ..export.engines import import_routing
from ..profiles.profile import RoutingSpec, load


def add_parser(sub):
    p = sub.add_parser(
        "import-routing",
        help="routing statistics recorded by another engine into a profile",
        description="SGLang's expert distribution counts (its logical_count, as JSON) or lucebox's hotness CSV become "
        "the profile's routing statistics (the heat map, hot-first strategies and exports read them), checked "
        "against the profile's model: its layers, experts and top-k.",
    )
    p.add_argument("file", metavar="FILE", help="the statistics file")
    p.add_argument("--format", required=True, choices=("sglang", "lucebox"), help="what FILE is")
    p.add_argument("--into", required=True, metavar="PROFILE", help="the profile to write them into (saved in place)")
    p.set_defaults(func=cmd_import_routing)
    return p


def cmd_import_routing(args) -> int:
    profile = load(args.into)
    folder = profile.model_folder()
    config = read_config(folder)
    stats = import_routing(args.file, args.format, config)
    profile.routing = RoutingSpec.inline(stats)
    profile.save()
    print(f"{args.into}: routing statistics from {args.file} ({args.format}): {int(stats.hits.sum())} selections over "
          f"{stats.num_layers} layers x {stats.num_experts} experts")  # fmt: skip
    return 0
