"""A primary device that cannot read host memory (a GPU primary), run here on hostsim: the forward pass goes
through the runtime's primary operations, with the weights, KV cache and activations in the device's memory.

hostsim computes them with the CPU path's arithmetic, so every result must be bit-identical to a cpu primary's,
for every placement: experts all on the primary (no host round trip), all in host memory (a round trip per MoE
layer), and scattered over three devices. In owner_local mode too here, because hostsim:0 is the last device: the
CPU path adds the owners' sums in device order, the device path adds its own sum to the others' (commutative for
two terms, so equal only while the primary comes last).
"""

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.core.errors import ArgumentError, OutOfMemoryError, UnsupportedError
from engine.model import Engine
from engine.runs.run import DecodeRun

PLACEMENTS = {
    "all on the primary": "*=hostsim:0",
    "all in host memory": "*=cpu:0",
    "three devices": "*=hostsim:0; 0=cpu:1; 2.6=cpu:0",
}


@pytest.fixture(scope="module")
def engine():
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, cpu_threads=1) as eng:
        yield eng


def run(model, name, mode, n_decode=8):
    ref = np.load(FIXTURES / name / "reference.npz")
    with model.context(64) as ctx:
        ctx.mode = mode
        rows = [ctx.prefill(ref["prompt_ids"])] + [ctx.decode([t]) for t in ref["generated_ids"][:n_decode]]
    return np.concatenate(rows)


@pytest.mark.parametrize("mode", ["reference", "owner_local"])
@pytest.mark.parametrize("name", ["qwen3moe-f32", "qwen3moe-bf16"])
def test_device_primary_gives_the_cpu_primarys_bits_on_every_placement(engine, name, mode):
    cpu = engine.load(FIXTURES / name)
    sim = engine.load(FIXTURES / name, device="hostsim:0")
    try:
        owners = {o for row in sim.placement.owners for o in row if o is not None}
        assert owners == {"cpu:0"}, f"experts start in host memory, not on {owners}"
        for label, text in PLACEMENTS.items():
            cpu.set_placement(text)
            sim.set_placement(text)
            before = sim.counters()
            expected, got = run(cpu, name, mode), run(sim, name, mode)
            after = sim.counters()
            assert np.array_equal(expected, got), f"{label}: max difference {np.abs(expected - got).max():.3e}"
            trips = after["host_round_trips"] - before["host_round_trips"]
            steps = after["layer_steps"] - before["layer_steps"]
            if label == "all on the primary":
                assert trips == 0 and steps > 0, f"{label}: {trips} host round trips"
            else:
                assert trips == steps > 0, f"{label}: {trips} round trips for {steps} MoE layer steps"
        # routing counted on the device equals the CPU's count
        hits_cpu, tokens_cpu = cpu.routing_counts()
        hits_sim, tokens_sim = sim.routing_counts()
        assert np.array_equal(hits_cpu, hits_sim) and np.array_equal(tokens_cpu, tokens_sim)
        assert hits_sim.sum() > 0
        # the primary's own rows are counted on the device; its weights and buffers are in its memory
        dev = sim.counters()["devices"]["hostsim:0"]
        assert dev["rows"] > 0 and dev["allocated_bytes"] > dev["weight_bytes"] > 0
        sim.reset_routing()
        assert sim.routing_counts()[0].sum() == 0
    finally:
        cpu.close()
        sim.close()


def test_attention_biases_on_a_device_primary(engine, tmp_path):
    """A checkpoint with attention_bias (q/k/v/o biases, none of the fixtures has them): the device path adds them
    with the CPU path's association."""
    import json
    import shutil

    from safetensors.numpy import load_file, save_file

    src = FIXTURES / "qwen3moe-f32"
    config = json.loads((src / "config.json").read_text())
    config["attention_bias"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(src / "tokenizer.json", tmp_path / "tokenizer.json")
    tensors = load_file(src / "model.safetensors")
    rng = np.random.default_rng(7)
    for layer in range(config["num_hidden_layers"]):
        for proj in ("q", "k", "v", "o"):
            rows = tensors[f"model.layers.{layer}.self_attn.{proj}_proj.weight"].shape[0]
            tensors[f"model.layers.{layer}.self_attn.{proj}_proj.bias"] = rng.normal(0, 0.1, rows).astype(np.float32)
    save_file(tensors, tmp_path / "model.safetensors")
    cpu = engine.load(tmp_path)
    sim = engine.load(tmp_path, device="hostsim:0")
    try:
        for text in ("*=hostsim:0", "*=cpu:0"):
            cpu.set_placement(text)
            sim.set_placement(text)
            expected, got = run(cpu, "qwen3moe-f32", "reference"), run(sim, "qwen3moe-f32", "reference")
            assert np.array_equal(expected, got), text
        with cpu.context(8) as ctx:  # the biases do move the logits
            moved = ctx.prefill([1, 2, 3])
        with engine.load(src) as plain, plain.context(8) as ctx:
            assert not np.allclose(moved, ctx.prefill([1, 2, 3]))
    finally:
        cpu.close()
        sim.close()


def test_dense_model_on_a_device_primary(engine):
    cpu = engine.load(FIXTURES / "qwen3-f32")
    sim = engine.load(FIXTURES / "qwen3-f32", device="hostsim:0")
    try:
        assert np.array_equal(run(cpu, "qwen3-f32", "reference"), run(sim, "qwen3-f32", "reference"))
        assert sim.counters()["host_round_trips"] == 0
    finally:
        cpu.close()
        sim.close()


def test_speculative_run_on_a_device_primary_matches_the_cpu(engine):
    """Draft and target both on the device primary: the verify batches (q + 1 rows) and the rollbacks of the
    KV cache in device memory give the CPU's tokens."""
    target, draft = FIXTURES / "qwen3moe-bf16", FIXTURES / "qwen3-f32"
    hashes = {}
    for device in ("cpu:0", "hostsim:0"):
        t, d = engine.load(target, device=device), engine.load(draft, device=device)
        try:
            result = DecodeRun(t, d, prompts=["hello world", "a b c"], tokens_per_prompt=12, q=3,
                               placement=f"*={device}").run()  # fmt: skip
            hashes[device] = result.output_sha256
        finally:
            t.close()
            d.close()
    assert hashes["cpu:0"] == hashes["hostsim:0"]


def test_one_token_steps_run_from_a_recorded_graph_with_the_same_bits(engine):
    """hostsim records a step's operations (graph_begin .. graph_end) and replays them: the core records a
    one-token step once per context, replays it for every later token, and records again after a placement or
    reduction mode change; with a layer's experts elsewhere the step is two recorded parts around the host round
    trip."""
    name = "qwen3moe-f32"
    model = engine.load(FIXTURES / name, device="hostsim:0")
    try:
        model.set_placement("*=hostsim:0")
        results = {}
        for graphs in (True, False):
            before = model.counters()
            with model.context(64) as ctx:
                ctx.graphs = graphs
                assert ctx.graphs is graphs
                ref = np.load(FIXTURES / name / "reference.npz")
                rows = [ctx.prefill(ref["prompt_ids"])] + [ctx.decode([t]) for t in ref["generated_ids"][:8]]
                results[graphs] = np.concatenate(rows)
            after = model.counters()
            captures = after["graph_captures"] - before["graph_captures"]
            launches = after["graph_launches"] - before["graph_launches"]
            assert (captures, launches) == ((1, 8) if graphs else (0, 0)), f"graphs={graphs}"
        assert np.array_equal(results[True], results[False])
        with model.context(16) as ctx:
            ctx.decode([1])
            model.set_placement("*=hostsim:0; 0=cpu:0")  # layer 0's experts elsewhere: two parts per step
            for token, captured in ((2, 2), (3, 0)):
                before = model.counters()
                ctx.decode([token])
                after = model.counters()
                assert after["graph_launches"] - before["graph_launches"] == 2
                assert after["graph_captures"] - before["graph_captures"] == captured
                assert after["host_round_trips"] - before["host_round_trips"] == 1
            model.set_placement("*=hostsim:0")  # the tables changed: recorded again, one part
            before = model.counters()
            ctx.decode([4])
            after = model.counters()
            assert (
                after["graph_captures"] - before["graph_captures"],
                after["graph_launches"] - before["graph_launches"],
            ) == (1, 1)
            ctx.mode = "owner_local"  # the mode is part of the recording
            ctx.decode([5])
            assert model.counters()["graph_captures"] - after["graph_captures"] == 1
        # with a layer elsewhere the mode changes the recorded expert steps: replayed steps after a mode change
        # must still equal steps queued anew
        model.set_placement("*=hostsim:0; 0=cpu:0; 2.6=cpu:0")
        rows = {}
        for graphs in (True, False):
            with model.context(16) as ctx:
                ctx.graphs = graphs
                out = [ctx.decode([t]) for t in (3, 1, 4)]
                ctx.mode = "owner_local"
                out += [ctx.decode([t]) for t in (1, 5, 9)]
                rows[graphs] = np.concatenate(out)
        assert np.array_equal(rows[True], rows[False])
        with model.context(4) as ctx, pytest.raises(ArgumentError, match="graphs must be True or False, got 'yes'"):
            ctx.graphs = "yes"
    finally:
        model.close()


def test_device_primary_needs_a_cpu_device_for_the_experts():
    with Engine(runtimes=("hostsim",)) as eng, pytest.raises(UnsupportedError) as err:
        eng.load(FIXTURES / "qwen3moe-f32", device="hostsim:0")
    assert "primary device hostsim:0: experts start in host memory, but no CPU device is loaded" in str(err.value)


def test_device_primary_without_room_for_the_weights_or_the_cache():
    opts = {"hostsim": {"memory_limit": 4096}}
    with Engine(runtimes=("cpu", "hostsim"), runtime_options=opts) as eng:
        with pytest.raises(OutOfMemoryError) as err:
            eng.load(FIXTURES / "qwen3moe-f32", device="hostsim:0")
        assert "the model's weights" in str(err.value) and "on hostsim:0" in str(err.value)
        # the engine survives and still runs the model on the CPU
        with eng.load(FIXTURES / "qwen3moe-f32") as model, model.context(8) as ctx:
            assert np.isfinite(ctx.prefill([1, 2, 3])).all()

    # measure what the weights and two contexts take, then leave room for the small context only
    def allocated(model):
        return model.counters()["devices"]["hostsim:0"]["allocated_bytes"]

    with Engine(runtimes=("cpu", "hostsim")) as eng, eng.load(FIXTURES / "qwen3moe-f32", device="hostsim:0") as model:
        weights = allocated(model)
        with model.context(16):
            small = allocated(model) - weights
        with model.context(256):
            large = allocated(model) - weights
    assert weights > 0 and large > small > 0
    opts = {"hostsim": {"memory_limit": weights + (small + large) // 2}}
    with Engine(runtimes=("cpu", "hostsim"), runtime_options=opts) as eng:
        model = eng.load(FIXTURES / "qwen3moe-f32", device="hostsim:0")
        try:
            with pytest.raises(OutOfMemoryError) as err:
                model.context(256)
            assert "a context of 256 positions (KV cache and buffers" in str(err.value)
            assert "hostsim:0" in str(err.value)
            with model.context(16) as ctx:  # a smaller one fits
                assert np.isfinite(ctx.prefill([1, 2, 3])).all()
        finally:
            model.close()
