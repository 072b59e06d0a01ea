"""engine.devices: one way to open an engine from device settings, a profile's `devices:` section included."""

import pytest
from fixture_paths import FIXTURES

from engine.devices import DeviceSettings
from engine.placement.placement import format_bytes
from engine.profiles import profile as P
from engine.profiles.devices import differences, engine_for_profile
from engine.profiles.profile import ProfileError

PROFILE = f"""expertbench_profile: 1
model:
  path: {FIXTURES / "qwen3moe-f32"}
devices:
  cpu: 2
  hostsim:
    devices: 2
    memory_limit: 40000000
placement:
  layers:
    0: cpu:1
    2: hostsim:1
"""


def test_a_profiles_devices_open_as_it_says(tmp_path):
    (tmp_path / "p.yaml").write_text(PROFILE)
    profile = P.load(tmp_path / "p.yaml")
    settings = DeviceSettings.from_profile(profile)
    assert settings.required == ("cpu", "hostsim")
    assert settings.options["hostsim"] == {"n_devices": 2, "threads_per_device": 1, "memory_limit": 40_000_000}
    with engine_for_profile(profile) as engine:
        devices = {d.name: d for d in engine.devices}
        assert sorted(devices) == ["cpu:0", "cpu:1", "hostsim:0", "hostsim:1"]
        assert devices["hostsim:1"].memory_total == 40_000_000
        assert differences(profile, engine.devices) == []
    with DeviceSettings(runtimes=("cpu", "hostsim"), required=("cpu",)).open() as plain:
        assert differences(profile, plain.devices) == [
            "devices.cpu: cpu:1 not open",
            "devices.hostsim: hostsim:1 not open",
        ]
    one = P.load(tmp_path / "p.yaml")
    one.devices = {"cpu": P.DeviceSpec(1), "hostsim": P.DeviceSpec(1, threads=3, memory_limit=40_000_000)}
    with DeviceSettings(runtimes=("cpu", "hostsim"), required=("cpu",)).open() as plain:
        total = {d.name: d.memory_total for d in plain.devices}["hostsim:0"]
        assert differences(one, plain.devices) == [
            f"devices.hostsim.memory_limit: hostsim:0 has {format_bytes(total)}, not the 38.1 MiB (40000000 bytes) "
            "the profile caps it at",
            "devices.hostsim.threads: hostsim:0 has 1 thread, not 3",
        ]


def test_an_entry_this_machine_cannot_provide_is_named_at_its_line_with_a_hint(tmp_path):
    text = PROFILE.replace("  cpu: 2\n", "  cpu: 2\n  cuda: 64\n")  # no machine here has 64 GPUs (most have none)
    (tmp_path / "p.yaml").write_text(text)
    with pytest.raises(ProfileError) as refused:
        engine_for_profile(P.load(tmp_path / "p.yaml"))
    assert str(refused.value).startswith(f"{tmp_path / 'p.yaml'}:6: devices.cuda: this machine ")
    assert "hint: remove the 'cuda' entry and move its experts to another device" in str(refused.value)
    many = PROFILE.replace("    devices: 2\n", "    devices: 60\n")  # 60 simulated devices are fine
    (tmp_path / "many.yaml").write_text(many)
    with engine_for_profile(P.load(tmp_path / "many.yaml")) as engine:
        assert len(engine.devices) == 2 + 60


def test_the_windows_default_adds_a_simulated_accelerator_when_there_is_none():
    settings = DeviceSettings.window()
    assert settings.required == () and settings.simulate_accelerator
    with settings.open() as engine:
        kinds = {d.kind for d in engine.devices}
        assert "cpu" in kinds and len(kinds) > 1  # a GPU where one loads, else hostsim
    with DeviceSettings.window(runtimes=("cpu",)).open() as engine:
        assert [d.kind for d in engine.devices] == ["cpu"] * len(engine.devices)
