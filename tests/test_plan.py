"""`expertbench plan`: a strategy's placement, bytes per device and prediction, as the window's buttons choose it."""

import json

import pytest
from fixture_paths import FIXTURES

from engine.cli import main
from engine.core.errors import ArgumentError
from engine.placement import costmodel
from engine.tune import plan

DEMO_LAYER = 12 << 20  # the default demo target: 8 MoE layers of 12 MiB of experts


@pytest.fixture
def demo(xdg_cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))


def plan_json(capsys, *args):
    assert main(["plan", *args, "--json"]) == 0
    out = capsys.readouterr().out
    report = json.loads(out)  # one document
    return report


def test_plan_prints_the_placement_the_bytes_per_device_and_a_measured_prediction(demo, capsys):
    assert main(["plan", "--strategy", "cold-layers", "--runtime", "hostsim", "--budget", "hostsim:0=40MiB"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "strategy   Cold layers (cold-layers): fast device hostsim:0, peer cpu:0"
    assert out[1].startswith("model      ") and "synthetic" in out[1]
    assert out[2] == "placement  0-4=cpu:0; 5-7=hostsim:0"  # three whole layers (36 MiB) fit in 40 MiB
    assert (
        out[3].startswith("cpu:0") and "60.0 MiB of experts  (no budget: it reads the experts from the mapped" in out[3]
    )
    assert out[4].startswith("hostsim:0") and "36.0 MiB of experts  (budget 40.0 MiB (--budget))" in out[4]
    assert out[5].startswith("predicted  ") and "tokens/s  (the cost model's" in out[5] and "measured here" in out[5]
    assert out[6] == "routing    none: every expert equally used"


def test_plan_json_is_one_document_with_what_the_window_would_plan(demo, capsys):
    report = plan_json(capsys, "--strategy", "hot-first", "--runtime", "hostsim", "--budget", "hostsim:0=30MiB")
    assert report["strategy"] == "hot-first" and report["fast"] == "hostsim:0" and report["peer"] is None
    assert report["device_bytes"] == {"cpu:0": 8 * DEMO_LAYER - (30 << 20), "hostsim:0": 30 << 20}
    assert report["budgets"] == {"cpu:0": None, "hostsim:0": 30 << 20} and report["caps"] == {"hostsim:0": 30 << 20}
    room = report["rooms"]["hostsim:0"]
    assert room["room"] == room["free"] + room["held"] - room["reserve"] and room["held"] == 0
    assert report["predicted_tokens_per_second"] > 0 and report["synthetic"] is True
    # the same choice in Python: engine.placement.strategy.choose with the window's rules
    placement = report["placement"]
    assert "hostsim:0" in placement and "cpu:0" in placement


def test_plan_without_a_calibration_says_the_prediction_is_unavailable(demo, capsys):
    report = plan_json(capsys, "--strategy", "uniform-split", "--runtime", "hostsim", "--no-calibrate")
    assert report["placement"] == "0-3=hostsim:0; 4-7=cpu:0"  # the fast device first
    assert report["predicted_tokens_per_second"] is None and report["prediction"] == "unavailable: --no-calibrate"
    single = plan_json(capsys, "--strategy", "single-device", "--no-calibrate")  # one device is enough for it
    assert single["placement"] == "0-7=cpu:0" and single["fast"] == "cpu:0"


def test_plan_reads_routing_statistics_and_the_fast_device_given(demo, capsys, tmp_path):
    rows = ["# hotness table: n_layer=8 n_expert=16 n_expert_used=2"]
    rows += [",".join(str(100 if e == layer else 1) for e in range(16)) for layer in range(8)]
    (tmp_path / "hot.csv").write_text("\n".join(rows) + "\n")
    report = plan_json(capsys, "--strategy", "hot-first", "--runtime", "hostsim", "--cpu-devices", "2", "--fast",
                       "cpu:1", "--routing", str(tmp_path / "hot.csv"), "--budget", "cpu:1=6MiB",
                       "--no-calibrate")  # fmt: skip
    assert report["fast"] == "cpu:1" and report["routing"] == str(tmp_path / "hot.csv")
    assert report["device_bytes"]["cpu:1"] == 6 << 20  # eight experts of 0.75 MiB
    hot = [f"{layer}.{layer}=cpu:1" for layer in range(8)]  # each layer's hottest expert first
    assert all(rule in report["placement"] for rule in hot), report["placement"]
    (tmp_path / "small.csv").write_text(
        "# hotness table: n_layer=3 n_expert=8 n_expert_used=2\n" + "1,1,1,1,1,1,1,1\n" * 3
    )
    assert main(["plan", "--strategy", "hot-first", "--runtime", "hostsim", "--routing", str(tmp_path / "small.csv"),
                 "--no-calibrate"]) == 2  # fmt: skip
    assert "counts for 3 layers of 8 experts, the model has 8 of 16" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--strategy", "fastest"], "--strategy fastest: strategy 'fastest' is unknown: expected one of "
                                    "single-device, uniform-split, cold-layers, hot-first, critical-path"),
        (["--strategy", "hot-first", "--budget", "hostsim:0"], "--budget 'hostsim:0': expected DEVICE=SIZE, e.g."),
        (["--strategy", "hot-first", "--budget", "=4GB"], "--budget '=4GB': expected DEVICE=SIZE"),
        (["--strategy", "hot-first", "--budget", "hostsim:0=lots"], "--budget 'hostsim:0=lots': size 'lots': expected "
                                                                    "bytes or a number with a unit"),
        (["--strategy", "hot-first", "--budget", "hostsim:0=1GB", "--budget", "hostsim:0=2GB"],
         "--budget 'hostsim:0=2GB': hostsim:0 has a budget already"),
    ],
)  # fmt: skip
def test_bad_strategy_names_and_budgets_exit_2_before_any_model_loads(args, message, refused_before_loading):
    refused_before_loading(["plan", *args], message)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--budget", "cuda:0=1GB"], "--budget cuda:0=1000000000: no device cuda:0 (devices: cpu:0, hostsim:0)"),
        (["--fast", "cuda:3"], "--fast cuda:3: no device cuda:3 (devices: cpu:0, hostsim:0)"),
        (["--budget", "hostsim:0=1KB"], "Cold layers: hostsim:0's budget of 0.0010 MiB is less than one MoE "
                                        "layer's experts (12.0 MiB)"),
    ],
)  # fmt: skip
def test_budgets_and_devices_the_engine_cannot_honour_exit_2_naming_them(demo, capsys, args, message):
    assert main(["plan", "--strategy", "cold-layers", "--runtime", "hostsim", "--no-calibrate", *args]) == 2
    assert message in capsys.readouterr().err


def test_a_strategy_that_needs_two_devices_or_a_calibration_says_so(demo, capsys):
    assert main(["plan", "--strategy", "cold-layers"]) == 2
    assert "Cold layers needs a second device besides cpu:0, and the engine has only that one (add --runtime cuda, " \
           "--runtime hostsim or --cpu-devices 2)" in capsys.readouterr().err  # fmt: skip
    assert main(["plan", "--strategy", "critical-path", "--runtime", "hostsim", "--no-calibrate"]) == 2
    assert "Critical path needs the devices measured: drop --no-calibrate" in capsys.readouterr().err


def test_a_device_that_cannot_be_measured_leaves_the_plan_without_a_prediction(capsys):
    from engine.model import Engine

    def refuse(model, devices, **kwargs):
        raise ArgumentError("calibration: hostsim:0 cannot hold one MoE layer's experts to be measured")

    with Engine(runtimes=("cpu", "hostsim")) as eng:
        target = eng.load(FIXTURES / "qwen3moe-f32")
        report = plan.make_plan(target, "cold-layers", calibrate_fn=refuse)
        assert report["predicted_tokens_per_second"] is None
        assert report["prediction"].startswith("unavailable: the devices could not be measured (calibration: ")
        with pytest.raises(ArgumentError, match="cannot hold one MoE layer"):
            plan.make_plan(target, "critical-path", calibrate_fn=refuse)
        measured = plan.make_plan(target, "critical-path", calibrate_fn=lambda m, d, **k: costmodel.calibrate(
            m, d, tokens=2, repeats=1, warmup_seconds=0))  # fmt: skip
        assert measured["predicted_tokens_per_second"] > 0


def test_sizes_are_read_in_both_kinds_of_units():
    from engine.placement.placement import parse_size

    assert parse_size("40MB") == 40_000_000 and parse_size("40 MiB") == 40 << 20 and parse_size("1.5GiB") == 3 << 29
    assert parse_size("65536") == 65536 and parse_size("2kb") == 2000 and parse_size("1TiB") == 1 << 40
    for bad in ("", "lots", "-1MB", "1 MBs", "1.2.3GB", "4 G"):
        with pytest.raises(ArgumentError, match="expected bytes or a number with a unit"):
            parse_size(bad)
