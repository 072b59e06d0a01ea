"""Runs from the window: points reach the plots, a row reaches the history, Stop cancels, exports."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import csv

import numpy as np
import pytest
from app_helpers import FIXTURES, TIMEOUT_MS, record, set_history  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402

from app import history  # noqa: E402

HASH, OUTPUT, PRECISION = (history.column(name) for name in ("Hash", "Output", "Precision"))


def setup_run(window, tokens, repeats, prompts=("The quick brown fox",), q=2):
    panel = window.run_panel
    panel.tokens.setValue(tokens)
    panel.repeats.setValue(repeats)
    panel.q.setValue(q)
    panel.prompts.setPlainText("\n".join(prompts))
    return panel


def test_a_run_delivers_points_to_the_plots_and_a_history_row(qtbot, make_window, tmp_path):
    window = make_window()
    state = window.state
    panel = setup_run(window, tokens=24, repeats=2)
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
        assert not panel.start_button.isEnabled() and panel.stop_button.isEnabled()
    record = finished.args[0]
    assert record.index == 1 and not record.cancelled and record.draft == "qwen3-f32" and record.q == 2
    assert len(record.output_hash) == 64 and record.is_reference
    assert record.placement == "0-2=cpu:0"
    x, y = window.plots.rate_curve.getData()
    assert len(x) > 0 and len(x) == len(y)
    assert (x[1:] >= x[:-1]).all()  # time runs forward
    ax, ay = window.plots.accept_curve.getData()
    assert ax is not None and len(ax) > 0 and len(ax) == len(ay)  # a run with a draft has acceptance points
    assert np.isfinite(ay).all() and ((ay >= 0) & (ay <= 100)).all()  # percent
    rx, ry = window.plots.runs_curve.getData()
    assert list(rx) == [1.0] and ry[0] == pytest.approx(record.decode_tokens_per_second)
    assert len(window.plots.hash_marks.data) == 1
    model = window.history.model
    assert model.rowCount() == 1
    assert model.index(0, HASH).data() == record.short_hash and model.index(0, OUTPUT).data() == "reference"
    assert model.index(0, PRECISION).data() == record.precision == "f32"
    assert panel.start_button.isEnabled() and not panel.stop_button.isEnabled()
    assert panel.progress.value() == panel.progress.maximum() == 2 * 24

    # Another placement, target only: same output (reference mode), so the hash mark says "same".
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.move({0: list(range(8))}, "hostsim:0")
    panel.draft_check.setChecked(False)
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        window.act_start.trigger()
    second = finished.args[0]
    assert second.placement == "0=hostsim:0; 2=cpu:0" and second.draft is None and second.accept_rate is None
    assert second.stable is True and model.index(1, OUTPUT).data() == "same"
    assert len(window.plots.runs_curve.getData()[0]) == 2

    path = tmp_path / "runs.csv"
    history.write_csv(path, state.history)
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == ["run", "time", "placement", "mode", "precision", "draft", "q", "tokens",
                             "decode_tokens_per_second", "greedy_agreement", "mean_kl", "prefill_tokens_per_second",
                             "predicted_tokens_per_second",
                             "accept_rate", "output_sha256", "output", "cancelled"]  # fmt: skip
    assert [r["run"] for r in rows] == ["1", "2"]
    assert (rows[0]["q"], rows[0]["draft"], rows[1]["q"], rows[1]["draft"]) == ("2", "qwen3-f32", "", "")
    assert rows[0]["output_sha256"] == record.output_hash and rows[0]["cancelled"] == "False"
    assert float(rows[1]["prefill_tokens_per_second"]) == pytest.approx(second.prefill_tokens_per_second)
    assert rows[0]["tokens"] == str(record.prompts * 24 * 2) and rows[1]["accept_rate"] == ""
    assert rows[1]["placement"] == "0=hostsim:0; 2=cpu:0" and rows[1]["output"] == "same"
    assert window.plots.export_png(str(tmp_path / "plots.png"))
    assert (tmp_path / "plots.png").stat().st_size > 1000


def test_stop_cancels_the_run(qtbot, make_window):
    window = make_window()
    state = window.state
    panel = setup_run(window, tokens=150, repeats=1000)
    panel.start()
    qtbot.waitUntil(lambda: len(state.live) > 0, timeout=TIMEOUT_MS)  # decoding has begun
    assert state.running and window.act_stop.isEnabled()
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        qtbot.mouseClick(panel.stop_button, Qt.MouseButton.LeftButton)
    record = finished.args[0]
    assert record.cancelled and not state.running
    done, total = state.live.progress
    assert done < total
    # "stopped" when no repeat completed before the click; if one did (a fast machine), the first run's output is
    # the reference
    assert window.history.model.index(0, OUTPUT).data() == ("reference" if record.output_hash else "stopped")
    assert panel.start_button.isEnabled() and "stopped" in panel.progress.format()
    # The models stay usable after a cancel.
    setup_run(window, tokens=8, repeats=1)
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        panel.start()
    assert not finished.args[0].cancelled


def test_a_failing_run_shows_an_error_and_the_window_stays_usable(qtbot, make_window, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    shown = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a: shown.append((title, text)))
    window = make_window()
    state = window.state
    setup_run(window, tokens=8, repeats=1)
    window.run_panel.tokens.setMaximum(100_000)  # the fixture holds 256 positions: ask for more
    window.run_panel.tokens.setValue(5000)
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        window.run_panel.start()
    assert finished.args[0] is None
    assert shown and shown[0][0] == "The run failed" and "max_position_embeddings" in shown[0][1]
    assert window.run_panel.start_button.isEnabled() and not state.running
    setup_run(window, tokens=8, repeats=1)
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        window.run_panel.start()
    assert finished.args[0] is not None and not finished.args[0].cancelled


def test_the_precision_choice_reaches_the_run_and_the_history(qtbot, make_window, tmp_path):
    """q8 beside the mode: the run decodes with int8 activations, the history has a column for it, and a q8 run is
    compared with q8 runs only (its first is its own reference, not 'CHANGED' against f32)."""
    window = make_window()
    state = window.state
    quantized = FIXTURES / "qwen3moe-gguf" / "model-q8_0.gguf"
    state.load_models(quantized, None)
    qtbot.waitUntil(lambda: state.model.target_path == str(quantized) and not state.busy, timeout=TIMEOUT_MS)
    panel = setup_run(window, tokens=8, repeats=1)
    combo = panel.precision
    assert [combo.itemData(i) for i in range(combo.count())] == ["f32", "q8"] and combo.currentData() == "f32"
    assert "not the reference" in combo.itemText(1) and "llama.cpp" in combo.toolTip()
    model = window.history.model
    header = [model.headerData(c, Qt.Orientation.Horizontal) for c in range(model.columnCount())]
    assert header[3:5] == ["Mode", "Precision"]
    records = []
    for precision in ("q8", "f32", "q8"):
        combo.setCurrentIndex(combo.findData(precision))
        assert panel.settings().precision == precision
        with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
            panel.start()
        records.append(finished.args[0])
    assert [r.precision for r in records] == ["q8", "f32", "q8"]
    # beside the speed, the q8 runs' quality cost against the reference mode (f32) on the same prompts
    assert [r.quality is not None for r in records] == [True, False, True]
    q = records[0].quality
    assert q["precision"] == "q8" and q["positions"] == 8 and 0 <= q["agreement"] <= 1 and q["mean_kl"] > 0
    assert header[header.index("Decode tok/s") + 1] == "Quality"
    quality = header.index("Quality")
    assert model.index(0, quality).data() == f"{100 * q['agreement']:.1f} % · KL {q['mean_kl']:.2g}"
    assert model.index(1, quality).data() == "" and model.index(0, quality).data(
        Qt.ItemDataRole.ToolTipRole
    ).startswith("q8: greedy agreement")
    assert [model.index(i, PRECISION).data() for i in range(3)] == ["q8", "f32", "q8"]
    assert [model.index(i, OUTPUT).data() for i in range(3)] == ["first q8", "reference", "same"]
    assert records[2].reference_hash == records[0].output_hash
    assert "not the reference" in model.index(0, PRECISION).data(Qt.ItemDataRole.ToolTipRole)
    assert "later q8 runs are compared with it" in model.index(0, OUTPUT).data(Qt.ItemDataRole.ToolTipRole)
    history.write_csv(tmp_path / "runs.csv", state.history)
    rows = list(csv.DictReader((tmp_path / "runs.csv").open()))
    assert [r["precision"] for r in rows] == ["q8", "f32", "q8"]
    assert float(rows[0]["mean_kl"]) == pytest.approx(q["mean_kl"]) and rows[1]["mean_kl"] == ""


def test_the_run_panel_repeats_three_times_by_default_as_the_command_line_does(make_window):
    from engine.cli import build_parser

    window = make_window()
    assert window.run_panel.repeats.value() == 3 == build_parser().parse_args(["run"]).repeats
    assert window.run_panel.settings().repeats == 3


def test_empty_plots_say_so_and_show_no_axes_until_a_run(qtbot, make_window):
    from app.plots import NO_DATA, is_empty

    window = make_window()
    plots = window.plots
    all_plots = (plots.rate_plot, plots.accept_plot, plots.runs_plot, plots.hash_plot)
    if window.state.history:  # a history kept from an earlier session: start from none
        set_history(window.state, [])
    for plot in all_plots:
        assert is_empty(plot) and plot.no_data.textItem.toPlainText() == NO_DATA
        assert not plot.getPlotItem().getAxis("bottom").isVisible()
    assert not plots.runs_plot.getPlotItem().getAxis("left").isVisible()
    setup_run(window, tokens=8, repeats=2)
    with qtbot.waitSignal(window.state.sigRunFinished, timeout=TIMEOUT_MS):
        window.run_panel.start()
    for plot in all_plots:
        assert not is_empty(plot) and plot.getPlotItem().getAxis("bottom").isVisible()
    for plot in (plots.rate_plot, plots.accept_plot, plots.runs_plot):  # y from 0
        assert plot.getPlotItem().getAxis("left").isVisible() and plot.viewRange()[1][0] <= 0
    record = window.state.history[-1]
    whiskers_x = plots.runs_whiskers.opts["x"]
    low = getattr(record, "decode_tokens_per_second_min", None)
    if low is not None and np.isfinite(low):  # the record carries the slowest and fastest pass: a whisker
        assert list(whiskers_x) == [record.index]
        top, bottom = plots.runs_whiskers.opts["top"][0], plots.runs_whiskers.opts["bottom"][0]
        assert record.decode_tokens_per_second + top == pytest.approx(record.decode_tokens_per_second_max)
        assert record.decode_tokens_per_second - bottom == pytest.approx(low)
        assert plots.runs_plot.viewRange()[1][1] >= record.decode_tokens_per_second_max


def test_runs_of_other_settings_and_stopped_runs_are_not_joined(qtbot, make_window):
    from app.plots import joined, whiskers

    window = make_window()
    plots = window.plots
    runs = [
        record(1, decode_tokens_per_second_min=90.0, decode_tokens_per_second_max=120.0),
        record(2, decode_tokens_per_second=110.0),  # same settings as 1: joined
        record(3, placement="0=hostsim:0; 2=cpu:0", decode_tokens_per_second=150.0),  # another placement
        record(4, placement="0=hostsim:0; 2=cpu:0", decode_tokens_per_second=40.0, cancelled=True, output_hash=""),
        record(5, placement="0=hostsim:0; 2=cpu:0", decode_tokens_per_second=148.0),  # after a stopped run
        record(6, placement="0=hostsim:0; 2=cpu:0", decode_tokens_per_second=149.0, q=3),  # another q
        record(7, placement="0=hostsim:0; 2=cpu:0", decode_tokens_per_second=151.0, q=3, mode="owner_local"),
    ]
    set_history(window.state, runs)
    x, y = plots.runs_curve.getData()
    assert list(x) == [1, 2, 3, 4, 5, 6, 7] and list(y) == [100, 110, 150, 40, 148, 149, 151]
    assert list(joined(runs)) == [True, False, False, False, False, False, False]
    assert list(plots.runs_curve.opts["connect"]) == list(joined(runs))
    wx, lo, hi = whiskers(runs)
    assert list(wx) == [1] and list(lo) == [90] and list(hi) == [120]
    assert list(plots.runs_whiskers.opts["x"]) == [1]
    assert plots.runs_plot.viewRange()[1][0] == 0 and plots.runs_plot.viewRange()[1][1] >= 151
    # The hash marks' legend, and one mark per run in its style
    assert plots.legend_names() == ["reference", "same", "changed", "stopped"]
    assert len(plots.hash_marks.data) == 7


def test_device_strip_shows_the_placements_shares_or_a_runs_busy_time(qtbot, make_window):
    window = make_window()
    state, strip = window.state, window.plots.devices
    assert list(strip.bars) == ["cpu:0", "hostsim:0"]
    assert strip.source == "bytes" and strip.values() == {"cpu:0": 1.0, "hostsim:0": 0.0}
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.move({0: list(range(8))}, "hostsim:0")
    assert strip.values() == pytest.approx({"cpu:0": 0.5, "hostsim:0": 0.5})  # two MoE layers of equal size
    assert "busy time" in strip.caption.toolTip()  # what the window is not told, said
    busy = record(1)
    busy.device_busy_share = {"cpu:0": 0.75, "hostsim:0": 0.25}  # a record that carries the run's busy shares
    set_history(state, [busy])
    assert strip.source == "busy" and strip.values() == {"cpu:0": 0.75, "hostsim:0": 0.25}
    assert strip.bars["cpu:0"].text == "75 % busy"


def test_live_busy_shares_are_the_change_in_busy_time_over_the_last_steps():
    from app.live import ROLLING_STEPS, LiveBuffer
    from engine.runs.run import StepEvent

    live = LiveBuffer()
    live.reset(100)
    assert live.busy_shares() == {}  # nothing yet
    live.append(StepEvent("prefill", 0, 0, 1, 0, 0, 1, 1.0, 0.5, (1,), 4, (), {"cpu:0": 0.2, "hostsim:0": 0.0}))
    assert live.busy_shares() == {}  # one step: no interval yet
    live.append(StepEvent("decode", 0, 0, 1, 0, 0, 2, 3.0, 2.0, (2,), 0, (), {"cpu:0": 1.2, "hostsim:0": 0.5}))
    assert live.busy_shares() == pytest.approx({"cpu:0": 0.5, "hostsim:0": 0.25})  # 1.0 s and 0.5 s of 2 s
    for i in range(ROLLING_STEPS + 5):  # the window slides: only the last steps count
        live.append(StepEvent("decode", 0, 0, 1, 0, 0, 3 + i, 4.0 + i, 1.0, (3,), 0, (),
                              {"cpu:0": 2.0 + i, "hostsim:0": 0.5}))  # fmt: skip
    assert live.busy_shares() == pytest.approx({"cpu:0": 1.0, "hostsim:0": 0.0})


def test_the_device_strip_shows_busy_time_while_a_run_decodes_and_the_runs_share_after(qtbot, make_window):
    window = make_window()
    state, strip = window.state, window.plots.devices
    with qtbot.waitSignal(state.sigPlacementApplied, timeout=TIMEOUT_MS):
        state.move({0: list(range(8))}, "hostsim:0")
    setup_run(window, tokens=400, repeats=1)
    window.run_panel.draft_check.setChecked(False)
    seen = []
    window.plots.timer.timeout.connect(lambda: seen.append((strip.source, strip.caption.text(), strip.values())))
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        window.act_start.trigger()
    live = [v for source, caption, v in seen if source == "busy" and caption.startswith("Busy (decoding")]
    assert live, f"no live busy shares among {len(seen)} redraws"
    assert all(set(v) == {"cpu:0", "hostsim:0"} and v["cpu:0"] > 0 for v in live)
    record = finished.args[0]
    assert set(record.device_busy_share) == {"cpu:0", "hostsim:0"} and record.device_busy_share["hostsim:0"] > 0
    assert strip.source == "busy" and strip.caption.text() == f"Busy (run {record.index}):"
    assert strip.values() == pytest.approx(record.device_busy_share)


def test_a_changed_hash_is_explained_on_the_hash_plot(qtbot, make_window):
    """The reference run as an earlier session kept it, choosing another token at token 2: the next run of the same
    outputs is CHANGED, and its record, its mark's tooltip and the note under the mark say where, the choices on
    both sides (the reference replayed here, its settings being the model's) and what differs."""
    from engine.runs.diverge import Trail
    from engine.runs.history import combined_hash
    from engine.runs.run import output_sha256

    window = make_window()
    state = window.state
    panel = setup_run(window, tokens=8, repeats=1)
    panel.draft_check.setChecked(False)
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        window.act_start.trigger()
    ref = finished.args[0]
    kept = ref.trails()[0]
    ids = kept.ids.copy()
    ids[2] = (ids[2] + 1) % 64
    ref.outputs = [Trail(ids, kept.gaps).compact()]
    ref.output_hash = ref.reference_hash = combined_hash([output_sha256(ids)])
    state.runs.references = {k: ref.output_hash for k in state.runs.references}
    with qtbot.waitSignal(state.sigRunFinished, timeout=TIMEOUT_MS) as finished:
        window.act_start.trigger()
    second = finished.args[0]
    assert second.stable is False and second.diagnosis is not None
    first = second.diagnosis["first"]
    assert (first["prompt"], first["index"], first["a"]["token"]) == (0, 2, int(ids[2]))
    assert first["b"]["logit"] is not None and first["b"]["token"] == kept.ids[2]
    # the reference replayed here (its settings are the model's now) does not choose what it kept: said
    assert first["note"].startswith(f"replayed here, reference run 1's ids lead to {kept.ids[2]} (logit ")
    assert second.diagnosis["rerun"].startswith("reference run 1's top-2 logits re-computed here")
    tips = [spot.data() for spot in window.plots.hash_marks.points()]
    assert "output CHANGED from the reference run" in tips[1] and "prompt 0: first differing token 2" in tips[1]
    notes = [item.toPlainText() for item in window.plots._hash_labels]
    assert any(n.startswith("p0 t2") for n in notes)
    model = window.history.model
    assert model.index(1, OUTPUT).data() == "CHANGED"
