"""The forward pass against transformers' own logits (computed by tests/fixtures/generate.py)."""

from pathlib import Path

import numpy as np
import pytest
from fixture_paths import FIXTURES, MODELS

from engine.model import Engine

TOLERANCE = 1e-4  # relative L2 error per position


def reference(name):
    ref = np.load(FIXTURES / name / "reference.npz")
    return ref["prompt_ids"], ref["generated_ids"], ref["logits"]


def relative_error(ours, ref):
    return np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)


def cpu_flags() -> set[str]:
    """Read from the kernel, independently of the engine's own detection."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        return set(next(ln for ln in text.splitlines() if ln.startswith("flags")).split())
    except (OSError, StopIteration):
        return set()


def cpu_has_avx2() -> bool:
    return {"avx2", "fma", "f16c"} <= cpu_flags()


def cpu_has_avx512_vnni() -> bool:
    return cpu_has_avx2() and {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= cpu_flags()


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


@pytest.mark.parametrize("name", MODELS)
def test_logits_match_transformers_at_every_position(engine, name):
    prompt, generated, ref = reference(name)
    model = engine.load(FIXTURES / name)
    with model.context() as ctx:
        rows = [ctx.prefill(prompt)]
        rows += [ctx.decode([t]) for t in generated]
    ours = np.concatenate(rows)
    assert ours.shape == ref.shape
    err = relative_error(ours, ref)
    assert err.max() < TOLERANCE, f"worst position {err.argmax()}: relative error {err.max():.2e}"


@pytest.mark.parametrize("name", MODELS)
def test_greedy_64_tokens_identical(engine, name):
    prompt, generated, _ = reference(name)
    model = engine.load(FIXTURES / name)
    with model.context() as ctx:
        assert ctx.generate(prompt, 64).ids == generated.tolist()


@pytest.mark.parametrize("name", ["qwen3moe-f32", "qwen3moe-bf16", "qwen3-bf16"])
@pytest.mark.parametrize("q", [1, 3, 8])
def test_batch_of_q_plus_1_equals_single_steps(engine, name, q):
    prompt, generated, _ = reference(name)
    batch = generated[: q + 1]
    model = engine.load(FIXTURES / name)
    with model.context() as ctx:
        ctx.prefill(prompt, all_rows=False)
        single = np.concatenate([ctx.decode([t]) for t in batch])
        ctx.truncate(len(prompt))
        batched = ctx.decode(batch)
    assert batched.shape == (q + 1, model.config.vocab_size)
    assert np.abs(batched - single).max() <= 1e-5 * np.abs(single).max()


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
