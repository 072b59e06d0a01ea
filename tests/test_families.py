"""The family registry (engine/families/): every family complete and found by each of its names, the core's codes the
same as the header's, and no module outside the registry naming a family (so that a new family is its folder)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine import families
from engine.checkpoints.checkpoint import parse_config
from engine.core.errors import UnsupportedError
from engine.core.native import lib
from engine.families.base import ConfigKeys

ENGINE = Path(__file__).resolve().parent.parent / "engine"


@pytest.mark.parametrize("fam", families.FAMILIES, ids=lambda f: f.architecture)
def test_each_family_is_found_by_each_of_its_names(fam):
    assert families.family(fam.architecture) is fam
    assert families.BY_GGUF_ARCH[fam.gguf_arch] is fam
    assert fam.hf_classes and all(families.BY_HF_CLASS[c] is fam for c in fam.hf_classes)
    # the core knows it by the code its header gives this architecture
    assert fam.native_code == getattr(lib, f"EB_ARCH_{fam.architecture.upper()}")
    if fam.routed:  # a routed family binds its router under one of the Hugging Face names the families save
        assert {"mlp.gate.weight", "mlp.router.weight", "ffn.gate.weight"} & set(fam.gguf_layer_tensors.values())


def test_a_family_awaiting_its_forward_pass_is_read_but_not_run():
    """The readers find it by its names (to read its keys and refuse it); the core has no code for it, so it is in
    none of the tables of the families the engine runs. When the core gets its EB_ARCH_ code, the family moves to
    FAMILIES (DeepSeek-V4 did: none awaits now, and no family the engine runs is marked awaiting)."""
    for fam in families.AWAITING:
        assert fam.awaiting and fam.native_code == 0
        assert not hasattr(lib, f"EB_ARCH_{fam.architecture.upper()}")
        assert families.gguf_family(fam.gguf_arch) is fam
        assert fam.hf_classes and all(families.hf_family(c) is fam for c in fam.hf_classes)
        assert fam.architecture not in families.BY_ARCHITECTURE and fam.gguf_arch not in families.BY_GGUF_ARCH
        assert not set(fam.hf_classes) & set(families.BY_HF_CLASS)
        assert fam.demo is None
        with pytest.raises(UnsupportedError, match=rf"architecture '{fam.architecture}' is not one the engine runs"):
            families.family(fam.architecture)
    for f in families.FAMILIES:
        assert not f.awaiting


def test_the_names_are_unique():
    fams = families.FAMILIES + families.AWAITING
    for names in ([f.architecture for f in fams], [f.gguf_arch for f in fams], [c for f in fams for c in f.hf_classes],
                  [f.native_code for f in families.FAMILIES]):  # fmt: skip
        assert len(names) == len(set(names)), names


def test_an_unknown_architecture_is_named_with_the_known_ones():
    with pytest.raises(UnsupportedError, match=r"architecture 'llama' is not one the engine runs \(expected one of "
                                               r"qwen3_moe, qwen3, deepseek_v3, gpt_oss, deepseek_v4\)"):  # fmt: skip
        families.family("llama")
    raw = {"architectures": ["LlamaForCausalLM", "MixtralForCausalLM"]}
    expected = r"architecture LlamaForCausalLM, MixtralForCausalLM is not supported \(expected one of Qwen3Moe"
    with pytest.raises(UnsupportedError, match=expected):
        parse_config(raw, Path("config.json"))


def test_config_keys_name_the_file_the_key_and_what_was_expected():
    keys = ConfigKeys({"a": True, "b": 0, "c": "x", "d": 3}, Path("m/config.json"))
    with pytest.raises(Exception, match=r"'m/config.json': 'a' = True, expected int"):
        keys.get("a", int)
    with pytest.raises(Exception, match=r"'m/config.json': 'b' = 0, expected a positive integer below 2\*\*31"):
        keys.count("b")
    with pytest.raises(Exception, match=r"'m/config.json': 'd' = 3, expected a positive integer below 3"):
        keys.count("d", below=3)
    with pytest.raises(Exception, match=r"'m/config.json': 'missing' is missing"):
        keys.get("missing", str)
    assert keys.get("missing", str, "default") == "default"
    assert keys.get("d", float) == 3.0  # an integer passes for a float; a bool passes for neither


def test_the_dense_family_routes_no_layer_and_a_routed_one_follows_its_keys():
    def config(arch_class, **extra):
        raw = {"architectures": [arch_class], "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4,
               "vocab_size": 100, "intermediate_size": 128, "max_position_embeddings": 256, **extra}  # fmt: skip
        return parse_config(raw, Path("config.json"))

    assert config("Qwen3ForCausalLM").moe_layers == []
    moe = config("Qwen3MoeForCausalLM", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                 decoder_sparse_step=2, mlp_only_layers=[3])  # fmt: skip
    assert moe.moe_layers == [1]  # layers 1 and 3 by the step, 3 left dense by mlp_only_layers
    assert config("GptOssForCausalLM", num_local_experts=4, num_experts_per_tok=2, sliding_window=16).moe_layers == [
        0, 1, 2, 3]  # fmt: skip


ARCH_NAME = re.compile(
    r"[\"'](qwen3|qwen3_moe|qwen3moe|deepseek_v3|deepseek2|deepseek_v4|deepseek4|gpt_oss|gpt-oss)"
    r"[\"']"
)


def test_no_engine_module_outside_the_registry_names_a_family():
    """A family is its module in engine/families/ (and its demo recipe, engine/checkpoints/demo.py): a module elsewhere
    that names one (`if config.architecture == "deepseek_v3"`) is a second place the next family must find."""
    named = []
    for path in sorted(ENGINE.rglob("*.py")):
        rel = path.relative_to(ENGINE).as_posix()
        if rel.startswith("families/") or rel == "checkpoints/demo.py":
            continue
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if ARCH_NAME.search(line):
                named.append(f"engine/{rel}:{no}: {line.strip()}")
    assert not named, "\n".join(named)
