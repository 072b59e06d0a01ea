"""Runtime extensions: the operations only some families need (DeepSeek-V3's MLA attention, DeepSeek-V4's mHC,
compressors, indexer, grouped projection and routing) are named, versioned
tables a module lists, not members of the table every module fills. A primary whose module lacks one, or has it at
another version, is refused at load naming the runtime, the extension and the family; the other families load on
it as before; `Engine.runtimes` says what each module has."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixture_paths import FIXTURES
from runtime_wrappers import wrapped_module

from engine.core.errors import UnsupportedError
from engine.model import Engine


def hostsim_with(tmp_path: Path, extensions: str) -> str:
    """The bundled hostsim module's table as it is, with its extension list replaced: the same devices and kernels."""
    declarations = "static const eb_rt_extension extensions[] = {" + extensions + "{{NULL, 0}, NULL}};"
    return wrapped_module(tmp_path, declarations, "table.extensions = extensions;")


def test_the_bundled_modules_list_their_extensions():
    with Engine(runtimes=("cpu", "hostsim")) as eng:
        both = ("mla/1", "deepseek_v4/1")
        assert {r.name: r.extensions for r in eng.runtimes} == {"cpu": both, "hostsim": both}


@pytest.mark.parametrize(
    "extensions, listed",
    [("", ()), ('{{"mla", 2}, (const void *)1},', ("mla/2",)), ('{{"other", 1}, (const void *)1},', ("other/1",))],
    ids=["none", "mla-version-2", "another"],
)
def test_a_primary_without_the_familys_extension_is_refused_naming_both(tmp_path, extensions, listed):
    with Engine(runtimes=("cpu", "hostsim"), module_paths={"hostsim": hostsim_with(tmp_path, extensions)}) as eng:
        assert {r.name: r.extensions for r in eng.runtimes}["hostsim"] == listed
        with pytest.raises(UnsupportedError) as exc:
            eng.load(FIXTURES / "deepseek-f32", device="hostsim:0")
        message = str(exc.value)
        assert "primary device hostsim:0" in message and "'hostsim' runtime" in message
        assert "the extension 'mla' version 1" in message and "DeepSeek-V3" in message
        assert "choose a CPU device as the primary" in message
        # the family that needs nothing beyond the common operations loads and runs on the same primary
        on_cpu = eng.load(FIXTURES / "qwen3moe-f32", device="cpu:0")
        model = eng.load(FIXTURES / "qwen3moe-f32", device="hostsim:0")
        assert greedy(model) == greedy(on_cpu)
        # and the DeepSeek model on a primary whose module has it, with its experts on the one that lacks it: the
        # experts need only the common contract, and the ids are those of every expert on the primary
        ds = eng.load(FIXTURES / "deepseek-f32", device="cpu:0")
        alone = greedy(ds)
        ds.set_placement("*=hostsim:0")
        assert greedy(ds) == alone
        assert ds.counters()["devices"]["hostsim:0"]["experts_run"] > 0


def greedy(model) -> list[int]:
    with model.context(32) as ctx:
        return ctx.greedy(1, 12)


@pytest.mark.parametrize(
    "extensions, listed",
    [('{{"mla", 1}, (const void *)1},', ("mla/1",)), ('{{"deepseek_v4", 2}, (const void *)1},', ("deepseek_v4/2",))],
    ids=["mla only", "deepseek_v4-version-2"],
)
def test_a_v4_model_on_a_primary_without_its_extension_is_refused_naming_both(tmp_path, extensions, listed):
    """A module without the "deepseek_v4" extension (as the cuda and hip modules are) cannot be a V4 model's primary;
    its devices still run the model's experts, which need only the common contract."""
    with Engine(runtimes=("cpu", "hostsim"), module_paths={"hostsim": hostsim_with(tmp_path, extensions)}) as eng:
        assert {r.name: r.extensions for r in eng.runtimes}["hostsim"] == listed
        with pytest.raises(UnsupportedError) as exc:
            eng.load(FIXTURES / "deepseek-v4-f32", device="hostsim:0")
        message = str(exc.value)
        assert (
            "primary device hostsim:0: the 'hostsim' runtime lacks the extension 'deepseek_v4' version 1 that "
            "DeepSeek-V4's forward pass needs; choose a CPU device as the primary"
        ) in message
        v4 = eng.load(FIXTURES / "deepseek-v4-f32", device="cpu:0")
        alone = greedy(v4)
        v4.set_placement("*=hostsim:0")
        assert greedy(v4) == alone
        assert v4.counters()["devices"]["hostsim:0"]["experts_run"] > 0
