"""llama.cpp export: -ot values that llama.cpp parses, regexes that pick exactly the right GGUF tensors."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.checkpoints.checkpoint import Checkpoint
from engine.cli import main as cli_main
from engine.core.errors import ArgumentError
from engine.export import llama_cpp
from engine.placement.placement import Placement
from engine.placement.routing import RoutingStats

EXAMPLES = Path(__file__).resolve().parent.parent / "profiles"


def gguf_tensor_names(n_layers: int) -> list[str]:
    """The tensor names of a Qwen3-MoE GGUF (llama.cpp's LLM_ARCH_QWEN3MOE), and fused/bias variants."""
    names = ["token_embd.weight", "output_norm.weight", "output.weight"]
    for n in range(n_layers):
        names += [f"blk.{n}.{t}.weight" for t in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                                   "attn_q_norm", "attn_k_norm", "ffn_norm", "ffn_gate_inp",
                                                   "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")]  # fmt: skip
    return names


def resolve(ot: str, names: list[str]) -> dict[str, str]:
    """What llama.cpp does with an -ot value: split at commas, then at the first '='; for each tensor, the first
    pattern std::regex_search finds in its name wins (ECMAScript; Python's re agrees on these patterns)."""
    overrides = []
    for item in ot.split(","):
        pattern, sep, buffer = item.partition("=")
        assert sep and pattern and re.fullmatch(r"CPU|CUDA\d+|ROCm\d+", buffer), item
        overrides.append((re.compile(pattern), buffer))
    out = {}
    for name in names:
        for pattern, buffer in overrides:
            if pattern.search(name):
                out[name] = buffer
                break
    return out


def uniform_config(n_layers=24):
    from engine.checkpoints.checkpoint import ModelConfig

    return ModelConfig("qwen3_moe", 100, 8, 8, n_layers, 1, 1, 8, 64, 1e4, 1e-6, False, False, num_experts=8, top_k=2,
                       moe_intermediate_size=4)  # fmt: skip


def test_buffer_names():
    assert llama_cpp.llama_cpp_buffer("cpu:0") == "CPU" and llama_cpp.llama_cpp_buffer("cpu:3") == "CPU"
    assert llama_cpp.llama_cpp_buffer("hostsim:0") == "CPU"
    assert llama_cpp.llama_cpp_buffer("cuda:0") == "CUDA0" and llama_cpp.llama_cpp_buffer("cuda:12") == "CUDA12"
    assert llama_cpp.llama_cpp_buffer("hip:1") == "ROCm1"
    with pytest.raises(ArgumentError, match="no llama.cpp buffer type"):
        llama_cpp.llama_cpp_buffer("tpu:0")


def test_whole_layer_placement_round_trips_through_llama_cpp_matching():
    config = uniform_config(24)
    placement = Placement.parse("0-9=cuda:0; 10-11=cuda:1; 20-23=cuda:0; 1=cpu:0", config)
    out = llama_cpp.to_llama_cpp(placement, "cpu:0")
    assert out.exact and out.args[:2] == ["-ngl", "0"] and out.args[2] == "-ot"
    names = gguf_tensor_names(24)
    got = resolve(out.override_tensor, names)
    for n in range(24):
        want = {**{k: "CUDA0" for k in list(range(0, 10)) + list(range(20, 24))}, 1: "CPU",
                10: "CUDA1", 11: "CUDA1"}.get(n, "CPU")  # fmt: skip
        for proj in ("gate", "up", "down"):
            assert got.get(f"blk.{n}.ffn_{proj}_exps.weight", "CPU") == want, (n, proj)
    # nothing but expert tensors is matched: not the router, not attention, not the embeddings
    assert all("_exps" in name for name in got)
    assert not any(p.search("blk.1.ffn_gate_inp.weight") for p, _ in
                   ((re.compile(a), b) for a, b in llama_cpp.parse_override_tensor(out.override_tensor)))  # fmt: skip


def test_layer_regex_does_not_match_other_layers_with_the_same_digits():
    pattern = re.compile(llama_cpp.layer_pattern([1, 2]))
    assert pattern.search("blk.1.ffn_up_exps.weight") and pattern.search("blk.2.ffn_down_exps.weight")
    for name in ("blk.11.ffn_up_exps.weight", "blk.21.ffn_up_exps.weight", "blk.12.ffn_gate_exps.weight",
                 "blk.1.ffn_up.weight", "blk.1.ffn_gate_inp.weight", "blk.1.ffn_up_shexp.weight"):  # fmt: skip
        assert not pattern.search(name), name
    assert pattern.search("blk.1.ffn_gate_up_exps.weight")  # fused gate+up (gpt-oss style) too
    assert pattern.search("blk.2.ffn_down_exps.bias")


def test_gpu_primary_and_hip_names():
    config = uniform_config(4)
    out = llama_cpp.to_llama_cpp(Placement.parse("*=cuda:0; 0-1=hip:1", config), "cuda:0")
    assert out.args[:6] == ["-ngl", "999", "--split-mode", "none", "--main-gpu", "0"]
    assert out.override_tensor == r"blk\.(0|1)\.ffn_(up|down|gate|gate_up)_(ch|)exps=ROCm1"


def ncmoe_overrides(n: int) -> str:
    r"""The -ot value llama.cpp builds for --n-cpu-moe N (llm_add_n_cpu_ffn_overrides, common/common.h): one
    override per layer 0..N-1, blk\.I + LLM_FFN_EXPS_REGEX, to the CPU."""
    return ",".join(rf"blk\.{i}{llama_cpp.EXPS_SUFFIX}=CPU" for i in range(n))


@pytest.mark.parametrize(("text", "n"), [("*=cuda:0; 0-7=cpu:0", 8), ("*=cpu:0", 16), ("*=cuda:0; 0=cpu:1", 1)])
def test_the_first_n_expert_layers_on_the_cpu_export_as_n_cpu_moe(text, n):
    config = uniform_config(16)
    out = llama_cpp.to_llama_cpp(Placement.parse(text, config), "cuda:0")
    assert out.exact and out.n_cpu_moe == n and out.args[-2:] == ["--n-cpu-moe", str(n)] and "-ot" not in out.args
    names = gguf_tensor_names(16)  # the same tensors land where llama.cpp's own --n-cpu-moe sends them
    assert resolve(out.override_tensor, names) == resolve(ncmoe_overrides(n), names)


@pytest.mark.parametrize("text", ["*=cuda:0; 1-7=cpu:0", "*=cuda:0; 0-3=cpu:0; 5=cpu:0", "*=cuda:0; 0-3=cuda:1",
                                  "*=cuda:0; 0-3=cpu:0; 8-9=cuda:1"])  # fmt: skip
def test_other_placements_keep_their_override_tensor(text):
    out = llama_cpp.to_llama_cpp(Placement.parse(text, uniform_config(16)), "cuda:0")
    assert out.n_cpu_moe is None and "--n-cpu-moe" not in out.args and "-ot" in out.args


def test_n_cpu_moe_counts_dense_layers_by_index():
    config = Checkpoint.open(FIXTURES / "qwen3moe-f32").config  # layer 1 is dense (mlp_only_layers)
    out = llama_cpp.to_llama_cpp(Placement.parse("*=cuda:0; 0=cpu:0; 2=cpu:0", config), "cuda:0")
    assert out.n_cpu_moe == 3  # layers 0..2 by index; layer 1 has no expert tensors to move
    out = llama_cpp.to_llama_cpp(Placement.parse("*=cuda:0; 2=cpu:0", config), "cuda:0")
    assert out.n_cpu_moe is None


def test_per_expert_exceptions_are_reported_not_silently_dropped():
    config = Checkpoint.open(FIXTURES / "qwen3moe-f32").config
    placement = Placement.parse("2=cuda:0; 2.6-7=cpu:1; 2.3=hip:0", config)
    out = llama_cpp.to_llama_cpp(placement, "cpu:0")
    assert not out.exact
    (line,) = out.not_expressible
    assert line.startswith("layer 2: experts 3 on hip:0, 6-7 on cpu:1:") and "CUDA0 (cuda:0)" in line
    assert resolve(out.override_tensor, gguf_tensor_names(3))["blk.2.ffn_up_exps.weight"] == "CUDA0"
    assert out.layer_buffers == {0: "CPU", 2: "CUDA0"}


def test_cpu_devices_collapse_to_one_cpu_buffer():
    config = uniform_config(4)
    out = llama_cpp.to_llama_cpp(Placement.parse("0-1=cpu:1", config), "cpu:0")
    assert out.exact and out.args == ["-ngl", "0"] and out.override_tensor == ""
    assert out.notes == ["cpu:0, cpu:1 are all the CPU in llama.cpp (one CPU buffer type; NUMA is --numa)"]


def test_export_command_llama_cpp(capsys, tmp_path, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))
    assert cli_main(["export", str(EXAMPLES / "split.yaml"), "--format", "llama.cpp"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "-ngl 0\n"  # cpu:0 and cpu:1 are one CPU for llama.cpp: nothing to override
    assert "cpu:0, cpu:1 are all the CPU" in captured.err
    gpu = tmp_path / "gpu.yaml"
    model = FIXTURES / "qwen3moe-f32"
    gpu.write_text(f"expertbench_profile: 1\nmodel: {{path: {model}}}\ndevices: {{cpu: 1, cuda: 1}}\n"
                   "placement:\n  layers: {2: cuda:0}\n  experts: {2: {6-7: cpu:0}}\n")  # fmt: skip
    assert cli_main(["export", str(gpu), "--format", "llama.cpp"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "-ngl 0 -ot 'blk\\.(2)\\.ffn_(up|down|gate|gate_up)_(ch|)exps=CUDA0'\n"
    assert "not expressible in llama.cpp: layer 2: experts 6-7 on cpu:0" in captured.err
    assert cli_main(["export", str(gpu), "--format", "llama.cpp", "--json", "-o", str(tmp_path / "o.json")]) == 0
    data = json.loads((tmp_path / "o.json").read_text())
    assert data["exact"] is False and data["layer_buffers"] == {"0": "CPU", "2": "CUDA0"}
    assert data["args"][-1] == data["override_tensor"]


def test_export_command_hotness_csv(tmp_path, capsys):
    assert (
        cli_main(["export", str(EXAMPLES / "split.yaml"), "--format", "hotness-csv", "-o", str(tmp_path / "h.csv")])
        == 0
    )
    stats = RoutingStats.read_hotness_csv(tmp_path / "h.csv")
    assert stats.hits.shape == (8, 16) and stats.top_k == 4
    assert cli_main(["export", str(EXAMPLES / "split.yaml"), "--format", "hotness-csv"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "# hotness table: n_layer=8 n_expert=16 n_expert_used=4"
    assert np.array_equal(np.array([[int(v) for v in ln.split(",")] for ln in out.splitlines()[1:]]), stats.hits)


def test_export_bad_input_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("expertbench_profile: 1\nmodel: {demo: default}\n")
    assert cli_main(["export", str(bad), "--format", "hotness-csv"]) == 2
    assert "has no routing statistics" in capsys.readouterr().err
    assert cli_main(["export", str(tmp_path / "missing.yaml"), "--format", "llama.cpp"]) == 2
