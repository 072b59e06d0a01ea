"""The fixtures of the registry (tests/fixture_registry.py) against their references, the same checks for every family
and format: the logits at every position within the fixture's tolerance and the 64 greedy tokens, in the best CPU
kernels and the portable ones; the q8 precision within its tolerance (or, on float weights, the f32 bits); a GGUF file
with the bits of the folder it came from; a batch equal to single steps; bit-identity across placements and devices,
the owner-local sums close to the reference's, and a host-staged primary with the CPU's bits.

Each check runs on every fixture where that is cheap; where a run costs more (the portable kernels, several devices)
on the fixtures the registry names for it, which hold every format and every routed family between them.

What only one family has (MLA's latent cache, gpt-oss's windows and sinks, MXFP4's packing, config refusals) is
tested in its family's file: test_reference.py (Qwen3), test_deepseek.py, test_gpt_oss.py, test_gguf_quantized.py.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from fixture_registry import (
    AWAITING,
    BY_NAME,
    FLOAT_ONLY,
    HOSTSIM_PRIMARY,
    ON_DEVICES,
    PORTABLE_FLOAT_COVER,
    PORTABLE_QUANTIZED_COVER,
    QUANTIZED,
    REGISTRY,
    ROUTED,
    Fixture,
    cpu_has_avx2,
    fixtures_on_disk,
)

from engine import families
from engine.checkpoints.checkpoint import Checkpoint
from engine.model import Engine, Model
from engine.placement.placement import Placement

# A GGUF file that holds its folder's weights bit for bit (test_a_gguf_file_gives_the_bits_of_the_folder_it_came_from)
# runs in the best kernels; in the portable ones its folder stands for it
OWN_WEIGHTS = [f for f in REGISTRY if not f.same_bits_as]
BEST, PORTABLE = ("best",), ("portable",)  # the CPU kernel choices (see kernel_engines)
Q_VALUES = (1, 3, 4, 8)  # a batch of q + 1 positions: a speculative step's verification
NEW_CONTEXT_Q_VALUES = (1, 4)


def names(fixtures: list[Fixture]) -> list:
    return [pytest.param(f, id=f.name) for f in fixtures]


def with_precisions(fixtures: list[Fixture]) -> list:
    return [pytest.param(f, p, id=f"{f.name}-{p}") for f in fixtures for p in f.precisions]


def reference(fixture: Fixture) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prompt ids, the 64 greedy ids, transformers' logits at every position)."""
    return read_reference(fixture.reference)


@cache
def read_reference(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ref = np.load(path)
    return ref["prompt_ids"], ref["generated_ids"], ref["logits"]


@cache
def checkpoint(path) -> Checkpoint:
    """Read once: every engine loads the same checkpoint."""
    return Checkpoint.open(path)


def relative_error(ours, ref):
    return np.linalg.norm(ours - ref, axis=-1) / np.linalg.norm(ref, axis=-1)


def step_logits(model: Model, prompt, tokens, *, precision="f32", mode="reference", placement=None, n_ctx=None,
                n_batch=512) -> np.ndarray:  # fmt: skip
    """The prompt's rows from one prefill, then one row per token decoded one at a time."""
    if placement is not None:
        model.set_placement(placement)
    with model.context(n_ctx, n_batch=n_batch) as ctx:
        ctx.precision = precision
        ctx.mode = mode
        return np.concatenate([ctx.prefill(prompt)] + [ctx.decode([t]) for t in tokens])


class Opened:
    """An engine and the fixtures it has opened: each opened once for every test that reads it, and the logits of
    its whole reference sequence computed once per precision."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._models: dict[tuple[str, str], Model] = {}
        self._logits: dict[tuple[str, str], np.ndarray] = {}

    def model(self, fixture: Fixture, device: str = "cpu:0") -> Model:
        key = (fixture.name, device)
        if key not in self._models:
            self._models[key] = self.engine.load(checkpoint(fixture.path), device=device)
        return self._models[key]

    def logits(self, fixture: Fixture, precision: str = "f32") -> np.ndarray:
        """Every position of the reference sequence: the prompt in one prefill, then one token at a time, in a context
        exactly as long as the sequence (the last row fills it)."""
        key = (fixture.name, precision)
        if key not in self._logits:
            prompt, generated, _ = reference(fixture)
            self._logits[key] = step_logits(self.model(fixture), prompt, generated, precision=precision,
                                            n_ctx=len(prompt) + len(generated))  # fmt: skip
        return self._logits[key]


def kernel_engines(choice: str):
    """An engine of one CPU kernel choice. The portable kernels are the ones asked for; the best ones are the AVX2
    kernels where the CPU has AVX2, FMA and F16C, adding AVX-512 VNNI products in the q8 precision where it has those
    (test_gguf_quantized.py holds their bits equal to the AVX2 ones', test_reference.py the choice against
    /proc/cpuinfo)."""
    with Engine(kernels=choice) as eng:
        variant = eng.runtimes[0].kernel_variant
        if choice == "portable" or not cpu_has_avx2():
            assert variant == "portable"
        else:
            assert variant.startswith("avx2+fma+f16c"), f"the CPU has AVX2/FMA/F16C but the engine chose {variant!r}"
        yield Opened(eng)


@pytest.fixture(scope="module")
def best_kernels():
    yield from kernel_engines("best")


@pytest.fixture(scope="module")
def portable_kernels():
    yield from kernel_engines("portable")


@pytest.fixture
def kernels(request) -> Opened:
    """The engines of the kernel choice the test is parametrized with."""
    return request.getfixturevalue(f"{request.param}_kernels")


def in_kernels(*groups: tuple[tuple[str, ...], list[Fixture]], precisions: bool = False):
    """parametrize(kernels, fixture[, precision]): each group's kernel choices with its fixtures (and each precision
    a fixture runs)."""
    cases = [(k, f, p) for choices, fixtures in groups for k in choices for f in fixtures
             for p in (f.precisions if precisions else [None])]  # fmt: skip
    if precisions:
        return pytest.mark.parametrize("kernels, fixture, precision", [pytest.param(k, f, p, id=f"{k}-{f.name}-{p}")
                                       for k, f, p in cases], indirect=["kernels"])  # fmt: skip
    return pytest.mark.parametrize("kernels, fixture", [pytest.param(k, f, id=f"{k}-{f.name}") for k, f, _ in cases],
                                   indirect=["kernels"])  # fmt: skip


def cpu_device_threads() -> list:
    """One worker thread per CPU device, and the default share of the cores where that share is more."""
    with Engine(cpu_devices=2) as eng:
        shared = max(d.threads for d in eng.devices)
    one = pytest.param(1, id="1 thread per device")
    return [one] if shared == 1 else [one, pytest.param(0, id="the cores shared out")]


@pytest.fixture(scope="module", params=cpu_device_threads())
def devices(request):
    """cpu:0, cpu:1 and the host-staged hostsim:0 (a device that behaves like a discrete accelerator)."""
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, cpu_threads=request.param) as eng:
        yield Opened(eng)


@pytest.fixture(scope="module")
def hostsim():
    """One CPU device of one thread beside hostsim:0, which can be the primary."""
    with Engine(runtimes=("cpu", "hostsim"), cpu_threads=1) as eng:
        yield Opened(eng)


# ---- the registry ----------------------------------------------------------------------------------------------


def test_the_registry_names_every_fixture_on_disk():
    checkpoints, references = fixtures_on_disk()
    assert {f.path for f in REGISTRY + AWAITING} == checkpoints
    modules = {f.next_token_reference for f in REGISTRY + AWAITING if f.next_token_reference}
    assert {f.reference for f in REGISTRY + AWAITING} | modules == references
    assert len(BY_NAME) == len(REGISTRY)
    assert not {f.name for f in AWAITING} & set(BY_NAME)


def test_only_a_family_the_engine_refuses_has_its_fixtures_left_out_of_the_suite():
    """AWAITING holds the fixtures of families awaiting their forward pass (engine.families.AWAITING) and no others;
    a family the core runs has every fixture in REGISTRY (tests/test_deepseek_v4.py holds them to the refusal)."""
    awaiting = {f.architecture for f in families.AWAITING}
    assert {f.family for f in AWAITING} <= awaiting
    assert not {f.family for f in REGISTRY} & awaiting
    assert {f.architecture for f in families.FAMILIES} >= {f.family for f in REGISTRY}


def test_every_routed_family_runs_the_device_checks_in_a_float_and_a_quantized_layout():
    for family in {f.family for f in ROUTED}:
        layouts = {False} if family in FLOAT_ONLY else {False, True}  # FLOAT_ONLY says why
        assert {f.quantized for f in ON_DEVICES if f.family == family} == layouts, family
    assert {f.family for f in HOSTSIM_PRIMARY} == {f.family for f in ROUTED}


@pytest.mark.parametrize("fixture", names(REGISTRY))
def test_the_registry_tells_each_checkpoint_s_family_formats_and_routed_layers(fixture):
    ckpt = checkpoint(fixture.path)
    cfg = ckpt.config
    assert cfg.architecture == fixture.family
    assert {t.dtype for t in ckpt.tensors.values()} == fixture.dtypes
    assert fixture.is_gguf == fixture.path.is_file() and fixture.is_gguf != fixture.path.is_dir()
    if fixture.routing is None:
        assert cfg.moe_layers == [] and cfg.num_experts == 0
    else:
        assert tuple(cfg.moe_layers) == fixture.routing.moe_layers
        assert cfg.num_experts == fixture.routing.num_experts
        assert next(iter(fixture.routing.placements.values())) == "*=cpu:0"  # the base the others are held to
        for text in [*fixture.routing.placements.values(), fixture.routing.owner_local, fixture.routing.hostsim_peer]:
            Placement.parse(text, cfg)  # names routed layers and experts this checkpoint has
    assert (fixture.q8 is not None) == fixture.quantized  # a quantized fixture states how far q8 may move
    prompt, generated, logits = reference(fixture)
    assert len(generated) == 64 and logits.shape == (len(prompt) + len(generated), cfg.vocab_size)
    if fixture.same_bits_as:
        folder = BY_NAME[fixture.same_bits_as]
        assert not folder.is_gguf and folder.family == fixture.family


# ---- against the reference -------------------------------------------------------------------------------------


@in_kernels((BEST, REGISTRY), (PORTABLE, OWN_WEIGHTS))
def test_logits_match_the_reference_at_every_position(kernels, fixture):
    _, _, ref = reference(fixture)
    ours = kernels.logits(fixture)
    assert ours.shape == ref.shape
    err = relative_error(ours, ref)
    assert err.max() < fixture.tolerance, f"worst position {err.argmax()}: relative error {err.max():.2e}"


@in_kernels((BEST, REGISTRY), (PORTABLE, OWN_WEIGHTS))
def test_greedy_64_tokens_identical(kernels, fixture):
    prompt, generated, _ = reference(fixture)
    with kernels.model(fixture).context() as ctx:
        assert ctx.generate(prompt, 64).ids == generated.tolist()


@in_kernels((BEST, QUANTIZED), (PORTABLE, [f for f in OWN_WEIGHTS if f.quantized]))
def test_q8_precision_within_its_tolerance_and_not_the_f32_output(kernels, fixture):
    _, _, ref = reference(fixture)
    q8 = kernels.logits(fixture, "q8")
    err = relative_error(q8, ref)
    tol = fixture.q8
    assert np.median(err) < tol.median, f"median relative error {np.median(err):.3f}"
    if tol.p90 is not None:
        assert np.quantile(err, 0.9) < tol.p90, f"90th percentile {np.quantile(err, 0.9):.3f}"
    if tol.max is not None:
        assert err.max() < tol.max, f"worst position {err.argmax()}: relative error {err.max():.3f}"
    assert not np.array_equal(q8, kernels.logits(fixture, "f32"))  # the quantized activations really ran


@in_kernels((BEST, [f for f in REGISTRY if f.is_gguf and not f.quantized]))
def test_q8_precision_on_float_weights_gives_the_f32_bits(kernels, fixture):
    """Float formats are read in f32 in either precision: an F32 GGUF file gives the same bits."""
    np.testing.assert_array_equal(kernels.logits(fixture, "q8"), kernels.logits(fixture, "f32"))


@in_kernels((BEST, [f for f in REGISTRY if f.same_bits_as]))
def test_a_gguf_file_gives_the_bits_of_the_folder_it_came_from(kernels, fixture):
    """llama.cpp's converter wrote the folder's weights without rounding them (split or repacked only)."""
    folder = BY_NAME[fixture.same_bits_as]
    for ours, theirs in zip(reference(fixture)[:2], reference(folder)[:2], strict=True):
        np.testing.assert_array_equal(ours, theirs)  # the same sequence, so the logits compare row by row
    np.testing.assert_array_equal(kernels.logits(fixture), kernels.logits(folder))


# ---- a batch is single steps -----------------------------------------------------------------------------------


@in_kernels((BEST, OWN_WEIGHTS), (PORTABLE, PORTABLE_FLOAT_COVER))
def test_decoding_q_plus_1_tokens_at_once_equals_single_steps(kernels, fixture):
    """After the prompt, q + 1 tokens decoded at once (a speculative step verifying q drafts) give the bits of single
    steps: in the context that decoded them one at a time and rolled them back (then each batch in turn), and in a new
    context. A speculative step rolls back less than its batch, and a window's ring keeps n_batch - 1 rows beyond the
    window: the roll back stays within n_batch positions. (The q8 precision's batches: the next test.)"""
    prompt, generated, _ = reference(fixture)
    model = kernels.model(fixture)
    p = len(prompt)
    single = kernels.logits(fixture)[p:]  # the prompt in one prefill, then one token at a time

    def context():
        return model.context(n_batch=fixture.n_batch)

    with context() as ctx:
        ctx.prefill(prompt, all_rows=False)
        stepped = np.concatenate([ctx.decode([t]) for t in generated[: min(max(Q_VALUES) + 1, fixture.n_batch)]])
        assert np.array_equal(stepped, single[: len(stepped)]), "the single steps"
        for q in (q for q in Q_VALUES if q + 1 <= len(stepped)):
            ctx.truncate(p)  # rolls back the single steps, then each batch
            batched = ctx.decode(generated[: q + 1])
            assert batched.shape == (q + 1, model.config.vocab_size)
            assert np.array_equal(batched, stepped[: q + 1]), f"q = {q}, after rolling back"
    for q in NEW_CONTEXT_Q_VALUES:
        with context() as ctx:
            ctx.prefill(prompt)
            batched = ctx.decode(generated[: q + 1])
        assert batched.shape == (q + 1, model.config.vocab_size)
        assert np.array_equal(batched, single[: q + 1]), f"q = {q}, in a new context"


@in_kernels(
    (BEST, [f for f in QUANTIZED if f.is_gguf and f.family == "qwen3_moe"]),
    (PORTABLE, PORTABLE_QUANTIZED_COVER),
    precisions=True,
)
def test_a_prefilled_sequence_equals_single_steps_from_the_start(kernels, fixture, precision):
    prompt, generated, _ = reference(fixture)
    ids = np.concatenate([prompt, generated[:6]])
    model = kernels.model(fixture)
    with model.context(len(ids), n_batch=fixture.n_batch) as ctx:
        ctx.precision = precision
        batch = ctx.prefill(ids)
    with model.context(len(ids), n_batch=fixture.n_batch) as ctx:
        ctx.precision = precision
        single = np.concatenate([ctx.decode([t]) for t in ids])
    assert np.array_equal(batch, single)


# ---- placements and devices ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fixture, precision",
    [p for p in with_precisions(ON_DEVICES) if p.values[1] == "f32" or p.values[0].family == "qwen3_moe"],
)  # the q8 precision's placements on the Qwen3-MoE files: its k-quant and MXFP4 products
def test_reference_mode_is_bit_identical_across_placements(devices, fixture, precision):
    prompt, generated, _ = reference(fixture)
    model = devices.model(fixture)
    base = None
    for label, text in fixture.routing.placements.items():  # the first puts every expert on cpu:0
        out = step_logits(model, prompt, generated[:8], precision=precision, placement=text)
        base = out if base is None else base
        assert np.array_equal(out, base), f"{label}: logits differ (max {np.abs(out - base).max():.3g})"
        assert model.placement.describe() == Placement.parse(text, model.config).describe()


@pytest.mark.parametrize("fixture", names([f for f in ON_DEVICES if f.is_gguf]))
def test_greedy_64_tokens_identical_beside_other_devices(devices, fixture):
    """Every expert on cpu:0 (of one thread), with cpu:1 and hostsim:0 in the engine: the placements are bit-identical
    to this one (test_reference_mode_is_bit_identical_across_placements)."""
    prompt, generated, _ = reference(fixture)
    model = devices.model(fixture)
    model.set_placement("*=cpu:0")
    with model.context() as ctx:
        assert ctx.generate(prompt, 64).ids == generated.tolist()


@pytest.mark.parametrize("fixture", names([f for f in ON_DEVICES if not f.is_gguf]))
def test_owner_local_mode_is_close(devices, fixture):
    prompt, generated, _ = reference(fixture)
    model = devices.model(fixture)
    ref = step_logits(model, prompt, generated[:4], placement=fixture.routing.owner_local)
    out = step_logits(model, prompt, generated[:4], mode="owner_local")
    assert relative_error(out, ref).max() < 1e-5


@pytest.mark.parametrize("fixture", names(HOSTSIM_PRIMARY))
def test_hostsim_primary_with_recorded_steps_gives_the_cpu_bits(hostsim, fixture):
    """hostsim:0 as the primary (its steps recorded and replayed), experts left on cpu:0: the logits of the same model
    on cpu:0, with the prefill in one batch (then 6 steps) and in chunks of 4 (then 12 steps)."""
    prompt, generated, _ = reference(fixture)
    for n_batch, steps in ((512, 6), (4, 12)):
        cpu = step_logits(hostsim.model(fixture), prompt, generated[:steps], n_batch=n_batch)
        out = step_logits(hostsim.model(fixture, "hostsim:0"), prompt, generated[:steps],
                          placement=fixture.routing.hostsim_peer, n_batch=n_batch)  # fmt: skip
        np.testing.assert_array_equal(out, cpu, err_msg=f"n_batch {n_batch}")
