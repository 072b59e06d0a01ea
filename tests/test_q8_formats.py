"""A device that reads a format with f32 activations only (its kernels have no q8 products for it: the GPU modules
for Q4_0, Q2_K, Q3_K, IQ4_XS and the other types they read in f32 so far) must not run that format's products under
the q8 precision's name: the q8 step is refused naming the weight, its format and the device, the f32 precision runs
on the same placement, and q8 runs again once those weights sit on a device with q8 products for them.

The device here is hostsim's, wrapped so that its module reports Q4_K among the formats it reads but not among those
it runs in q8 (eb_rt_device_info.q8_formats): the same kernels, the report a GPU module gives for its f32-only
formats."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_paths import FIXTURES
from runtime_wrappers import wrapped_module

from engine.core import formats
from engine.core.errors import UnsupportedError
from engine.model import Engine

Q4_K_M = FIXTURES / "qwen3moe-gguf" / "model-q4_k_m.gguf"  # Q4_K experts in both layers, Q6_K in some

# the module's device report, with Q4_K taken out of the formats it runs in q8
REPORT = r"""
static int (*real_info)(void *, int, eb_rt_device_info *, char *, size_t);
static int info(void *rt, int dev, eb_rt_device_info *i, char *err, size_t errlen) {
    int st = real_info(rt, dev, i, err, errlen);
    i->q8_formats &= ~(1u << Q4_K);
    return st;
}
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("q8_formats")
    patch = "real_info = table.device_info; table.device_info = info;"
    module = wrapped_module(tmp, f"#define Q4_K {formats.get('Q4_K').code}\n{REPORT}", patch)
    with Engine(runtimes=("cpu", "hostsim"), module_paths={"hostsim": module}) as eng:
        yield eng


def logits(model, precision: str) -> np.ndarray:
    with model.context(16) as ctx:
        ctx.precision = precision
        return ctx.prefill([5, 17, 42, 9])


def test_q8_is_refused_where_an_expert_s_format_has_no_q8_products_on_its_device(engine):
    model = engine.load(Q4_K_M, device="cpu:0")
    q8_alone, f32_alone = logits(model, "q8"), logits(model, "f32")
    model.set_placement("*=cpu:0; 1.3=hostsim:0")
    with pytest.raises(UnsupportedError) as exc:
        logits(model, "q8")
    message = str(exc.value)
    assert "precision q8" in message and "of expert 3 of layer 1 is stored as Q4_K" in message
    assert "hostsim:0 reads with f32 activations only" in message
    assert "set precision f32, or place that expert on another device" in message
    # f32 on the same placement gives the one-device bits; q8 again once the expert is back
    assert np.array_equal(logits(model, "f32"), f32_alone)
    model.set_placement("*=cpu:0")
    assert np.array_equal(logits(model, "q8"), q8_alone)


def test_a_context_kept_across_placements_checks_its_q8_formats_after_each(engine):
    """A step checks the formats against the owners' q8 kernels once per placement (not every step): the placement
    that moves a Q4_K expert onto the device refuses the next step of a context that ran q8 before it."""
    model = engine.load(Q4_K_M, device="cpu:0")
    with model.context(32) as ctx:
        ctx.precision = "q8"
        ctx.prefill([5, 17, 42, 9])
        ctx.decode([3])
        model.set_placement("*=cpu:0; 1.3=hostsim:0")
        with pytest.raises(UnsupportedError, match="expert 3 of layer 1 is stored as Q4_K, which hostsim:0"):
            ctx.decode([11])
        model.set_placement("*=cpu:0")
        assert np.all(np.isfinite(ctx.decode([11])))


def test_q8_is_refused_on_a_primary_that_reads_its_weights_in_f32_only(engine):
    model = engine.load(Q4_K_M, device="hostsim:0")
    with pytest.raises(UnsupportedError, match=r"precision q8: \S+ of layer \d+ is stored as Q4_K, which hostsim:0"):
        logits(model, "q8")
    with engine.load(Q4_K_M, device="cpu:0") as on_cpu:
        assert np.array_equal(logits(model, "f32"), logits(on_cpu, "f32"))


def test_formats_without_a_q8_block_run_in_q8_on_such_a_device(engine):
    """The float formats and Q5_0/Q5_1 are read with f32 activations in either precision, by every module: a device
    without q8 products for Q4_K still runs the q8 precision on an F32 model."""
    model = engine.load(FIXTURES / "qwen3moe-gguf" / "model-q8_0.gguf", device="hostsim:0")
    logits(model, "q8")
    f32 = engine.load(FIXTURES / "qwen3moe-f32", device="hostsim:0")
    assert np.array_equal(logits(f32, "q8"), logits(f32, "f32"))
