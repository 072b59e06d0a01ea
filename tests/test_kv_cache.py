"""The KV cache in f16 or bf16 (`Context(kv=...)`, `DecodeRun(kv=...)`, `expertbench run --kv`): half the cache's
bytes, each key and value rounded to the nearest when stored and read back exactly, so the attention's arithmetic is
the f32 cache's on rounded keys and values. A fast mode: close to the reference (f32) but not its bits, and as
deterministic as it: batch == single steps, the same bits on every placement and primary, truncation and speculative
decoding as in f32. Families whose cache is other state (MLA's latent, DeepSeek-V4's) and primaries whose module keeps
f32 only are refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fixture_paths import FIXTURES
from runtime_wrappers import wrapped_module

from engine.cli import main
from engine.core.errors import ArgumentError, UnsupportedError
from engine.model import Engine
from engine.runs.history import outputs_key
from engine.runs.quality import quality_cost
from engine.runs.run import DecodeRun

MOE, GPT_OSS = FIXTURES / "qwen3moe-f32", FIXTURES / "gpt-oss-bf16"  # gpt-oss: sinks, a sliding window's ring
PROMPT = [5, 17, 42, 9, 33, 2, 61, 7, 11, 3]


@pytest.fixture(scope="module")
def engine():
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=2, cpu_threads=1) as eng:
        yield eng


def rows(model, kv: str, ids=PROMPT, n_batch: int = 512) -> np.ndarray:
    with model.context(64, n_batch=n_batch, kv=kv) as ctx:
        return ctx.prefill(list(ids))


@pytest.mark.parametrize("name", [MOE, GPT_OSS])
def test_a_half_cache_is_close_to_the_reference_and_not_its_bits(engine, name):
    """Keys and values rounded to f16 (10 mantissa bits) or bf16 (7): every position's logits near f32's (bf16 further
    than f16), none of them the f32 bits over a prompt (the cache really is halved)."""
    model = engine.load(name)
    try:
        ref = rows(model, "f32")
        err = {}
        for kv in ("f16", "bf16"):
            got = rows(model, kv)
            err[kv] = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
            assert not np.array_equal(got, ref), kv
        assert err["f16"].max() < 2e-3 and err["bf16"].max() < 2e-2, {k: v.max() for k, v in err.items()}
        assert err["f16"].max() < err["bf16"].max()
    finally:
        model.close()


@pytest.mark.parametrize("kv", ["f16", "bf16"])
def test_a_half_cache_gives_the_same_bits_in_any_batch_on_any_placement_and_primary(engine, kv):
    """As the f32 cache: one prefill, batches of 3 and one token at a time give the same rows; experts over cpu:0,
    cpu:1 and hostsim:0 and a hostsim primary change no bit; truncating back and decoding again gives the same rows."""
    model = engine.load(MOE)
    try:
        want = rows(model, kv)
        assert np.array_equal(rows(model, kv, n_batch=3), want)
        with model.context(64, kv=kv) as ctx:
            single = np.concatenate([ctx.decode([t]) for t in PROMPT])
            assert np.array_equal(single, want)
            ctx.truncate(4)
            assert np.array_equal(np.concatenate([ctx.decode([t]) for t in PROMPT[4:]]), want[4:])
        for placement in ("*=cpu:1", "*=cpu:0; 0=hostsim:0; 2.3-6=cpu:1"):
            model.set_placement(placement)
            assert np.array_equal(rows(model, kv), want), placement
    finally:
        model.close()
    on_hostsim = engine.load(MOE, device="hostsim:0")
    try:
        assert np.array_equal(rows(on_hostsim, kv), want)
    finally:
        on_hostsim.close()


def test_a_half_cache_holds_half_the_bytes_on_the_primary():
    """A hostsim primary's free memory (under a limit, which it counts against): a context with an f16 cache takes the
    f32 cache's bytes less half of them (keys and values of every layer and position), within the buffers'
    alignment."""
    limit = {"hostsim": {"memory_limit": 1 << 30}}
    with Engine(runtimes=("cpu", "hostsim"), runtime_options=limit) as eng, eng.load(MOE, device="hostsim:0") as model:

        def free() -> int:
            return next(d.memory_free for d in eng.devices if d.name == "hostsim:0")

        before, used = free(), {}
        for kv in ("f32", "f16"):
            ctx = model.context(256, kv=kv)
            used[kv] = before - free()
            ctx.close()
        assert free() == before
        cfg = model.config
        cache = cfg.num_layers * 256 * cfg.num_kv_heads * cfg.head_dim * 2 * 4  # keys and values, f32
        assert used["f16"] > 0 and abs((used["f32"] - used["f16"]) - cache // 2) <= 4096, (used, cache)


def test_speculative_decoding_with_a_half_cache_gives_the_greedy_tokens(engine):
    target, draft = engine.load(MOE), engine.load(FIXTURES / "qwen3-f32")
    try:
        run = {"prompts": ["hello world", [3, 4, 5]], "tokens_per_prompt": 24, "kv": "f16"}
        greedy = DecodeRun(target, **run).run()
        spec = DecodeRun(target, draft, q=3, **run).run()
        assert greedy.kv == spec.kv == "f16" and spec.output_sha256 == greedy.output_sha256
    finally:
        target.close()
        draft.close()


def test_the_quality_cost_of_a_half_cache_is_measured_against_the_reference(engine):
    model = engine.load(MOE)
    try:
        cost = quality_cost(model, prompts=[PROMPT], tokens=16, kv="bf16")
        assert cost.kv == "bf16" and cost.fast_mode == "bf16 KV cache" and cost.to_dict()["kv"] == "bf16"
        assert cost.positions == 16 and cost.mean_kl > 0 and cost.agreement > 0.5
        f32 = DecodeRun(model, prompts=[PROMPT], tokens_per_prompt=16).run()
        with pytest.raises(ArgumentError, match="the fast run ran in reference, f32: expected reference, f32, a bf16 "
                                                "KV cache"):  # fmt: skip
            quality_cost(model, prompts=[PROMPT], tokens=16, kv="bf16", fast_result=f32)
    finally:
        model.close()
    # runs with another cache give other outputs: they are compared only with runs of the same cache
    key = outputs_key("t", ["p"], 16, "f32", "reference")
    assert outputs_key("t", ["p"], 16, "f32", "reference", kv="f16") not in (key, outputs_key(
        "t", ["p"], 16, "f32", "reference", kv="bf16"))  # fmt: skip


@pytest.mark.parametrize(
    ("name", "why"),
    [("deepseek-f32", "DeepSeek-V3 keeps its attention state \\(MLA's compressed latent\\) in f32 only"),
     ("deepseek-v4-f32", "DeepSeek-V4 keeps its attention state \\(its compressed entries\\) in f32 only")],
)  # fmt: skip
def test_families_whose_cache_is_other_state_refuse_a_half_cache_by_name(engine, name, why):
    model = engine.load(FIXTURES / name)
    try:
        with pytest.raises(UnsupportedError, match=f"a f16 KV cache: {why}"):
            model.context(16, kv="f16")
        with pytest.raises(UnsupportedError, match=why):
            DecodeRun(model, prompts=[[1, 2]], tokens_per_prompt=2, kv="bf16").run()
        with model.context(16) as ctx:  # the f32 cache still works
            assert np.isfinite(ctx.prefill([1, 2, 3])).all()
    finally:
        model.close()


def test_bad_cache_formats_are_refused_by_name(engine):
    model = engine.load(MOE)
    try:
        for bad in ("fp8", "F16", None, 16):
            with pytest.raises(ArgumentError, match=f"KV cache {bad!r}: expected one of f32, f16, bf16"):
                model.context(16, kv=bad)
        with pytest.raises(ArgumentError, match="KV cache 'q8' is unknown: expected one of f32, f16, bf16"):
            DecodeRun(model, prompts=[[1]], tokens_per_prompt=1, kv="q8")
    finally:
        model.close()


def test_a_primary_whose_module_keeps_f32_only_refuses_a_half_cache(tmp_path):
    """hostsim's module wrapped to report no half cache formats (as the GPU modules report): a context with an f16
    cache on a hostsim primary is refused naming the device; on a CPU primary beside it, and in f32 there, it runs."""
    report = r"""
static int (*real_info)(void *, int, eb_rt_device_info *, char *, size_t);
static int info(void *rt, int dev, eb_rt_device_info *i, char *err, size_t errlen) {
    int st = real_info(rt, dev, i, err, errlen);
    i->kv_formats = 0;
    return st;
}
"""
    module = wrapped_module(tmp_path, report, "real_info = table.device_info; table.device_info = info;")
    with Engine(runtimes=("cpu", "hostsim"), module_paths={"hostsim": module}) as eng:
        assert next(d for d in eng.devices if d.name == "hostsim:0").kv_caches == ("f32",)
        assert next(d for d in eng.devices if d.name == "cpu:0").kv_caches == ("f32", "f16", "bf16")
        model = eng.load(MOE, device="hostsim:0")
        with pytest.raises(UnsupportedError, match="a f16 KV cache: the primary device hostsim:0 keeps its cache in "
                                                   "f32 only"):  # fmt: skip
            model.context(16, kv="f16")
        assert np.isfinite(rows(model, "f32")).all()
        model.close()
        on_cpu = eng.load(MOE, device="cpu:0")
        on_cpu.set_placement("*=hostsim:0")  # experts on the f32-only module: the cache is the primary's alone
        assert np.isfinite(rows(on_cpu, "f16")).all()
        on_cpu.close()


def test_run_kv_prints_the_cache_and_its_quality_cost(tmp_path, capsys):
    code = main(["run", "--model", str(MOE), "--no-draft", "-n", "8", "--repeats", "1", "--kv", "f16", "--prompt",
                 "hello", "--json"])  # fmt: skip
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kv"] == "f16" and report["quality"]["fast_mode"] == "f16 KV cache"
    assert main(["run", "--model", str(MOE), "--no-draft", "-n", "4", "--repeats", "1", "--kv", "f16", "--prompt",
                 "hi", "--no-quality"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "kv cache  f16 (half the cache's bytes" in out
    with pytest.raises(SystemExit):
        main(["run", "--model", str(MOE), "--kv", "f8"])
    assert "invalid choice: 'f8'" in capsys.readouterr().err


def test_a_profile_keeps_the_cache_format_and_refuses_a_typo_by_name(tmp_path):
    """run.kv is read and written back (a replay decodes with it: its hashes are those of runs with that cache,
    another outputs key); a format it does not know is an error naming the line and what is expected."""
    from engine.profiles import profile as P

    text = "expertbench_profile: 1\nmodel: {{demo: default}}\nrun:\n  tokens: 4\n  kv: {}\n"
    profile = P.loads(text.format("bf16"))
    assert profile.run.kv == "bf16" and profile.run.resolved()["kv"] == "bf16"
    assert "kv: bf16" in profile.to_yaml() and P.loads(profile.to_yaml()) == profile
    assert P.loads(text.format("f32").replace("  kv: f32\n", "")).run.resolved()["kv"] == "f32"
    with pytest.raises(P.ProfileError, match=r"<profile>:5.*run\.kv: expected one of f32, f16, bf16 \(the KV "
                                             r"cache's format; f32: the reference\), got 'f8'"):  # fmt: skip
        P.loads(text.format("f8"))
