"""What the window's Live plots panel costs a decode run: runs started in the window (offscreen, as trace_cost.py
--window sets it up: the demo pair, cpu:0 the primary with half of every MoE layer's experts on hostsim:0, the draft
proposing --q tokens, the four demo prompts), untraced (the device timeline shown but empty), with the Live plots
panel shown and hidden in turns (the order swapped every round: ABBA), --rounds of each. Per run: the decode
tokens/s; the GUI thread's CPU time and its share of the run's time (what the window's drawing takes: a loaded
machine moves it far less than the speeds); the GUI thread's longest stall while the run decodes (the largest gap
between the ticks of a 5 ms heartbeat timer, from the run's first step to its last) and over the whole run (its
start included); the time the plots' 20 Hz redraw (LivePlots.refresh_live) took per tick. Prints the medians and
the ratio shown / hidden (of the medians, and each round's shown run over its hidden one), and writes a JSON report:

    cd bench && python live_plots_cost.py --tokens 64 --rounds 5 --json results/live_plots_cost.json

--profile FILE writes a cProfile of the GUI thread over the shown runs (pstats; the top entries by cumulative time
are printed): what the GUI thread's Python does while the panel draws.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import statistics
import time

from measure import write_report
from trace_cost import demo_window, window_run

from engine.checkpoints.demo import DEMO_PROMPTS

KEYS = ("shown", "hidden")


class Heartbeat:
    """A 5 ms timer on the GUI thread: the longest gap between its ticks is the longest the GUI thread did not
    answer; `decoding` counts only while the run is between its first and its last step."""

    def __init__(self, state):
        from PySide6.QtCore import QTimer

        self.state = state
        self.timer = QTimer()
        self.timer.setInterval(5)
        self.timer.timeout.connect(self._tick)
        self.start()

    def start(self) -> None:
        self.longest = self.decoding = 0.0
        self._last = self._last_decoding = None
        self.timer.start()

    def _tick(self) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.longest = max(self.longest, now - self._last)
        self._last = now
        done, total = self.state.live.progress
        if not (self.state.running and 0 < done < total):
            self._last_decoding = None
            return
        if self._last_decoding is not None:
            self.decoding = max(self.decoding, now - self._last_decoding)
        self._last_decoding = now


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="default", help="demo size (default: default)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per prompt (default 64)")
    ap.add_argument("--rounds", type=int, default=5, help="runs of each, in turns (default 5)")
    ap.add_argument("--q", type=int, default=2, help="draft tokens per step, 0 for none (default 2)")
    ap.add_argument("--profile", help="write a cProfile of the GUI thread over the shown runs here")
    ap.add_argument("--json", help="write the JSON report here")
    args = ap.parse_args()
    app, window, half = demo_window(args.size, args.tokens, args.q)
    state, plots = window.state, window.plots
    state.trace_runs = False  # the timeline shown and empty: only the plots draw
    ticks: list[float] = []
    refresh = plots.refresh_live

    def timed() -> None:
        t0 = time.perf_counter()
        refresh()
        ticks.append(time.perf_counter() - t0)

    plots.timer.timeout.disconnect()
    plots.timer.timeout.connect(timed)
    profile = cProfile.Profile() if args.profile else None
    runs: dict[str, list[dict]] = {key: [] for key in KEYS}
    for _round in range(args.rounds + 1):  # the first round warms up and is not counted
        for key in KEYS if _round % 2 else KEYS[::-1]:
            window.docks["plots"].setVisible(key == "shown")
            app.processEvents()
            ticks.clear()
            beat = Heartbeat(state)
            if profile and key == "shown" and _round:
                profile.enable()
            cpu, wall = time.thread_time(), time.perf_counter()
            record = window_run(app, window)
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            if profile:
                profile.disable()
            beat.timer.stop()
            if _round:
                runs[key].append({"decode_tokens_per_second": record.decode_tokens_per_second, "gui_cpu_ms": 1000 * cpu,
                                  "gui_busy": cpu / wall,
                                  "stall_decoding_ms": 1000 * beat.decoding, "stall_run_ms": 1000 * beat.longest,
                                  "refreshes": len(ticks), "refresh_ms_mean": 1000 * statistics.fmean(ticks or [0]),
                                  "refresh_ms_max": 1000 * max(ticks or [0])})  # fmt: skip
    state.saved_placement = state.placement
    window.close()

    def median(key: str, field: str) -> float:
        return statistics.median(r[field] for r in runs[key])

    shown, hidden = median("shown", "decode_tokens_per_second"), median("hidden", "decode_tokens_per_second")
    # each round's shown run against its hidden one: a machine whose load moves between rounds moves both
    paired = statistics.median(a["decode_tokens_per_second"] / b["decode_tokens_per_second"]
                               for a, b in zip(runs["shown"], runs["hidden"], strict=True))  # fmt: skip
    report = {"machine": platform.machine(), "cpus": os.cpu_count(), "load_average": os.getloadavg(),
              "size": args.size, "where": "window", "tokens_per_prompt": args.tokens, "prompts": len(DEMO_PROMPTS),
              "q": args.q, "placement": half.describe(), "rounds": args.rounds, "runs": runs,
              "median_shown": shown, "median_hidden": hidden, "shown_over_hidden": shown / hidden,
              "shown_over_hidden_paired": paired}  # fmt: skip
    print("| Live plots panel | decode tok/s | GUI thread CPU ms a run (share of the run) | stall while decoding, ms | "
          "stall over the run, ms | refresh_live ms (mean / max) |\n|---|---|---|---|---|---|")  # fmt: skip
    for key in KEYS:
        speeds = sorted(r["decode_tokens_per_second"] for r in runs[key])
        cells = [f"{speeds[0]:.1f}-{speeds[-1]:.1f}, median {median(key, 'decode_tokens_per_second'):.1f}",
                 f"{median(key, 'gui_cpu_ms'):.0f} ({100 * median(key, 'gui_busy'):.0f} %)"]  # fmt: skip
        for field in ("stall_decoding_ms", "stall_run_ms"):
            cells.append(f"{median(key, field):.0f} (max {max(r[field] for r in runs[key]):.0f})")
        cells.append(f"{median(key, 'refresh_ms_mean'):.2f} / {max(r['refresh_ms_max'] for r in runs[key]):.1f}")
        print(f"| {key} | {' | '.join(cells)} |")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"shown / hidden: {shown / hidden:.3f} (medians of {args.rounds}), paired by round {paired:.3f}; load {load}")
    write_report(args.json, report)
    if profile:
        profile.dump_stats(args.profile)
        pstats.Stats(args.profile).sort_stats("cumulative").print_stats(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
