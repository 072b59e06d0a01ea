"""The per-token trace: spans per step, layer and device from the core, the Chrome trace event JSON that
`expertbench run --trace` writes, and the overlap it shows when a MoE layer's experts are split between a device
primary (hostsim) and a CPU peer: the primary's own experts run while the peer's do."""

import json

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.checkpoints.demo import ensure_demo_pair
from engine.cli import main
from engine.core.errors import ArgumentError, RangeError
from engine.core.trace import SPAN_KINDS, chrome_trace, overlap_ns
from engine.model import Engine
from engine.runs.run import DecodeRun


@pytest.fixture(scope="module")
def engine():
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=1, cpu_threads=1) as eng:
        yield eng


def test_spans_cover_every_layer_of_a_step_on_the_devices_that_ran_them(engine):
    model = engine.load(FIXTURES / "qwen3moe-f32", device="hostsim:0")
    try:
        model.set_placement("*=hostsim:0; 0=cpu:0; 2.0-3=cpu:0")  # layer 0 all on cpu:0, layer 2 split
        model.reset_routing()
        with model.context(32) as ctx:
            ctx.graphs = False  # every operation its own span
            ctx.trace = 1000
            ctx.prefill([1, 2, 3])
            spans = ctx.trace_spans()
            assert ctx.trace_spans() == [], "a read moves the spans out"
        kinds = {(s.kind, s.device, s.layer) for s in spans}
        assert ("embed", "hostsim:0", -1) in kinds and ("logits", "hostsim:0", -1) in kinds
        for layer in range(model.config.num_layers):
            assert ("attention", "hostsim:0", layer) in kinds
        assert ("dense", "hostsim:0", 1) in kinds  # the fixture's mlp_only layer
        for layer in (0, 2):  # experts elsewhere: routing read back, the peer's branch, the join, the combine
            for kind in ("route", "stage", "join", "combine"):
                assert (kind, "hostsim:0", layer) in kinds, (kind, layer)
        hits = model.routing_counts()[0]
        for layer, (lo, hi) in ((0, (0, 8)), (2, (0, 4))):  # an owner's span where the routing chose its experts
            assert (("experts", "cpu:0", layer) in kinds) == (hits[layer, lo:hi].sum() > 0)
        assert ("experts", "hostsim:0", 0) not in kinds  # no expert of layer 0 is the primary's
        assert (("experts", "hostsim:0", 2) in kinds) == (hits[2, 4:].sum() > 0)
        assert all(s.kind in SPAN_KINDS and s.end_ns >= s.start_ns and s.token == 0 for s in spans)
        # the rows of one layer's expert spans are its (token, expert) pairs, wherever they ran
        pairs = sum(s.rows for s in spans if s.kind == "experts" and s.layer == 2)
        assert pairs == 3 * model.config.top_k
        # the join waits for the peer: its branch ends before the join does
        for peer in (s for s in spans if s.kind == "experts" and s.device == "cpu:0"):
            join = next(s for s in spans if s.kind == "join" and s.layer == peer.layer)
            assert peer.end_ns <= join.end_ns
    finally:
        model.close()


def test_a_staged_peers_branch_is_traced_as_its_upload_its_experts_and_its_download(engine):
    """A peer that is not host-addressable (hostsim:0 beside a cpu:0 primary; a GPU beside a CPU or another runtime)
    receives its rows through host staging: while tracing, its branch is three spans on its lane, in order and
    touching: the rows' upload (a stage span over the tokens staged), its experts (the pairs) and the outputs'
    download (a stage span over the pairs), with the bits of an untraced step."""
    model = engine.load(FIXTURES / "qwen3moe-f32", device="cpu:0")
    try:
        model.set_placement("*=cpu:0; *.0-3=hostsim:0")
        with model.context(32) as ctx:
            want = ctx.prefill([5, 6, 7, 8])
            ctx.truncate(0)
            ctx.trace = 1000
            got = ctx.prefill([5, 6, 7, 8])
            spans = ctx.trace_spans()
        assert np.array_equal(got, want)
        hits = model.routing_counts()[0]
        layers = [layer for layer in range(model.config.num_layers) if hits[layer, 0:4].sum() > 0]
        assert layers, "the fixture's routing chose hostsim:0's experts somewhere"
        for layer in layers:
            lane = sorted((s for s in spans if s.device == "hostsim:0" and s.layer == layer), key=lambda s: s.start_ns)
            assert [s.kind for s in lane] == ["stage", "experts", "stage"], (layer, lane)
            up, experts, down = lane
            assert up.end_ns == experts.start_ns and experts.end_ns == down.start_ns
            assert 1 <= up.rows <= 4 and experts.rows == down.rows > 0
            join = next(s for s in spans if s.kind == "join" and s.layer == layer and s.device == "cpu:0")
            assert down.end_ns <= join.end_ns
    finally:
        model.close()


def test_tracing_changes_no_bits_and_a_full_trace_counts_what_it_lost(engine):
    model = engine.load(FIXTURES / "qwen3moe-f32", device="hostsim:0")
    try:
        model.set_placement("*=hostsim:0; 0.0-3=cpu:0")
        rows = {}
        for capacity in (0, 4, 10000):
            with model.context(32) as ctx:
                ctx.trace = capacity
                rows[capacity] = np.concatenate([ctx.prefill([5, 6, 7])] + [ctx.decode([t]) for t in (1, 2, 3)])
                spans = ctx.trace_spans()
                assert len(spans) == min(capacity, len(spans) + ctx.trace_lost)
                if capacity == 4:
                    assert len(spans) == 4 and ctx.trace_lost > 0
                if capacity == 0:
                    assert spans == [] and ctx.trace_lost == 0
        assert np.array_equal(rows[0], rows[4]) and np.array_equal(rows[0], rows[10000])
    finally:
        model.close()


@pytest.mark.parametrize("capacity", [-1, 1.5, "many", 1 << 27])
def test_a_bad_trace_capacity_is_refused_and_the_context_keeps_working(engine, capacity):
    model = engine.load(FIXTURES / "qwen3-f32")
    try:
        with model.context(16) as ctx:
            with pytest.raises(RangeError, match="trace capacity"):
                ctx.trace = capacity
            assert ctx.trace == 0
            assert ctx.prefill([1, 2]).shape[0] == 2
    finally:
        model.close()


def test_a_split_layer_runs_the_primarys_experts_while_the_peers_run(xdg_cache):
    """Every MoE layer's experts split between hostsim:0 (the primary) and cpu:0: the primary's experts of a layer
    step run on the calling thread while cpu:0's run on its own, so their spans overlap (in most layer steps; the
    test asks for one in ten, as a busy machine may delay a thread now and then)."""
    pair = ensure_demo_pair("default", cache_dir=xdg_cache / "expertbench")
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=1, cpu_threads=1) as eng:
        model = eng.load(pair.target, device="hostsim:0")
        try:
            half = model.config.num_experts // 2
            model.set_placement(f"*=hostsim:0; *.0-{half - 1}=cpu:0")
            run = DecodeRun(model, prompts=["the quick brown fox"], tokens_per_prompt=12, trace=True)
            result = run.run()
        finally:
            model.close()
    assert result.trace_spans == len(run.spans) > 0 and result.trace_lost == 0
    experts = {}
    for s in run.spans:
        if s.kind == "experts":
            experts.setdefault((s.token, s.layer), {})[s.device] = s
    split = [v for v in experts.values() if len(v) == 2]
    assert len(split) >= model.config.num_layers * 10  # every layer of every decode step was split
    overlapping = [v for v in split if overlap_ns(v["hostsim:0"], v["cpu:0"]) > 0]
    assert len(overlapping) * 10 >= len(split), f"{len(overlapping)} of {len(split)} split layer steps overlapped"


def test_run_trace_writes_chrome_trace_event_json(tmp_path, xdg_cache, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    out = tmp_path / "run.trace.json"
    args = ["run", "--no-draft", "-n", "4", "--repeats", "1", "--prompt", "hello", "--runtime", "hostsim"]
    args += ["--device", "hostsim:0", "--placement", "*=hostsim:0; 0-1=cpu:0", "--trace", str(out)]
    assert main(args) == 0
    assert f"trace     {out}" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert events and doc["metadata"]["placement"] is not None
    threads = {e["args"]["name"]: e["tid"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert set(threads) == {"cpu:0", "hostsim:0"}
    for e in events:
        assert {"device", "layer", "token", "kind"} <= set(e["args"]) and e["dur"] >= 0 and e["ts"] >= 0
        assert threads[e["args"]["device"]] == e["tid"]
    assert {e["args"]["kind"] for e in events} >= {"experts", "route", "stage", "join", "combine"}
    assert any(e["args"]["device"] == "cpu:0" and e["args"]["kind"] == "experts" for e in events)


def test_run_trace_to_a_missing_folder_fails_before_loading(tmp_path, capsys):
    assert main(["run", "--no-draft", "--trace", str(tmp_path / "nowhere" / "t.json")]) == 2
    assert "does not exist or is not writable" in capsys.readouterr().err


def test_chrome_trace_of_no_spans_is_still_valid():
    doc = chrome_trace([])
    assert [e["ph"] for e in doc["traceEvents"]] == ["M"]


def test_a_traced_run_keeps_its_newest_steps_spans_bounded_and_counts_the_rest(engine):
    """A long traced run keeps the newest whole steps up to trace_keep spans; the older are counted as dropped, and
    what is kept is what an unbounded run of the same settings kept last."""
    model = engine.load(FIXTURES / "qwen3moe-f32", device="hostsim:0")
    try:
        model.set_placement("*=hostsim:0; 0=cpu:0")
        events = []
        full = DecodeRun(model, prompts=[[1, 2, 3]], tokens_per_prompt=12, trace=True, on_event=events.append)
        whole = full.run()
        steps = [e.spans for e in events if e.spans]
        per_step = max(len(s) for s in steps)
        keep = 3 * per_step
        bounded = DecodeRun(model, prompts=[[1, 2, 3]], tokens_per_prompt=12, trace=True, trace_keep=keep)
        result = bounded.run()
    finally:
        model.close()
    assert whole.trace_dropped == 0 and whole.trace_spans == len(full.spans) == sum(map(len, steps))
    kept = bounded.spans
    assert 0 < len(kept) <= keep < result.trace_spans
    assert result.trace_dropped == result.trace_spans - len(kept) > 0
    assert result.trace_spans == whole.trace_spans  # the same steps were traced; only fewer kept
    # the newest steps' (within a step, two devices' spans that ran at once may start in either order)
    newest = sorted((s.token, s.kind, s.device, s.layer) for s in kept)
    assert newest == sorted((s.token, s.kind, s.device, s.layer) for s in full.spans[-len(kept) :])
    assert [s.token for s in kept] == sorted(s.token for s in kept)  # oldest step first


@pytest.mark.parametrize("keep", [0, -1, 2.5, True, "100"])
def test_trace_keep_must_be_a_positive_count(engine, keep):
    model = engine.load(FIXTURES / "qwen3moe-f32")
    try:
        with pytest.raises(ArgumentError, match=r"trace_keep \(spans kept\) = .*expected a positive integer"):
            DecodeRun(model, prompts=[[1, 2, 3]], tokens_per_prompt=2, trace=True, trace_keep=keep)
    finally:
        model.close()
