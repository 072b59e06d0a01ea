"""calibrate() recovers the cost model's figures from measurements, also when a peer holds only some layers.

The measurements are synthetic (made from known figures by a stand-in for measure_decode), so nothing here
depends on timing; the placements calibrate asks for are still applied to the real engine, so a peer too small for
every layer must be given only the layers it can hold.
"""

import pytest
from fixture_paths import FIXTURES

from engine.core.errors import ArgumentError
from engine.model import Engine
from engine.placement import costmodel

FIXED, TP, TD, JOIN, DENSE = 2e-3, 4e-5, 1e-5, 3e-4, 1.5e-3  # seconds: fixed, per expert on P / on d, join, P's dense


def fake_measure(model, placement, tokens, repeats, prompt, warmup_seconds, batch):
    """What the engine would measure if the cost model were exact: per MoE layer only one device works."""
    model.set_placement(placement)  # the placement must really fit
    cfg = model.config
    per_layer = cfg.top_k if batch == 1 else min(cfg.num_experts, 3 * cfg.top_k)
    experts = {"cpu:0": 0.0, "hostsim:0": 0.0}
    layers = {"cpu:0": 0, "hostsim:0": 0}
    for layer in cfg.moe_layers:
        owner = placement.owners[layer][0]
        experts[owner] += per_layer
        layers[owner] += 1
    busy = {"cpu:0": DENSE + experts["cpu:0"] * TP, "hostsim:0": experts["hostsim:0"] * TD}
    seconds = FIXED + experts["cpu:0"] * TP + experts["hostsim:0"] * TD + layers["hostsim:0"] * JOIN
    return {"seconds": seconds, "busy": busy, "experts": experts, "samples": [seconds]}


def calibrate_with_limit(monkeypatch, layers_room: float, placement: str | None = None):
    monkeypatch.setattr(costmodel, "measure_decode", fake_measure)
    with Engine(runtimes=("cpu", "hostsim"), cpu_threads=1) as probe:
        layer = costmodel.ModelShape.from_model(probe.load(FIXTURES / "qwen3moe-f32")).layer_bytes
    # room for the layers asked for, after the tenth kept back for staging (engine.placement.placement.ExpertRoom)
    limit = int(layers_room * layer / 0.9)
    opts = {"hostsim": {"memory_limit": limit}}
    with Engine(runtimes=("cpu", "hostsim"), cpu_threads=1, runtime_options=opts) as eng:
        model = eng.load(FIXTURES / "qwen3moe-f32")
        if placement is not None:
            model.set_placement(placement)
        before = model.placement.describe()
        cal = costmodel.calibrate(model, ["hostsim:0"], tokens=2, repeats=1)
        assert model.placement.describe() == before  # restored
        shape = costmodel.ModelShape.from_model(model)
    return cal, shape


@pytest.mark.parametrize("room", [2.5, 1.5])  # every MoE layer fits; only one of the two does
def test_calibration_recovers_the_figures(monkeypatch, room):
    cal, shape = calibrate_with_limit(monkeypatch, room)
    assert cal.measured["peer_layers"]["hostsim:0"] == (2 if room > 2 else 1)
    assert cal.fixed_seconds == pytest.approx(FIXED)
    assert cal.rate("cpu:0").bandwidth == pytest.approx(shape.expert_bytes / TP)
    assert cal.rate("hostsim:0").bandwidth == pytest.approx(shape.expert_bytes / TD)
    assert cal.rate("hostsim:0").join_seconds == pytest.approx(JOIN)
    assert cal.rate("hostsim:0").dispatch_seconds == pytest.approx(0.0, abs=1e-12)


def test_a_peer_with_no_room_for_one_layer_is_a_clear_error_that_states_the_rule_in_numbers(monkeypatch):
    with pytest.raises(ArgumentError) as refused:
        calibrate_with_limit(monkeypatch, 0.2)
    message = str(refused.value)
    assert message.startswith("calibration: hostsim:0 cannot hold one MoE layer's experts to be measured: it needs "
                              "0.2 MiB; the device has 0.0375 MiB for experts = free 0.0417 MiB + this model's "
                              "experts 0.0 MiB - reserve 0.0042 MiB (a tenth for staging"), message  # fmt: skip


def test_a_peer_full_of_the_current_placement_is_measured(monkeypatch):
    """The device's free memory is what the current placement left: its experts there count as room (the first
    measurement moves them off), so a full device is measured, as many layers as it holds."""
    cal, _shape = calibrate_with_limit(monkeypatch, 2.5, placement="*=hostsim:0")
    assert cal.measured["peer_layers"]["hostsim:0"] == 2


def test_a_swamped_primary_measurement_falls_back_to_bytes_per_step(monkeypatch):
    """When noise makes P's busy time in B as large as in A, the difference says nothing: no absurd bandwidth."""

    def noisy(model, placement, tokens, repeats, prompt, warmup_seconds, batch):
        out = fake_measure(model, placement, tokens, repeats, prompt, warmup_seconds, batch)
        out["busy"]["cpu:0"] = DENSE + 40 * TP  # the same in every run
        return out

    monkeypatch.setattr(costmodel, "measure_decode", noisy)
    with Engine(runtimes=("cpu", "hostsim"), cpu_threads=1) as eng:
        model = eng.load(FIXTURES / "qwen3moe-f32")
        cal = costmodel.calibrate(model, ["hostsim:0"], tokens=2, repeats=1)
        per_step = fake_measure(
            model, costmodel.ModelShape.from_model(model).empty_placement("cpu:0"), 2, 1, None, 0, 1
        )
        assert cal.rate("cpu:0").bandwidth == pytest.approx(model.info["bytes_per_token"] / per_step["seconds"])
        assert cal.rate("cpu:0").bandwidth < costmodel.PLAUSIBLE_PRIMARY_BANDWIDTH
