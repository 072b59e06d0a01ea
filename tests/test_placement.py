"""Expert placement across devices: bit-identity in reference mode, owner_local, memory, bad placements."""

from dataclasses import replace

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.core.errors import ArgumentError, OutOfMemoryError, RangeError
from engine.model import Engine
from engine.placement.placement import Placement

PLACEMENTS = {
    "all on cpu:0": "*=cpu:0",
    "all on cpu:1": "*=cpu:1",
    "split cpu:0 / cpu:1": "0=cpu:1; 2=cpu:0",
    "host-staged peer": "0=hostsim:0",
    "three devices": "0=hostsim:0; 2=cpu:1",
    "single experts scattered": "*=cpu:0; 0.1=cpu:1; 0.4-5=hostsim:0; 2.0=hostsim:0; 2.3=cpu:1; 2.7=cpu:1",
}


@pytest.fixture(params=[1, 2], ids=["1-thread devices", "2-thread devices"])
def engine(request):
    # with two threads per device the pools' workers run beside the peer branches, as users run it
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, cpu_threads=request.param) as eng:
        yield eng


def trace(model, placement, mode="reference"):
    """Logits of a prefill, 8 single decode steps and one 4-position batch, under a placement (None: as it is)."""
    ref = np.load(FIXTURES / model.checkpoint.folder.name / "reference.npz")
    prompt, generated = ref["prompt_ids"], ref["generated_ids"]
    if placement is not None:
        model.set_placement(placement)
    with model.context() as ctx:
        ctx.mode = mode
        rows = [ctx.prefill(prompt)] + [ctx.decode([t]) for t in generated[:8]] + [ctx.decode(generated[8:12])]
    return np.concatenate(rows)


@pytest.mark.parametrize("name", ["qwen3moe-f32", "qwen3moe-bf16"])
def test_reference_mode_is_bit_identical_across_placements(engine, name):
    model = engine.load(FIXTURES / name)
    base = trace(model, PLACEMENTS["all on cpu:0"])
    for label, text in PLACEMENTS.items():
        out = trace(model, text)
        assert np.array_equal(out, base), f"{label}: logits differ (max {np.abs(out - base).max():.3g})"
        # and the placement really is what was asked
        assert model.placement.describe() == Placement.parse(text, model.config).describe()


def test_experts_really_run_where_placed(engine):
    model = engine.load(FIXTURES / "qwen3moe-f32")
    model.set_placement("0=hostsim:0; 2=cpu:1")
    model.reset_counters()
    with model.context() as ctx:
        ctx.prefill([5, 6, 7, 8])
        ctx.decode([9])
    c = model.counters()
    dev = c["devices"]
    k = model.config.top_k
    assert dev["hostsim:0"]["rows"] == 5 * k and dev["cpu:1"]["rows"] == 5 * k and dev["cpu:0"]["rows"] == 0
    assert dev["hostsim:0"]["waits"] == 2 and dev["cpu:1"]["waits"] == 2  # one join per layer step
    assert c["layer_steps"] == 4 and c["joins"] == 4
    # only the unlike runtime is staged: input rows plus the routing plan in, one output row per pair out
    assert dev["cpu:1"]["bytes_to_device"] == 0 and dev["cpu:0"]["bytes_to_device"] == 0
    h = model.config.hidden_size
    assert dev["hostsim:0"]["bytes_from_device"] == 5 * k * h * 4
    assert dev["hostsim:0"]["bytes_to_device"] >= 5 * h * 4
    assert dev["hostsim:0"]["weight_bytes"] == dev["cpu:1"]["weight_bytes"] > 0
    assert dev["hostsim:0"]["allocated_bytes"] >= dev["hostsim:0"]["weight_bytes"]
    assert dev["cpu:1"]["allocated_bytes"] == 0  # host-addressable: reads the mapped file


def test_owner_local_difference_is_small(engine):
    model = engine.load(FIXTURES / "qwen3moe-f32")
    base = trace(model, "*=cpu:0")
    for text in ("0=hostsim:0; 2=cpu:1", PLACEMENTS["single experts scattered"]):
        out = trace(model, text, mode="owner_local")
        rel = np.linalg.norm(out - base, axis=1) / np.linalg.norm(base, axis=1)
        assert rel.max() < 1e-5


def test_owner_local_stages_fewer_bytes(engine):
    model = engine.load(FIXTURES / "qwen3moe-f32")
    model.set_placement("*=hostsim:0")
    moved = {}
    for mode in ("reference", "owner_local"):
        model.reset_counters()
        with model.context() as ctx:
            ctx.mode = mode
            ctx.prefill(list(range(16)))
        moved[mode] = model.counters()["devices"]["hostsim:0"]["bytes_from_device"]
    assert moved["owner_local"] * model.config.top_k == moved["reference"]


def test_no_allocation_on_the_hot_path(engine):
    model = engine.load(FIXTURES / "qwen3moe-f32")
    model.set_placement(PLACEMENTS["three devices"])
    with model.context() as ctx:
        ctx.prefill([1, 2, 3, 4, 5, 6])
        for t in range(4):  # warm up with the largest shapes a single step needs
            ctx.decode([t])
        before = model.counters()["arena_allocations"]
        for t in range(40):
            ctx.decode([(t * 7) % 500])
        assert model.counters()["arena_allocations"] == before
        assert before > 0


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_moving_layers_back_and_forth_leaks_nothing(engine):
    model = engine.load(FIXTURES / "qwen3moe-bf16")
    with model.context() as ctx:
        ctx.prefill([1, 2, 3])
        start_counts = model.counters()["devices"]
        for i in range(3):  # settle the allocator
            model.set_placement("0=hostsim:0; 2=cpu:1" if i % 2 == 0 else "*=cpu:0")
        rss0 = rss_bytes()
        for i in range(100):
            model.set_placement("0=hostsim:0; 2=cpu:1" if i % 2 == 0 else "*=cpu:0")
            ctx.truncate(3)
            ctx.decode([i % 500])
        assert model.placement.describe() == "0-2=cpu:0"
        end = model.counters()["devices"]
        assert end["hostsim:0"]["weight_bytes"] == 0 == start_counts["hostsim:0"]["weight_bytes"]
        # weight copies are gone; what remains on the device is this context's staging arena
        assert end["hostsim:0"]["allocated_bytes"] < 64 * 1024
        # layer 0's 8 experts went to hostsim 51 times (the first loop step repeats the settled placement);
        # cpu:1 reads the mapped file, so layer 2 never uploads
        assert model.counters()["uploads"] == 51 * 8
    assert rss_bytes() - rss0 < 2 * 1024 * 1024


def test_placement_bytes_predicts_per_device_memory(engine):
    model = engine.load(FIXTURES / "qwen3moe-f32")
    need = model.placement_bytes("0=hostsim:0")
    per_layer = 8 * 3 * 32 * 64 * 4
    assert need == {"cpu:0": per_layer, "cpu:1": 0, "hostsim:0": per_layer}
    assert model.placement.describe() == "0-2=cpu:0"  # nothing moved


def weights_state(model):
    c = model.counters()
    return c["uploads"], {d: (v["weight_bytes"], v["allocated_bytes"]) for d, v in c["devices"].items()}


def check_old_placement_still_works(model, expected_logits, before):
    """The refused call changed nothing: no upload, the same bytes per device, the same logits without
    re-applying anything."""
    assert weights_state(model) == before
    assert np.array_equal(trace(model, None), expected_logits)


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ("0=cuda:0", RangeError, "no device named 'cuda:0'"),
        ("5=cpu:1", RangeError, r"layer 5 out of range \(0\.\.2\)"),
        ("0.8=cpu:1", RangeError, r"expert 8 out of range \(0\.\.7\)"),
        ("1=cpu:1", ArgumentError, "no MoE layer in 1"),
        ("0=cpu1", ArgumentError, "expected LAYERS=DEVICE"),
        ("0-=cpu:1", ArgumentError, "expected LAYERS=DEVICE"),
    ],
)
def test_bad_placement_text_is_refused_and_old_placement_kept(engine, text, error, message):
    model = engine.load(FIXTURES / "qwen3moe-f32")
    logits = trace(model, "0=hostsim:0")
    state = weights_state(model)
    with pytest.raises(error, match=message):
        model.set_placement(text)
    assert model.placement.describe() == "0=hostsim:0; 2=cpu:0"
    check_old_placement_still_works(model, logits, state)


def test_wrong_shape_and_dense_layer_entries_are_refused(engine):
    model = engine.load(FIXTURES / "qwen3moe-f32")
    bad = model.placement
    bad.owners.pop()
    with pytest.raises(ArgumentError, match="placement has 2 layers, expected 3 layers of 8 experts"):
        model.set_placement(bad)
    bad = model.placement
    bad.owners[1] = ["cpu:1"] * 8  # layer 1 is the dense mlp_only layer
    with pytest.raises(ArgumentError, match="layer 1 is not an MoE layer"):
        model.set_placement(bad)


def test_overflowing_a_device_is_refused_and_old_placement_kept():
    layer = 8 * 3 * 32 * 64 * 4
    opts = {"hostsim": {"memory_limit": layer + layer // 2}}  # room for one layer's experts, not two
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, cpu_threads=1, runtime_options=opts) as eng:
        model = eng.load(FIXTURES / "qwen3moe-f32")
        logits = trace(model, "0=hostsim:0")
        state = weights_state(model)
        with pytest.raises(OutOfMemoryError, match=r"placement needs .* MiB more on hostsim:0, which has .* MiB free"):
            model.set_placement("*=hostsim:0")
        assert model.placement.describe() == "0=hostsim:0; 2=cpu:0"
        check_old_placement_still_works(model, logits, state)
        assert model.counters()["devices"]["hostsim:0"]["weight_bytes"] == layer


def test_dense_model_has_nothing_to_place(engine):
    from engine.core.errors import UnsupportedError

    model = engine.load(FIXTURES / "qwen3-f32")
    with pytest.raises((UnsupportedError, ArgumentError), match="no experts to place"):
        model.set_placement("*=cpu:1")


def test_text_form_round_trip():
    from engine.checkpoints.checkpoint import Checkpoint

    cfg = Checkpoint.open(FIXTURES / "qwen3moe-f32").config
    for text in ("0-2=cpu:0", "0=hostsim:0; 2=cpu:1", "0=cpu:1; 2.0-3=cpu:0; 2.4-7=hostsim:0"):
        assert Placement.parse(text, cfg).describe() == text
    p = Placement.parse("*=cpu:1; 2.3=cpu:0", cfg)
    assert p.owners[1] == [None] * 8 and p.owners[2][3] == "cpu:0" and p.devices() == ["cpu:0", "cpu:1"]
    p.move_layer(0, "cuda:0")
    assert p.describe() == "0=cuda:0; 2.0-2=cpu:1; 2.3=cpu:0; 2.4-7=cpu:1"
    with pytest.raises(RangeError):
        p.move_layer(1, "cpu:0")


# ---- fit checks and moves (engine.placement.placement: what the window and the command line ask) ---------------------


class Dev:
    """A DeviceInfo's fields that the fit checks read."""

    def __init__(self, name, kind, memory_free):
        self.name, self.kind, self.memory_free = name, kind, memory_free


MIB = 1 << 20
# 3 layers (layer 1 dense), 4 experts of 1 MiB in layers 0 and 2
OWNERS = [["cpu:0"] * 4, [None] * 4, ["cpu:0"] * 4]
SIZES = [MIB, 0, MIB]


def test_rooms_count_what_the_models_experts_hold_and_a_reserve_on_devices_that_hold_copies():
    from engine.placement.placement import STAGING_MAX, expert_room, expert_rooms

    sim = expert_room(Dev("hostsim:0", "sim", 2 * MIB), held=38 * MIB)  # a device full of this model's experts
    assert (sim.free, sim.held, sim.reserve) == (2 * MIB, 38 * MIB, 4 * MIB)  # a tenth of free + held
    assert sim.capacity == 40 * MIB and sim.room == 36 * MIB
    assert sim.explain() == ("the device has 36.0 MiB for experts = free 2.0 MiB + this model's experts 38.0 MiB "
                             "- reserve 4.0 MiB (a tenth for staging, at most 1024.0 MiB)")  # fmt: skip
    big = expert_room(Dev("cuda:0", "gpu", 80 << 30))
    assert big.reserve == STAGING_MAX and big.room == (80 << 30) - STAGING_MAX
    cpu = expert_room(Dev("cpu:0", "cpu", MIB), held=8 * MIB)
    assert cpu.unlimited and cpu.reserve == 0 and "mapped files" in cpu.explain()
    rooms = expert_rooms([Dev("cpu:0", "cpu", MIB), Dev("hostsim:0", "sim", 3 * MIB)], {"hostsim:0": MIB})
    assert rooms["hostsim:0"].capacity == 4 * MIB and rooms["cpu:0"].held == 0


def test_a_move_gives_the_new_placement_or_says_why_not():
    from engine.placement.placement import PlacementRefused, device_bytes, moved

    p = Placement([list(r) for r in OWNERS])
    devices = ["cpu:0", "hostsim:0"]
    new = moved(p, {0: [1, 2]}, "hostsim:0", devices)
    assert new.owners[0] == ["cpu:0", "hostsim:0", "hostsim:0", "cpu:0"] and p.owners == OWNERS  # a copy
    assert device_bytes(new, SIZES, devices) == {"cpu:0": 6 * MIB, "hostsim:0": 2 * MIB}
    assert device_bytes(new, lambda layer: SIZES[layer]) == {"cpu:0": 6 * MIB, "hostsim:0": 2 * MIB}
    assert device_bytes(None, SIZES, devices) == {"cpu:0": 0, "hostsim:0": 0}
    for moves, device, message in [
        ({0: [0]}, "cuda:0", "device cuda:0 is unknown (devices: cpu:0, hostsim:0)"),
        ({1: [0]}, "hostsim:0", "layer 1 is not an MoE layer: it has no experts to move"),
        ({7: [0]}, "hostsim:0", "layer 7 is not an MoE layer"),
        ({0: [4]}, "hostsim:0", "expert 4 of layer 0 does not exist (0..3)"),
        ({0: [0]}, "cpu:0", "already on cpu:0"),
    ]:
        with pytest.raises(PlacementRefused, match=message.replace("(", r"\(").replace(")", r"\)")):
            moved(p, moves, device, devices)


def test_a_placement_that_overflows_a_device_is_refused_with_needed_against_free():
    from engine.placement.placement import PlacementRefused, check_fits, expert_rooms

    rooms = expert_rooms([Dev("cpu:0", "cpu", 0), Dev("hostsim:0", "sim", 3 * MIB)], {"hostsim:0": 0})
    before = Placement([list(r) for r in OWNERS])
    one = Placement([["hostsim:0"] * 4, [None] * 4, ["cpu:0"] * 4])
    both = Placement([["hostsim:0"] * 4, [None] * 4, ["hostsim:0"] * 4])
    rooms["hostsim:0"] = replace(rooms["hostsim:0"], free=4 * MIB)
    assert check_fits(before, one, SIZES, rooms) == {"cpu:0": 4 * MIB, "hostsim:0": 4 * MIB}
    rooms["hostsim:0"] = replace(rooms["hostsim:0"], free=3 * MIB)
    with pytest.raises(PlacementRefused) as refused:
        check_fits(before, both, SIZES, rooms, "move")
    assert str(refused.value) == ("hostsim:0 would hold 8.0 MiB of experts but has room for 3.0 MiB (free 3.0 MiB + "
                                  "this model's experts there 0.0 MiB): the move is refused")  # fmt: skip
    # a device that shrinks is never refused, nor a CPU device (it reads the mapped files)
    rooms_full = expert_rooms([Dev("cpu:0", "cpu", 0), Dev("hostsim:0", "sim", 0)], {"hostsim:0": 8 * MIB})
    assert check_fits(both, one, SIZES, rooms_full)["hostsim:0"] == 4 * MIB
    with pytest.raises(PlacementRefused, match="names cuda:0, which this engine does not have"):
        check_fits(before, Placement([["cuda:0"] * 4, [None] * 4, ["cpu:0"] * 4]), SIZES, rooms)


def test_a_models_bytes_on_a_device_count_its_other_weights_on_the_primary_only():
    from engine.placement.placement import model_bytes

    assert model_bytes("cpu:0", "cpu:0", experts=6, weight_bytes=100, all_expert_bytes=80, draft_weight_bytes=7) == 33
    assert model_bytes("hostsim:0", "cpu:0", experts=6, weight_bytes=100, all_expert_bytes=80) == 6
    p = Placement([list(r) for r in OWNERS])
    q = p.copy()
    q.owners[0][0] = "hostsim:0"
    assert p.owners == OWNERS and q != p
