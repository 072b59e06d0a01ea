"""Exports for the engines users move to, each checked against that engine's own rules as its source states them
(sglang 0.5.23 python/sglang/srt/eplb/expert_location.py; vllm 0.33.0 vllm/config/parallel.py and
model_executor/layers/fused_moe/layer.py; lucebox server/src/common/moe_hybrid_placement.cpp and moe_hybrid_storage.cpp;
ktransformers' sglang fork python/sglang/srt/layers/moe/kt_ep_wrapper.py)."""

import json

import numpy as np
import pytest

from engine.checkpoints.checkpoint import ModelConfig
from engine.cli import main as cli_main
from engine.core.errors import ArgumentError
from engine.export import engines
from engine.placement.placement import Placement
from engine.placement.routing import RoutingStats

L, E, K = 6, 16, 4


def config(mlp_only=(1,)):
    return ModelConfig("qwen3_moe", 100, 8, 8, L, 1, 1, 8, 64, 1e4, 1e-6, False, False, num_experts=E, top_k=K,
                       moe_intermediate_size=4, mlp_only_layers=mlp_only)  # fmt: skip


def skewed_stats(cfg, seed=0):
    rng = np.random.default_rng(seed)
    hits = (rng.zipf(1.6, size=(cfg.num_layers, cfg.num_experts)) * 10).astype(np.uint64)
    for layer in cfg.mlp_only_layers:
        hits[layer] = 0
    return RoutingStats(hits, hits.sum(axis=1) // cfg.top_k, cfg.top_k)


def sglang_accepts(doc: dict, cfg, gpus: int | None, redundant: int) -> None:
    """What compute_initial_expert_location_metadata / init_by_mapping / init_by_eplb need of the JSON."""
    assert len(doc) == 1, "init_by_mapping(**data): any key besides physical_to_logical_map is a TypeError"
    if "logical_count" in doc:
        counts = np.array(doc["logical_count"])
        assert counts.shape == (cfg.num_layers, cfg.num_experts)  # [num_layers, num_logical]; 2-D is unsqueezed
        assert counts.dtype.kind in "iu" and (counts >= 0).all()
        return
    m = np.array(doc["physical_to_logical_map"])
    physical = cfg.num_experts + redundant  # num_physical = num_logical + ep_num_redundant_experts
    assert m.shape == (cfg.num_layers, physical)  # rows: decoder layers by index (Qwen3: num_hidden_layers)
    assert physical % gpus == 0  # num_local_physical_experts asserts it
    assert m.dtype.kind == "i" and m.min() >= 0 and m.max() < cfg.num_experts  # list indexes: no wrap, no overrun
    for row in m:  # nothing in SGLang checks it, but an expert without a slot is never loaded
        assert set(row.tolist()) == set(range(cfg.num_experts))


def test_sglang_logical_count_has_the_shape_sglang_reads():
    cfg = config()
    stats = skewed_stats(cfg)
    out = engines.to_sglang(Placement.single(cfg, "cpu:0"), cfg, stats)
    sglang_accepts(out.document, cfg, None, 0)
    counts = np.array(out.document["logical_count"])
    assert (counts[1] == 0).all() and (counts[0] == stats.hits[0]).all()  # the dense layer's row is zeros
    assert out.args[:2] == ["--init-expert-location", "FILE.json"]


@pytest.mark.parametrize(("gpus", "redundant"), [(1, 0), (2, 0), (4, 0), (4, 4), (8, 8), (2, 6), (16, 16)])
def test_sglang_physical_map_covers_every_expert_and_balances_the_load(gpus, redundant):
    cfg = config()
    stats = skewed_stats(cfg, seed=gpus + redundant)
    out = engines.to_sglang(Placement.single(cfg, "cpu:0"), cfg, stats, gpus, redundant)
    sglang_accepts(out.document, cfg, gpus, redundant)
    m = np.array(out.document["physical_to_logical_map"])
    per_gpu = (E + redundant) // gpus
    worst = []
    for layer in range(L):
        if layer in cfg.mlp_only_layers:
            continue
        load = stats.hits[layer].astype(float)
        replicas = np.bincount(m[layer], minlength=E)
        assert replicas.sum() == E + redundant and (replicas >= 1).all()
        if redundant:  # the replicas go to the hottest experts
            assert replicas[int(np.argmax(load))] > 1
        gpu_load = [sum(load[e] / replicas[e] for e in m[layer][g * per_gpu : (g + 1) * per_gpu]) for g in range(gpus)]
        ratio = max(gpu_load) / np.mean(gpu_load)
        assert ratio == pytest.approx(out.balance["max_over_mean_per_layer"][len(worst)])
        # no worse than SGLang's own trivial map (slot p holds expert p % E)
        trivial = [sum(load[p % E] / np.bincount(np.arange(E + redundant) % E)[p % E]
                       for p in range(g * per_gpu, (g + 1) * per_gpu)) for g in range(gpus)]  # fmt: skip
        assert ratio <= max(trivial) / np.mean(trivial) + 1e-9
        worst.append(ratio)
    assert out.balance["worst"] == pytest.approx(max(worst))


def test_sglang_and_vllm_refuse_replicas_that_do_not_divide_over_the_gpus():
    cfg = config()
    for fn in (lambda: engines.to_sglang(Placement.single(cfg, "cpu:0"), cfg, None, 3, 0),
               lambda: engines.to_vllm(Placement.single(cfg, "cpu:0"), cfg, 3, 1)):  # fmt: skip
        with pytest.raises(ArgumentError, match=r"divide evenly over --gpus 3"):
            fn()
    with pytest.raises(ArgumentError, match="--redundant -1"):
        engines.to_sglang(Placement.single(cfg, "cpu:0"), cfg, None, 4, -1)


def test_vllm_gets_its_eplb_settings_and_is_told_what_it_cannot_take():
    cfg = config()
    out = engines.to_vllm(Placement.parse("*=cpu:0; 0=cuda:0", cfg), cfg, 4, 4)
    assert out.args[:2] == ["--enable-expert-parallel", "--enable-eplb"]
    eplb = json.loads(out.args[out.args.index("--eplb-config") + 1])
    assert eplb == {"num_redundant_experts": 4}  # EPLBConfig field; >= 0, (E + R) % ep_size == 0
    assert out.not_expressible and "initial placement" in out.not_expressible[0]


def test_lucebox_placement_json_has_the_keys_and_shapes_it_checks():
    cfg = config()
    stats = skewed_stats(cfg)
    placement = Placement.parse("*=cpu:0; 0.0-5=cuda:0; 2=cuda:0; 3.8=cuda:1", cfg)
    doc = engines.to_lucebox(placement, cfg, stats).document
    assert set(doc) == {"arch", "version", "n_layer", "n_expert", "n_expert_used", "total_hot", "hot_counts",
                        "hot_expert_ids"}  # fmt: skip
    assert (doc["n_layer"], doc["n_expert"], doc["n_expert_used"], doc["version"]) == (L, E, K, 1)
    assert len(doc["hot_counts"]) == len(doc["hot_expert_ids"]) == L  # load_json: "invalid placement dimensions"
    assert doc["hot_counts"] == [len(h) for h in doc["hot_expert_ids"]] and doc["total_hot"] == sum(doc["hot_counts"])
    assert all(0 <= e < E for h in doc["hot_expert_ids"] for e in h)  # "hot expert id out of range"
    assert sorted(doc["hot_expert_ids"][0]) == list(range(6)) and len(doc["hot_expert_ids"][2]) == E
    assert doc["hot_expert_ids"][3] == [8] and doc["hot_expert_ids"][1] == []  # cuda:1 counts; the dense layer empty
    h = doc["hot_expert_ids"][0]  # ranked by hits, ties to the lower id
    assert [(-int(stats.hits[0][e]), e) for e in h] == sorted((-int(stats.hits[0][e]), e) for e in h)


@pytest.mark.parametrize(
    ("text", "n", "strategy"),
    [("*=cpu:0; *.0-3=cuda:0", 4, "uniform"), ("*=cpu:0", 0, "uniform"), ("*=cpu:0; *.2-5=cuda:0", 4, "frequency"),
     ("*=cpu:0; 0.0-3=cuda:0", 1, "frequency")],
)  # fmt: skip
def test_ktransformers_gpu_experts(text, n, strategy):
    cfg = config()
    out = engines.to_ktransformers(Placement.parse(text, cfg), cfg)
    assert out.args[:4] == ["--kt-num-gpu-experts", str(n), "--kt-expert-placement-strategy", strategy]
    assert bool(out.not_expressible) == (strategy == "frequency")


def test_export_command_writes_the_sglang_file_and_says_what_to_launch(tmp_path, capsys, xdg_cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    from pathlib import Path

    profile = Path(__file__).resolve().parent.parent / "profiles" / "split.yaml"
    out = tmp_path / "init.json"
    assert cli_main(["export", str(profile), "--format", "sglang", "--gpus", "4", "--redundant", "4", "-o",
                     str(out)]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "--ep-size 4 --ep-num-redundant-experts 4" in err and "predicted GPU load" in err
    doc = json.loads(out.read_text())
    assert list(doc) == ["physical_to_logical_map"]
    assert cli_main(["export", str(profile), "--format", "sglang", "--gpus", "3"]) == 2
    assert "divide evenly" in capsys.readouterr().err


def _profile_copy(tmp_path):
    import shutil
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent / "profiles" / "split.yaml"
    dst = tmp_path / "split.yaml"
    shutil.copy(src, dst)
    return dst


@pytest.mark.parametrize("fmt", ["sglang", "lucebox"])
def test_import_routing_round_trips_what_the_export_wrote(tmp_path, capsys, xdg_cache, monkeypatch, fmt):
    """export (the sglang logical_count / the lucebox hotness CSV) then import-routing into another profile: the
    same statistics come back."""
    from engine.profiles.profile import load

    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    profile = _profile_copy(tmp_path)
    before = load(profile).routing_stats()
    exported = tmp_path / ("counts.json" if fmt == "sglang" else "hot.csv")
    args = ["--format", "sglang"] if fmt == "sglang" else ["--format", "hotness-csv"]
    assert cli_main(["export", str(profile), *args, "-o", str(exported)]) == 0
    other = tmp_path / "other.yaml"
    text = profile.read_text().split("\nrouting:", 1)[0] + "\n"
    other.write_text(text)
    assert load(other).routing_stats() is None
    assert cli_main(["import-routing", str(exported), "--format", fmt, "--into", str(other)]) == 0
    after = load(other).routing_stats()
    assert np.array_equal(after.hits, before.hits) and after.top_k == before.top_k
    if fmt == "lucebox":
        assert np.array_equal(after.tokens, before.tokens)


@pytest.mark.parametrize(
    ("content", "message"),
    [('{"logical_count": [[1, 2], [3, 4]]}', "2 layers x 2 experts, but the model has"),
     ('{"nothing": 1}', "no 'logical_count' key"), ('{"logical_count": [[1, -2]]}', "non-negative whole counts"),
     ('{"logical_count": [[1], [2, 3]]}', "not a rectangular array"), ("[[[[", "not SGLang's logical_count JSON"),
     # counts that do not survive a save and load, or that silently became 0: refused, named by index
     ('{"logical_count": [[1, 9223372036854775808]]}', "'logical_count'[0][1] = 9223372036854775808: expected"),
     ('{"logical_count": [[18446744073709551616, 1]]}', "'logical_count'[0][0] = 18446744073709551616"),
     ('{"logical_count": [[1e30, 1]]}', "'logical_count'[0][0] = 1e+30"),
     ('{"logical_count": [[true, 1]]}', "'logical_count'[0][0] = True"),
     ('{"logical_count": [["5", 1]]}', "'logical_count'[0][0] = '5'"),
     ('{"logical_count": [[9007199254740991, 9007199254740991]]}', "sum past 9007199254740991"),
     ('{"logical_count": [[[9007199254740991]], [[1]]]}', "sum past 9007199254740991")],
)  # fmt: skip
def test_import_routing_refuses_what_does_not_fit_the_model(tmp_path, capsys, xdg_cache, monkeypatch, content,
                                                            message):  # fmt: skip
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    profile = _profile_copy(tmp_path)
    before = profile.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert cli_main(["import-routing", str(bad), "--format", "sglang", "--into", str(profile)]) == 2
    assert message in capsys.readouterr().err
    assert profile.read_text() == before  # the profile is not touched


def test_a_hotness_csv_as_lucebox_writes_it_is_read(tmp_path):
    csv = tmp_path / "hot.csv"  # MoeHybridRoutingStats::save_csv: the header, a format comment, a row per layer
    csv.write_text("# hotness table: n_layer=2 n_expert=3 n_expert_used=2\n"
                   "# format: one row per layer, columns are expert activation counts (expert 0..N-1)\n"
                   "5,0,7\n1 2\t3\n")  # fmt: skip
    stats = RoutingStats.read_hotness_csv(csv)
    assert stats.hits.tolist() == [[5, 0, 7], [1, 2, 3]] and stats.top_k == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [("# hotness table: n_layer=1000000000000 n_expert=1 n_expert_used=1\n1\n", "n_layer=1000000000000: expected"),
     ("# hotness table: n_layer=1 n_expert=1000000000000 n_expert_used=1\n1\n", "n_expert=1000000000000: expected"),
     ("# hotness table: n_layer=1 n_expert=2 n_expert_used=1\n1,\u00b2\n", "count '\u00b2' is not a non-negative"),
     ("# hotness table: n_layer=1 n_expert=2 n_expert_used=1\n1,\u0661\n", "count '\u0661' is not"),
     ("# hotness table: n_layer=1 n_expert=2 n_expert_used=1\n1,9223372036854775808\n", "count '9223372036854775808'"),
     ("# hotness table: n_layer=1 n_expert=2 n_expert_used=1\n9007199254740991,1\n", "sum past 9007199254740991")],
)  # fmt: skip
def test_import_routing_refuses_a_hotness_table_of_counts_a_profile_cannot_hold(
    tmp_path, capsys, xdg_cache, monkeypatch, content, message
):
    """Counts below 2^53 (said in the error), ASCII digits only, the declared size checked before allocating;
    exit 2 with one line and the profile not touched."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    profile = _profile_copy(tmp_path)
    before = profile.read_text()
    bad = tmp_path / "bad.csv"
    bad.write_text(content, encoding="utf-8")
    assert cli_main(["import-routing", str(bad), "--format", "lucebox", "--into", str(profile)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert profile.read_text() == before


def test_a_profile_with_counts_past_2_53_is_refused_by_name(tmp_path, xdg_cache, monkeypatch):
    from engine.profiles.profile import ProfileError, load

    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    profile = _profile_copy(tmp_path)
    text = profile.read_text().split("\nrouting:", 1)[0]
    profile.write_text(text + "\nrouting:\n  top_k: 1\n  tokens: [9007199254740993]\n  hits: [[1]]\n")
    with pytest.raises(ProfileError, match=r"routing.tokens: expected an integer 0..9007199254740991"):
        load(profile)
