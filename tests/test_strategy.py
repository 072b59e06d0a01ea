"""Placement strategies and the cost model, checked with fixed calibration figures (no timing asserted)."""

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.checkpoints.checkpoint import Checkpoint
from engine.core.errors import ArgumentError
from engine.model import Engine
from engine.placement import strategy as S
from engine.placement.costmodel import (
    Calibration,
    DeviceRate,
    ModelShape,
    calibrate,
    expert_shares,
    predict_tokens_per_second,
    step_seconds,
)
from engine.placement.placement import Placement
from engine.placement.routing import RoutingStats

MB = 1_000_000
# 6 layers (layer 3 dense), 8 experts of 1 MB, top-2
SHAPE = ModelShape(num_layers=6, moe_layers=(0, 1, 2, 4, 5), num_experts=8, top_k=2, expert_bytes=MB)
# primary gpu:0 at 1000 MB/s; peer cpu:0 at 100 MB/s with a 1 ms join
CAL = Calibration("cuda:0", 0.002, {"cuda:0": DeviceRate(1000 * MB, 0.0), "cpu:0": DeviceRate(100 * MB, 0.001)})


def skewed_stats(shape=SHAPE, seed=0) -> RoutingStats:
    """Expert e of each layer picked in proportion to 2^-e (layer 4 very concentrated, layer 5 uniform)."""
    rng = np.random.default_rng(seed)
    hits = np.zeros((shape.num_layers, shape.num_experts), dtype=np.uint64)
    tokens = np.zeros(shape.num_layers, dtype=np.uint64)
    for layer in shape.moe_layers:
        w = 0.5 ** np.arange(shape.num_experts) if layer != 5 else np.ones(shape.num_experts)
        if layer == 4:
            w = np.array([100, 100] + [1] * (shape.num_experts - 2), dtype=float)
        for _ in range(1000):
            for e in rng.choice(shape.num_experts, shape.top_k, replace=False, p=w / w.sum()):
                hits[layer, e] += 1
        tokens[layer] = 1000
    return RoutingStats(hits, tokens, shape.top_k)


def owners_of(plan, layer):
    return set(plan.placement.owners[layer])


# ---- cost model ---------------------------------------------------------------------------------------------


def test_cost_model_single_devices_by_hand():
    on_gpu = SHAPE.empty_placement("cuda:0")
    # fixed + 5 layers x 2 experts x 1 MB / 1000 MB/s
    assert step_seconds(SHAPE, on_gpu, CAL) == pytest.approx(0.002 + 5 * 2 * 0.001)
    on_cpu = SHAPE.empty_placement("cpu:0")
    # every layer waits for the peer: 2 MB / 100 MB/s plus one join
    assert step_seconds(SHAPE, on_cpu, CAL) == pytest.approx(0.002 + 5 * (0.02 + 0.001))
    assert predict_tokens_per_second(SHAPE, on_gpu, CAL) == pytest.approx(1 / 0.012)
    # a batch of 4 tokens reads each expert once when any token picks it: 8 * (1 - (1 - 1/4)^4) experts per layer
    distinct = 8 * (1 - 0.75**4)
    assert step_seconds(SHAPE, on_gpu, CAL, tokens_per_step=4) == pytest.approx(0.002 + 5 * distinct * 0.001)


def test_cost_model_mixed_layer_waits_for_the_busier_device_of_each_token():
    p = SHAPE.empty_placement("cuda:0")
    for e in range(4):
        p.move_expert(0, e, "cpu:0")  # half of layer 0 on the peer
    # a token's 2 picks: both on the GPU (1/4): 2 x 1 ms; one each (1/2): max(1 ms, 10 ms + 1 ms join);
    # both on the peer (1/4): 2 x 10 ms + 1 ms
    layer0 = 0.25 * 0.002 + 0.5 * 0.011 + 0.25 * 0.021
    assert step_seconds(SHAPE, p, CAL) == pytest.approx(0.002 + layer0 + 4 * 0.002)
    # the max of the average times would say less: the expected peer work (1 expert) plus its expected join
    assert layer0 > 0.010 + 0.75 * 0.001
    # batches of several tokens use the expected times
    distinct = 4 * (1 - 0.75**2)
    involved = 1 - (1 - 1 / 2) ** 4
    assert step_seconds(SHAPE, p, CAL, tokens_per_step=2) == pytest.approx(
        0.002 + (distinct * 0.01 + involved * 0.001) + 4 * 8 * (1 - 0.75**2) * 0.001
    )


def test_dispatch_time_is_paid_once_per_layer_a_device_works_in():
    cal = Calibration("cuda:0", 0.002, {"cuda:0": DeviceRate(1000 * MB, 0.0, 0.0005),
                                        "cpu:0": DeviceRate(100 * MB, 0.001, 0.0002)})  # fmt: skip
    assert step_seconds(SHAPE, SHAPE.empty_placement("cuda:0"), cal) == pytest.approx(0.002 + 5 * (0.002 + 0.0005))
    p = SHAPE.empty_placement("cuda:0")
    for e in range(4):
        p.move_expert(0, e, "cpu:0")
    # as in the test above, each device that got a pick pays its dispatch (the peer its join too)
    layer0 = 0.25 * 0.0025 + 0.5 * max(0.0015, 0.0112) + 0.25 * 0.0212
    assert step_seconds(SHAPE, p, cal) == pytest.approx(0.002 + layer0 + 4 * 0.0025)


def test_calibration_solves_bandwidth_and_dispatch_from_two_batch_sizes():
    from engine.placement.costmodel import _rate

    # 5 layers: 10 experts per step at 1 position, 25 at 4; 2 us dispatch per layer, 1 MB per expert at 1 GB/s
    seconds = {1: 5 * 2e-6 + 10 * 1e-3, 4: 5 * 2e-6 + 25 * 1e-3}
    rate = _rate(SHAPE, {1: 10, 4: 25}, seconds, 3e-6)
    assert rate.bandwidth == pytest.approx(1000 * MB) and rate.dispatch_seconds == pytest.approx(2e-6)
    assert rate.join_seconds == 3e-6
    # noise that would make the dispatch negative: everything counts as bandwidth
    rate = _rate(SHAPE, {1: 10, 4: 25}, {1: 0.010, 4: 0.030}, 0.0)
    assert rate.dispatch_seconds == 0 and rate.bandwidth == pytest.approx(10 * MB / 0.010)


def test_shares_follow_the_statistics_and_default_to_uniform():
    stats = skewed_stats()
    shares = expert_shares(SHAPE, stats)
    assert shares[3].sum() == 0  # dense layer
    for layer in SHAPE.moe_layers:
        assert shares[layer].sum() == pytest.approx(2)
    assert shares[0, 0] > shares[0, 7]
    uniform = expert_shares(SHAPE)
    assert np.allclose(uniform[SHAPE.moe_layers, :], 0.25)
    with pytest.raises(ArgumentError, match="do not fit"):
        expert_shares(SHAPE, RoutingStats(np.zeros((2, 2), np.uint64), np.zeros(2, np.uint64), 2))


def test_calibration_round_trips_and_names_missing_devices():
    assert Calibration.from_dict(CAL.to_dict()) == CAL
    with pytest.raises(ArgumentError, match="no calibration for device 'hip:0'"):
        step_seconds(SHAPE, SHAPE.empty_placement("hip:0"), CAL)


# ---- strategies ---------------------------------------------------------------------------------------------


def test_single_and_uniform():
    plan = S.single_device(SHAPE, "cuda:0", calibration=CAL)
    assert plan.device_bytes == {"cuda:0": 40 * MB}
    assert plan.predicted_tokens_per_second == pytest.approx(1 / 0.012)
    with pytest.raises(ArgumentError, match="cuda:0 would hold 38.1 MiB of experts, more than its budget"):
        S.single_device(SHAPE, "cuda:0", budgets={"cuda:0": 10 * MB})
    split = S.uniform_split(SHAPE, ["cuda:0", "cpu:0"], calibration=CAL)
    owners = [split.placement.owners[layer][0] for layer in SHAPE.moe_layers]
    assert owners == ["cuda:0", "cuda:0", "cuda:0", "cpu:0", "cpu:0"]  # the earlier device gets the odd layer
    assert split.placement.owners[3] == [None] * 8
    assert split.predicted_tokens_per_second < plan.predicted_tokens_per_second


@pytest.mark.parametrize("budget_layers", [0, 1, 3, 5])
def test_cold_placement_moves_whole_layers(budget_layers):
    budget = budget_layers * SHAPE.layer_bytes + SHAPE.layer_bytes // 2  # half a layer more never splits one
    plan = S.cold_layers(SHAPE, "cuda:0", "cpu:0", budgets={"cuda:0": budget}, calibration=CAL)
    for layer in SHAPE.moe_layers:
        assert len(owners_of(plan, layer)) == 1, f"layer {layer} split: {plan.placement.owners[layer]}"
    on_fast = [layer for layer in SHAPE.moe_layers if owners_of(plan, layer) == {"cuda:0"}]
    assert len(on_fast) == budget_layers
    assert plan.device_bytes.get("cuda:0", 0) <= budget
    # one token per step: every layer is as hot as any other, and the cold ones are the first (llama.cpp's order)
    assert on_fast == list(SHAPE.moe_layers[len(SHAPE.moe_layers) - budget_layers :])


def test_cold_layers_for_batches_keeps_concentrated_layers_on_the_peer():
    stats = skewed_stats()
    heat = S.layer_heat(SHAPE, stats, tokens_per_step=4)
    assert heat[4] == min(heat[layer] for layer in SHAPE.moe_layers)  # two experts take almost every pick
    assert heat[5] == max(heat[layer] for layer in SHAPE.moe_layers)  # uniform: the most distinct experts
    plan = S.cold_layers(SHAPE, "cuda:0", "cpu:0", budgets={"cuda:0": 4 * SHAPE.layer_bytes}, stats=stats,
                         tokens_per_step=4)  # fmt: skip
    assert owners_of(plan, 4) == {"cpu:0"} and owners_of(plan, 5) == {"cuda:0"}


def test_hot_first_respects_budgets_and_takes_the_hottest():
    stats = skewed_stats()
    budgets = {"cuda:0": 12 * MB, "cpu:0": 20 * MB, "cpu:1": 8 * MB}
    plan = S.hot_first(SHAPE, ["cuda:0", "cpu:0", "cpu:1"], budgets=budgets, calibration=None, stats=stats)
    assert plan.predicted_tokens_per_second is None
    for device, nbytes in plan.device_bytes.items():
        assert nbytes <= budgets[device]
    assert sum(plan.device_bytes.values()) == SHAPE.total_bytes
    shares = expert_shares(SHAPE, stats)
    on_gpu = [shares[layer, e] for layer in SHAPE.moe_layers for e in range(8)
              if plan.placement.owners[layer][e] == "cuda:0"]  # fmt: skip
    elsewhere = [shares[layer, e] for layer in SHAPE.moe_layers for e in range(8)
                 if plan.placement.owners[layer][e] != "cuda:0"]  # fmt: skip
    assert len(on_gpu) == 12 and min(on_gpu) >= max(elsewhere)
    with pytest.raises(ArgumentError, match="hold less than the 38.1 MiB of experts"):
        S.hot_first(SHAPE, ["cuda:0", "cpu:0"], budgets={"cuda:0": 10 * MB, "cpu:0": 10 * MB})


def test_critical_path_only_moves_what_lowers_the_critical_path():
    stats = skewed_stats()
    all_peer = step_seconds(SHAPE, SHAPE.empty_placement("cpu:0"), CAL, stats)
    plan = S.critical_path(SHAPE, "cuda:0", "cpu:0", calibration=CAL, budgets={"cuda:0": 15 * MB}, stats=stats)
    assert plan.device_bytes["cuda:0"] <= 15 * MB
    assert 1 / plan.predicted_tokens_per_second < all_peer
    # no single expert moved back to the peer would be faster: each move lowered its layer's max(fast, peer)
    base = step_seconds(SHAPE, plan.placement, CAL, stats)
    for layer in SHAPE.moe_layers:
        for e, device in enumerate(plan.placement.owners[layer]):
            if device == "cuda:0":
                plan.placement.owners[layer][e] = "cpu:0"
                assert step_seconds(SHAPE, plan.placement, CAL, stats) >= base - 1e-12
                plan.placement.owners[layer][e] = "cuda:0"
    # the hot experts went first: on a layer, every expert on the fast device is at least as hot as those left
    shares = expert_shares(SHAPE, stats)
    for layer in SHAPE.moe_layers:
        fast = [shares[layer, e] for e, d in enumerate(plan.placement.owners[layer]) if d == "cuda:0"]
        slow = [shares[layer, e] for e, d in enumerate(plan.placement.owners[layer]) if d == "cpu:0"]
        if fast and slow:
            assert min(fast) >= max(slow) - 1e-12


def test_critical_path_balances_equal_devices_and_stops_when_moving_no_longer_helps():
    # fast = the primary, peer as fast with no join cost: the best split of a layer is half and half
    cal = Calibration("cpu:0", 0.0, {"cpu:0": DeviceRate(100 * MB), "cpu:1": DeviceRate(100 * MB, 0.0)})
    plan = S.critical_path(SHAPE, "cpu:0", "cpu:1", calibration=cal)
    for layer in SHAPE.moe_layers:
        assert plan.placement.owners[layer].count("cpu:0") == 4
    # a peer so slow that everything belongs on the fast device
    cal = Calibration("cpu:0", 0.0, {"cpu:0": DeviceRate(100 * MB), "cpu:1": DeviceRate(1 * MB, 0.01)})
    assert S.critical_path(SHAPE, "cpu:0", "cpu:1", calibration=cal).device_bytes == {"cpu:0": SHAPE.total_bytes}


def test_critical_path_puts_experts_never_seen_chosen_on_the_fast_device_while_it_has_room():
    # layer 0's experts 6 and 7 never chosen: the model gives them no cost on either device, but one chosen after
    # all would make layer 0 wait on the peer
    stats = skewed_stats()
    stats.hits[0, 6:] = 0
    ample = S.critical_path(SHAPE, "cuda:0", "cpu:0", calibration=CAL, stats=stats)
    assert ample.placement.owners[0][6:] == ["cuda:0", "cuda:0"]
    assert any("never saw chosen" in note for note in ample.notes)
    # a budget too small for every expert: the unseen take only the room the seen experts' moves left
    tight = S.critical_path(SHAPE, "cuda:0", "cpu:0", calibration=CAL, stats=stats, budgets={"cuda:0": 15 * MB})
    on_fast = [e for e in (6, 7) if tight.placement.owners[0][e] == "cuda:0"]
    assert tight.device_bytes["cuda:0"] <= 15 * MB
    assert len(on_fast) == 2 or tight.device_bytes["cuda:0"] + MB > 15 * MB  # they took the room there was
    back = Placement([list(row) for row in tight.placement.owners])
    back.owners[0][6:] = ["cpu:0", "cpu:0"]
    assert step_seconds(SHAPE, back, CAL, stats) == pytest.approx(step_seconds(SHAPE, tight.placement, CAL, stats))
    # without statistics every expert has the uniform share: nothing is unseen
    plain = S.critical_path(SHAPE, "cuda:0", "cpu:0", calibration=CAL)
    assert not any("never saw chosen" in note for note in plain.notes)


def test_critical_path_honours_the_peer_budget_too():
    plan = S.critical_path(SHAPE, "cuda:0", "cpu:0", calibration=CAL, budgets={"cuda:0": 30 * MB, "cpu:0": 20 * MB})
    assert plan.device_bytes["cpu:0"] <= 20 * MB and plan.device_bytes["cuda:0"] <= 30 * MB
    with pytest.raises(ArgumentError, match="cannot hold"):
        S.critical_path(SHAPE, "cuda:0", "cpu:0", calibration=CAL, budgets={"cuda:0": 10 * MB, "cpu:0": 20 * MB})
    with pytest.raises(ArgumentError, match="needs a calibration"):
        S.critical_path(SHAPE, "cuda:0", "cpu:0")


# two GPUs beside a CPU primary: 1000 MB/s each with a 0.5 ms join, the CPU at 100 MB/s
CAL2 = Calibration("cpu:0", 0.002, {"cpu:0": DeviceRate(100 * MB), "cuda:0": DeviceRate(1000 * MB, 0.0, 0.0005),
                                   "cuda:1": DeviceRate(1000 * MB, 0.0, 0.0005)})  # fmt: skip


def test_critical_path_balances_across_two_fast_devices_and_the_peer():
    stats = skewed_stats()
    budgets = {"cuda:0": 12 * MB, "cuda:1": 12 * MB}
    both = S.critical_path(SHAPE, ["cuda:0", "cuda:1"], "cpu:0", budgets, CAL2, stats)
    assert both.device_bytes["cuda:0"] <= 12 * MB and both.device_bytes["cuda:1"] <= 12 * MB
    assert both.device_bytes["cuda:0"] > 0 and both.device_bytes["cuda:1"] > 0
    one = S.critical_path(SHAPE, "cuda:0", "cpu:0", budgets, CAL2, stats)
    assert both.predicted_tokens_per_second > one.predicted_tokens_per_second  # the second GPU's room is used
    # no single expert moved to another device that has room would be faster, under the same model
    base = step_seconds(SHAPE, both.placement, CAL2, stats)
    for layer in SHAPE.moe_layers:
        for e, device in enumerate(list(both.placement.owners[layer])):
            for other in ("cpu:0", "cuda:0", "cuda:1"):
                if other == device or (other in budgets and both.device_bytes[other] + MB > budgets[other]):
                    continue
                both.placement.owners[layer][e] = other
                assert step_seconds(SHAPE, both.placement, CAL2, stats) >= base - 1e-12, (layer, e, device, other)
            both.placement.owners[layer][e] = device
    # a fast device with no room takes nothing; the other takes what one device alone would
    no_room = S.critical_path(SHAPE, ["cuda:0", "cuda:1"], "cpu:0", {"cuda:0": 0, "cuda:1": 12 * MB}, CAL2, stats)
    assert "cuda:0" not in no_room.device_bytes or no_room.device_bytes["cuda:0"] == 0
    alone = S.critical_path(SHAPE, "cuda:1", "cpu:0", {"cuda:1": 12 * MB}, CAL2, stats)
    assert no_room.placement == alone.placement
    assert any("moved" in note and "on cuda:1" in note for note in both.notes)
    with pytest.raises(ArgumentError, match="must be others than the peer"):
        S.critical_path(SHAPE, ["cuda:0", "cpu:0"], "cpu:0", budgets, CAL2, stats)


def test_choose_balances_every_gpu_against_the_cpu_and_the_tuner_seeds_it():
    from engine.placement.placement import ExpertRoom
    from engine.tune.search import search_space

    rooms = {"cpu:0": ExpertRoom("cpu:0", 0, 0, 0, unlimited=True),
             "cuda:0": ExpertRoom("cuda:0", 12 * MB, 0, 0), "cuda:1": ExpertRoom("cuda:1", 12 * MB, 0, 0)}  # fmt: skip
    names = ["cpu:0", "cuda:0", "cuda:1"]
    plan = S.choose("critical-path", SHAPE, names, "cpu:0", "cuda:0", rooms, CAL2, skewed_stats())
    assert plan.device_bytes.get("cuda:0", 0) > 0 and plan.device_bytes.get("cuda:1", 0) > 0
    assert S.fast_devices("cuda:0", names, "cpu:0", S.budgets_for(rooms), CAL2) == ["cuda:0", "cuda:1"]
    candidates, _notes = search_space(SHAPE, names, "cpu:0", "cuda:0", S.budgets_for(rooms), CAL2, skewed_stats())
    balanced = [c for c in candidates if c.origin.startswith("critical path")]
    assert any(c.device_bytes.get("cuda:0", 0) > 0 and c.device_bytes.get("cuda:1", 0) > 0 for c in balanced)


# ---- on the fixture model ------------------------------------------------------------------------------------


def test_shape_from_checkpoint_matches_the_engine():
    ckpt = Checkpoint.open(FIXTURES / "qwen3moe-f32")
    shape = ModelShape.from_checkpoint(ckpt)
    assert shape.moe_layers == (0, 2) and shape.num_experts == 8 and shape.top_k == 2
    with Engine() as eng:
        model = eng.load(ckpt)
        assert ModelShape.from_model(model) == shape
        assert S.uniform_split(shape, ["cpu:0"]).placement == model.placement


def test_calibrate_measures_every_device_and_restores_the_placement():
    with Engine(cpu_devices=2, cpu_threads=1) as eng:
        model = eng.load(FIXTURES / "qwen3moe-f32")
        model.set_placement("2=cpu:1")
        before = model.placement
        cal = calibrate(model, tokens=4, repeats=1, warmup_seconds=0)
        assert model.placement == before
    assert cal.primary == "cpu:0" and set(cal.devices) == {"cpu:0", "cpu:1"}
    assert all(r.bandwidth > 0 and r.join_seconds >= 0 for r in cal.devices.values())
    assert cal.fixed_seconds >= 0 and cal.devices["cpu:0"].join_seconds == 0
    shape = ModelShape.from_checkpoint(Checkpoint.open(FIXTURES / "qwen3moe-f32"))
    assert predict_tokens_per_second(shape, Placement.parse("0=cpu:1", model.config), cal) > 0


# ---- layers whose experts differ in size (a quantized file's mix of formats) ---------------------------------

# layers 0 and 1 hold 2 MB experts (say Q6_K down projections), layers 2, 4, 5 hold 1 MB ones
MIXED = ModelShape(num_layers=6, moe_layers=(0, 1, 2, 4, 5), num_experts=8, top_k=2, expert_bytes=1_400_000,
                   layer_expert_bytes=(2 * MB, 2 * MB, MB, 0, MB, MB))  # fmt: skip


def test_mixed_layers_count_each_layers_bytes():
    on_gpu = MIXED.empty_placement("cuda:0")
    assert MIXED.total_bytes == 8 * (2 + 2 + 1 + 1 + 1) * MB
    assert S.placement_bytes(MIXED, on_gpu) == {"cuda:0": MIXED.total_bytes}
    # the cost model reads each layer's own bytes: 2 x (2 + 2 + 1 + 1 + 1) MB at 1000 MB/s
    assert step_seconds(MIXED, on_gpu, CAL) == pytest.approx(0.002 + 2 * 7 * 0.001)
    # equal heat: the last layers first (5, 4, 2: 8 MB each fill the 24 MB); layer 1's 16 MB no longer fit
    plan = S.cold_layers(MIXED, "cuda:0", "cpu:0", budgets={"cuda:0": 24 * MB})
    assert [layer for layer in MIXED.moe_layers if owners_of(plan, layer) == {"cuda:0"}] == [2, 4, 5]
    assert plan.device_bytes == {"cuda:0": 24 * MB, "cpu:0": 32 * MB}
    held = S.hot_first(MIXED, ["cuda:0", "cpu:0"], budgets={"cuda:0": 5 * MB})
    assert held.device_bytes["cuda:0"] <= 5 * MB
    assert held.device_bytes["cuda:0"] + held.device_bytes["cpu:0"] == MIXED.total_bytes


def test_shape_from_a_checkpoint_is_uniform_when_the_layers_are():
    shape = ModelShape.from_checkpoint(Checkpoint.open(FIXTURES / "qwen3moe-f32"))
    assert shape.layer_expert_bytes == ()
    assert shape.bytes_of(shape.moe_layers[0]) == shape.expert_bytes


# ---- the KV cache's reads: full-attention layers read the context, sliding-window ones at most their window ----

# 4 layers alternating sliding (window 8) and full attention, 1000 bytes per position and layer
WINDOWED = ModelShape(num_layers=4, moe_layers=(0, 1, 2, 3), num_experts=8, top_k=2, expert_bytes=MB,
                      kv_row_bytes=1000, layer_windows=(8, 0, 8, 0))  # fmt: skip
FULL = ModelShape(num_layers=4, moe_layers=(0, 1, 2, 3), num_experts=8, top_k=2, expert_bytes=MB, kv_row_bytes=1000)
# calibrated at a mean context of 20 positions, the primary reading 1000 MB/s
CAL_AT_20 = Calibration("cuda:0", 0.002, dict(CAL.devices), context=20.0)


def test_sliding_window_layers_read_a_bounded_cache():
    assert WINDOWED.kv_bytes_per_token == 2 * 1000 and WINDOWED.kv_window_bytes == 2 * 8 * 1000
    assert FULL.kv_bytes_per_token == 4 * 1000 and FULL.kv_window_bytes == 0
    assert WINDOWED.kv_read_bytes(4) == FULL.kv_read_bytes(4) == 4 * 4 * 1000  # inside the window: every position
    assert WINDOWED.kv_read_bytes(100) == (2 * 8 + 2 * 100) * 1000
    assert FULL.kv_read_bytes(100) == 4 * 100 * 1000
    # past the window only the full layers grow
    assert WINDOWED.kv_read_bytes(2000) - WINDOWED.kv_read_bytes(1000) == 2 * 1000 * 1000


def test_predictions_at_a_context_add_the_kv_reads_beyond_the_calibrated_ones():
    on_gpu = WINDOWED.empty_placement("cuda:0")
    experts = 4 * 2 * 0.001  # 4 layers x 2 experts of 1 MB at 1000 MB/s
    assert step_seconds(WINDOWED, on_gpu, CAL_AT_20) == pytest.approx(0.002 + experts)
    assert step_seconds(WINDOWED, on_gpu, CAL_AT_20, context=20) == pytest.approx(0.002 + experts)
    # at 10 020 positions: the full layers read 10 000 more positions each, the windowed ones none more
    longer = (2 * 10_000) * 1000 / (1000 * MB)
    assert step_seconds(WINDOWED, on_gpu, CAL_AT_20, context=10_020) == pytest.approx(0.002 + experts + longer)
    assert step_seconds(FULL, on_gpu, CAL_AT_20, context=10_020) == pytest.approx(0.002 + experts + 2 * longer)
    # a shorter context reads less (never below no fixed time at all); the batch shares one read of the cache
    assert step_seconds(WINDOWED, on_gpu, CAL_AT_20, context=1) < 0.002 + experts
    assert CAL_AT_20.fixed_at(WINDOWED, 0) >= 0.0
    assert (step_seconds(WINDOWED, on_gpu, CAL_AT_20, tokens_per_step=4, context=10_020) -
            step_seconds(WINDOWED, on_gpu, CAL_AT_20, tokens_per_step=4)) == pytest.approx(longer)  # fmt: skip
    # the KV term is the same whatever the placement: it moves tokens/s, never the order of two placements
    split = WINDOWED.empty_placement("cuda:0")
    split.owners[0] = split.owners[1] = ["cpu:0"] * WINDOWED.num_experts
    for shape in (WINDOWED, FULL):
        a = step_seconds(shape, split, CAL_AT_20, context=5000) - step_seconds(shape, split, CAL_AT_20)
        b = step_seconds(shape, on_gpu, CAL_AT_20, context=5000) - step_seconds(shape, on_gpu, CAL_AT_20)
        assert a == pytest.approx(b) and a > 0
    # no calibrated context (an older calibration file), or a shape without a cache size: no KV term
    assert Calibration.from_dict({k: v for k, v in CAL_AT_20.to_dict().items() if k != "context"}).context == 0.0
    assert step_seconds(WINDOWED, on_gpu, CAL, context=10_020) == pytest.approx(0.002 + experts)
    plain = SHAPE.empty_placement("cuda:0")
    assert step_seconds(SHAPE, plain, CAL_AT_20, context=10_020) == pytest.approx(step_seconds(SHAPE, plain, CAL_AT_20))
    assert Calibration.from_dict(CAL_AT_20.to_dict()) == CAL_AT_20


@pytest.mark.parametrize("name", ["gpt-oss-bf16", "gpt-oss-mxfp4", "deepseek-f32", "qwen3moe-f32"])
def test_the_shapes_kv_figures_are_the_engines(name):
    """ModelShape's cache sizes from the config are the core's (model info): gpt-oss's sliding layers at their
    windows, MLA's latent, plain keys and values."""
    ckpt = Checkpoint.open(FIXTURES / name)
    shape = ModelShape.from_checkpoint(ckpt)
    assert shape.layer_windows == ckpt.config.layer_windows
    with Engine() as eng:
        info = eng.load(ckpt).info
    assert (shape.kv_bytes_per_token, shape.kv_window_bytes) == (info["kv_bytes_per_token"], info["kv_window_bytes"])
    if name.startswith("gpt-oss"):
        assert shape.kv_window_bytes > 0 and 0 < shape.kv_bytes_per_token < shape.kv_row_bytes * shape.num_layers


def test_calibration_records_its_context():
    with Engine() as eng:
        model = eng.load(FIXTURES / "gpt-oss-mxfp4")
        cal = calibrate(model, tokens=4, repeats=1, warmup_seconds=0)
        prompt = len(model.encode("The quick brown fox jumps over the lazy dog."))
    assert cal.context == prompt + 2.5
    shape = ModelShape.from_checkpoint(Checkpoint.open(FIXTURES / "gpt-oss-mxfp4"))
    at = {n: predict_tokens_per_second(shape, shape.empty_placement("cpu:0"), cal, context=n) for n in (8, 4096)}
    assert at[8] >= at[4096] > 0


# ---- choosing a strategy (the window's buttons and `expertbench plan`) ---------------------------------------


class Dev:
    def __init__(self, name, kind, memory_free):
        self.name, self.kind, self.memory_free = name, kind, memory_free


def rooms(free_gpu, held_gpu=0, devices=("cuda:0", "cpu:0")):
    from engine.placement.placement import expert_rooms

    info = [Dev(d, "cpu" if d.startswith("cpu") else "gpu", free_gpu if d == "cuda:0" else 1 << 40) for d in devices]
    return expert_rooms(info, {"cuda:0": held_gpu})


def test_choose_pairs_the_fast_device_with_the_primary_or_the_first_other():
    assert S.peer_of("cuda:0", ["cpu:0", "cuda:0"], "cpu:0") == "cpu:0"
    assert S.peer_of("cpu:0", ["cpu:0", "cuda:0", "cpu:1"], "cpu:0") == "cuda:0"
    with pytest.raises(ArgumentError, match="needs a second device besides cpu:0"):
        S.peer_of("cpu:0", ["cpu:0"], "cpu:0")
    assert S.default_fast([Dev("cpu:0", "cpu", 0), Dev("cpu:1", "cpu", 0), Dev("hostsim:0", "sim", 0)], "cpu:0") == (
        "hostsim:0"
    )
    assert S.default_fast([Dev("cpu:0", "cpu", 0), Dev("cpu:1", "cpu", 0)], "cpu:0") == "cpu:1"
    assert S.default_fast([Dev("cpu:0", "cpu", 0)], "cpu:0") == "cpu:0"


def test_hot_first_fills_the_other_devices_by_measured_bandwidth():
    cal = Calibration("cpu:0", 0.002, {"cpu:0": DeviceRate(100 * MB), "cpu:1": DeviceRate(300 * MB),
                                       "cuda:0": DeviceRate(1000 * MB)})  # fmt: skip
    assert S.fastest_first("cuda:0", ["cpu:0", "cpu:1", "cuda:0"], cal) == ["cuda:0", "cpu:1", "cpu:0"]
    assert S.fastest_first("cuda:0", ["cpu:0", "cpu:1", "cuda:0"], None) == ["cuda:0", "cpu:0", "cpu:1"]


def test_the_budget_is_the_room_for_experts_less_the_reserve_or_a_smaller_cap():
    r = rooms(free_gpu=20 * MB, held_gpu=30 * MB)
    assert S.budgets_for(r) == {"cuda:0": 45 * MB}  # 20 free + 30 held - a tenth; the CPU device has none
    assert S.budgets_for(r, {"cuda:0": 10 * MB, "cpu:0": 2 * MB}) == {"cuda:0": 10 * MB, "cpu:0": 2 * MB}


def test_a_fast_device_full_of_the_current_placement_is_not_refused():
    """The device holds the current placement's experts and has almost nothing free: its room is what the experts
    hold plus what is free (less the reserve), so the strategy plans on it."""
    full = rooms(free_gpu=MB // 2, held_gpu=SHAPE.total_bytes)  # 40 MB of experts there, 0.5 MB free
    plan = S.choose("cold-layers", SHAPE, ["cpu:0", "cuda:0"], "cpu:0", "cuda:0", full, CAL)
    assert S.budgets_for(full)["cuda:0"] == 36_450_000  # 0.5 MB free + 40 MB held, less a tenth
    assert plan.device_bytes["cuda:0"] == 4 * 8 * MB  # four whole layers of five fit in 36.45 MB
    hot = S.choose("hot-first", SHAPE, ["cpu:0", "cuda:0"], "cpu:0", "cuda:0", full, CAL, skewed_stats())
    assert hot.device_bytes["cuda:0"] == 36 * MB


def test_a_fast_device_that_cannot_hold_the_strategys_least_is_refused_with_the_rule_in_numbers():
    tiny = rooms(free_gpu=2 * MB, held_gpu=5 * MB)  # 7 MB, less a tenth: 6.3 MB, less than one layer (8 MB)
    with pytest.raises(ArgumentError) as refused:
        S.choose("cold-layers", SHAPE, ["cpu:0", "cuda:0"], "cpu:0", "cuda:0", tiny, CAL)
    assert str(refused.value) == (
        "Cold layers: cuda:0 cannot hold one MoE layer's experts: it needs 7.6 MiB; the device has 6.0 MiB for "
        "experts = free 1.9 MiB + this model's experts 4.8 MiB - reserve 0.7 MiB (a tenth for staging, at most "
        "1024.0 MiB)"
    )
    with pytest.raises(ArgumentError, match=r"Hot first: cuda:0's budget of 0.5 MiB is less than one expert \(1.0 MiB"):
        S.choose("hot-first", SHAPE, ["cpu:0", "cuda:0"], "cpu:0", "cuda:0", tiny, CAL, caps={"cuda:0": MB // 2})


@pytest.mark.parametrize(
    "name, kwargs, message",
    [
        ("fastest", {}, "strategy 'fastest' is unknown: expected one of single-device, uniform-split, cold-layers, "
                        "hot-first, critical-path"),
        ("cold-layers", {"fast": "cuda:1"}, "Cold layers: no device cuda:1 (devices: cpu:0, cuda:0)"),
        ("hot-first", {"caps": {"hip:0": MB}}, "Hot first: no device hip:0 (devices: cpu:0, cuda:0)"),
        ("critical-path", {"calibration": None}, "Critical path needs the devices measured (a calibration)"),
    ],
)  # fmt: skip
def test_choose_refuses_bad_choices_by_name(name, kwargs, message):
    args = {"fast": "cuda:0", "calibration": CAL, "caps": None, **kwargs}
    with pytest.raises(ArgumentError) as refused:
        S.choose(name, SHAPE, ["cpu:0", "cuda:0"], "cpu:0", args["fast"], rooms(1 << 40), args["calibration"],
                 None, args["caps"])  # fmt: skip
    assert str(refused.value) == message


def test_choose_gives_what_each_strategy_gives_with_the_choices_filled_in():
    r = rooms(1 << 40)
    stats = skewed_stats()
    devices = ["cpu:0", "cuda:0"]
    caps = {"cuda:0": 20 * MB}
    budgets = S.budgets_for(r, caps)
    assert S.choose("single-device", SHAPE, devices, "cpu:0", "cpu:0", r).placement == SHAPE.empty_placement("cpu:0")
    assert S.choose("uniform-split", SHAPE, devices, "cpu:0", "cuda:0", r, CAL).placement == S.uniform_split(
        SHAPE, ["cuda:0", "cpu:0"]).placement  # fmt: skip
    for name, direct in [
        ("cold-layers", lambda: S.cold_layers(SHAPE, "cuda:0", "cpu:0", budgets, CAL, stats)),
        ("hot-first", lambda: S.hot_first(SHAPE, ["cuda:0", "cpu:0"], budgets, CAL, stats)),
        ("critical-path", lambda: S.critical_path(SHAPE, "cuda:0", "cpu:0", budgets, CAL, stats)),
    ]:
        plan = S.choose(name, SHAPE, devices, "cpu:0", "cuda:0", r, CAL, stats, caps)
        assert plan.placement == direct().placement and plan.device_bytes["cuda:0"] <= 20 * MB
