"""A primary whose operations are queued (a GPU's stream: eb_rt_device_info.queued_ops) queues its peers' branches
first, then its own experts, then runs the CPU peer's on the calling thread (forward.c's eb_block_moe): the staged
peers' branches, the longest, start first. No GPU runs here, so the order is exercised through hostsim's module
wrapped to report queued operations (the same kernels, which return when done: the order of the calls is what
differs): every placement over the primary, a second staged device and the CPUs gives the bits of every expert on the
primary, in both precisions, traced or not.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from fixture_paths import FIXTURES
from runtime_wrappers import wrapped_module

from engine.core.errors import EngineError
from engine.model import Engine

Q4_K_M = FIXTURES / "qwen3moe-gguf" / "model-q4_k_m.gguf"
TOKENS = [5, 17, 42, 9, 3, 11, 27, 8]
# hostsim's module reporting queued operations, and a log of the order of its calls: 'F<dev>' for a peer's expert
# batch (expert_ffn), 'M<dev>' for the primary's own experts (forward->moe, the EXPERTS phase); fail_own makes the
# next EXPERTS phase fail (as a GPU's launch can)
REPORT = r"""
#include <string.h>
static int (*real_info)(void *, int, eb_rt_device_info *, char *, size_t);
static int (*real_ffn)(void *, int, const eb_rt_expert_batch *, int, char *, size_t);
static int (*real_moe)(void *, int, const eb_rt_moe *, char *, size_t);
static eb_rt_forward_ops fwd;
EB_EXPORT char calls[4096];
EB_EXPORT int n_calls, fail_own;
static void note(char kind, int dev) {
    if (n_calls + 2 < (int)sizeof calls) calls[n_calls++] = kind, calls[n_calls++] = (char)('0' + dev);
}
static int info(void *rt, int dev, eb_rt_device_info *i, char *err, size_t errlen) {
    int st = real_info(rt, dev, i, err, errlen);
    i->queued_ops = 1;
    return st;
}
static int ffn(void *rt, int dev, const eb_rt_expert_batch *b, int async, char *err, size_t errlen) {
    note('F', dev);
    return real_ffn(rt, dev, b, async, err, errlen);
}
static int moe(void *rt, int dev, const eb_rt_moe *b, char *err, size_t errlen) {
    if (b->phase == EB_MOE_EXPERTS) {
        note('M', dev);
        if (fail_own) {
            fail_own = 0;
            strncpy(err, "injected launch failure", errlen - 1);
            return EB_ERR_DEVICE;
        }
    }
    return real_moe(rt, dev, b, err, errlen);
}
"""
PATCH = (
    "real_info = table.device_info; table.device_info = info; real_ffn = table.expert_ffn; table.expert_ffn = ffn; "
    "fwd = *table.forward; real_moe = fwd.moe; fwd.moe = moe; table.forward = &fwd;"
)
PLACEMENTS = [
    "*=hostsim:0; *.0-3=hostsim:1",  # a staged peer
    "*=hostsim:0; 0=cpu:0; 1.2-6=hostsim:1",  # the CPU inline, a staged peer
    "*=hostsim:0; *.1=cpu:0; *.2=cpu:1; *.5-7=hostsim:1",  # two CPU peers (one queued, one inline) and a staged one
    "*=cpu:0",  # every expert on the inline CPU
]


@pytest.fixture(scope="module")
def wrapper(tmp_path_factory) -> str:
    return wrapped_module(tmp_path_factory.mktemp("queued"), REPORT, PATCH)


@pytest.fixture(scope="module")
def engine(wrapper):
    with Engine(runtimes=("cpu", "hostsim"), module_paths={"hostsim": wrapper}, cpu_devices=2,
                runtime_options={"hostsim": {"n_devices": 2}}) as eng:  # fmt: skip
        yield eng


@pytest.fixture(scope="module")
def log(wrapper, engine):
    """The wrapper's call log, through the module the engine loaded (the same library: one copy of its globals)."""
    return ctypes.CDLL(wrapper)


def calls(log) -> str:
    n = ctypes.c_int.in_dll(log, "n_calls")
    text = bytes((ctypes.c_char * n.value).in_dll(log, "calls")).decode()
    n.value = 0
    return text


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


def test_the_staged_peer_s_branch_is_queued_before_the_primary_s_own_experts(engine, log):
    """Every split layer step: hostsim:1's expert batch (F1: the module numbers its own devices) before hostsim:0's
    own experts (M0). Queued the other way round (the order before), each layer's pair reads M0, F1."""
    with engine.load(Q4_K_M, device="hostsim:0") as model:
        model.set_placement("*=hostsim:0; *.0-3=hostsim:1")
        calls(log)
        with model.context(32) as ctx:
            ctx.decode([5])
        steps = calls(log)
    pairs = [steps[i : i + 2] for i in range(0, len(steps), 2)]
    assert pairs and pairs.count("F1") == pairs.count("M0") == 2, pairs  # two MoE layers, one token
    for layer in range(2):
        assert pairs[2 * layer : 2 * layer + 2] == ["F1", "M0"], pairs


def test_a_failure_of_the_primary_s_own_experts_after_the_peers_were_queued(engine, log):
    """The primary's launch fails with the peer's branch queued: the error names it, the peer's branch is waited for,
    and the context gives the one-device bits once the step is run again."""
    fail = ctypes.c_int.in_dll(log, "fail_own")
    with engine.load(Q4_K_M, device="hostsim:0") as model:
        base = run(model, "f32")
        model.set_placement("*=hostsim:0; *.0-3=hostsim:1; 1.5=cpu:0")
        with model.context(32) as ctx:
            fail.value = 1
            with pytest.raises(EngineError, match="injected launch failure"):
                ctx.prefill(TOKENS[:5])
            assert fail.value == 0
            ctx.truncate(0)
            got = np.concatenate([ctx.prefill(TOKENS[:5]), *[ctx.decode([t]) for t in TOKENS[5:]]])
        assert np.array_equal(got.view(np.uint32), base.view(np.uint32))
