"""A split MoE layer's owners running at the same time, and what the per-token trace costs.

Every MoE layer's experts split between the primary and a peer (experts 0..E/2-1 on the peer): for each decode step
and layer the trace gives the primary's own experts (t_main), the peer's branch (t_peer: staging and its experts,
from its events; a staged peer's upload and download are spans of their own, t_stage, with their bytes) and the
layer's expert phase (t_layer: from the routing read back to the end of the join). Reports their medians, t_layer
against max(t_main, t_peer), against t_main + t_peer and against the aim (the longer owner's experts plus the staged
bytes at the host link's speed, --link-gbs), decode tokens/s with every expert on the primary against the split, and
the trace's cost: decode tokens/s with the trace on and off in alternating rounds, the median of each round's on/off
ratio (the ids must be the same, and equal to every expert on the primary: reference mode). Writes a JSON report and
prints a Markdown table.

    python bench/overlap.py --primary hostsim:0 --peer cpu:0 --size default --threads 1
    python bench/overlap.py --primary cuda:0 --peer cpu:0 --size bench --json bench/results/overlap_cuda.json
    python bench/overlap.py --primary cuda:0 --peer hip:0 --size bench   # two runtime modules (hip for NVIDIA)

With --family deepseek (the DeepSeek-V3-shaped demo) the primary also runs each MoE layer's shared experts while the
peer runs its branch: their span (t_shared) and how much of it falls inside the peer's branch (shared_overlap: the
overlapped microseconds over t_shared) are reported too.

    python bench/overlap.py --family deepseek --primary cpu:0 --peer cpu:1 --size bench --threads 1
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys

from measure import add_model_arguments, at_least, prefill_ids, write_report

from engine.checkpoints.demo import ensure_demo_pair
from engine.model import Engine
from engine.runs.run import TRACE_ROOM_EXTRA, TRACE_ROOM_PER_LAYER


def runtimes_for(primary: str, peer: str) -> tuple[tuple[str, ...], int]:
    names = {d.split(":")[0] for d in (primary, peer)}
    cpu_devices = 1 + max((int(d.split(":")[1]) for d in (primary, peer) if d.startswith("cpu:")), default=0)
    return ("cpu", *sorted(names - {"cpu"})), cpu_devices


def layer_steps(spans, primary: str, peer: str, hidden: int) -> list[dict]:
    """Per (token, layer) of a split layer step, in microseconds: t_main (the primary's own experts), t_peer (the
    peer's whole branch), t_peer_experts (its experts alone), t_stage (a staged peer's upload and download, from the
    stage spans on the peer) with staged_bytes (its rows up and its outputs down, f32), t_layer, join and combine."""
    steps: dict[tuple[int, int], dict] = {}
    for s in spans:
        if s.layer < 0:
            continue
        key = (s.token, s.layer)
        d = steps.setdefault(key, {})
        on_peer = s.device == peer
        if on_peer and s.kind in ("experts", "stage"):
            lo, hi = d.get("peer_span", (s.start_ns, s.end_ns))
            d["peer_span"] = (min(lo, s.start_ns), max(hi, s.end_ns))
        if s.kind == "experts":
            d["t_main" if s.device == primary else "t_peer_experts"] = s.duration_ns / 1000
        elif s.kind == "stage" and on_peer:
            d["t_stage"] = d.get("t_stage", 0.0) + s.duration_ns / 1000
            d["staged_bytes"] = d.get("staged_bytes", 0) + s.rows * hidden * 4
        elif s.kind == "shared":
            d["t_shared"] = s.duration_ns / 1000
            d["shared_span"] = (s.start_ns, s.end_ns)
        elif s.kind == "stage" and s.device == primary:
            d["from"] = s.end_ns
        elif s.kind == "join":
            d["join"], d["to"] = s.duration_ns / 1000, s.end_ns
        elif s.kind == "combine":
            d["combine"] = s.duration_ns / 1000
    out = []
    for d in steps.values():
        if {"t_main", "peer_span", "from", "to"} <= set(d):
            d["t_layer"] = (d.pop("to") - d.pop("from")) / 1000
            peer_span, shared = d.pop("peer_span"), d.pop("shared_span", None)
            d["t_peer"] = (peer_span[1] - peer_span[0]) / 1000
            if shared:  # the part of the shared experts' time the peer was running too
                d["shared_overlap"] = max(0, min(peer_span[1], shared[1]) - max(peer_span[0], shared[0])) / 1000
            out.append(d)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(ap, threads_default=0)
    ap.add_argument("--primary", default="hostsim:0")
    ap.add_argument("--peer", default="cpu:0")
    ap.add_argument("--tokens", type=at_least(2), default=48, help="decode steps per round")
    ap.add_argument("--rounds", type=at_least(1), default=4, help="pairs of rounds, trace off and on")
    ap.add_argument(
        "--family", default=None, help="the demo family (engine.checkpoints.demo's; default: its default one)"
    )
    ap.add_argument("--model", help="a target checkpoint (folder or .gguf) instead of the demo's of --size")
    ap.add_argument("--link-gbs", type=float, default=25.0,
                    help="the host link's speed the aim assumes for a staged peer's bytes (default 25 GB/s: PCIe 4.0 "
                    "x16 as measured by copies of pinned memory)")  # fmt: skip
    args = ap.parse_args()

    target = args.model or ensure_demo_pair(args.size, family=args.family).target
    runtimes, cpu_devices = runtimes_for(args.primary, args.peer)
    with Engine(runtimes=runtimes, cpu_devices=cpu_devices, cpu_threads=args.threads) as eng:
        model = eng.load(target, device=args.primary, weights=args.weights)
        cfg = model.config
        prompt = prefill_ids(cfg.vocab_size, 16)
        model.set_placement(f"*={args.primary}")
        alone_speeds: list[float] = []
        ids_differ = False
        with model.context(len(prompt) + args.tokens + 1) as ctx:
            alone = ctx.generate(prompt, args.tokens).ids  # warm
            for _ in range(args.rounds):
                ctx.truncate(0)
                res = ctx.generate(prompt, args.tokens)
                alone_speeds.append(res.decode_tokens_per_second)
                ids_differ |= res.ids != alone
        placement = f"*={args.primary}; *.0-{cfg.num_experts // 2 - 1}={args.peer}"
        model.set_placement(placement)
        speeds: dict[str, list[float]] = {"off": [], "on": []}
        steps: list[dict] = []
        with model.context(len(prompt) + args.tokens + 1) as ctx:
            ctx.generate(prompt, args.tokens)  # warm: arenas, graphs, page cache
            for _ in range(args.rounds):
                for state in ("off", "on"):
                    ctx.truncate(0)
                    ctx.trace = (
                        (TRACE_ROOM_PER_LAYER * cfg.num_layers + TRACE_ROOM_EXTRA) * (args.tokens + 1) * (state == "on")
                    )
                    res = ctx.generate(prompt, args.tokens)
                    speeds[state].append(res.decode_tokens_per_second)
                    ids_differ |= res.ids != alone
                    if state == "on":
                        steps += layer_steps(ctx.trace_spans(), args.primary, args.peer, cfg.hidden_size)
            ctx.trace = 0
        model.close()

    def med(key):  # combine is inside a recorded part where the primary records steps (then not traced)
        values = [s[key] for s in steps if key in s]
        return statistics.median(values) if values else float("nan")

    t_main, t_peer, t_layer = med("t_main"), med("t_peer"), med("t_layer")
    serial = statistics.median(s["t_main"] + s["t_peer"] for s in steps) if steps else float("nan")
    longest = statistics.median(max(s["t_main"], s["t_peer"]) for s in steps) if steps else float("nan")
    overlapped = sum(s["t_layer"] < s["t_main"] + s["t_peer"] for s in steps)
    # the aim for a split layer: the longer owner's experts, plus the staged bytes at the host link's speed
    aim = (
        statistics.median(
            max(s["t_main"], s.get("t_peer_experts", s["t_peer"])) + s.get("staged_bytes", 0) / (args.link_gbs * 1e3)
            for s in steps
        )
        if steps
        else float("nan")
    )
    t_stage, staged = med("t_stage"), med("staged_bytes")
    off, on = statistics.median(speeds["off"]), statistics.median(speeds["on"])
    alone_tps = statistics.median(alone_speeds)
    # each round's two runs back to back: the ratio of a pair drifts less than either speed on a shared machine
    ratio = statistics.median(b / a for a, b in zip(speeds["off"], speeds["on"], strict=True))
    report = {
        "machine": platform.node(),
        "model": str(target),
        "primary": args.primary,
        "peer": args.peer,
        "placement": placement,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "split_layer_steps": len(steps),
        "median_us": {
            "t_main": t_main,
            "t_peer": t_peer,
            "t_peer_experts": med("t_peer_experts"),
            "t_stage": t_stage,
            "t_layer": t_layer,
            "max_main_peer": longest,
            "sum_main_peer": serial,
            "join": med("join"),
            "combine": med("combine"),
            "t_shared": med("t_shared"),
            "shared_overlap": med("shared_overlap"),
            "aim_max_plus_link": aim,
        },  # fmt: skip
        "staged_bytes_per_layer_step": staged,
        "stage_share_of_peer_branch": t_stage / t_peer if t_stage == t_stage else None,
        "link_gbs_assumed": args.link_gbs,
        "t_layer_over_aim": t_layer / aim,
        "layer_steps_shorter_than_the_sum": overlapped,
        "decode_tokens_per_second": {
            "all_on_primary": alone_speeds,
            "trace_off": speeds["off"],
            "trace_on": speeds["on"],
        },  # fmt: skip
        "split_over_all_on_primary": off / alone_tps,
        "trace_cost": 1 - ratio,
        "ids_equal_to_all_on_the_primary": not ids_differ,
    }
    write_report(args.json, report)
    print(f"{args.primary} primary, {args.peer} peer, {placement}; {len(steps)} split layer steps")
    print()
    print("| per split layer step (median) | us |")
    print("| --- | --- |")
    for label, v in (("primary's own experts (t_main)", t_main), ("peer's branch (t_peer)", t_peer),
                     ("of which the peer's experts", med("t_peer_experts")),
                     ("of which staging, up and down (t_stage)", t_stage),
                     ("max(t_main, t_peer)", longest), ("t_main + t_peer", serial),
                     ("expert phase, read-back to join (t_layer)", t_layer),
                     (f"aim: max(t_main, peer's experts) + staged bytes at {args.link_gbs:g} GB/s", aim),
                     ("join wait", med("join")),
                     ("combine (outputs sent, canonical sum)", med("combine")),
                     ("primary's shared experts (t_shared)", med("t_shared")),
                     ("of which the peer ran meanwhile", med("shared_overlap"))):  # fmt: skip
        if v == v:  # not NaN: shared experts only where the model has them
            print(f"| {label} | {v:.1f} |")
    print()
    print(f"t_layer / max = {t_layer / longest:.2f}, t_layer / sum = {t_layer / serial:.2f}; "
          f"{overlapped} of {len(steps)} steps shorter than the sum")  # fmt: skip
    if t_stage == t_stage:
        print(f"staging {staged / 1e3:.1f} kB per split layer step at {staged / t_stage / 1e3:.2f} GB/s, "
              f"{100 * t_stage / t_peer:.0f} % of the peer's branch; t_layer / aim = {t_layer / aim:.2f}")  # fmt: skip
    print(f"decode tok/s: every expert on {args.primary} {alone_tps:.1f}, split {off:.1f} "
          f"({off / alone_tps:.2f}x)")  # fmt: skip
    print(f"decode tok/s trace off {off:.1f}, on {on:.1f} (medians of {args.rounds}); trace cost "
          f"{100 * (1 - ratio):.1f} % (median of the rounds' on/off ratios)")  # fmt: skip
    if ids_differ:
        print("ids differ from every expert on the primary", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
