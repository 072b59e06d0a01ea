"""Our CPU kernels against llama.cpp's llama-bench on the same quantized GGUF files, on the CPUs this process may use.

bench/cpu/isa_vs_llamacpp.sh runs it under `taskset -c 0,1`; every program it starts inherits those CPUs. For each
file (NAME=PATH): our engine (one CPU device of --threads threads) in q8 precision with the default kernels, again
with EXPERTBENCH_CPU_KERNELS=avx2, and in f32 precision, each in a process of its own (the kernels are chosen when
the runtime loads); then llama-bench on the same file with as many threads. Each of our runs: one warm-up decode,
then --repeats decodes of --tokens tokens after the demo prompt, a sustained read of the memory (bench/decode.py's
SustainedRead: bench/membw/readpass.c on --threads threads, as many bytes as one decode reads) just before and just
after them, then --repeats prefills of a --prefill-token prompt. llama-bench: -p PREFILL -n TOKENS -r REPEATS (its
tg test decodes from an empty context, ours after the prompt's few tokens), the same read just before and after it.
Decode GB/s are our weight bytes read per token (the engine's bytes_per_token: attention, router, the top-k routed
experts, one embedding row, lm_head, as bench/decode.py counts them) times tokens/s, for llama.cpp too (the same
file); each as a fraction of the higher of its two reads. Prints a markdown table last; writes JSON.

    taskset -c 0,1 python3 bench/cpu/isa_bench.py run --file q8_0=A.gguf q4_k_m=B.gguf \
        --llama-bench build/bin/llama-bench --json out.json
    python3 bench/cpu/isa_bench.py convert --src /tmp/ll/llama.cpp     (the bench demo target as an F32 GGUF)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

KERNEL_RUNS = (("", "q8"), ("avx2", "q8"), ("", "f32"))  # (EXPERTBENCH_CPU_KERNELS, precision)


def ours(args) -> int:
    """One file, one precision, the kernels the environment asks for: writes one JSON document to args.out."""
    from decode import SustainedRead
    from measure import decode_speed, prefill_ids, prefill_speed

    from engine.checkpoints.demo import DEMO_PROMPTS
    from engine.model import Engine

    with Engine(cpu_devices=1, cpu_threads=args.threads) as eng:
        model = eng.load(args.file)
        info = model.info
        prompt = model.encode(DEMO_PROMPTS[0])
        per_decode = args.tokens * info["bytes_per_token"]
        with SustainedRead(Path(args.readpass), info["file_bytes"], eng.devices[0].threads) as reader:
            decode_speed(model, prompt, args.tokens, 0, precision=args.precision)  # page cache and arenas warm
            before = reader.read(per_decode)
            speeds, _ = decode_speed(model, prompt, args.tokens, args.repeats, warm=False, precision=args.precision)
            after = reader.read(per_decode)
        prefill = prefill_speed(model, prefill_ids(model.config.vocab_size, args.prefill), args.repeats,
                                precision=args.precision)  # fmt: skip
        out = {"kernels": eng.runtimes[0].kernel_variant, "threads": eng.devices[0].threads,
               "requested_kernels": os.environ.get("EXPERTBENCH_CPU_KERNELS", ""), "precision": args.precision,
               "decode": speeds, "prefill": prefill, "prompt_tokens": len(prompt), "tokens": args.tokens,
               "prefill_tokens": args.prefill, "bytes_per_token": info["bytes_per_token"],
               "file_bytes": info["file_bytes"], "weights": info["weights"], "read_before": before,
               "read_after": after}  # fmt: skip
    Path(args.out).write_text(json.dumps(out))
    return 0


def convert(args) -> int:
    """The bench demo target (safetensors, bf16; of --family) converted by llama.cpp's convert_hf_to_gguf.py in
    args.src to a GGUF of --outtype (f32 or bf16) beside it (bench/vs_llamacpp.py's to_gguf, with its pre-tokenizer
    patch); prints its path."""
    from checkpoints import demo_target
    from vs_llamacpp import to_gguf

    target = demo_target(args.size, "bf16", args.family)
    print(to_gguf(target, args.outtype, python=Path(sys.executable), src=Path(args.src)))
    return 0


def llama_bench(exe: str, path: str, args) -> dict:
    """llama-bench's decode (tg) and prompt (pp) tokens/s of each repetition. Its KV cache is f16 (llama-bench takes
    no f32 cache type); ours is f32."""
    cmd = [exe, "-m", path, "-t", str(args.threads), "-p", str(args.prefill), "-n", str(args.tokens), "-r",
           str(args.repeats), "-o", "json"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()[-600:]}")
    tests = json.loads(proc.stdout)
    gen = next(t for t in tests if t["n_gen"] > 0)
    pp = next(t for t in tests if t["n_prompt"] > 0 and t["n_gen"] == 0)
    return {"decode": gen["samples_ts"], "prefill": pp["samples_ts"], "kv": gen.get("type_k", "f16"),
            "cpu_info": gen.get("cpu_info"), "command": " ".join(cmd), "tests": tests}  # fmt: skip


def fraction(tps: float, per_token: int | None, before: dict, after: dict) -> tuple[float | None, float]:
    """Decode GB/s as a fraction of the higher of the two reads beside it, and that read's GB/s."""
    ceiling = max(before["read"], after["read"])
    return (tps * per_token / 1e9 / ceiling if per_token else None), ceiling


def run(args) -> int:
    from decode import SustainedRead
    from measure import build_c

    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        readpass = build_c("readpass", Path(tmp))
        for spec in args.file:
            name, _, path = spec.partition("=")
            if not Path(path).is_file():
                notes.append(f"{name}: no file at {path!r}: skipped")
                print(notes[-1], flush=True)
                continue
            per_token, file_rows = None, []
            for kernels, precision in KERNEL_RUNS:
                env = {k: v for k, v in os.environ.items() if k != "EXPERTBENCH_CPU_KERNELS"}
                if kernels:
                    env["EXPERTBENCH_CPU_KERNELS"] = kernels
                out = Path(tmp) / "ours.json"
                out.unlink(missing_ok=True)
                cmd = [sys.executable, __file__, "ours", path, "--precision", precision, "--readpass", str(readpass),
                       "--out", str(out)] + [f"--{k}={getattr(args, k)}" for k in ("threads", "tokens", "prefill",
                                                                                  "repeats")]  # fmt: skip
                label = f"{name} ours kernels={kernels or 'default'} {precision}"
                try:
                    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
                    if proc.returncode != 0:
                        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr.strip()[-800:]}")
                    got = json.loads(out.read_text())
                except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as exc:
                    notes.append(f"{label}: failed: {exc}")
                    print(notes[-1], flush=True)
                    continue
                per_token = got["bytes_per_token"]
                got["fraction"], got["read_ceiling_gbs"] = fraction(
                    statistics.median(got["decode"]), per_token, got["read_before"], got["read_after"]
                )
                got.update(file=name, path=path, engine="ours")
                file_rows.append(got)
                print(f"{label}: decode {statistics.median(got['decode']):.1f} tok/s ({got['kernels']}), prefill "
                      f"{statistics.median(got['prefill']):.1f} tok/s", flush=True)  # fmt: skip
            if args.llama_bench:
                label = f"{name} llama.cpp"
                try:
                    nbytes = args.tokens * per_token if per_token else Path(path).stat().st_size
                    with SustainedRead(readpass, Path(path).stat().st_size, args.threads) as reader:
                        before = reader.read(nbytes)
                        got = llama_bench(args.llama_bench, path, args)
                        after = reader.read(nbytes)
                    got["fraction"], got["read_ceiling_gbs"] = fraction(
                        statistics.median(got["decode"]), per_token, before, after
                    )
                    got.update(file=name, path=path, engine="llama.cpp", kernels=args.llama_label, precision="-",
                               read_before=before, read_after=after, bytes_per_token=per_token)  # fmt: skip
                    file_rows.append(got)
                    print(f"{label}: decode {statistics.median(got['decode']):.1f} tok/s (KV {got['kv']}), prefill "
                          f"{statistics.median(got['prefill']):.1f} tok/s", flush=True)  # fmt: skip
                except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError, StopIteration) as exc:
                    notes.append(f"{label}: failed: {exc}")
                    print(notes[-1], flush=True)
            theirs = next((r for r in file_rows if r["engine"] == "llama.cpp"), None)
            for r in file_rows:
                for what in ("decode", "prefill"):
                    r[f"{what}_tps"] = statistics.median(r[what])
                    r[f"{what}_vs_llama_cpp"] = r[f"{what}_tps"] / statistics.median(theirs[what]) if theirs else None
            rows += file_rows
    report = {"command": " ".join(["python3", *sys.argv]), "cpus": sorted(os.sched_getaffinity(0)),
              "threads": args.threads, "tokens": args.tokens, "prefill_tokens": args.prefill,
              "repeats": args.repeats, "llama_cpp": args.llama_label, "rows": rows, "notes": notes}  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print_table(report)
    return 0


def print_table(report: dict) -> None:
    rows = report["rows"]
    print(f"\nCPUs {','.join(map(str, report['cpus']))}, {report['threads']} threads; decode: {report['tokens']} "
          f"tokens (ours after the demo prompt, KV cache f32; llama-bench tg from an empty context, KV cache f16), "
          f"prefill: {report['prefill_tokens']} tokens; medians of {report['repeats']} runs. The read ceiling: "
          f"bench/membw/readpass.c on {report['threads']} threads on the same CPUs, just before and just after each "
          "decode, the higher of the two.")  # fmt: skip
    for r in rows:
        ceil = f"{r['read_before']['read']:.1f} / {r['read_after']['read']:.1f} GB/s"
        extra = f", KV {r['kv']}" if r["engine"] == "llama.cpp" else f", {r['prompt_tokens']}-token prompt"
        print(f"  {r['file']} {r['engine']} {r['kernels']} {r['precision']}: read before / after {ceil}{extra}")
    for note in report["notes"]:
        print(f"note: {note}")
    print(f"\n| file | ours kernels | precision | decode tok/s | x llama.cpp | of the {report['threads']}-thread read "
          "ceiling | prefill tok/s | x llama.cpp |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")

    def x(v):
        return f"{v:.2f}x" if v is not None else "-"

    for r in rows:
        if r["engine"] == "llama.cpp":
            kernels = f"llama.cpp ({r['kernels']})"
        else:
            asked = f", asked {r['requested_kernels']}" if r["requested_kernels"] else ""
            kernels = f"{r['kernels']}{asked}"
        frac = f"{r['fraction']:.0%} of {r['read_ceiling_gbs']:.1f} GB/s" if r["fraction"] is not None else "-"
        print(f"| {r['file']} | {kernels} | {r['precision']} | {r['decode_tps']:.1f} | {x(r['decode_vs_llama_cpp'])} "
              f"| {frac} | {r['prefill_tps']:.1f} | {x(r['prefill_vs_llama_cpp'])} |")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--threads", type=int, default=2)
    common.add_argument("--tokens", type=int, default=64, help="decode steps per run (default 64)")
    common.add_argument("--prefill", type=int, default=128, help="prompt length of the prefill runs (default 128)")
    common.add_argument("--repeats", type=int, default=3)
    p = sub.add_parser("run", parents=[common], help="every file, both engines, the table")
    p.add_argument("--file", nargs="*", default=[], help="NAME=PATH of a GGUF file")
    p.add_argument("--llama-bench", help="llama.cpp's llama-bench (none: ours only)")
    p.add_argument("--llama-label", default="", help="how llama.cpp was built, for the table")
    p.add_argument("--timeout", type=int, default=240, help="seconds for each run (default 240)")
    p.add_argument("--json", help="write the report here")
    p = sub.add_parser("ours", parents=[common], help="one of our runs (run starts these)")
    p.add_argument("file")
    p.add_argument("--precision", choices=("q8", "f32"), default="q8")
    p.add_argument("--readpass", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("convert", help="the bench demo target as an F32 GGUF, by llama.cpp's converter")
    p.add_argument("--src", required=True, help="llama.cpp's source folder")
    p.add_argument("--size", default="bench")
    p.add_argument(
        "--family", default=None, help="the demo family (engine.checkpoints.demo's; default: its default one)"
    )
    p.add_argument("--outtype", choices=("f32", "bf16"), default="f32")
    args = ap.parse_args()
    return {"run": run, "ours": ours, "convert": convert}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
