"""Side by side with llama.cpp on the same checkpoint: decode and prefill speed, and whether greedy tokens agree.

Float formats (--dtypes bf16 f32): the demo checkpoint is converted to GGUF with llama.cpp's own
convert_hf_to_gguf.py (from the llama-cpp-python source package) and run by llama.cpp through llama-cpp-python,
built from source for this CPU (-DGGML_NATIVE=ON), in a virtual environment this script makes under
~/.cache/expertbench/bench-llamacpp (a first run builds it: several minutes). Both engines get the same thread
count, the same token ids (ours), the same prompt and token counts; llama.cpp's KV cache is set to f32 to match
ours. Prints our/their ratios, writes JSON. Our engine holds the weights as --weights says (auto: copied onto huge
pages where the kernel allows it); llama.cpp memory-maps its GGUF file by default (--llama-mmap off: it reads it
into its own buffers instead). With --rounds N both engines are measured N times, alternating which goes first, and
the ratio is the median of the rounds' ratios (a shared machine's speed drifts over minutes). Each engine's decodes
are also set against the memory read ceiling, as bench/decode.py does: bench/membw measured just before and just
after them (llama.cpp's run waits for it), each round's decode GB/s (our weight bytes read per token, the same file)
as a fraction of the higher of the two.

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

--family deepseek runs the DeepSeek-V3-shaped demo instead (llama.cpp's deepseek2 architecture):

    python bench/vs_llamacpp.py --family deepseek --size bench --dtypes bf16 --quants q4_k_m --precisions q8 f32 \
        --rounds 3 --threads 2 --json bench/results/vs_llamacpp_deepseek.json

--llama-env PATH uses an existing environment with llama-cpp-python (and torch, transformers) instead of building
one, e.g. the one tests/fixtures/recipes/gguf_files.py uses.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

from engine.checkpoints.checkpoint import Checkpoint
from engine.checkpoints.demo import DEMO_PROMPTS
from engine.model import Engine

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from checkpoints import demo_target  # noqa: E402
from decode import against, memory_ceiling, read_ceiling  # noqa: E402
from measure import add_common_arguments, build_c, decode_speed, prefill_ids, prefill_speed, write_report  # noqa: E402

LLAMA_CPP_PYTHON = "0.3.36"
WORK = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "expertbench" / "bench-llamacpp"
VENV = WORK / "venv"
PY = VENV / "bin" / "python"
SRC = WORK / "sdist" / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"

# Runs inside the llama-cpp-python environment; prints one JSON document. Before and after its measured decodes it
# prints SYNC and waits for a line on stdin (the read ceiling is measured meanwhile).
SYNC = "measure the ceiling"
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
def decode_once():
    llm.reset()
    llm.eval(cfg["prompt_ids"])
    ids = [int(np.argmax(last_logits()))]
    t0 = time.perf_counter()
    while len(ids) < cfg["tokens"]:
        llm.eval([ids[-1]])
        ids.append(int(np.argmax(last_logits())))
    return (len(ids) - 1) / (time.perf_counter() - t0), ids
def sync():
    print(cfg["sync"], flush=True)
    sys.stdin.readline()
decode_once()  # warms
sync()
decode, ids = [], []
for _ in range(cfg["repeats"]):
    speed, ids = decode_once()
    decode.append(speed)
sync()
print(json.dumps({"prefill": prefill, "decode": decode, "ids": ids}))
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


def to_gguf(model_dir: Path, dtype: str, python: Path | None = None, src: Path | None = None) -> Path:
    """model_dir converted by llama.cpp's convert_hf_to_gguf.py (the one in src, default SRC, run by python, default
    PY) to a GGUF file of dtype ("f32", "bf16", ...) beside it; kept when already there."""
    out = model_dir.parent / f"{model_dir.name}-{dtype}.gguf"
    if not out.exists():
        tmp = out.with_suffix(".partial")
        run([str(python or PY), "-c", CONVERTER, str(src or SRC), str(model_dir), "--outtype", dtype, "--outfile",
             str(tmp)])  # fmt: skip
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
         precision: str = "f32", ceiling=None) -> dict:  # fmt: skip
    """Our decode and prefill speeds; ceiling() (bench/decode.py's memory_ceiling) measured just before and just after
    the decodes, once they are warm."""
    before = resident_bytes()
    with Engine(cpu_threads=threads) as eng:
        model = eng.load(model_dir, weights=weights)
        decode_speed(model, prompt_ids, tokens, 0, precision=precision)  # page cache and arenas warm
        ceiling_before = ceiling() if ceiling else None
        decode, ids = decode_speed(model, prompt_ids, tokens, repeats, warm=False, precision=precision)
        ceiling_after = ceiling() if ceiling else None
        grown = resident_bytes() - before  # the weights as held, the contexts' KV caches and scratch, once warm
        prefill = prefill_speed(model, prefill_prompt, repeats, precision=precision)
        info = model.info
    return {"prefill": prefill, "decode": decode, "ids": ids, "weights": info["weights"],
            "file_bytes": info["file_bytes"], "bytes_per_token": info["bytes_per_token"],
            "resident_growth_bytes": grown, "ceiling_before": ceiling_before,
            "ceiling_after": ceiling_after}  # fmt: skip


def theirs(python: Path, cfg: dict, ceiling) -> dict:
    """llama.cpp's speeds (RUNNER, run by python), ceiling() measured just before and just after its decodes while
    the runner waits."""
    cmd = [str(python), "-c", RUNNER, json.dumps({**cfg, "sync": SYNC})]
    print("+", cmd[0], "-c RUNNER CONFIG", file=sys.stderr)
    ceilings, out = [], ""
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            if line.rstrip("\n") == SYNC:
                ceilings.append(ceiling())
                proc.stdin.write("\n")
                proc.stdin.flush()
            else:
                out += line
    if proc.returncode != 0 or len(ceilings) != 2:
        raise subprocess.CalledProcessError(proc.returncode, [cmd[0], "-c", "RUNNER"], out)
    return json.loads(out) | {"ceiling_before": ceilings[0], "ceiling_after": ceilings[1]}


def resident_bytes() -> int:
    """This process's resident memory (VmRSS), bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def ceiling_of(threads: int):
    """bench/decode.py's read_ceiling for membw's one-thread figure when the engines run one thread, for its
    all-cores figure otherwise."""
    return functools.partial(read_ceiling, threads="1" if threads == 1 else "all")


def decode_fractions(rounds: list[dict], per_token: int, threads: int) -> dict:
    """Each side's decode GB/s (per_token bytes per token) against the read ceiling, per round: the higher of the
    ceilings measured just before and just after that side's decodes (bench/decode.py's against; ceiling_of)."""
    out = {"bytes_per_token": per_token}
    for side, name in (("ours", "ours"), ("theirs", "llama_cpp")):
        runs = [g[side] for g in rounds]
        tps = [statistics.median(r["decode"]) for r in runs]
        ceilings, fractions = against(ceiling_of(threads), runs, tps, per_token)
        out[name] = statistics.median(fractions)
        out[f"round_{name}"] = fractions
        out[f"round_ceilings_gbs_{name}"] = ceilings
    return out


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
    ap.add_argument(
        "--family", default=None, help="the demo family (engine.checkpoints.demo's; default: its default one)"
    )
    ap.add_argument("--depth", type=int, default=0,
                    help="decode after this many tokens of context (llama-bench's -d): both engines' decode figures "
                         "are then tg N @ d D")  # fmt: skip
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
    WORK.mkdir(parents=True, exist_ok=True)
    ceiling = functools.partial(memory_ceiling, {"membw": build_c("membw", WORK)})  # built anew each invocation
    jobs = [(dtype, None, "f32") for dtype in args.dtypes]
    jobs += [("f32", quant, precision) for quant in args.quants for precision in args.precisions]
    rows = []
    for dtype, quant, precision in jobs:
        model_dir = demo_target(args.size, dtype, args.family)
        checkpoint = Checkpoint.open(model_dir)  # the token ids both engines get (no model load for this)
        prompt_ids = checkpoint.tokenizer.encode(DEMO_PROMPTS[0], add_special_tokens=False).ids
        if args.depth:  # decode at a depth (llama-bench's tg N @ d D): D tokens of context before the prompt
            prompt_ids = prefill_ids(checkpoint.config.vocab_size, args.depth) + prompt_ids
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
                    got[side] = theirs(run_py, cfg, ceiling)
                else:
                    got[side] = ours(model_dir, args.threads, prompt_ids, prefill_prompt, args.tokens, args.repeats,
                                     args.weights, precision, ceiling)  # fmt: skip
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
            "decode_fraction_of_read_ceiling": decode_fractions(rounds, rounds[0]["ours"]["bytes_per_token"],
                                                                args.threads),
            "prefill_tokens_per_second": round_speeds(rounds, "prefill"),
            "greedy_tokens_agree": agree is None, "first_difference": agree,
            "runs": [{"ours": g["ours"], "llama_cpp": g["theirs"]} for g in rounds],
        })  # fmt: skip
    print("read ceiling (bench/membw, the fastest of its reads) just before / just after each side's decodes, per "
          "round; each decode is compared with the higher:")  # fmt: skip
    for r in rows:
        of = ceiling_of(args.threads)
        sides = "; ".join(
            name + " " + ", ".join(f"{of(g[key]['ceiling_before']):.1f} / {of(g[key]['ceiling_after']):.1f}"
                                   for g in r["runs"])
            for name, key in (("ours", "ours"), ("llama.cpp", "llama_cpp"))
        )  # fmt: skip
        per_token = r["decode_fraction_of_read_ceiling"]["bytes_per_token"]
        print(f"  {r['dtype']} {r['precision']}: {sides} GB/s ({per_token / 1e6:.0f} MB read per token)")
    print("| file | our precision | decode tok/s ours | llama.cpp | ratio (per round) | of read ceiling ours / "
          "llama.cpp (per round) | prefill tok/s ours | llama.cpp | ratio (per round) | tokens agree |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        d, p, f = r["decode_tokens_per_second"], r["prefill_tokens_per_second"], r["decode_fraction_of_read_ceiling"]
        agree = "yes" if r["greedy_tokens_agree"] else f"no (from token {r['first_difference']})"

        def per_round(x):
            return ", ".join(f"{v:.2f}" for v in x["round_ratios"])

        fractions = ", ".join(f"{a:.0%} / {b:.0%}" for a, b in zip(f["round_ours"], f["round_llama_cpp"], strict=True))
        print(f"| {r['dtype']} | {r['precision']} | {d['ours']:.1f} | {d['llama_cpp']:.1f} "
              f"| {d['ratio']:.2f}x ({per_round(d)}) | {f['ours']:.0%} / {f['llama_cpp']:.0%} ({fractions}) "
              f"| {p['ours']:.1f} | {p['llama_cpp']:.1f} | {p['ratio']:.2f}x ({per_round(p)}) | {agree} |")  # fmt: skip
    report = {"command": " ".join(["python", *sys.argv]), "llama_cpp_python": LLAMA_CPP_PYTHON,
              "llama_mmap": args.llama_mmap, "depth": args.depth, "results": rows}  # fmt: skip
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
