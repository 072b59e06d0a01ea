"""Routing statistics: counted by the core, written and read as a hotness table."""

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.core.errors import ArgumentError, CheckpointError
from engine.model import Engine
from engine.placement.routing import RoutingStats, profile


@pytest.fixture
def model():
    with Engine() as eng:
        yield eng.load(FIXTURES / "qwen3moe-f32")


def test_every_routed_token_counts_top_k_picks(model):
    stats = profile(model, [[1, 2, 3, 4], [5, 6]], tokens_per_prompt=5)
    cfg = model.config
    # prefill positions plus the decoded ones (the last generated token is not fed back)
    expected_tokens = (4 + 4) + (2 + 4)
    for layer in range(cfg.num_layers):
        if cfg.is_moe_layer(layer):
            assert stats.tokens[layer] == expected_tokens
            assert stats.hits[layer].sum() == expected_tokens * cfg.top_k
        else:
            assert stats.tokens[layer] == 0 and stats.hits[layer].sum() == 0
    assert np.allclose(stats.share()[0].sum(), cfg.top_k)
    assert not stats.share()[1].any()  # the dense layer routed nothing: no division by zero, all zeros


def test_counts_do_not_depend_on_the_placement():
    with Engine(cpu_devices=2, cpu_threads=1) as eng:
        model = eng.load(FIXTURES / "qwen3moe-f32")
        a = profile(model, [[1, 2, 3, 4]], 6)
        model.set_placement("0=cpu:1; 2.3-7=cpu:1")
        b = profile(model, [[1, 2, 3, 4]], 6)
    np.testing.assert_array_equal(a.hits, b.hits)


def test_hotness_csv_round_trip(model, tmp_path):
    stats = profile(model, [[7, 8, 9]], 4)
    path = tmp_path / "hot.csv"
    stats.write_hotness_csv(path)
    assert path.read_text().splitlines()[0] == "# hotness table: n_layer=3 n_expert=8 n_expert_used=2"
    back = RoutingStats.read_hotness_csv(path)
    np.testing.assert_array_equal(back.hits, stats.hits)
    np.testing.assert_array_equal(back.tokens, stats.tokens)
    assert back.top_k == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file"),
        ("1,2\n", r":1: expected '# hotness table"),
        ("# hotness table: n_layer=2 n_expert=2 n_expert_used=1\n1,2\n", "1 rows of counts, expected n_layer=2"),
        ("# hotness table: n_layer=1 n_expert=2 n_expert_used=1\n1,2,3\n", ":2: 3 counts, expected n_expert=2"),
        ("# hotness table: n_layer=1 n_expert=2 n_expert_used=1\n1,x\n", ":2: count 'x' is not"),
    ],
)
def test_bad_hotness_csv(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(CheckpointError, match=message):
        RoutingStats.read_hotness_csv(path)


def test_hits_land_on_the_right_experts():
    """Cross-check against the scheduler: with one expert alone on cpu:1, the rows cpu:1 computed are exactly
    the hits counted for that expert."""
    with Engine(cpu_devices=2, cpu_threads=1) as eng:
        model = eng.load(FIXTURES / "qwen3moe-f32")
        first = profile(model, [[11, 12, 13, 14, 15]], tokens_per_prompt=12)
        for layer in (0, 2):
            # the busiest expert and a quiet one that still served some tokens
            served = [e for e in range(8) if first.hits[layer][e] > 0]
            for expert in (
                max(served, key=lambda e: first.hits[layer][e]),
                min(served, key=lambda e: first.hits[layer][e]),
            ):
                model.set_placement(f"*=cpu:0; {layer}.{expert}=cpu:1")
                model.reset_counters()
                stats = profile(model, [[11, 12, 13, 14, 15]], tokens_per_prompt=12)
                rows = model.counters()["devices"]["cpu:1"]["rows"]
                assert rows == stats.hits[layer][expert] > 0
                assert stats.hits[layer].sum() == stats.tokens[layer] * model.config.top_k


def test_statistics_from_hits_their_heat_and_the_tokens_counted():
    stats = RoutingStats.from_hits([[4, 2, 0, 2], [0, 0, 0, 0], [1, 1, 1, 3]], top_k=2)
    assert stats.tokens.tolist() == [4, 0, 3] and stats.top_k == 2 and stats.tokens_counted == 4
    np.testing.assert_array_equal(stats.heat(), [[1, 0.5, 0, 0.5], [0, 0, 0, 0], [1 / 3, 1 / 3, 1 / 3, 1]])
    for bad in ([1, 2], [[1.5, 2]], [[-1, 2]], [[np.nan, 1]]):
        with pytest.raises(ArgumentError, match="expected \\[layers, experts\\] of whole non-negative numbers"):
            RoutingStats.from_hits(bad, 2)
