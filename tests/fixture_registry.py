"""Every checkpoint under tests/fixtures/ with its reference, for the conformance suite (tests/test_conformance.py).

One entry per checkpoint the engine opens: a Hugging Face folder (its reference.npz beside it), or one GGUF file of a
`<family>-gguf/` folder (model-<quant>.gguf with its reference-<quant>.npz). Each reference holds transformers' own
logits at every position of a prompt and of its 64 greedy tokens (tests/fixtures/generate*.py wrote them; for a GGUF
file, transformers ran on the file's weights as the gguf package dequantizes them). An entry says how the engine
should meet it: the tolerance, which layers route and where their experts may go, how far the q8 precision may move
from the reference where the weights are quantized, and what is family-specific. tests/test_conformance.py checks that
the registry names every fixture on disk, so a new fixture cannot be left out of the suite.

A plain module, not a conftest: conftest names clash between test folders.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fixture_paths import FIXTURES

TOLERANCE = 1e-4  # relative L2 error of the logits per position, in the f32 precision (the reference mode's)
FLOAT_DTYPES = frozenset({"F32", "F16", "BF16"})  # read in f32 whatever the precision
TABLE_DTYPES = frozenset({"I64", "I32"})  # integer tables (DeepSeek-V4's tid2eid): no weight format, no precision
# Routed families with no quantized fixture yet, and why: the device checks run on their float folders only. None now.
FLOAT_ONLY: dict[str, str] = {}


@dataclass(frozen=True)
class Q8Tolerance:
    """How far the q8 precision (activations quantized per block, integer products, as llama.cpp's CPU kernels) may
    move from the reference, as statistics of the relative L2 error per position: rounding moves every logit a
    little; where two experts score nearly alike a routing choice flips, and a few positions differ by more."""

    median: float
    p90: float | None = None
    max: float | None = None


# llama.cpp's own quantized files: about 1 % relative L2 at the median position, as llama.cpp's CPU run of them gives
Q8_LLAMA_CPP = Q8Tolerance(median=0.03, p90=0.06)
# the IQ4_XS file: llama.cpp's own CPU run of it is as far from the reference (relative L2 median 0.021, 90th
# percentile 0.074, worst 0.41: 8-bit activations flip a few positions' routing), and the q8 precision with it
Q8_IQ4_XS = Q8Tolerance(median=0.03, p90=0.09)
# gpt-oss's MXFP4 experts: int8 activations beside biased experts and the clamped SwiGLU, near ties in the routing
Q8_GPT_OSS = Q8Tolerance(median=0.05, max=0.5)


@dataclass(frozen=True)
class Routing:
    """Which layers route (the rest are dense) and the placements the suite runs: their experts over cpu:0, cpu:1 and
    the host-staged hostsim:0, by whole layers and by single experts. `owner_local` puts experts on a peer so the
    owner-local sums differ from the reference's; `hostsim_peer` leaves experts on cpu:0 when hostsim:0 is the
    primary."""

    moe_layers: tuple[int, ...]
    num_experts: int
    placements: dict[str, str]
    owner_local: str
    hostsim_peer: str


QWEN3_MOE = Routing(  # layers 0 and 2 route, layer 1 is dense (mlp_only_layers)
    moe_layers=(0, 2),
    num_experts=8,
    placements={
        "all on cpu:0": "*=cpu:0",
        "all on cpu:1": "*=cpu:1",
        "split by layer": "0=cpu:1; 2=hostsim:0",
        "single experts scattered": "*=cpu:0; 0.1-3=cpu:1; 2.2=hostsim:0; 2.5-7=cpu:1",
    },
    owner_local="2=cpu:1",
    hostsim_peer="2=cpu:0",
)
QWEN3_MOE_GGUF = Routing(  # two layers, both routed
    moe_layers=(0, 1),
    num_experts=8,
    placements={
        "all on cpu:0": "*=cpu:0",
        "all on cpu:1": "*=cpu:1",
        "layer 0 on hostsim:0": "0=hostsim:0",
        "single experts scattered": "*=cpu:0; 0.1-3=cpu:1; 1.2=hostsim:0; 1.5-7=cpu:1",
    },
    owner_local="1=cpu:1",
    hostsim_peer="1=cpu:0",
)
DEEPSEEK_V3 = Routing(  # layer 0 is dense (first_k_dense_replace); the shared experts stay on the primary
    moe_layers=(1, 2, 3),
    num_experts=16,
    placements={
        "all on cpu:0": "*=cpu:0",
        "all on cpu:1": "*=cpu:1",
        "split by layer": "1=cpu:1; 2=hostsim:0",
        "single experts scattered": "*=cpu:0; 1.3=cpu:1; 1.9-12=hostsim:0; 2.0=cpu:1; 3.15=hostsim:0",
    },
    owner_local="1-2=cpu:1",
    hostsim_peer="1=cpu:0",
)
DEEPSEEK_V4 = Routing(  # every layer routes: 0 and 1 by token id (tid2eid), 2 and 3 by their router
    moe_layers=(0, 1, 2, 3),
    num_experts=8,
    placements={
        "all on cpu:0": "*=cpu:0",
        "all on cpu:1": "*=cpu:1",
        "split by layer": "1=cpu:1; 2-3=hostsim:0",
        "single experts scattered": "*=cpu:0; 0.3=cpu:1; 1.1-5=hostsim:0; 2.0=cpu:1; 3.7=hostsim:0",
    },
    owner_local="1-2=cpu:1",
    hostsim_peer="1=cpu:0",
)
GPT_OSS = Routing(  # every layer routes
    moe_layers=(0, 1, 2, 3),
    num_experts=8,
    placements={
        "all on cpu:0": "*=cpu:0",
        "all on cpu:1": "*=cpu:1",
        "split by layer": "1=cpu:1; 2-3=hostsim:0",
        "single experts scattered": "*=cpu:0; 0.3=cpu:1; 1.1-5=hostsim:0; 2.0=cpu:1; 3.7=hostsim:0",
    },
    owner_local="1-2=cpu:1",
    hostsim_peer="1=cpu:0",
)


@dataclass(frozen=True)
class Fixture:
    """One checkpoint and its reference.

    family: the engine's architecture name (ModelConfig.architecture). format: the folder's dtype or the GGUF file's
    llama.cpp file type. dtypes: the tensor formats the checkpoint holds (F32, BF16, U8 for MXFP4 blocks and scales in
    transformers' layout, Q4_K, ...). routing: None for a dense model. q8: the q8 precision's tolerance where the
    weights are quantized (on float weights the q8 precision gives the f32 bits). same_bits_as: the folder a GGUF file
    was converted from without rounding, whose logits it gives bit for bit. n_batch: the context's batch where a
    family needs a small one for the batch == single check (gpt-oss: its window's ring of window + n_batch - 1 rows
    then wraps inside the batch). devices: the fixture runs the checks over several devices (placements, the
    owner-local sums, a host-staged primary); every routed family does in a float layout and a quantized one, and the
    other fixtures repeat a family and a layout of these."""

    name: str
    family: str
    format: str
    path: Path
    reference: Path
    dtypes: frozenset[str]
    routing: Routing | None
    tolerance: float = TOLERANCE
    q8: Q8Tolerance | None = None
    same_bits_as: str | None = None
    n_batch: int = 512
    devices: bool = False
    # the reference of the checkpoint's multi-token-prediction module (tests/test_next_token_module.py), where it
    # holds one
    next_token_reference: Path | None = None

    @property
    def is_gguf(self) -> bool:
        return self.path.suffix == ".gguf"

    @property
    def quantized(self) -> bool:
        return not self.dtypes - TABLE_DTYPES <= FLOAT_DTYPES

    @property
    def precisions(self) -> tuple[str, ...]:
        """The activation precisions whose output differs: q8 only where the weights are quantized."""
        return ("f32", "q8") if self.quantized else ("f32",)


def folder(name: str, family: str, fmt: str, dtypes: set[str], routing: Routing | None, **kw) -> Fixture:
    return Fixture(name, family, fmt, FIXTURES / name, FIXTURES / name / "reference.npz", frozenset(dtypes), routing,
                   **kw)  # fmt: skip


def gguf(folder_name: str, quant: str, family: str, dtypes: set[str], routing: Routing, **kw) -> Fixture:
    where = FIXTURES / folder_name
    return Fixture(f"{folder_name}/{quant}", family, quant, where / f"model-{quant}.gguf",
                   where / f"reference-{quant}.npz", frozenset(dtypes), routing, **kw)  # fmt: skip


def lowbit(quant: str, dtypes: set[str], **kw) -> Fixture:
    """A file of qwen3moe-gguf-lowbit/ (its norms and router F32, beside the types it holds)."""
    kw.setdefault("q8", Q8_LLAMA_CPP)
    return gguf("qwen3moe-gguf-lowbit", quant, "qwen3_moe", {"F32", *dtypes}, QWEN3_MOE_GGUF, **kw)


K_QUANTS = {"F32", "Q4_K", "Q5_K", "Q6_K", "Q8_0"}  # Q4_K_M: Q4_K, with Q5_K, Q6_K and Q8_0 where llama.cpp keeps more
MXFP4_MOE = {"F32", "Q8_0", "MXFP4"}  # MXFP4 experts, the other matrices Q8_0
REGISTRY: list[Fixture] = [
    # Qwen3 (dense) and Qwen3-MoE, transformers' folders (tests/fixtures/generate.py)
    folder("qwen3moe-f32", "qwen3_moe", "f32", {"F32"}, QWEN3_MOE, devices=True),
    folder("qwen3moe-bf16", "qwen3_moe", "bf16", {"BF16"}, QWEN3_MOE),  # sharded: model.safetensors.index.json
    folder("qwen3-f32", "qwen3", "f32", {"F32"}, None),
    folder("qwen3-bf16", "qwen3", "bf16", {"BF16"}, None),
    # DeepSeek-V3: MLA, YaRN, grouped sigmoid routing, shared experts, a leading dense layer (recipes/deepseek.py)
    folder("deepseek-f32", "deepseek_v3", "f32", {"F32"}, DEEPSEEK_V3, devices=True),
    folder(
        "deepseek-bf16",
        "deepseek_v3",
        "bf16",
        {"BF16"},
        DEEPSEEK_V3,
        devices=True,  # sharded, an MTP layer
        next_token_reference=FIXTURES / "deepseek-bf16" / "reference-mtp.npz",
    ),  # fmt: skip
    folder("deepseek-noqlora-f32", "deepseek_v3", "f32", {"F32"}, DEEPSEEK_V3),  # q_lora_rank null: q_proj
    # gpt-oss: sinks, sliding windows, YaRN, clamped SwiGLU (recipes/gpt_oss.py); bf16 as transformers saves it, and
    # the released layout with MXFP4 experts (U8 blocks and scales)
    folder("gpt-oss-bf16", "gpt_oss", "bf16", {"BF16"}, GPT_OSS, n_batch=8, devices=True),
    folder("gpt-oss-mxfp4", "gpt_oss", "mxfp4", {"BF16", "U8"}, GPT_OSS, q8=Q8_GPT_OSS, n_batch=8, devices=True),
    # llama.cpp's converter and quantizer (recipes/qwen3moe_gguf.py); references on the dequantized weights
    gguf("qwen3moe-gguf", "f32", "qwen3_moe", {"F32"}, QWEN3_MOE_GGUF),
    gguf("qwen3moe-gguf", "q8_0", "qwen3_moe", {"F32", "Q8_0"}, QWEN3_MOE_GGUF, q8=Q8_LLAMA_CPP),
    gguf("qwen3moe-gguf", "q4_k_m", "qwen3_moe", K_QUANTS, QWEN3_MOE_GGUF, q8=Q8_LLAMA_CPP, devices=True),
    gguf("qwen3moe-gguf", "mxfp4_moe", "qwen3_moe", MXFP4_MOE, QWEN3_MOE_GGUF, q8=Q8_LLAMA_CPP, devices=True),
    # the small types users download, by llama.cpp's llama-imatrix and llama-quantize (recipes/qwen3moe_lowbit.py):
    # its presets as it picks their per-tensor types, IQ2_XXS with Q2_K down projections, an unsloth-style i-quant mix
    # (an expert's gate, up and down in three types, others in the other layer)
    lowbit("q4_0", {"Q4_0", "Q6_K", "Q8_0"}),
    lowbit("q2_k", {"Q2_K", "Q3_K", "Q5_K", "Q6_K", "Q8_0"}),
    lowbit("q3_k_m", {"Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_0"}),
    lowbit("iq4_xs", {"IQ4_XS", "Q5_K", "Q6_K", "Q8_0"}, q8=Q8_IQ4_XS),
    lowbit("iq2_xxs", {"IQ2_XXS", "Q2_K", "Q4_K", "Q5_K"}, devices=True),
    lowbit(
        "ud_mix",
        {"IQ1_M", "IQ1_S", "IQ2_XS", "IQ3_S", "IQ3_XXS", "IQ4_XS", "Q2_K", "Q4_K", "Q6_K", "Q8_0"},
        devices=True,
    ),  # fmt: skip
    # kv_b_proj split into attn_k_b and attn_v_b by llama.cpp's converter: the same f32 values
    gguf("deepseek-gguf", "f32", "deepseek_v3", {"F32"}, DEEPSEEK_V3, same_bits_as="deepseek-f32"),
    gguf("deepseek-gguf", "q8_0", "deepseek_v3", {"F32", "Q8_0"}, DEEPSEEK_V3, q8=Q8_LLAMA_CPP, devices=True),
    # converted from gpt-oss-mxfp4: its MXFP4 blocks repacked into ggml's (the same codes and exponents), the rest
    # widened to f32
    gguf(
        "gpt-oss-gguf",
        "mxfp4_moe",
        "gpt_oss",
        {"F32", "MXFP4"},
        GPT_OSS,
        q8=Q8_GPT_OSS,
        n_batch=8,
        devices=True,
        same_bits_as="gpt-oss-mxfp4",
    ),
    # DeepSeek-V4: sliding-window, CSA and HCA layers, hash routing, mHC (recipes/deepseek_v4.py); n_batch 8: a batch
    # ends inside compressed windows and its rows span the sliding window
    folder("deepseek-v4-f32", "deepseek_v4", "f32", {"F32", "I64"}, DEEPSEEK_V4, n_batch=8, devices=True),
    # sharded
    folder("deepseek-v4-bf16", "deepseek_v4", "bf16", {"BF16", "F32", "I64"}, DEEPSEEK_V4, n_batch=8, devices=True),
    # the released layout (FP8 matrices in 128 x 128 blocks, FP4 experts) through llama.cpp's converter
    # (recipes/deepseek_v4_gguf.py): its deepseek4 file, the FP8 matrices Q8_0, the experts MXFP4, tid2eid I32
    gguf(
        "deepseek-v4-gguf",
        "mxfp4_moe",
        "deepseek_v4",
        {"F32", "Q8_0", "MXFP4", "I32"},
        DEEPSEEK_V4,
        q8=Q8_LLAMA_CPP,
        n_batch=8,
        devices=True,
    ),
]
# Fixtures of a family the engine reads but cannot run yet (engine.families.AWAITING): named here so that the registry
# still names every fixture on disk, held to the family's refusal by its test file, and moved into REGISTRY, and so
# into the conformance suite, with the family's forward pass. None now.
AWAITING: list[Fixture] = []
BY_NAME = {f.name: f for f in REGISTRY}
ROUTED = [f for f in REGISTRY if f.routing is not None]
ON_DEVICES = [f for f in ROUTED if f.devices]
QUANTIZED = [f for f in REGISTRY if f.quantized]
# A host-staged primary: one folder of each routed family (gpt-oss in its MXFP4 layout, whose blocks are staged as such)
HOSTSIM_PRIMARY = [BY_NAME[name] for name in ("qwen3moe-f32", "deepseek-f32", "gpt-oss-mxfp4", "deepseek-v4-f32")]


# The CPU kernels are chosen per weight format. The portable ones' batch checks run on the Qwen3 folders (f32 and
# bf16, dense and routed feed-forwards) and on the k-quant file (Q4_K, Q5_K, Q6_K and Q8_0 blocks)
PORTABLE_FLOAT_COVER = [f for f in REGISTRY if f.family in ("qwen3", "qwen3_moe") and not f.is_gguf]
PORTABLE_QUANTIZED_COVER = [f for f in REGISTRY if f.format == "q4_k_m"]


def fixtures_on_disk() -> tuple[set[Path], set[Path]]:
    """(checkpoints, references) under tests/fixtures/: every folder holding a config.json but no GGUF file is a
    checkpoint with its reference.npz (and reference-mtp.npz for its multi-token-prediction module); in a folder of GGUF
    files, each file is one, with its reference-<quant>.npz."""
    checkpoints, references = set(), set()
    for sub in sorted(p for p in FIXTURES.iterdir() if p.is_dir() and p.name not in ("__pycache__", "recipes")):
        files = list(sub.glob("model-*.gguf"))  # beside them: imatrix.gguf, the importance matrix they were made with
        checkpoints |= set(files) if files else {sub}
        references |= set(sub.glob("reference*.npz"))
    return checkpoints, references


# ---- the CPU the suite runs on --------------------------------------------------------------------------------


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
