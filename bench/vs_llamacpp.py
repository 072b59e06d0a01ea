"""Side by side with llama.cpp on the same checkpoint: decode and prefill speed, and whether greedy tokens agree.

The demo checkpoint (bf16 and f32) is converted to GGUF with llama.cpp's own convert_hf_to_gguf.py (from the
llama-cpp-python source package) and run by llama.cpp through llama-cpp-python, built from source for this CPU
(-DGGML_NATIVE=ON), in a virtual environment this script makes under ~/.cache/expertbench/bench-llamacpp (a
first run builds it: several minutes). Both engines get the same thread count, the same token ids (ours), the
same prompt and token counts; llama.cpp's KV cache is set to f32 to match ours. Prints our/their ratios, writes JSON.
Our engine holds the weights as --weights says (auto: copied onto huge pages where the kernel allows it);
llama.cpp memory-maps its GGUF file by default (--llama-mmap off: it reads it into its own buffers instead).
With --rounds N both engines are measured N times, alternating which goes first, and the ratio is the median of the
rounds' ratios (a shared machine's speed drifts over minutes).

    python bench/vs_llamacpp.py --size bench --dtypes bf16 f32 --rounds 3 --json bench/results/vs_llamacpp.json
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
            n_batch=512, n_ubatch=512, type_k=0, type_v=0, use_mmap=cfg["use_mmap"], verbose=False)
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


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, **kw)


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


def ours(model_dir: Path, threads: int, prompt_ids, prefill_prompt, tokens: int, repeats: int, weights: str) -> dict:
    with Engine(cpu_threads=threads) as eng:
        model = eng.load(model_dir, weights=weights)
        decode, ids = decode_speed(model, prompt_ids, tokens, repeats)  # first, as bench/decode.py does: it warms
        prefill = prefill_speed(model, prefill_prompt, repeats)
        weights = model.info["weights"]
    return {"prefill": prefill, "decode": decode, "ids": ids, "weights": weights}


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
    args = ap.parse_args()
    setup()
    rows = []
    for dtype in args.dtypes:
        model_dir = demo_target(args.size, dtype)
        checkpoint = Checkpoint.open(model_dir)  # the token ids both engines get (no model load for this)
        prompt_ids = checkpoint.tokenizer.encode(DEMO_PROMPTS[0], add_special_tokens=False).ids
        prefill_prompt = prefill_ids(checkpoint.config.vocab_size, args.prefill)
        gguf = to_gguf(model_dir, dtype)
        n_ctx = max(args.prefill, len(prompt_ids) + args.tokens) + 8
        cfg = {"gguf": str(gguf), "threads": args.threads, "n_ctx": n_ctx, "repeats": args.repeats,
               "prompt_ids": prompt_ids, "prefill_ids": prefill_prompt, "tokens": args.tokens,
               "use_mmap": args.llama_mmap == "on"}  # fmt: skip
        # Rounds alternate which engine goes first, so that a machine whose speed drifts over minutes (a shared VM)
        # does not favour one side; each round's ratio compares two measurements minutes apart at most.
        rounds = []
        for r in range(args.rounds):
            order = ("theirs", "ours") if r % 2 == 0 else ("ours", "theirs")
            got = {}
            for side in order:
                if side == "theirs":
                    out = run([str(PY), "-c", RUNNER, json.dumps(cfg)], capture_output=True, text=True).stdout
                    got[side] = json.loads(out)
                else:
                    got[side] = ours(
                        model_dir, args.threads, prompt_ids, prefill_prompt, args.tokens, args.repeats, args.weights
                    )
            rounds.append(got)
        # the first position where the greedy tokens differ, over every round
        differ = [i for g in rounds for i, (a, b) in enumerate(zip(g["ours"]["ids"], g["theirs"]["ids"], strict=True))
                  if a != b]  # fmt: skip
        agree = min(differ) if differ else None

        rows.append({
            "dtype": dtype, "gguf": str(gguf), "threads": args.threads, "rounds": args.rounds,
            "decode_tokens_per_second": round_speeds(rounds, "decode"),
            "prefill_tokens_per_second": round_speeds(rounds, "prefill"),
            "greedy_tokens_agree": agree is None, "first_difference": agree,
            "runs": [{"ours": g["ours"], "llama_cpp": g["theirs"]} for g in rounds],
        })  # fmt: skip
    print("| dtype | decode tok/s ours | llama.cpp | ratio (per round) | prefill tok/s ours | llama.cpp "
          "| ratio (per round) | tokens agree |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        d, p = r["decode_tokens_per_second"], r["prefill_tokens_per_second"]
        agree = "yes" if r["greedy_tokens_agree"] else f"no (from token {r['first_difference']})"

        def per_round(x):
            return ", ".join(f"{v:.2f}" for v in x["round_ratios"])

        print(f"| {r['dtype']} | {d['ours']:.1f} | {d['llama_cpp']:.1f} | {d['ratio']:.2f}x ({per_round(d)}) "
              f"| {p['ours']:.1f} | {p['llama_cpp']:.1f} | {p['ratio']:.2f}x ({per_round(p)}) | {agree} |")  # fmt: skip
    report = {"command": " ".join(["python", *sys.argv]), "llama_cpp_python": LLAMA_CPP_PYTHON,
              "llama_mmap": args.llama_mmap, "results": rows}  # fmt: skip
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
