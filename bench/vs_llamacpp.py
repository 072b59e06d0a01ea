"""Side by side with llama.cpp on the same checkpoint: decode and prefill speed, and whether greedy tokens agree.

Float formats (--dtypes bf16 f32): the demo checkpoint is converted to GGUF with llama.cpp's own
convert_hf_to_gguf.py (from the llama-cpp-python source package) and run by llama.cpp through llama-cpp-python,
built from source for this CPU (-DGGML_NATIVE=ON), in a virtual environment this script makes under
~/.cache/expertbench/bench-llamacpp (a first run builds it: several minutes). Both engines get the same thread
count, the same token ids (ours), the same prompt and token counts; llama.cpp's KV cache is set to f32 to match
ours. Prints our/their ratios, writes JSON. Our engine holds the weights as --weights says (auto: copied onto huge
pages where the kernel allows it); llama.cpp memory-maps its GGUF file by default (--llama-mmap off: it reads it
into its own buffers instead). With --rounds N both engines are measured N times, alternating which goes first, and
the ratio is the median of the rounds' ratios (a shared machine's speed drifts over minutes).

    python bench/vs_llamacpp.py --size bench --dtypes bf16 f32 --rounds 3 --json bench/results/vs_llamacpp.json

Quantized files (--quants q8_0 q4_k_m mxfp4_moe): the demo checkpoint converted to an F32 GGUF as above, then
quantized by llama.cpp's own quantizer (llama_model_quantize, the types it picks per tensor), and that one file run by
both engines; ours in each of --precisions (q8: activations quantized per 32 values as llama.cpp does; f32: the
reference). On a CPU with AMX, llama-cpp-python 0.3.36 built for it (GGML_NATIVE) crashes on quantized files (a
SIGSEGV in ggml_backend_amx_mul_mat, with or without use_extra_bufts): --llama-run-env names an environment whose
llama.cpp is built with every AVX-512 extension (VNNI, VBMI, BF16) and without AMX, which then runs them, repacking
included.

    python bench/vs_llamacpp.py --size bench --dtypes --quants q8_0 q4_k_m mxfp4_moe --rounds 3 \
        --json bench/results/vs_llamacpp_quant.json

--llama-env PATH uses an existing environment with llama-cpp-python (and torch, transformers) instead of building
one, e.g. the one tests/fixtures/generate_gguf.py uses.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

from engine.checkpoint import Checkpoint
from engine.demo import DEMO_PROMPTS
from engine.model import Engine

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from checkpoints import demo_target  # noqa: E402
from measure import add_common_arguments, decode_speed, prefill_ids, prefill_speed, write_report  # noqa: E402

LLAMA_CPP_PYTHON = "0.3.36"
WORK = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "expertbench" / "bench-llamacpp"
VENV = WORK / "venv"
PY = VENV / "bin" / "python"
SRC = WORK / "sdist" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"

# Runs inside the llama-cpp-python environment; prints one JSON document.
RUNNER = r"""
import json, sys, time
import numpy as np
from llama_cpp import Llama
cfg = json.loads(sys.argv[1])
llm = Llama(model_path=cfg["gguf"], n_threads=cfg["threads"], n_threads_batch=cfg["threads"], n_ctx=cfg["n_ctx"],
            n_batch=512, n_ubatch=512, type_k=0, type_v=0, use_mmap=cfg["use_mmap"], verbose=False,
            use_extra_bufts=cfg["extra_bufts"])
prefill = []
for _ in range(cfg["repeats"]):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(cfg["prefill_ids"])
    prefill.append(len(cfg["prefill_ids"]) / (time.perf_counter() - t0))
def last_logits():  # without logits_all, llama-cpp-python keeps no scores: read the context's last row
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
decode, ids = [], []
for _ in range(cfg["repeats"] + 1):
    llm.reset()
    llm.eval(cfg["prompt_ids"])
    ids = [int(np.argmax(last_logits()))]
    t0 = time.perf_counter()
    while len(ids) < cfg["tokens"]:
        llm.eval([ids[-1]])
        ids.append(int(np.argmax(last_logits())))
    decode.append((len(ids) - 1) / (time.perf_counter() - t0))
print(json.dumps({"prefill": prefill, "decode": decode[1:], "ids": ids}))
"""

# Runs llama.cpp's converter with the pre-tokenizer named: the demo tokenizer is byte-level BPE with the GPT-2
# pattern, whose hash the converter cannot know.
CONVERTER = r"""
import sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[1] + "/gguf-py")
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[2:]]
convert_hf_to_gguf.main()
"""


# Runs llama.cpp's quantizer: argv = source GGUF, destination, ftype name (LLAMA_FTYPE_MOSTLY_<name>).
QUANTIZER = r"""
import sys
import llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3])
params.nthread = 2
rc = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), params)
sys.exit(rc)
"""


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, **kw)


def use_environment(env: Path) -> None:
    """An existing environment with llama-cpp-python (and torch, transformers for the converter)."""
    global PY, SRC
    PY = env / "bin" / "python"
    found = sorted(env.glob("src/llama_cpp_python-*/vendor/llama.cpp")) + sorted(
        WORK.glob("sdist/llama_cpp_python-*/vendor/llama.cpp")
    )
    if not PY.exists() or not found:
        raise SystemExit(f"--llama-env {env}: expected bin/python and src/llama_cpp_python-*/vendor/llama.cpp there")
    SRC = found[0]


def setup() -> None:
    """The llama-cpp-python environment (built for this CPU) and llama.cpp's converter with what it needs."""
    WORK.mkdir(parents=True, exist_ok=True)
    if not PY.exists():
        run([sys.executable, "-m", "venv", str(VENV)])
    probe = subprocess.run([str(PY), "-c", "import llama_cpp, torch, transformers, gguf"], capture_output=True)
    if probe.returncode == 0 and SRC.exists():
        return
    env = {**os.environ, "CMAKE_ARGS": "-DGGML_NATIVE=ON -DGGML_BLAS=OFF"}
    run([str(PY), "-m", "pip", "install", "-q", f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], env=env)
    if not SRC.exists():
        run([str(PY), "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(WORK / "sdist")])  # fmt: skip
        with tarfile.open(WORK / "sdist" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz") as tar:
            tar.extractall(WORK / "sdist", filter="data")
    run([str(PY), "-m", "pip", "install", "-q", "torch==2.13.0", "transformers==4.57.6", "sentencepiece",
         "protobuf<5", "numpy", str(SRC / "gguf-py")])  # fmt: skip


def to_gguf(model_dir: Path, dtype: str) -> Path:
    out = model_dir.parent / f"{model_dir.name}-{dtype}.gguf"
    if not out.exists():
        tmp = out.with_suffix(".partial")
        run([str(PY), "-c", CONVERTER, str(SRC), str(model_dir), "--outtype", dtype, "--outfile", str(tmp)])
        tmp.rename(out)
    return out


def quantize(f32_gguf: Path, quant: str) -> Path:
    out = f32_gguf.with_name(f32_gguf.name.replace("-f32.gguf", f"-{quant}.gguf"))
    if not out.exists():
        tmp = out.with_suffix(".partial")
        run([str(PY), "-c", QUANTIZER, str(f32_gguf), str(tmp), quant.upper()])
        tmp.rename(out)
    return out


def ours(model_dir: Path, threads: int, prompt_ids, prefill_prompt, tokens: int, repeats: int, weights: str,
         precision: str = "f32") -> dict:  # fmt: skip
    before = resident_bytes()
    with Engine(cpu_threads=threads) as eng:
        model = eng.load(model_dir, weights=weights)
        decode, ids = decode_speed(model, prompt_ids, tokens, repeats, precision=precision)  # first: it warms
        grown = resident_bytes() - before  # the weights as held, the contexts' KV caches and scratch, once warm
        prefill = prefill_speed(model, prefill_prompt, repeats, precision=precision)
        weights = model.info["weights"]
        files = model.info["file_bytes"]
    return {"prefill": prefill, "decode": decode, "ids": ids, "weights": weights, "file_bytes": files,
            "resident_growth_bytes": grown}  # fmt: skip


def resident_bytes() -> int:
    """This process's resident memory (VmRSS), bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def round_speeds(rounds: list[dict], what: str) -> dict:
    """Medians over the rounds of each side's median speed, and the median of the rounds' ratios."""
    o = [statistics.median(g["ours"][what]) for g in rounds]
    t = [statistics.median(g["theirs"][what]) for g in rounds]
    ratios = [a / b for a, b in zip(o, t, strict=True)]
    return {"ours": statistics.median(o), "llama_cpp": statistics.median(t), "ratio": statistics.median(ratios),
            "round_ratios": ratios}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(ap, threads_default=os.cpu_count())
    ap.add_argument("--llama-mmap", choices=("on", "off"), default="on",
                    help="llama.cpp maps the GGUF file (on, its default) or reads it into its buffers")  # fmt: skip
    ap.add_argument(
        "--quants",
        nargs="*",
        default=[],
        choices=("q8_0", "q4_k_m", "q5_k_m", "q6_k", "mxfp4_moe"),
        help="quantized files made by llama.cpp's quantizer from the F32 GGUF, run by both engines",
    )
    ap.add_argument(
        "--precisions",
        nargs="+",
        default=["q8", "f32"],
        choices=("q8", "f32"),
        help="our activation precisions on the quantized files (default: q8 f32)",
    )
    ap.add_argument("--llama-env", type=Path, help="an existing environment with llama-cpp-python")
    ap.add_argument("--llama-run-env", type=Path,
                    help="another environment whose llama-cpp-python runs the files (the converter and quantizer stay "
                         "--llama-env's): e.g. one built without AMX")  # fmt: skip
    args = ap.parse_args()
    if args.llama_env:
        use_environment(args.llama_env)
    else:
        setup()
    run_py = args.llama_run_env / "bin" / "python" if args.llama_run_env else PY
    jobs = [(dtype, None, "f32") for dtype in args.dtypes]
    jobs += [("f32", quant, precision) for quant in args.quants for precision in args.precisions]
    rows = []
    for dtype, quant, precision in jobs:
        model_dir = demo_target(args.size, dtype)
        checkpoint = Checkpoint.open(model_dir)  # the token ids both engines get (no model load for this)
        prompt_ids = checkpoint.tokenizer.encode(DEMO_PROMPTS[0], add_special_tokens=False).ids
        prefill_prompt = prefill_ids(checkpoint.config.vocab_size, args.prefill)
        gguf = to_gguf(model_dir, dtype)
        if quant:  # both engines read the one quantized file
            gguf = quantize(gguf, quant)
            model_dir = gguf
        n_ctx = max(args.prefill, len(prompt_ids) + args.tokens) + 8
        cfg = {"gguf": str(gguf), "threads": args.threads, "n_ctx": n_ctx, "repeats": args.repeats,
               "prompt_ids": prompt_ids, "prefill_ids": prefill_prompt, "tokens": args.tokens,
               "use_mmap": args.llama_mmap == "on", "extra_bufts": True}  # fmt: skip
        # Rounds alternate which engine goes first, so that a machine whose speed drifts over minutes (a shared VM)
        # does not favour one side; each round's ratio compares two measurements minutes apart at most.
        rounds = []
        for r in range(args.rounds):
            order = ("theirs", "ours") if r % 2 == 0 else ("ours", "theirs")
            got = {}
            for side in order:
                if side == "theirs":
                    out = run([str(run_py), "-c", RUNNER, json.dumps(cfg)], capture_output=True, text=True).stdout
                    got[side] = json.loads(out)
                else:
                    got[side] = ours(model_dir, args.threads, prompt_ids, prefill_prompt, args.tokens, args.repeats,
                                     args.weights, precision)  # fmt: skip
            rounds.append(got)
        # the first position where the greedy tokens differ, over every round
        differ = [i for g in rounds for i, (a, b) in enumerate(zip(g["ours"]["ids"], g["theirs"]["ids"], strict=True))
                  if a != b]  # fmt: skip
        agree = min(differ) if differ else None

        growth = statistics.median(g["ours"]["resident_growth_bytes"] for g in rounds)
        rows.append({
            "resident_over_file": growth / gguf.stat().st_size,
            "dtype": quant or dtype, "precision": precision, "gguf": str(gguf), "gguf_bytes": gguf.stat().st_size,
            "threads": args.threads, "rounds": args.rounds,
            "decode_tokens_per_second": round_speeds(rounds, "decode"),
            "prefill_tokens_per_second": round_speeds(rounds, "prefill"),
            "greedy_tokens_agree": agree is None, "first_difference": agree,
            "runs": [{"ours": g["ours"], "llama_cpp": g["theirs"]} for g in rounds],
        })  # fmt: skip
    print("| file | our precision | decode tok/s ours | llama.cpp | ratio (per round) | prefill tok/s ours | llama.cpp "
          "| ratio (per round) | tokens agree |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        d, p = r["decode_tokens_per_second"], r["prefill_tokens_per_second"]
        agree = "yes" if r["greedy_tokens_agree"] else f"no (from token {r['first_difference']})"

        def per_round(x):
            return ", ".join(f"{v:.2f}" for v in x["round_ratios"])

        print(f"| {r['dtype']} | {r['precision']} | {d['ours']:.1f} | {d['llama_cpp']:.1f} "
              f"| {d['ratio']:.2f}x ({per_round(d)}) "
              f"| {p['ours']:.1f} | {p['llama_cpp']:.1f} | {p['ratio']:.2f}x ({per_round(p)}) | {agree} |")  # fmt: skip
    report = {"command": " ".join(["python", *sys.argv]), "llama_cpp_python": LLAMA_CPP_PYTHON,
              "llama_mmap": args.llama_mmap, "results": rows}  # fmt: skip
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
