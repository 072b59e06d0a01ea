"""What the per-token trace costs a decode run, as the window runs it: the demo pair over two devices (cpu:0 the
primary, half of every MoE layer's experts on hostsim:0), the draft proposing --q tokens, every step handed to the
window's LiveBuffer (whose SpanRing keeps the traced steps for the timeline), with trace=False and trace=True in
turns (ABAB: both see the same machine), --rounds of each. Prints the median decode tokens/s of each and their ratio,
and writes a JSON report:

    python bench/trace_cost.py --tokens 64 --rounds 5 --json bench/results/trace_cost.json

--window measures the same in the window itself (offscreen, wide arrangement, every panel shown): runs started as the
Start button starts them, traced (the device timeline drawing them while they decode) and not traced (the timeline
empty: as when it is closed, without a change of layout) in turns, and untraced with the live plots' panel closed;
there the GUI thread's drawing competes with the run's thread for the GIL and the cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics

from measure import write_report

from app.live import LiveBuffer
from engine.checkpoints.demo import DEMO_PROMPTS, ensure_demo_pair
from engine.model import Engine
from engine.runs.run import DecodeRun


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="default", help="demo size (default: default)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per prompt (default 64)")
    ap.add_argument("--rounds", type=int, default=5, help="runs of each, in turns (default 5)")
    ap.add_argument("--q", type=int, default=2, help="draft tokens per step, 0 for none (default 2)")
    ap.add_argument("--window", action="store_true", help="measure runs started in the window (offscreen)")
    ap.add_argument("--json", help="write the JSON report here")
    args = ap.parse_args()
    if args.window:
        return in_window(args)
    pair = ensure_demo_pair(args.size)
    speeds: dict[bool, list[float]] = {False: [], True: []}
    spans = 0
    with Engine(runtimes=("cpu", "hostsim")) as eng:
        target = eng.load(pair.target, device="cpu:0")
        draft = eng.load(pair.draft, device="cpu:0") if args.q else None
        half = target.config.num_experts // 2
        target.set_placement(f"*=cpu:0; *.0-{half - 1}=hostsim:0")
        prompts = list(DEMO_PROMPTS)
        for _round in range(args.rounds + 1):  # the first round warms up and is not counted
            for trace in (False, True):
                live = LiveBuffer()
                run = DecodeRun(target, draft, prompts=prompts, tokens_per_prompt=args.tokens, q=args.q or None,
                                on_event=live.append, trace=trace)  # fmt: skip
                result = run.run()
                if _round:
                    speeds[trace].append(result.decode_tokens_per_second)
                    spans = max(spans, result.trace_spans)
        placement = target.placement.describe()
        for model in (target, draft):
            if model is not None:
                model.close()
    off, on = statistics.median(speeds[False]), statistics.median(speeds[True])
    report = {"machine": platform.machine(), "cpus": os.cpu_count(), "size": args.size,
              "tokens_per_prompt": args.tokens, "prompts": len(DEMO_PROMPTS), "q": args.q, "placement": placement,
              "rounds": args.rounds, "decode_tokens_per_second": {"untraced": speeds[False], "traced": speeds[True]},
              "median_untraced": off, "median_traced": on, "traced_over_untraced": on / off,
              "spans_per_run": spans}  # fmt: skip
    print(f"| trace | decode tokens/s (median of {args.rounds}) |\n|---|---|")
    print(f"| off | {off:.1f} |\n| on | {on:.1f} |")
    print(f"traced / untraced: {on / off:.3f} ({spans} spans a run)")
    write_report(args.json, report)
    return 0


def demo_window(size: str, tokens: int, q: int):
    """The window offscreen (1600x1000, the wide arrangement, every panel shown) on the demo pair, cpu:0 the primary
    with half of every MoE layer's experts on hostsim:0, its run panel set for the four demo prompts x `tokens`, one
    pass, the draft proposing `q` (0: no draft): (app, window, placement)."""
    import tempfile

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.screenshot import _wait
    from app.window import MainWindow
    from engine.placement.placement import Placement

    app = QApplication.instance() or QApplication([])
    folder = tempfile.mkdtemp()
    window = MainWindow(settings=QSettings(f"{folder}/settings.ini", QSettings.Format.IniFormat))
    state = window.state
    state.keep_history = False  # the user's run history is not touched
    state.open_engine(lambda: Engine(runtimes=("cpu", "hostsim")))
    state.load_models(None, primary="cpu:0", demo=size)
    window.resize(1600, 1000)
    window.show()
    _wait(app, state.sigModelChanged, done=lambda: state.model is not None)
    _wait(app, state.sigBusyChanged, done=lambda: not state.busy)
    cfg = state.model.config
    half = Placement.parse(f"*=cpu:0; *.0-{cfg.num_experts // 2 - 1}=hostsim:0", cfg)
    state.set_placement(half, "half of every layer's experts on hostsim:0")
    _wait(app, state.sigPlacementApplied, done=lambda: not state.busy)
    panel = window.run_panel
    panel.tokens.setValue(tokens)
    panel.repeats.setValue(1)
    panel.q.setValue(q or 1)
    panel.draft_check.setChecked(bool(q))
    panel.prompts.setPlainText("\n".join(DEMO_PROMPTS))
    return app, window, half


def window_run(app, window):
    """One run started as the Start button starts it; its record once the window is idle again."""
    from app.screenshot import _wait

    state, records = window.state, []
    state.sigRunFinished.connect(records.append)
    window.act_start.trigger()
    _wait(app, state.sigRunFinished, done=lambda: bool(records))
    _wait(app, state.sigBusyChanged, done=lambda: not state.busy)
    state.sigRunFinished.disconnect(records.append)
    return records[0]


def in_window(args) -> int:
    """The window's runs with the device timeline open and closed, in turns."""
    app, window, half = demo_window(args.size, args.tokens, args.q)
    state = window.state
    speeds: dict[str, list[float]] = {"untraced": [], "traced_and_drawn": [], "untraced_live_plots_closed": []}
    for _round in range(args.rounds + 1):  # the first round warms up and is not counted
        for key in speeds:
            traced = key == "traced_and_drawn"
            state.trace_runs = traced
            window.docks["plots"].setVisible(key != "untraced_live_plots_closed")
            app.processEvents()
            record = window_run(app, window)
            assert (state.last_trace is not None) == traced
            if _round:
                speeds[key].append(record.decode_tokens_per_second)
    state.saved_placement = state.placement
    window.close()
    off, on = statistics.median(speeds["untraced"]), statistics.median(speeds["traced_and_drawn"])
    no_plots = statistics.median(speeds["untraced_live_plots_closed"])
    report = {"machine": platform.machine(), "cpus": os.cpu_count(), "size": args.size, "where": "window",
              "tokens_per_prompt": args.tokens, "prompts": len(DEMO_PROMPTS), "q": args.q,
              "placement": half.describe(), "rounds": args.rounds,
              "decode_tokens_per_second": speeds, "median_untraced": off, "median_traced_and_drawn": on,
              "median_untraced_live_plots_closed": no_plots, "traced_over_untraced": on / off}  # fmt: skip
    print(f"| window run | decode tokens/s (median of {args.rounds}) |\n|---|---|")
    print(f"| not traced | {off:.1f} |\n| traced, the timeline drawing | {on:.1f} |")
    print(f"| not traced, the live plots' panel closed | {no_plots:.1f} |")
    print(f"traced / untraced: {on / off:.3f}")
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
