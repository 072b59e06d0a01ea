"""Quantized GGUF files from llama.cpp's own converter and quantizer (tests/fixtures/recipes/qwen3moe_gguf.py): what
the q8 precision adds beyond the conformance suite (tests/test_conformance.py holds every file against transformers run
on its dequantized weights, in both precisions: f32 within 1e-4, q8 within its stated tolerance, batches and placements
bit-identical).

- q8 with the AVX-512 VNNI kernels gives the AVX2 kernels' bits (where the CPU has AVX-512 VNNI): the suite's best
  kernels stand for the AVX2 ones.
- a precision or a kernel choice that does not exist is named.
"""

from __future__ import annotations

import numpy as np
import pytest
from fixture_paths import FIXTURES
from fixture_registry import QUANTIZED

from engine.model import Engine

GGUF = FIXTURES / "qwen3moe-gguf"


def reference(path):
    ref = np.load(path)
    return ref["prompt_ids"], ref["generated_ids"], ref["logits"]


def all_logits(model, prompt, generated, precision):
    with model.context(len(prompt) + len(generated)) as ctx:
        ctx.precision = precision
        return np.concatenate([ctx.prefill(prompt)] + [ctx.decode([t]) for t in generated])


@pytest.fixture(scope="module", params=["best", "portable"])
def engine(request):
    with Engine(kernels=request.param) as eng:
        yield eng


def test_bad_precision_is_named(engine):
    with engine.load(GGUF / "model-q8_0.gguf") as model, model.context(8) as ctx:
        with pytest.raises(Exception, match="precision 'q4': expected one of f32, q8"):
            ctx.precision = "q4"
        assert ctx.precision == "f32"


def test_avx512_q8_kernels_give_the_avx2_bits():
    """The q8 precision's AVX-512 VNNI products are the AVX2 ones, bit for bit, on every quantized Qwen3-MoE file (its
    Q8_0, k-quant and MXFP4 matrices): a run's hashes do not depend on whether the machine has AVX-512 (the native
    tests check the products alone)."""
    with Engine(kernels="best") as best, Engine(kernels="avx2") as avx2:
        variants = best.runtimes[0].kernel_variant, avx2.runtimes[0].kernel_variant
        if "avx512vnni" not in variants[0]:
            pytest.skip(f"this CPU runs {variants[0]} kernels only (no AVX-512 VNNI): the comparison runs where it has")
        for fixture in (f for f in QUANTIZED if f.path.parent == GGUF):
            prompt, generated, _ = reference(fixture.reference)
            got = []
            for eng in (best, avx2):
                with eng.load(fixture.path) as model:
                    got.append(all_logits(model, prompt, generated, "q8"))
            assert np.array_equal(got[0], got[1]), f"{fixture.name}: {variants[0]} and {variants[1]} logits differ"


@pytest.mark.parametrize("bad", ["avx512", "", "PORTABLE"])
def test_unknown_kernels_are_named(bad, monkeypatch):
    from engine.core.errors import ArgumentError

    with pytest.raises(ArgumentError, match="expected one of best, portable, avx2"):
        Engine(kernels=bad)
    monkeypatch.setenv("EXPERTBENCH_CPU_KERNELS", bad or "x")
    with pytest.raises(ArgumentError, match="EXPERTBENCH_CPU_KERNELS"):
        Engine()
