"""Decode and prefill speed of the CPU runtime against this machine's memory-bandwidth ceiling, in one run.

For each dtype of the demo checkpoint: decode tokens/s (median of --repeats, min-max), the weight bytes read per
decoded token (attention, router, the top-k experts selected, one embedding row, lm_head), the effective GB/s,
its fraction of the read ceiling measured by bench/membw just before and just after that decode (the higher of
the two: this shared machine's memory speed changes within minutes), its fraction of STREAM's bandwidth measured
by the same runs (the faster of copy and triad, the ceiling as the issue names it; lower than a pure read, since
decode only reads), and prefill tokens/s for a --prefill-token prompt. Then --pairs decodes, each between two
samples of bench/membw/readpass (a sustained read and STREAM's copy and triad over as many bytes as the decode
read, and the core-to-core round trip that tells a shared VM's states apart): each decode against the higher
sample beside it, and the steady pairs grouped by state, the measurement to quote on a machine whose memory speed
changes within seconds. Prints a table and writes JSON.

    python bench/decode.py --size bench --dtypes bf16 f32 --json bench/results/decode.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.checkpoints.demo import DEMO_PROMPTS
from engine.model import Engine

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from checkpoints import demo_target  # noqa: E402
from measure import (  # noqa: E402
    add_common_arguments,
    at_least,
    build_c,
    cpu_has_avx2_kernels,
    decode_speed,
    prefill_ids,
    prefill_speed,
    write_report,
)


def build_programs(out_dir: Path) -> dict[str, Path]:
    """bench/membw's programs, built once per invocation: membw and readpass always; matmul_stream and
    decode_products where the CPU runs the engine's AVX2 kernels."""
    names = ["membw", "readpass"] + (["matmul_stream", "decode_products"] if cpu_has_avx2_kernels() else [])
    return {name: build_c(name, out_dir) for name in names}


def memory_ceiling(programs: dict[str, Path]) -> dict:
    """bench/membw: read / copy / triad / read_ahead, 1 thread and all cores."""
    out = programs["membw"].with_suffix(".json")
    subprocess.run([str(programs["membw"]), "--json", str(out)], check=True, capture_output=True)
    return json.loads(out.read_text())


class SustainedRead:
    """bench/membw/readpass, holding a buffer of a model's size on huge pages and waiting on its stdin between
    requests (so it takes no CPU time from a decode): each request moves as many bytes as a decode read."""

    def __init__(self, exe: Path, nbytes: int, threads: int):
        mib = str(max(1, nbytes >> 20))
        self.proc = subprocess.Popen([str(exe), "--mib", mib, "--threads", str(threads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)  # fmt: skip

    def read(self, nbytes: int) -> dict:
        """About nbytes moved: "read", GB/s of the faster of a plain read and one requesting lines ahead; "stream",
        of the faster of STREAM's copy and triad; "round_trip_ns", the core-to-core round trip just after (0 with one
        CPU)."""
        self.proc.stdin.write(f"{nbytes}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"readpass stopped (exit status {self.proc.wait()})")
        plain, ahead, copy, triad, round_trip = (float(v) for v in line.split())
        return {"read": max(plain, ahead), "stream": max(copy, triad), "round_trip_ns": round_trip}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        with contextlib.suppress(OSError):  # readpass already gone: its own error is the one to see
            self.proc.stdin.close()
        self.proc.wait()


def paired(model, prompt, tokens: int, pairs: int, reader: SustainedRead) -> dict:
    """Decodes of `tokens` tokens, each between two sustained samples of the ceiling over as many bytes (sample,
    decode, sample, decode, ..., sample): each decode's GB/s against the higher read, and the higher STREAM
    bandwidth, on either side of it. With each sample, the core-to-core round trip, which tells a shared VM's memory
    states apart (bench/membw/readpass.c)."""
    per_token = model.info["bytes_per_token"]
    samples = [reader.read(tokens * per_token)]
    decodes = []
    for _ in range(pairs):
        decodes.append(decode_speed(model, prompt, tokens, 1, warm=False)[0][0] * per_token / 1e9)
        samples.append(reader.read(tokens * per_token))
    out = {"decode_gbs": decodes, "round_trip_ns": [s["round_trip_ns"] for s in samples]}
    for key, name in (("read", "fractions"), ("stream", "stream_fractions")):
        ceiling = [s[key] for s in samples]
        out[f"{key}_gbs"] = ceiling
        out[name] = [d / max(a, b) for d, a, b in zip(decodes, ceiling, ceiling[1:], strict=False)]
    return out


def spread(values: list[float]) -> list[float]:
    """Lowest, median, highest."""
    return [min(values), statistics.median(values), max(values)]


def by_state(rounds: list[dict]) -> list[dict]:
    """The steady pairs of all rounds (the reads on both sides of the decode within 10 % of each other, STREAM's
    figures too, and their round trips within 1.5x), grouped by the machine's state: where the round trips span
    more than 3x, in two groups split at their geometric middle (on the development VM, about 50 and about 400 ns:
    two memory states)."""
    steady = []
    for p in rounds:
        for i, (f, sf) in enumerate(zip(p["fractions"], p["stream_fractions"], strict=True)):
            (ra, rb), (sa, sb) = p["read_gbs"][i : i + 2], p["stream_gbs"][i : i + 2]
            ta, tb = p["round_trip_ns"][i : i + 2]
            if (
                max(ra, rb) <= 1.1 * min(ra, rb)
                and max(sa, sb) <= 1.1 * min(sa, sb)
                and max(ta, tb) <= 1.5 * max(min(ta, tb), 1.0)
            ):
                steady.append({"round_trip_ns": (ta + tb) / 2, "read_gbs": max(ra, rb), "fraction": f,
                               "stream_fraction": sf})  # fmt: skip
    if not steady:
        return []
    trips = [s["round_trip_ns"] for s in steady]
    lo, hi = max(min(trips), 1.0), max(trips)
    split = (lo * hi) ** 0.5 if hi > 3 * lo else float("inf")
    groups = []
    for below in (True, False):
        members = [s for s in steady if (s["round_trip_ns"] < split) == below]
        if members:
            groups.append({"pairs": len(members)} | {key: spread([m[key] for m in members]) for key in steady[0]})
    return groups


def products_alone(programs: dict[str, Path], dtypes: list[str], module: str, threads: int) -> dict | None:
    """Two measurements that split the gap between decode and the ceiling, each against a plain read in the same
    run, for each dtype: the one-token kernel alone (bench/membw/matmul_stream.c, built with the engine's kernel
    sources) and a decode step's products alone through the engine's CPU runtime module, in decode's order
    (bench/membw/decode_products.c). None where the CPU has no AVX2 kernels."""
    if "decode_products" not in programs:
        return None
    out, n = {}, str(threads)
    for dtype in dtypes:
        cmd = [str(programs["matmul_stream"]), "--dtype", dtype, "--mib", "512", "--repeats", "3", "--threads", n]
        kernel = last_row(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        cmd = [str(programs["decode_products"]), module, "--dtype", dtype, "--tokens", "64", "--threads", n]
        steps = last_row(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        out[dtype] = {"read_gbs": float(kernel[1]), "kernel_gbs": float(kernel[2]),
                      "products_gbs": float(steps[2]), "products_read_gbs": float(steps[3])}  # fmt: skip
    return out


def last_row(table: str) -> list[str]:
    """The cells of a markdown table's last row."""
    return [c.strip() for c in table.strip().splitlines()[-1].strip("|").split("|")]


READS = ("read_gbs", "read_ahead_gbs", "read_huge_gbs", "read_ahead_huge_gbs")
STREAM = ("copy_gbs", "triad_gbs", "copy_huge_gbs", "triad_huge_gbs")


def read_ceiling(ceiling: dict, threads: str = "all") -> float:
    """The decode ceiling: the fastest of membw's four reads (plain, and with each line requested ahead as the
    decode kernels request their weights; each on 4 KiB and on 2 MiB pages, as the engine holds a checkpoint it
    maps and one it copies)."""
    return max(ceiling[k][threads] for k in READS)


def stream_ceiling(ceiling: dict, threads: str = "all") -> float:
    """STREAM's bandwidth, as the issue defines bench/membw's ceiling: the faster of copy and triad (bytes counted
    as STREAM counts them), on either page size. Lower than the read ceiling: a write costs more than a read."""
    return max(ceiling[k][threads] for k in STREAM)


def against(ceiling_of, per_round: list[dict], tps: list[float], per_token: int) -> tuple[list, list]:
    """Per round: the higher of a ceiling (ceiling_of: read_ceiling or stream_ceiling) measured just before and just
    after that round's decode, and the decode's GB/s as a fraction of it."""
    ceilings = [max(ceiling_of(m["ceiling_before"]), ceiling_of(m["ceiling_after"])) for m in per_round]
    return ceilings, [t * per_token / 1e9 / c for t, c in zip(tps, ceilings, strict=True)]


def measure(dtype: str, args, ceiling, programs: dict[str, Path]) -> dict:
    """One dtype's decode with the read ceiling (ceiling(): bench/membw's report) measured just before and just
    after it, then --pairs decodes each between two samples of bench/membw/readpass (paired()), the share of
    runtime operations and prefill."""
    path = demo_target(args.size, dtype)
    with Engine(cpu_threads=args.threads) as eng:
        model = eng.load(path, weights=args.weights)
        prompt = model.encode(DEMO_PROMPTS[0])
        decode_speed(model, prompt, args.tokens, 0)  # page cache and arenas warm before the first ceiling
        before = ceiling()
        speeds, ids = decode_speed(model, prompt, args.tokens, args.repeats, warm=False)
        after = ceiling()
        pairs = None
        if args.pairs > 0:  # the ceiling sampled beside each decode, over as many bytes (bench/membw/readpass.c)
            with SustainedRead(programs["readpass"], model.info["file_bytes"], eng.devices[0].threads) as reader:
                pairs = paired(model, prompt, args.tokens, args.pairs, reader)
        # one more decode, the same loop (generate), for the share of its time the device spent in the runtime's
        # operations (products, attention, experts) rather than in the core's work between them (norms, RoPE,
        # routing, hand-offs): args.tokens one-token steps after the prompt's first len - 1 positions
        with model.context(len(prompt) + args.tokens + 1) as ctx:
            ctx.prefill(prompt[:-1], all_rows=False)
            before_c, t0 = model.counters(), time.perf_counter()
            ctx.generate(prompt[-1:], args.tokens)
            seconds, after_c = time.perf_counter() - t0, model.counters()
        dev = eng.devices[0].name
        busy = after_c["devices"][dev]["busy_seconds"] - before_c["devices"][dev]["busy_seconds"]
        prefill = prefill_speed(model, prefill_ids(model.config.vocab_size, args.prefill), args.repeats)
        return {"dtype": dtype, "model": str(path), "kernels": eng.runtimes[0].kernel_variant,
                "threads": eng.devices[0].threads, "speeds": speeds, "prefill": prefill, "generated_ids": ids,
                "bytes_per_token": model.info["bytes_per_token"], "runtime_ops_share": busy / seconds,
                "weights": model.info["weights"], "huge_page_bytes": model.info["huge_page_bytes"],
                "ceiling_before": before, "ceiling_after": after, "paired": pairs}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(ap, threads_default=0)
    ap.add_argument("--pairs", type=at_least(0), default=6,
                    help="per round and dtype, decodes each between two sustained reads of as many bytes "
                    "(bench/membw/readpass.c); 0 skips them (default 6)")  # fmt: skip
    args = ap.parse_args()
    with Engine(cpu_threads=args.threads) as eng:  # the decode's module and its first device's thread count
        module, threads = eng.runtimes[0].path, eng.devices[0].threads
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        programs = build_programs(Path(tmp))
        ceiling = lambda: memory_ceiling(programs)  # noqa: E731
        for _ in range(args.rounds):  # the ceiling next to the decodes it is compared with: a shared machine drifts
            # decode_products has the bench target's shapes: its figures belong beside that model only
            alone = products_alone(programs, args.dtypes, module, threads) if args.size == "bench" else None
            rounds.append({"alone": alone,
                           "results": [measure(dtype, args, ceiling, programs) for dtype in args.dtypes]})  # fmt: skip
    rows = []
    for i, dtype in enumerate(args.dtypes):
        per_round = [r["results"][i] for r in rounds]
        tps = [statistics.median(m["speeds"]) for m in per_round]
        per_token = per_round[0]["bytes_per_token"]
        # each decode against the higher of the ceilings just before and just after it, read and STREAM's
        ceilings, fractions = against(read_ceiling, per_round, tps, per_token)
        streams, stream_fractions = against(stream_ceiling, per_round, tps, per_token)
        speeds = [v for m in per_round for v in m["speeds"]]
        read_all = statistics.median(ceilings)
        round_alone = [r["alone"][dtype] for r in rounds if r["alone"]]
        # the same decodes against a longer plain read: decode_products' sweeps over all the model's weights (best
        # of 3), measured at the start of the round (another view of the ceiling on a machine whose short reads burst)
        weights_read = [t * per_token / 1e9 / r["alone"][dtype]["products_read_gbs"]
                        for t, r in zip(tps, rounds, strict=True) if r["alone"]]  # fmt: skip
        rows.append({
            "dtype": dtype, "model": per_round[0]["model"], "kernels": per_round[0]["kernels"],
            "threads": per_round[0]["threads"], "decode_tokens_per_second": statistics.median(tps),
            "decode_min": min(speeds), "decode_max": max(speeds), "bytes_per_token": per_token,
            "effective_gbs": statistics.median(tps) * per_token / 1e9,
            "fraction_of_read_ceiling": statistics.median(fractions), "round_fractions": fractions,
            "round_ceilings_gbs": ceilings,
            "fraction_of_stream_ceiling": statistics.median(stream_fractions),
            "round_fractions_of_stream": stream_fractions, "round_stream_ceilings_gbs": streams,
            "round_ceilings_before_after_gbs": [[read_ceiling(m["ceiling_before"]),
                                                 read_ceiling(m["ceiling_after"])] for m in per_round],
            "roofline_tokens_per_second": read_all * 1e9 / per_token,
            "prefill_tokens": args.prefill,
            "prefill_tokens_per_second": statistics.median(v for m in per_round for v in m["prefill"]),
            "generated_ids": per_round[-1]["generated_ids"],
            "round_alone": round_alone,
            "round_fractions_of_weights_read": weights_read,
            "round_runtime_ops_share": [m["runtime_ops_share"] for m in per_round],
            "round_paired": [m["paired"] for m in per_round if m["paired"]],
            "paired_by_state": by_state([m["paired"] for m in per_round if m["paired"]]),
            "weights": per_round[0]["weights"], "huge_page_bytes": per_round[0]["huge_page_bytes"],
        })  # fmt: skip
    first_ceiling = rounds[0]["results"][0]["ceiling_before"]  # membw's whole report, for the 1-thread figure
    report = {"command": " ".join(["python", *sys.argv]), "host": platform.node(), "cpu": platform.processor(),
              "cores": os.cpu_count(), "memory_ceiling": first_ceiling,
              "rounds": [{"alone": r["alone"]} for r in rounds],
              "results": rows}  # fmt: skip
    print(f"memory read ceiling ({first_ceiling['threads']} threads; the fastest of a plain read and one that "
          "requests lines ahead, each on 4 KiB and on 2 MiB pages; "
          f"{read_ceiling(first_ceiling, '1'):.1f} GB/s with 1 thread), "
          "just before / just after each decode; each decode is compared with the higher:")  # fmt: skip
    for r in rows:
        pairs = ", ".join(f"{b:.1f} / {a:.1f}" for b, a in r["round_ceilings_before_after_gbs"])
        print(f"  {r['dtype']}: {pairs} GB/s")
    print(
        "| dtype | decode tok/s (min-max) | MB/token | GB/s | of ceiling (per round) | products alone, of a "
        "plain read (per round) | kernel alone, of a plain read (per round) | roofline tok/s | prefill tok/s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        each = ", ".join(f"{f:.0%}" for f in r["round_fractions"])
        steps = ", ".join(f"{a['products_gbs']:.0f} of {a['products_read_gbs']:.0f}" for a in r["round_alone"]) or "-"
        kernel = ", ".join(f"{a['kernel_gbs']:.0f} of {a['read_gbs']:.0f}" for a in r["round_alone"]) or "-"
        print(f"| {r['dtype']} | {r['decode_tokens_per_second']:.1f} ({r['decode_min']:.1f}-{r['decode_max']:.1f}) "
              f"| {r['bytes_per_token'] / 1e6:.0f} | {r['effective_gbs']:.1f} | {r['fraction_of_read_ceiling']:.0%} "
              f"({each}) | {steps} GB/s | {kernel} GB/s | {r['roofline_tokens_per_second']:.0f} "
              f"| {r['prefill_tokens_per_second']:.1f} |")  # fmt: skip
    for r in rows:
        each = ", ".join(f"{f:.0%}" for f in r["round_fractions_of_stream"])
        gbs = ", ".join(f"{c:.1f}" for c in r["round_stream_ceilings_gbs"])
        print(f"{r['dtype']}: decode against STREAM's bandwidth (the faster of membw's copy and triad: {gbs} GB/s), "
              f"per round: {each}; median {r['fraction_of_stream_ceiling']:.0%}")  # fmt: skip
    for r in rows:
        if r["round_fractions_of_weights_read"]:
            each = ", ".join(f"{f:.0%}" for f in r["round_fractions_of_weights_read"])
            print(f"{r['dtype']}: decode against the plain read of all the weights beside the products alone (a "
                  f"longer read than membw's), per round: {each}")  # fmt: skip
    for r in rows:
        if r["round_paired"]:
            each = "; ".join(
                f"median {statistics.median(p['fractions']):.0%}, lowest {min(p['fractions']):.0%} "
                f"(reads {min(p['read_gbs']):.0f}-{max(p['read_gbs']):.0f} GB/s, core-to-core round trip "
                f"{min(p['round_trip_ns']):.0f}-{max(p['round_trip_ns']):.0f} ns)"
                for p in r["round_paired"]
            )
            print(f"{r['dtype']}: each decode against a sustained read of as many bytes just before and just after it "
                  f"(the higher; {len(r['round_paired'][0]['fractions'])} per round), per round: {each}")  # fmt: skip
    for r in rows:
        for g in r["paired_by_state"]:
            trip, reads, (lo, mid, hi), (slo, smid, shi) = (g[k] for k in ("round_trip_ns", "read_gbs", "fraction",
                                                                            "stream_fraction"))  # fmt: skip
            print(f"{r['dtype']}: steady pairs at a round trip of {trip[0]:.0f}-{trip[2]:.0f} ns ({g['pairs']}; reads "
                  f"{reads[0]:.0f}-{reads[2]:.0f} GB/s): of the sustained read {mid:.0%} ({lo:.0%}-{hi:.0%}), of "
                  f"STREAM's copy/triad beside it {smid:.0%} ({slo:.0%}-{shi:.0%})")  # fmt: skip
    for r in rows:
        print(f"{r['dtype']}: weights {r['weights']}, {r['huge_page_bytes'] / 2**20:.0f} MiB of them on huge pages")
    for r in rows:
        shares = ", ".join(f"{v:.0%}" for v in r["round_runtime_ops_share"])
        print(
            f"{r['dtype']}: share of decode time in the runtime's operations (products, attention, experts) per "
            f"round: {shares}; the rest is the core's work between them"
        )
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
