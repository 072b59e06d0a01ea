"""A primary whose operations are queued (a GPU's stream: eb_rt_device_info.queued_ops) queues its peers' branches
first, then its own experts, then runs the CPU peer's on the calling thread (forward.c's eb_block_moe): the staged
peers' branches, the longest, start first. No GPU runs here, so the order is exercised through hostsim's module
wrapped to report queued operations (the same kernels, which return when done: the order of the calls is what
differs): every placement over the primary, a second staged device and the CPUs gives the bits of every expert on the
primary, in both precisions, traced or not.
"""

from __future__ import annotations

import numpy as np
import pytest
from fixture_paths import FIXTURES
from runtime_wrappers import wrapped_module

from engine.model import Engine

Q4_K_M = FIXTURES / "qwen3moe-gguf" / "model-q4_k_m.gguf"
TOKENS = [5, 17, 42, 9, 3, 11, 27, 8]
REPORT = r"""
static int (*real_info)(void *, int, eb_rt_device_info *, char *, size_t);
static int info(void *rt, int dev, eb_rt_device_info *i, char *err, size_t errlen) {
    int st = real_info(rt, dev, i, err, errlen);
    i->queued_ops = 1;
    return st;
}
"""
PLACEMENTS = [
    "*=hostsim:0; *.0-3=hostsim:1",  # a staged peer
    "*=hostsim:0; 0=cpu:0; 1.2-6=hostsim:1",  # the CPU inline, a staged peer
    "*=hostsim:0; *.1=cpu:0; *.2=cpu:1; *.5-7=hostsim:1",  # two CPU peers (one queued, one inline) and a staged one
    "*=cpu:0",  # every expert on the inline CPU
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    module = wrapped_module(tmp_path_factory.mktemp("queued"), REPORT,
                            "real_info = table.device_info; table.device_info = info;")  # fmt: skip
    with Engine(runtimes=("cpu", "hostsim"), module_paths={"hostsim": module}, cpu_devices=2,
                runtime_options={"hostsim": {"n_devices": 2}}) as eng:  # fmt: skip
        yield eng


def run(model, precision: str, trace: bool = False) -> np.ndarray:
    with model.context(32) as ctx:
        ctx.precision = precision
        if trace:
            ctx.trace = 4096
        return np.concatenate([ctx.prefill(TOKENS[:5]), *[ctx.decode([t]) for t in TOKENS[5:]]])


def test_the_wrapped_module_reports_queued_operations(engine):
    queued = {d.name: d.queued for d in engine.devices}
    assert queued == {"cpu:0": False, "cpu:1": False, "hostsim:0": True, "hostsim:1": True}


@pytest.mark.parametrize("precision", ["f32", "q8"])
def test_every_placement_gives_the_bits_of_one_device(engine, precision):
    with engine.load(Q4_K_M, device="hostsim:0") as model:
        base = run(model, precision)
        for text in PLACEMENTS:
            model.set_placement(text)
            got = run(model, precision, trace=text == PLACEMENTS[2])
            assert np.array_equal(got.view(np.uint32), base.view(np.uint32)), text
