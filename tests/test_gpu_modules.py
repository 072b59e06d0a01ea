"""The cuda and hip runtime modules: built wherever their compilers exist, loadable side by side in one process.

On a machine without the GPU, each must load and report "no device" with its own runtime's reason; the CPU keeps
working. With a GPU present (the device machine), bench/gpu/ checks tokens and speed.
"""

import shutil
from pathlib import Path

import numpy as np
import pytest
from fixture_paths import FIXTURES
from fixture_registry import BY_NAME
from races import close_while_decoding, place_while_decoding, race

from engine.core.errors import OutOfMemoryError, StateError, UnsupportedError
from engine.core.native import core_location
from engine.model import Engine

MODULES = Path(core_location())


def compiler(name: str) -> bool:
    return shutil.which(name) is not None or (name == "nvcc" and Path("/usr/local/cuda/bin/nvcc").exists())


@pytest.mark.parametrize(("runtime", "tool"), [("cuda", "nvcc"), ("hip", "hipcc")])
def test_module_is_built_where_its_compiler_exists(runtime, tool):
    if not compiler(tool):
        pytest.skip(f"{tool} is not installed on this machine, so the {runtime} module is not expected")
    assert (MODULES / f"expertbench_rt_{runtime}.so").is_file()


def built(runtime: str) -> bool:
    return (MODULES / f"expertbench_rt_{runtime}.so").is_file()


@pytest.mark.parametrize("order", [("cuda", "hip"), ("hip", "cuda")])
def test_cuda_and_hip_load_side_by_side_and_report_their_reason(order):
    if not (built("cuda") and built("hip")):
        pytest.skip("needs both GPU modules built: nvcc and hipcc are not both on this machine")
    with Engine(runtimes=("cpu", *order), strict=False) as eng:
        names = [d.name for d in eng.devices]
        for runtime in order:
            if any(n.startswith(f"{runtime}:") for n in names):
                continue  # a real GPU of this kind is present
            reason = eng.load_errors[runtime]
            api = "CUDA" if runtime == "cuda" else "HIP"
            assert f"runtime module '{runtime}': no device: {api} reports" in reason
        # the CPU still runs a model in the same process
        model = eng.load(FIXTURES / "qwen3-f32")
        with model.context(8) as ctx:
            assert np.isfinite(ctx.prefill([1, 2, 3])).all()


def gpu_engine(runtime: str):
    """An engine with the CPU and this GPU runtime, or a skip saying why there is none."""
    if not built(runtime):
        pytest.skip(f"the {runtime} module is not built: its compiler is not on this machine")
    eng = Engine(runtimes=("cpu", runtime), strict=False)
    if f"{runtime}:0" not in [d.name for d in eng.devices]:
        eng.close()
        pytest.skip(
            f"no {runtime} GPU on this machine"
            + (" (runs on the GPU machine: bench/gpu/run_on_device.sh)" if runtime == "cuda" else "")
        )
    return eng


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qwen3moe-f32", "qwen3moe-bf16", "qwen3-f32"])
@pytest.mark.parametrize("runtime", ["cuda", "hip"])
def test_gpu_primary_matches_transformers_and_cpu_tokens(runtime, name):
    """The whole forward pass on the GPU: logits within 1e-4 of transformers, the 64 greedy tokens of the
    fixture, recorded steps (graphs, in parts around host round trips) bit-identical to steps queued anew, no
    host round trip while every expert is on the GPU and one per MoE layer step for each layer with experts
    elsewhere."""
    with gpu_engine(runtime) as eng:
        gpu = f"{runtime}:0"
        ref = np.load(FIXTURES / name / "reference.npz")
        prompt, generated, logits = ref["prompt_ids"], ref["generated_ids"], ref["logits"]
        model = eng.load(FIXTURES / name, device=gpu)
        moe = model.config.num_experts > 0
        for text in (f"*={gpu}", "*=cpu:0", f"*={gpu}; 0=cpu:0; 2.6=cpu:0") if moe else (None,):
            for mode in ("reference", "owner_local") if moe else ("reference",):
                if text:
                    model.set_placement(text)
                before = model.counters()
                decoded = {}
                for graphs in (True, False):
                    launched = model.counters()["graph_launches"]
                    with model.context() as ctx:
                        ctx.mode, ctx.graphs = mode, graphs
                        rows = np.concatenate([ctx.prefill(prompt)] + [ctx.decode([t]) for t in generated])
                        ctx.truncate(0)
                        assert ctx.generate(prompt, 64).ids == generated.tolist(), f"{text} {mode} graphs={graphs}"
                    decoded[graphs] = rows
                    if not graphs:
                        assert model.counters()["graph_launches"] == launched, "graphs=False still launched graphs"
                    rel = np.linalg.norm(rows - logits, axis=1) / np.linalg.norm(logits, axis=1)
                    assert rel.max() < 1e-4, f"{text} {mode}: {rel.max():.2e}"
                assert np.array_equal(decoded[True], decoded[False]), f"{text} {mode}: graph steps differ"
                after = model.counters()
                trips = after["host_round_trips"] - before["host_round_trips"]
                assert after["graph_launches"] > before["graph_launches"], "no step ran from a graph"
                if text is None or text == f"*={gpu}":
                    assert trips == 0, f"{text}: {trips} host round trips"
                else:  # every MoE layer has experts on cpu:0: one round trip each, parts recorded around them
                    assert trips == after["layer_steps"] - before["layer_steps"] > 0
        model.close()


@pytest.mark.gpu
@pytest.mark.parametrize("runtime", ["cuda", "hip"])
def test_speculative_run_on_a_gpu_primary_gives_its_greedy_tokens(runtime):
    """Verification batches (q + 1 rows: the multi-row kernels) against one-row steps (the decode kernels and
    graphs): a speculative run writes the tokens of target-only greedy decoding on the same GPU."""
    from engine.runs.run import DecodeRun

    with gpu_engine(runtime) as eng:
        gpu = f"{runtime}:0"
        target = eng.load(FIXTURES / "qwen3moe-bf16", device=gpu)
        draft = eng.load(FIXTURES / "qwen3-f32", device=gpu)
        prompts = ["hello world", "a b c d"]
        alone = DecodeRun(target, None, prompts=prompts, tokens_per_prompt=24, placement=f"*={gpu}").run()
        for q in (1, 3, 8):
            run = DecodeRun(target, draft, prompts=prompts, tokens_per_prompt=24, q=q, placement=f"*={gpu}").run()
            assert run.output_sha256 == alone.output_sha256, f"q={q}"
        target.close()
        draft.close()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["qwen3moe-f32", "qwen3moe-bf16"])
@pytest.mark.parametrize("runtime", ["cuda", "hip"])
def test_gpu_experts_match_transformers_and_cpu_tokens(runtime, name):
    if not built(runtime):
        pytest.skip(f"the {runtime} module is not built: its compiler is not on this machine")
    with Engine(runtimes=("cpu", runtime), strict=False) as eng:
        gpu = f"{runtime}:0"
        if gpu not in [d.name for d in eng.devices]:
            pytest.skip(
                f"no {runtime} GPU on this machine"
                + (" (runs on the GPU machine: bench/gpu/run_on_device.sh)" if runtime == "cuda" else "")
            )
        ref = np.load(FIXTURES / name / "reference.npz")
        prompt, generated, logits = ref["prompt_ids"], ref["generated_ids"], ref["logits"]
        model = eng.load(FIXTURES / name)
        for text in (f"*={gpu}", f"0={gpu}", f"*=cpu:0; 0.1-3={gpu}; 2.6={gpu}"):
            for mode in ("reference", "owner_local"):
                model.set_placement(text)
                with model.context() as ctx:
                    ctx.mode = mode
                    rows = np.concatenate([ctx.prefill(prompt)] + [ctx.decode([t]) for t in generated])
                    ctx.truncate(0)
                    assert ctx.generate(prompt, 64).ids == generated.tolist(), f"{text} {mode}"
                rel = np.linalg.norm(rows - logits, axis=1) / np.linalg.norm(logits, axis=1)
                assert rel.max() < 1e-4, f"{text} {mode}: {rel.max():.2e}"
        assert model.counters()["devices"][gpu]["rows"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name", ["deepseek-f32", "deepseek-bf16", "deepseek-noqlora-f32", "gpt-oss-bf16", "gpt-oss-mxfp4"]
)
@pytest.mark.parametrize("runtime", ["cuda", "hip"])
def test_deepseek_and_gpt_oss_on_a_gpu_primary_and_beside_a_cpu_one(runtime, name):
    """DeepSeek-V3 and gpt-oss with the GPU as the primary (MLA attention over the latent cache, grouped sigmoid
    routing and the shared experts there; attention sinks, window rings wrapped by batches of 4, top-k-then-softmax
    routing, biased experts with the clamped SwiGLU; graphs and queued steps bit-identical) and with a CPU primary
    whose routed experts are on the GPU: transformers' logits within 1e-4 and the fixture's 64 greedy tokens on every
    placement."""
    with gpu_engine(runtime) as eng:
        gpu = f"{runtime}:0"
        ref = np.load(FIXTURES / name / "reference.npz")
        prompt, generated, logits = ref["prompt_ids"], ref["generated_ids"], ref["logits"]
        for primary, placements in ((gpu, (f"*={gpu}", "*=cpu:0", f"*={gpu}; 1=cpu:0; 3.2-5=cpu:0")),
                                    ("cpu:0", (f"*={gpu}", f"*=cpu:0; 2={gpu}; 1.0-5={gpu}"))):  # fmt: skip
            model = eng.load(FIXTURES / name, device=primary)
            for text in placements:
                model.set_placement(text)
                decoded = {}
                for graphs in (True, False):
                    with model.context(n_batch=4) as ctx:
                        ctx.graphs = graphs
                        rows = np.concatenate([ctx.prefill(prompt)] + [ctx.decode([t]) for t in generated])
                        ctx.truncate(0)
                        assert ctx.generate(prompt, 64).ids == generated.tolist(), f"{primary} {text}"
                    rel = np.linalg.norm(rows - logits, axis=1) / np.linalg.norm(logits, axis=1)
                    assert rel.max() < 1e-4, f"{primary} {text}: {rel.max():.2e}"
                    decoded[graphs] = rows
                assert np.array_equal(decoded[True], decoded[False]), f"{primary} {text}: graph steps differ"
            model.close()


@pytest.mark.gpu
@pytest.mark.parametrize("runtime", ["cuda", "hip"])
def test_the_multi_token_prediction_module_on_a_gpu(runtime):
    """DeepSeek-V3's MTP layer with the GPU as the target's and the module's primary: the target's hidden states (the
    final norm of every row, read back beside the logits, with the last row's logits alone too: the norm then the
    head as two operations) and the module's logits are transformers' within 1e-4 (graphs and queued steps the same
    bits), and speculative decoding with it gives the greedy tokens, its experts on the GPU or the CPU."""
    from engine.checkpoints.checkpoint import Checkpoint
    from engine.runs.speculative import generate

    folder = FIXTURES / "deepseek-bf16"
    ref = np.load(BY_NAME["deepseek-bf16"].next_token_reference)
    ids = ref["ids"]
    ck = Checkpoint.open(folder)
    with gpu_engine(runtime) as eng:
        gpu = f"{runtime}:0"
        target, module = eng.load(ck, device=gpu), eng.load(ck.next_token_module(), device=gpu)
        with target.context(len(ids), n_batch=16) as tc:
            last, hidden = tc.eval_hidden(ids, all_rows=False)
            tc.truncate(0)
            _, every = tc.eval_hidden(ids, all_rows=True)
            tc.truncate(0)
            _, few = tc.eval_hidden(ids[:3], all_rows=False)  # rows few enough for the fused norm: the norm alone
        assert np.array_equal(hidden, every)
        np.testing.assert_allclose(hidden, ref["hidden"], atol=1e-4, rtol=0)
        np.testing.assert_allclose(few, ref["hidden"][:3], atol=1e-4, rtol=0)
        for placement in (f"*={gpu}", "*=cpu:0", f"0.0-7=cpu:0; 0.8-15={gpu}"):
            module.set_placement(placement)
            rows = {}
            for graphs in (True, False):
                with module.context(len(ids)) as mc:
                    mc.graphs = graphs
                    first, _ = mc.eval_hidden(ids[1:40], hidden_in=hidden[:39])
                    steps = [mc.eval_hidden(ids[j + 1 : j + 2], hidden_in=hidden[j : j + 1])[0] for j in range(39, 90)]
                    rows[graphs] = np.concatenate([first, *steps])
            assert np.array_equal(rows[True], rows[False]), placement
            np.testing.assert_allclose(rows[True], ref["mtp_logits"], atol=1e-4, rtol=0)
            with target.context(80) as tc, module.context(80) as mc:
                prompt = ids[:27].tolist()
                assert generate(tc, mc, prompt, 40, 3) == ids[27:67].tolist(), placement


def rows_and_ids(model, placement, precision, prompt, generated):
    """Every position's logits (the prompt in one prefill, then one token at a time) and the greedy tokens."""
    model.set_placement(placement)
    with model.context() as ctx:
        ctx.precision = precision
        rows = np.concatenate([ctx.prefill(prompt)] + [ctx.decode([t]) for t in generated])
        ctx.truncate(0)
        return rows, ctx.generate(prompt, len(generated)).ids


def cuda_and_hip(**options) -> Engine:
    """An engine with a cuda and a hip device in one process (runtime_options: options), or a skip saying why not."""
    if not (built("cuda") and built("hip")):
        pytest.skip("needs the cuda and hip modules (EXPERTBENCH_HIP_PLATFORM=nvidia builds hip with nvcc)")
    eng = Engine(runtimes=("cpu", "cuda", "hip"), strict=False, runtime_options=options)
    names = [d.name for d in eng.devices]
    if not {"cuda:0", "hip:0"} <= set(names):
        eng.close()
        pytest.skip(f"needs a cuda and a hip device in one process (this machine has {', '.join(names)}): runs on "
                    "the GPU machine with the hip module built for the NVIDIA platform")  # fmt: skip
    return eng


@pytest.mark.gpu
@pytest.mark.parametrize("primary", ["cuda:0", "hip:0"])
def test_cuda_and_hip_own_experts_of_one_model_with_the_bits_of_one_device(primary):
    """Two runtime modules in one process, each owning experts of one model (on the GPU machine, the hip module built
    for the NVIDIA platform beside the cuda module on the same card: EXPERTBENCH_HIP_PLATFORM=nvidia): every layer
    split between them, whole layers on each, and the CPU as a third owner. In the q8 precision (integer products,
    the cpu module's bits on every device) the logits of every expert on the primary bit for bit; in f32 (the GPU's
    expert kernels sum in another order than the primary's fused MoE, as a GPU against the CPU: not the same bits)
    within 1e-5 and the same greedy tokens; a speculative run gives the greedy tokens."""
    from engine.runs.run import DecodeRun

    with cuda_and_hip() as eng:
        other = "hip:0" if primary == "cuda:0" else "cuda:0"
        placements = [f"*={primary}; *.1={other}; *.3={other}; *.5-7={other}", f"*={primary}; 0={other}",
                      f"*={other}", f"*={primary}; *.0-1={other}; *.6-7=cpu:0"]  # fmt: skip
        for path, precision in ((FIXTURES / "qwen3moe-gguf" / "model-q4_k_m.gguf", "q8"),
                                (FIXTURES / "qwen3moe-f32", "f32")):  # fmt: skip
            ref = np.load(path.parent / "reference-q4_k_m.npz" if path.is_file() else path / "reference.npz")
            prompt, generated = ref["prompt_ids"], ref["generated_ids"]
            model = eng.load(path, device=primary)
            alone, alone_ids = rows_and_ids(model, f"*={primary}", precision, prompt, generated)
            for text in placements:
                rows, ids = rows_and_ids(model, text, precision, prompt, generated)
                assert ids == alone_ids, f"{precision} {text}"
                if precision == "q8":
                    assert np.array_equal(rows, alone), f"q8 {text}"
                else:
                    rel = np.linalg.norm(rows - alone, axis=1) / np.linalg.norm(alone, axis=1)
                    assert rel.max() < 1e-5, f"f32 {text}: {rel.max():.2e}"
            assert model.counters()["devices"][other]["experts_run"] > 0
            if precision == "f32":
                draft = eng.load(FIXTURES / "qwen3-f32", device=primary)
                split = placements[0]
                run = {"prompts": ["hello world"], "tokens_per_prompt": 24, "placement": split}
                greedy = DecodeRun(model, None, **run).run()
                assert DecodeRun(model, draft, q=3, **run).run().output_sha256 == greedy.output_sha256
                draft.close()
            model.close()
        model.close()


Q4_K_M = FIXTURES / "qwen3moe-gguf" / "model-q4_k_m.gguf"
SPLIT = "*=cuda:0; *.1=hip:0; *.3=hip:0; *.5-7=hip:0"
TOKENS = [3, 17, 42, 5, 9, 1, 30, 7]
GPU_ROUNDS = 60


@pytest.mark.gpu
def test_closing_a_context_model_or_engine_while_a_cuda_and_hip_step_is_in_flight():
    """The lifecycle of the two-owner bridge: a context, its model or the engine closed from this thread while
    another decodes with every layer split between cuda:0 and hip:0 (branches queued on both runtimes' streams,
    staging arenas in use). The close waits for the step in flight; the decoding thread finishes or finds its handle
    closed (StateError); nothing crashes, and a new engine then runs the split with the bits of one device."""
    with cuda_and_hip() as eng:
        model = eng.load(Q4_K_M, device="cuda:0")
        with model.context(len(TOKENS)) as ctx:
            ctx.precision = "q8"
            want = np.concatenate([ctx.decode([t]) for t in TOKENS])
        model.set_placement(SPLIT)
        for r in range(GPU_ROUNDS):
            ctx = model.context(16)
            ctx.precision = "q8"

            def decode(ctx=ctx):
                for t in TOKENS:
                    ctx.decode([t])

            err = race(decode, ctx.close, r)
            assert err is None or (isinstance(err, StateError) and "this Context is closed" in str(err)), repr(err)
            assert ctx.closed
        with model.context(len(TOKENS)) as ctx:
            ctx.precision = "q8"
            assert np.array_equal(np.concatenate([ctx.decode([t]) for t in TOKENS]), want)

    def open_split():
        eng = cuda_and_hip()
        model = eng.load(Q4_K_M, device="cuda:0")
        model.set_placement(SPLIT)
        return eng, model

    close_while_decoding(open_split, TOKENS, GPU_ROUNDS // 4)


@pytest.mark.gpu
def test_placing_experts_between_cuda_and_hip_while_another_thread_decodes_changes_no_bit():
    """Placements moved between cuda:0, hip:0 and the CPU while another thread decodes in q8 (every device's
    products the cpu module's bits): each step waits for a placement in flight, no step sees half of one, and every
    round's logits are those of every expert on cuda:0."""
    with cuda_and_hip() as eng:
        model = eng.load(Q4_K_M, device="cuda:0")
        placements = [SPLIT, "*=hip:0", "*=cuda:0; 0=hip:0; 1.3-5=cpu:0", "*=cuda:0"]
        with model.context(len(TOKENS)) as ctx:
            ctx.precision = "q8"
            expected = np.concatenate([ctx.decode([t]) for t in TOKENS])
            place_while_decoding(model, ctx, TOKENS, placements, expected, GPU_ROUNDS // 4, 4)


@pytest.mark.gpu
def test_a_staging_that_does_not_fit_on_hip_is_an_error_and_the_context_still_works():
    """The bridge's staging failure on a real card: hip:0 under a memory limit (runtime_options memory_limit, the
    GPU modules' cap on what they allocate) with room for its experts and a short batch's staging, not a long one's.
    The long prefill raises an error naming hip:0, what it needed and what it had; the cuda:0 branch queued beside it
    is waited for; the context then runs short prefills and decodes with the unlimited engine's bits, and its staging
    goes with it."""
    prompt = list(range(1, 41))
    with cuda_and_hip() as eng, eng.load(Q4_K_M, device="cuda:0") as model:
        model.set_placement(SPLIT)
        weights = model.counters()["devices"]["hip:0"]["weight_bytes"]
        with model.context(64) as ctx:
            ctx.precision = "q8"
            want_short, want_next = ctx.prefill(prompt[:3]), ctx.decode([4])
    with cuda_and_hip(hip={"memory_limit": weights + 48_000}) as eng, eng.load(Q4_K_M, device="cuda:0") as model:
        hip = next(d for d in eng.devices if d.name == "hip:0")
        model.set_placement(SPLIT)
        with model.context(64) as ctx:
            ctx.precision = "q8"
            free = next(d for d in eng.devices if d.name == "hip:0").memory_free
            assert free <= 48_000 and hip.memory_total == weights + 48_000
            for _ in range(2):
                with pytest.raises(OutOfMemoryError, match=r"hip:0: out of device memory: the staging of a batch of "
                                                           r"40 tokens \(\d+ expert rows\) needs \d+ bytes, \d+ "
                                                           r"free \(of \d+\)"):  # fmt: skip
                    ctx.prefill(prompt)
                assert ctx.position == 0
            assert np.array_equal(ctx.prefill(prompt[:3]), want_short)
            assert np.array_equal(ctx.decode([4]), want_next)
        assert next(d for d in eng.devices if d.name == "hip:0").memory_free == free


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["deepseek-v4-f32", "deepseek-v4-bf16"])
@pytest.mark.parametrize("runtime", ["cuda", "hip"])
def test_deepseek_v4_experts_on_the_gpu_and_its_primary_refused_by_name(runtime, name):
    """The GPU modules have no "deepseek_v4" extension: a V4 model on a GPU primary is refused naming it; on a CPU
    primary its routed experts (the clamped SwiGLU, hash-routed layers too) run on the GPU with transformers' logits
    within 1e-4 and the fixture's 64 greedy tokens."""
    with gpu_engine(runtime) as eng:
        gpu = f"{runtime}:0"
        with pytest.raises(UnsupportedError, match=rf"primary device {gpu}: the '{runtime}' runtime lacks the "
                                                   r"extension 'deepseek_v4' version 1 that DeepSeek-V4's forward "
                                                   r"pass needs"):  # fmt: skip
            eng.load(FIXTURES / name, device=gpu)
        ref = np.load(FIXTURES / name / "reference.npz")
        prompt, generated, logits = ref["prompt_ids"], ref["generated_ids"], ref["logits"]
        model = eng.load(FIXTURES / name, device="cpu:0")
        for text in (f"*={gpu}", f"*=cpu:0; 0={gpu}; 2.1-5={gpu}"):
            model.set_placement(text)
            with model.context(n_batch=8) as ctx:
                rows = np.concatenate([ctx.prefill(prompt)] + [ctx.decode([t]) for t in generated])
                ctx.truncate(0)
                assert ctx.generate(prompt, 64).ids == generated.tolist(), text
            rel = np.linalg.norm(rows - logits, axis=1) / np.linalg.norm(logits, axis=1)
            assert rel.max() < 1e-4, f"{text}: {rel.max():.2e}"
        assert model.counters()["devices"][gpu]["rows"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("runtime", ["cuda", "hip"])
def test_a_gpu_primary_keeps_its_kv_cache_in_f32_and_refuses_a_half_one_by_name(runtime):
    """The GPU modules' attention reads an f32 cache only (no kv_formats): a half cache on a GPU primary is refused
    naming the device; on a CPU primary whose experts are on the GPU it runs (the cache is the primary's)."""
    with gpu_engine(runtime) as eng:
        gpu = f"{runtime}:0"
        assert next(d for d in eng.devices if d.name == gpu).kv_caches == ("f32",)
        refused = pytest.raises(UnsupportedError, match=f"a f16 KV cache: the primary device {gpu} keeps its cache "
                                                        "in f32 only")  # fmt: skip
        with eng.load(FIXTURES / "qwen3moe-f32", device=gpu) as model, refused:
            model.context(16, kv="f16")
        with eng.load(FIXTURES / "qwen3moe-f32", device="cpu:0") as model:
            model.set_placement(f"*={gpu}")
            with model.context(16, kv="f16") as ctx:
                assert np.isfinite(ctx.prefill([1, 2, 3])).all()
