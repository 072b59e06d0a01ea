"""Qwen3 and Qwen3-MoE beyond the conformance suite (tests/test_conformance.py holds every fixture's logits, greedy
tokens and batches against transformers' own, tests/fixtures/generate.py): rolling back, prefill in chunks, the last
row alone, the CPU kernels the engine chooses, thread counts, and f16 weights."""

import numpy as np
import pytest
from fixture_paths import FIXTURES
from fixture_registry import cpu_has_avx2, cpu_has_avx512_vnni

from engine.model import Engine

TOLERANCE = 1e-4  # relative L2 error per position


def reference(name):
    ref = np.load(FIXTURES / name / "reference.npz")
    return ref["prompt_ids"], ref["generated_ids"], ref["logits"]


def relative_error(ours, ref):
    return np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)


@pytest.fixture(params=["avx2", "portable"])
def engine(request):
    with Engine(kernels=request.param) as eng:
        variant = eng.runtimes[0].kernel_variant
        if request.param == "avx2":
            if not cpu_has_avx2():
                pytest.skip("this CPU has no AVX2/FMA/F16C")
            assert variant == "avx2+fma+f16c", f"the CPU has AVX2/FMA/F16C but the engine chose {variant!r}"
        else:
            assert variant == "portable"
        yield eng


@pytest.mark.parametrize("name", ["qwen3moe-f32", "qwen3-bf16"])
def test_truncate_then_redecode_equals_never_going_ahead(engine, name):
    prompt, generated, _ = reference(name)
    model = engine.load(FIXTURES / name)
    with model.context() as ctx:
        ctx.prefill(prompt, all_rows=False)
        straight = ctx.decode(generated[:4])
    with model.context() as ctx:
        ctx.prefill(prompt, all_rows=False)
        ctx.decode(generated[:2])
        ctx.decode([7, 9, 11, 13, 17])  # a wrong continuation, then roll back
        assert ctx.position == len(prompt) + 7
        ctx.truncate(len(prompt) + 2)
        assert ctx.position == len(prompt) + 2
        again = ctx.decode(generated[2:4])
    np.testing.assert_array_equal(again, straight[2:4])


def test_prefill_in_chunks_equals_one_batch(engine):
    prompt, _, ref = reference("qwen3moe-f32")
    model = engine.load(FIXTURES / "qwen3moe-f32")
    with model.context(n_batch=5) as ctx:
        chunked = ctx.prefill(prompt)
    with model.context() as ctx:
        whole = ctx.prefill(prompt)
    np.testing.assert_array_equal(chunked, whole)
    assert relative_error(whole, ref[: len(prompt)]).max() < TOLERANCE


def test_last_row_prefill_matches_all_rows(engine):
    prompt, _, _ = reference("qwen3-f32")
    model = engine.load(FIXTURES / "qwen3-f32")
    with model.context() as ctx:
        last = ctx.prefill(prompt, all_rows=False)
        ctx.truncate(0)
        rows = ctx.prefill(prompt)
    np.testing.assert_array_equal(last, rows[-1])


def test_portable_and_avx2_kernels_agree():
    prompt, generated, _ = reference("qwen3moe-bf16")
    out = {}
    for portable in (False, True):
        with Engine(kernels="portable" if portable else "avx2") as eng:
            model = eng.load(FIXTURES / "qwen3moe-bf16")
            with model.context() as ctx:
                out[portable] = (eng.runtimes[0].kernel_variant, ctx.prefill(prompt))
    assert out[True][0] == "portable"
    if cpu_has_avx2():
        assert out[False][0] == "avx2+fma+f16c"
    assert relative_error(out[False][1], out[True][1]).max() < 1e-5


def test_best_kernels_follow_the_cpu():
    """The default choice is the best the CPU runs, as /proc/cpuinfo tells it: AVX-512 VNNI q8 products beside the
    AVX2 kernels where the CPU has both, the AVX2 kernels where it has AVX2, FMA and F16C, else the portable ones."""
    with Engine() as eng:
        variant = eng.runtimes[0].kernel_variant
    if cpu_has_avx512_vnni():
        assert variant == "avx2+fma+f16c+avx512vnni"
    elif cpu_has_avx2():
        assert variant == "avx2+fma+f16c"
    else:
        assert variant == "portable"


def test_thread_count_does_not_change_logits():
    prompt, _, _ = reference("qwen3moe-f32")
    results = []
    for threads in (1, 2, 3):
        with Engine(cpu_threads=threads) as eng:
            assert eng.devices[0].threads == threads
            model = eng.load(FIXTURES / "qwen3moe-f32")
            with model.context() as ctx:
                results.append(ctx.prefill(prompt))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])


def write_f16_copies(tmp_path, name="qwen3moe-f32"):
    """The fixture with every tensor in f16, and in f32 holding exactly the f16-rounded values."""
    import json
    import shutil

    from safetensors.numpy import load_file, save_file

    src = FIXTURES / name
    tensors = load_file(str(src / "model.safetensors"))
    out = {}
    for dtype in ("f16", "f16-as-f32"):
        folder = tmp_path / dtype
        folder.mkdir()
        for f in ("config.json", "tokenizer.json"):
            shutil.copy(src / f, folder / f)
        rounded = {k: v.astype(np.float16) for k, v in tensors.items()}
        if dtype == "f16-as-f32":
            rounded = {k: v.astype(np.float32) for k, v in rounded.items()}
        save_file(rounded, str(folder / "model.safetensors"))
        config = json.loads((folder / "config.json").read_text())
        config["torch_dtype"] = config["dtype"] = "float16" if dtype == "f16" else "float32"
        (folder / "config.json").write_text(json.dumps(config))
        out[dtype] = folder
    return out


def test_f16_weights_decode_as_their_exact_values(engine, tmp_path):
    """f16 checkpoints: the same logits as f32 weights holding the same (f16-rounded) values, and close to
    transformers' f32 reference (the rounding of the weights is all that differs)."""
    prompt, generated, ref = reference("qwen3moe-f32")
    folders = write_f16_copies(tmp_path)
    rows = {}
    for dtype, folder in folders.items():
        model = engine.load(folder)
        assert {t.dtype for t in model.checkpoint.tensors.values()} == {"F16" if dtype == "f16" else "F32"}
        with model.context() as ctx:
            rows[dtype] = np.concatenate([ctx.prefill(prompt)] + [ctx.decode([t]) for t in generated[:16]])
        model.close()
    assert relative_error(rows["f16"], rows["f16-as-f32"]).max() < 1e-5
    assert relative_error(rows["f16"], ref[: len(rows["f16"])]).max() < 1e-2
