"""A primary device that cannot read host memory (a GPU primary), run here on hostsim: the forward pass goes
through the runtime's primary operations, with the weights, KV cache and activations in the device's memory.

hostsim computes them with the CPU path's arithmetic, so every result must be bit-identical to a cpu primary's,
for every placement: experts all on the primary (no host round trip), all in host memory (a round trip per MoE
layer), and scattered over three devices.
"""

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.errors import ArgumentError, OutOfMemoryError, UnsupportedError
from engine.model import Engine
from engine.run import DecodeRun

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
        assert set(sim.placement.describe().split("=")[1:]) == {"cpu:0"}, "experts start in host memory"
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


def test_graphs_flag(engine):
    model = engine.load(FIXTURES / "qwen3moe-f32", device="hostsim:0")
    try:
        with model.context(16) as ctx:
            assert ctx.graphs is True
            ctx.graphs = False
            assert ctx.graphs is False
            with pytest.raises(ArgumentError, match="graphs must be True or False, got 'yes'"):
                ctx.graphs = "yes"
            ctx.decode([1])
        # hostsim records no graphs: every step is queued anew
        assert model.counters()["graph_captures"] == model.counters()["graph_launches"] == 0
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
