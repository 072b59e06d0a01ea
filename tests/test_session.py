"""Opening a model pair once for every front end (engine/session.py): the draft's checks and placement, the experts
per token, and nothing left loaded when the pair is refused."""

from __future__ import annotations

import json
import shutil

import pytest
from fixture_paths import FIXTURES

from engine.core.errors import ArgumentError, EngineError
from engine.core.model import Engine
from engine.session import open_pair

TARGET, DRAFT = FIXTURES / "qwen3moe-f32", FIXTURES / "qwen3-f32"


def test_a_pair_opens_with_the_draft_on_its_own_device():
    with Engine(runtime_options={"cpu": {"n_devices": 2}}) as eng:
        pair = open_pair(eng, TARGET, DRAFT, device="cpu:0", draft_device="cpu:1")
        assert (pair.target.device, pair.draft.device) == ("cpu:0", "cpu:1")
        assert pair.run_top_k is None
        pair.close()
        assert eng._models == []


def test_a_routed_draft_runs_its_experts_on_its_device():
    with Engine(runtime_options={"cpu": {"n_devices": 2}}) as eng:
        pair = open_pair(eng, TARGET, TARGET, device="cpu:0", draft_device="cpu:1")
        owners = pair.draft.placement.owners
        assert {d for layer in pair.draft.config.moe_layers for d in owners[layer]} == {"cpu:1"}


def test_experts_per_token_above_the_checkpoints_are_the_loads():
    with Engine() as eng:
        native = open_pair(eng, TARGET).target.config.top_k
        fewer = open_pair(eng, TARGET, top_k=native - 1)
        assert (fewer.target.config.top_k, fewer.run_top_k) == (native, native - 1)  # the run's contexts ask
        more = open_pair(eng, TARGET, top_k=native + 1)
        assert (more.target.config.top_k, more.run_top_k) == (native + 1, None)  # loaded with them


def test_a_dense_target_is_refused_where_experts_are_needed_and_nothing_stays_loaded():
    with Engine() as eng:
        with pytest.raises(EngineError, match=r"qwen3-f32' is a dense model: it has no experts to place"):
            open_pair(eng, DRAFT, DRAFT, experts_needed=True)
        assert eng._models == []
        assert open_pair(eng, DRAFT).target.config.num_experts == 0  # the CLI runs dense models


def test_a_draft_of_another_vocabulary_is_refused_and_nothing_stays_loaded(tmp_path):
    other = tmp_path / "qwen3-swapped-tokens"
    shutil.copytree(DRAFT, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["\u0120the"], vocab["The"] = vocab["The"], vocab["\u0120the"]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    with Engine() as eng:
        with pytest.raises(ArgumentError, match=r"different tokenizers \(2 of 512 tokens differ"):
            open_pair(eng, TARGET, other)
        assert eng._models == []


def test_a_missing_draft_is_named_and_the_target_closed(tmp_path):
    with Engine() as eng:
        with pytest.raises(EngineError, match=f"model folder or GGUF file '{tmp_path / 'nope'}' does not exist"):
            open_pair(eng, TARGET, tmp_path / "nope")
        assert eng._models == []
