"""Quantized GGUF files from llama.cpp's own converter and quantizer (tests/fixtures/generate_gguf.py) against
transformers run on the same weights dequantized by the gguf package: F32, Q8_0, Q4_K_M (Q4_K, Q5_K, Q6_K and Q8_0
matrices mixed) and MXFP4_MOE (MXFP4 experts).

- f32 precision (the default, the reference mode's): logits within 1e-4 relative L2 at every position, 64 greedy
  tokens identical, in the best kernels this CPU runs and in the portable ones.
- q8 precision (activations quantized per block of 32 or 256 values, integer products, as llama.cpp's CPU
  kernels): the stated tolerance below, and another output than f32 on quantized files.
- q8 with the AVX-512 VNNI kernels gives the AVX2 kernels' bits (where the CPU has AVX-512 VNNI).
- both precisions bit-identical across placements on cpu:0, cpu:1 and the host-staged hostsim:0, and a batch of
  positions equal to single steps.
"""

from __future__ import annotations

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.model import Engine

GGUF = FIXTURES / "qwen3moe-gguf"
QUANTS = ["f32", "q8_0", "q4_k_m", "mxfp4_moe"]
TOLERANCE = 1e-4  # f32 precision: relative L2 error per position
# q8 precision: activations rounded to 8 bits per block move every logit a little (about 1 % relative L2 at the
# median position on these files, as llama.cpp's own CPU run of them does) and, where two experts score nearly alike,
# flip a routing choice: a few positions then differ by more
Q8_MEDIAN, Q8_P90 = 0.03, 0.06


def reference(quant):
    ref = np.load(GGUF / f"reference-{quant}.npz")
    return ref["prompt_ids"], ref["generated_ids"], ref["logits"]


def relative_error(ours, ref):
    return np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)


def all_logits(model, prompt, generated, precision, placement=None):
    if placement is not None:
        model.set_placement(placement)
    with model.context(len(prompt) + len(generated)) as ctx:
        ctx.precision = precision
        return np.concatenate([ctx.prefill(prompt)] + [ctx.decode([t]) for t in generated])


@pytest.fixture(scope="module", params=["best", "portable"])
def engine(request):
    with Engine(kernels=request.param) as eng:
        yield eng


@pytest.mark.parametrize("quant", QUANTS)
def test_f32_precision_matches_transformers_on_the_dequantized_weights(engine, quant):
    prompt, generated, ref = reference(quant)
    with engine.load(GGUF / f"model-{quant}.gguf") as model:
        ours = all_logits(model, prompt, generated, "f32")
        err = relative_error(ours, ref)
        assert err.max() < TOLERANCE, f"worst position {err.argmax()}: relative error {err.max():.2e}"
        with model.context(len(prompt) + 64) as ctx:
            assert ctx.generate(prompt, 64).ids == generated.tolist()


@pytest.mark.parametrize("quant", QUANTS[1:])
def test_q8_precision_within_its_tolerance_and_not_the_reference(engine, quant):
    prompt, generated, ref = reference(quant)
    with engine.load(GGUF / f"model-{quant}.gguf") as model:
        q8 = all_logits(model, prompt, generated, "q8")
        f32 = all_logits(model, prompt, generated, "f32")
    err = relative_error(q8, ref)
    assert np.median(err) < Q8_MEDIAN, f"median relative error {np.median(err):.3f}"
    assert np.quantile(err, 0.9) < Q8_P90, f"90th percentile {np.quantile(err, 0.9):.3f}"
    assert not np.array_equal(q8, f32)  # the quantized activations really ran


def test_q8_on_float_weights_is_f32():
    """Float formats are read in f32 in either precision: an F32 file gives the same bits."""
    prompt, generated, _ = reference("f32")
    with Engine() as eng, eng.load(GGUF / "model-f32.gguf") as model:
        assert np.array_equal(all_logits(model, prompt, generated, "q8"), all_logits(model, prompt, generated, "f32"))


PLACEMENTS = ["*=cpu:1", "0=hostsim:0", "*=cpu:0; 0.1-3=cpu:1; 1.2=hostsim:0; 1.5-7=cpu:1"]


@pytest.mark.parametrize("precision", ["f32", "q8"])
@pytest.mark.parametrize("quant", ["q4_k_m", "mxfp4_moe"])
def test_both_precisions_are_bit_identical_across_placements(quant, precision):
    prompt, generated, _ = reference(quant)
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2) as eng, eng.load(GGUF / f"model-{quant}.gguf") as model:
        one = all_logits(model, prompt, generated[:8], precision, "*=cpu:0")
        for placement in PLACEMENTS:
            assert np.array_equal(all_logits(model, prompt, generated[:8], precision, placement), one), placement


@pytest.mark.parametrize("precision", ["f32", "q8"])
def test_a_batch_equals_single_steps(engine, precision):
    prompt, generated, _ = reference("q4_k_m")
    with engine.load(GGUF / "model-q4_k_m.gguf") as model:
        ids = np.concatenate([prompt, generated[:6]])
        with model.context(len(ids)) as ctx:
            ctx.precision = precision
            batch = ctx.prefill(ids)
        with model.context(len(ids)) as ctx:
            ctx.precision = precision
            single = np.concatenate([ctx.decode([t]) for t in ids])
        assert np.array_equal(batch, single)


def test_bad_precision_is_named(engine):
    with engine.load(GGUF / "model-q8_0.gguf") as model, model.context(8) as ctx:
        with pytest.raises(Exception, match="precision 'q4': expected one of f32, q8"):
            ctx.precision = "q4"
        assert ctx.precision == "f32"


def test_avx512_q8_kernels_give_the_avx2_bits():
    """The q8 precision's AVX-512 VNNI products are the AVX2 ones, bit for bit, on every quantized file: a run's hashes
    do not depend on whether the machine has AVX-512 (the native tests check the products alone)."""
    with Engine(kernels="best") as best, Engine(kernels="avx2") as avx2:
        variants = best.runtimes[0].kernel_variant, avx2.runtimes[0].kernel_variant
        if "avx512vnni" not in variants[0]:
            pytest.skip(f"this CPU runs {variants[0]} kernels only (no AVX-512 VNNI): the comparison runs where it has")
        for quant in QUANTS[1:]:
            prompt, generated, _ = reference(quant)
            got = []
            for eng in (best, avx2):
                with eng.load(GGUF / f"model-{quant}.gguf") as model:
                    got.append(all_logits(model, prompt, generated, "q8"))
            assert np.array_equal(got[0], got[1]), f"{quant}: {variants[0]} and {variants[1]} logits differ"


@pytest.mark.parametrize("bad", ["avx512", "", "PORTABLE"])
def test_unknown_kernels_are_named(bad, monkeypatch):
    from engine.errors import ArgumentError

    with pytest.raises(ArgumentError, match="expected one of best, portable, avx2"):
        Engine(kernels=bad)
    monkeypatch.setenv("EXPERTBENCH_CPU_KERNELS", bad or "x")
    with pytest.raises(ArgumentError, match="EXPERTBENCH_CPU_KERNELS"):
        Engine()
