"""Runtime modules, devices, handle lifetimes."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.core.errors import ArgumentError, StateError
from engine.core.native import RUNTIME_ABI_VERSION, core_location
from engine.model import Engine


def test_cpu_module_found_next_to_the_core():
    with Engine() as eng:
        (rt,) = eng.runtimes
        assert rt.name == "cpu"
        assert Path(rt.path).parent == Path(core_location())
        assert rt.abi_version == RUNTIME_ABI_VERSION
        assert [d.name for d in eng.devices] == ["cpu:0"]
        assert eng.devices[0].memory_total > 0


def test_module_never_taken_from_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "expertbench_rt_cpu.so").write_bytes(b"not a library")
    monkeypatch.chdir(tmp_path)
    with Engine() as eng:
        assert Path(eng.runtimes[0].path).parent == Path(core_location())


def test_explicit_module_path_is_used(tmp_path):
    copy = tmp_path / "my_cpu_module.so"
    shutil.copy(Path(core_location()) / "expertbench_rt_cpu.so", copy)
    with Engine(module_paths={"cpu": str(copy)}) as eng:
        assert eng.runtimes[0].path == str(copy)


def test_failed_runtime_is_reported_not_fatal_when_not_strict():
    with Engine(runtimes=("cpu", "nosuchruntime"), strict=False) as eng:
        assert [r.name for r in eng.runtimes] == ["cpu"]
        assert "nosuchruntime" in eng.load_errors
        assert "does not exist" in eng.load_errors["nosuchruntime"]


def test_loading_a_runtime_twice_is_refused():
    with Engine() as eng, pytest.raises(StateError, match="already loaded"):
        eng.load_runtime("cpu")


def test_bad_runtime_name():
    with pytest.raises(ArgumentError, match="not a runtime name"):
        Engine(runtimes=("../evil",))


def test_several_cpu_devices():
    with Engine(cpu_devices=2, cpu_threads=1) as eng:
        assert [d.name for d in eng.devices] == ["cpu:0", "cpu:1"]
        assert eng.device_index("cpu:1") == 1
        model = eng.load(FIXTURES / "qwen3-f32", device="cpu:1")
        with model.context() as ctx:
            assert ctx.prefill([1, 2, 3]).shape == (3, model.config.vocab_size)


def test_unknown_device():
    from engine.core.errors import RangeError

    with Engine() as eng, pytest.raises(RangeError, match="no device named 'cuda:0'"):
        eng.load(FIXTURES / "qwen3-f32", device="cuda:0")


def test_closed_handles_raise_instead_of_crashing():
    eng = Engine()
    model = eng.load(FIXTURES / "qwen3-f32")
    ctx = model.context()
    eng.close()  # closes the model and its context too
    assert model.closed and ctx.closed
    with pytest.raises(StateError, match="closed"):
        ctx.decode([1])
    with pytest.raises(StateError, match="closed"):
        model.context()
    eng.close()  # twice is fine


def test_model_info_counts_bytes():
    with Engine() as eng:
        model = eng.load(FIXTURES / "qwen3moe-f32")
        info = model.info
        assert info["n_layers"] == 3 and info["n_moe_layers"] == 2
        files = sum(os.path.getsize(f) for f in model.checkpoint.files)
        assert 0 < info["expert_bytes"] < info["weight_bytes"] <= files
        # per token: everything but the unselected experts (6 of 8 per MoE layer) and all but one embedding row
        cfg = model.config
        expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size * 4
        embed_rest = (cfg.vocab_size - 1) * cfg.hidden_size * 4
        norms = (cfg.hidden_size * (2 * cfg.num_layers + 1) + 2 * cfg.head_dim * cfg.num_layers) * 4
        assert info["bytes_per_token"] == info["weight_bytes"] - 2 * 6 * expert - embed_rest - norms


THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
HUGE_PAGES = THP.exists() and ("[always]" in THP.read_text() or "[madvise]" in THP.read_text())


def test_weights_copied_or_mapped_give_the_same_logits():
    """A checkpoint read into private memory (on huge pages where the kernel gives them) or memory-mapped: the same
    logits bits, and the info says which."""
    logits, held = {}, {}
    with Engine() as eng:
        for weights in ("map", "copy", "auto"):
            model = eng.load(FIXTURES / "qwen3moe-f32", weights=weights)
            info = model.info
            held[weights] = info["weights"]
            assert info["file_bytes"] == sum(os.path.getsize(f) for f in model.checkpoint.files)
            if weights == "map":
                assert info["huge_page_bytes"] == 0
            elif info["weights"] == "copy" and HUGE_PAGES:  # the copy is advised for huge pages: the kernel gives some
                assert info["huge_page_bytes"] > 0
            with model.context() as ctx:
                logits[weights] = ctx.prefill([1, 2, 3, 4, 5])
            model.close()
    assert held["map"] == "map" and held["copy"] == "copy" and held["auto"] in ("map", "copy")
    assert logits["map"].tobytes() == logits["copy"].tobytes() == logits["auto"].tobytes()


def test_unknown_weights_mode_is_refused_before_loading():
    with Engine() as eng:
        with pytest.raises(ArgumentError, match=r"weights 'cpy': expected one of auto, map, copy"):
            eng.load(FIXTURES / "qwen3moe-f32", weights="cpy")
        assert eng.load(FIXTURES / "qwen3moe-f32").info["n_layers"] == 3  # the engine still loads models


def test_decode_returns_independent_arrays():
    with Engine() as eng:
        model = eng.load(FIXTURES / "qwen3-f32")
        with model.context() as ctx:
            a = ctx.prefill([1, 2, 3])
            b = ctx.decode([4])
            assert a.flags.owndata and b.flags.owndata
            assert not np.shares_memory(a, b)


def test_unknown_device_of_a_runtime_not_loaded_says_how_to_load_it():
    from engine.core.errors import RangeError

    with Engine() as eng, pytest.raises(RangeError, match="runtime 'hostsim' is not loaded.*--runtime hostsim"):
        eng.device_index("hostsim:0")
    with Engine(runtimes=("cpu", "nosuch"), strict=False) as eng, pytest.raises(RangeError, match="did not load"):
        eng.device_index("nosuch:0")


def test_generate_refuses_a_bool_token_count():
    from engine.core.errors import ArgumentError

    with (
        Engine() as eng,
        eng.load(FIXTURES / "qwen3-f32") as model,
        model.context(16) as ctx,
        pytest.raises(ArgumentError, match="positive integer, got True"),
    ):
        ctx.generate([1, 2], True)


def test_generate_chooses_the_tokens_a_decode_loop_chooses():
    """generate's loop runs in the core; it chooses what decode + numpy's argmax choose, stops where they stop, and
    leaves the same positions appended."""
    with Engine() as eng, eng.load(FIXTURES / "qwen3-f32") as model, model.context(64) as ctx:
        prompt = [3, 17, 42, 5]
        last = ctx.prefill(prompt, all_rows=False)
        loop = [int(np.argmax(last))]
        while len(loop) < 12:
            loop.append(int(np.argmax(ctx.decode([loop[-1]])[0])))
        ctx.truncate(0)
        res = ctx.generate(prompt, 12)
        assert res.ids == loop and res.decode_tokens == 11
        assert ctx.position == len(prompt) + 11
        # a stop id first chosen mid-loop: the loop ends on it, which is not appended; ids outside the vocabulary
        # never match
        at = next(i for i in range(1, len(loop)) if loop[i] not in loop[:i])
        ctx.truncate(0)
        res = ctx.generate(prompt, 12, stop_ids=[-1, 10**9, loop[at]])
        assert res.ids == loop[: at + 1]
        assert ctx.position == len(prompt) + at


def test_generate_refuses_stop_ids_that_are_not_integers():
    with Engine() as eng, eng.load(FIXTURES / "qwen3-f32") as model, model.context(16) as ctx:
        with pytest.raises(ArgumentError, match="stop ids must be integers, got \\['eos'\\]"):
            ctx.generate([1, 2], 4, stop_ids=["eos"])
        assert ctx.position == 0  # refused before anything was appended


def test_greedy_in_the_core_reports_bad_arguments():
    from engine.core.errors import RangeError
    from engine.core.native import check, ffi, lib

    with Engine() as eng, eng.load(FIXTURES / "qwen3-f32") as model, model.context(16) as ctx:
        out, chosen = ffi.new("int32_t[4]"), ffi.new("int32_t *")
        with pytest.raises(ArgumentError, match="0 tokens to choose, expected at least one"):
            check(lib.eb_context_greedy(ctx._live(), 1, 0, ffi.NULL, 0, out, chosen))
        with pytest.raises(RangeError, match=f"first token id {model.config.vocab_size} out of range"):
            check(lib.eb_context_greedy(ctx._live(), model.config.vocab_size, 4, ffi.NULL, 0, out, chosen))
        with pytest.raises(ArgumentError, match="-1 stop ids"):
            check(lib.eb_context_greedy(ctx._live(), 1, 4, out, -1, out, chosen))
        assert ctx.position == 0
        # the KV cache fills up: the tokens chosen so far are kept and reported
        with pytest.raises(RangeError, match="longer than the KV cache"):
            check(lib.eb_context_greedy(ctx._live(), 1, 40, ffi.NULL, 0, ffi.new("int32_t[40]"), chosen))
        assert chosen[0] == 17 and ctx.position == 16


def test_greedy_chooses_no_token_from_logits_that_hold_nan(tmp_path):
    """A broken checkpoint (tied embeddings, row 5 NaN) is refused at load; loaded anyway (check_weights=False) it
    gives NaN logits for token 5 beside finite ones: the core's greedy loop chooses no token from them (numpy's argmax
    would take the first NaN, 5, and then 0 from rows all NaN) but fails naming the step and the token id."""
    from safetensors.numpy import load_file, save_file

    from engine.core.errors import CheckpointError, NumericError
    from engine.core.native import ffi, lib

    folder = tmp_path / "nan-row"
    shutil.copytree(FIXTURES / "qwen3-f32", folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.embed_tokens.weight"][5] = np.nan
    save_file(tensors, folder / "model.safetensors")
    with Engine() as eng:
        with pytest.raises(CheckpointError, match=r"tensor 'model.embed_tokens.weight' holds NaN at row 5, column 0"):
            eng.load(folder)
        with eng.load(folder, check_weights=False) as model, model.context(16) as ctx:
            row = ctx.decode([1])[0]
            assert np.isnan(row[5]) and np.isfinite(row).sum() > 1  # NaN at 5 beside finite logits
            ctx.truncate(0)
            with pytest.raises(NumericError, match=r"step 1 \(position 0\): the logits hold NaN at token id 5"):
                ctx.greedy(1, 3)
            out, chosen = ffi.new("int32_t[3]"), ffi.new("int32_t *")
            ctx.truncate(0)
            assert lib.eb_context_greedy(ctx._live(), 1, 3, ffi.NULL, 0, out, chosen) == lib.EB_ERR_NUMERIC
            assert chosen[0] == 1  # the first token only (given): none was chosen from the NaN row


def test_greedy_continues_from_a_chosen_token_and_refuses_bad_arguments():
    from engine.core.errors import RangeError

    with Engine() as eng, eng.load(FIXTURES / "qwen3-f32") as model, model.context(32) as ctx:
        ctx.prefill([3, 17, 42], all_rows=False)
        loop = [9]
        while len(loop) < 5:
            loop.append(int(np.argmax(ctx.decode([loop[-1]])[0])))
        ctx.truncate(3)
        assert ctx.greedy(9, 5) == loop and ctx.position == 3 + 4  # every chosen token but the last appended
        for first, n, match in (("9", 5, "first token must be an integer"), (9, 0, "positive integer, got 0")):
            with pytest.raises(ArgumentError, match=match):
                ctx.greedy(first, n)
        with pytest.raises(RangeError, match="first token id 512 out of range"):
            ctx.greedy(model.config.vocab_size, 2)
        assert ctx.position == 7  # nothing appended by the refused calls
