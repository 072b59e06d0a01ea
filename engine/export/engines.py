"""A placement (and its routing statistics) for the expert-parallel engines: SGLang's expert location, vLLM's EPLB
settings, lucebox's placement and hotness files, ktransformers' GPU experts; and routing counts read back from them.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

import numpy as np

from ..checkpoints.checkpoint import ModelConfig
from ..core.errors import ArgumentError
from ..families import family
from ..placement.placement import Placement
from ..placement.routing import RoutingStats

# ---- expert-parallel engines: SGLang, vLLM; and lucebox, ktransformers ----------------------------------------
#
# What each reads, from their sources (sglang 0.5.23 python/sglang/srt/eplb/expert_location.py, vllm 0.33.0
# vllm/config/parallel.py and distributed/eplb/eplb_state.py, lucebox 62880e2 server/src/common/
# moe_hybrid_placement.cpp and moe_hybrid_routing_stats.cpp, the kvcache-ai sglang fork 04653fa
# python/sglang/srt/layers/moe/kt_ep_wrapper.py):
#
# * SGLang --init-expert-location FILE.json: a JSON object with only "physical_to_logical_map" (init_by_mapping is
#   called with the whole object, so another key is a TypeError) of [num_hidden_layers][E + R] logical ids, or with
#   "logical_count" [num_hidden_layers][E] (SGLang then runs its EPLB rebalance itself with
#   --ep-num-redundant-experts R). Rows are decoder layers by index, dense ones included. Physical slots go to GPUs
#   in contiguous blocks of (E + R) / ep_size; E + R must divide by ep_size. Nothing checks that every logical
#   expert has a slot: an expert without one is never loaded, so the map written here always covers every one.
# * vLLM: --enable-expert-parallel --enable-eplb --eplb-config '{"num_redundant_experts": R}'; E + R must divide by
#   the EP size; its initial map is fixed ([0..E-1] + [i % E for i < R] for every MoE layer): a placement cannot be
#   handed to it.
# * lucebox: the hotness CSV (DFLASH_QWEN35MOE_HOTNESS / DFLASH_LAGUNA_HOTNESS) ranks experts; its placement JSON
#   (arch, version 1, n_layer: every layer, n_expert, n_expert_used, total_hot = sum of hot_counts, hot_counts per
#   layer, hot_expert_ids per layer ranked by hits) is read by its remote expert daemon only.
# * ktransformers (its sglang fork): --kt-num-gpu-experts N with --kt-expert-placement-strategy uniform puts experts
#   0..N-1 of every MoE layer on the GPU; other masks come from routing frequencies (a .pt of logical_count).


def _gpu_devices(placement: Placement) -> set[str]:
    return {d for row in placement.owners for d in row if d is not None and not d.startswith(("cpu:", "hostsim:"))}


def _layer_loads(stats: RoutingStats | None, config: ModelConfig) -> np.ndarray:
    """Per layer, per expert: its routing hits (1 each where no statistics were recorded: a uniform guess)."""
    if stats is None:
        return np.ones((config.num_layers, config.num_experts))
    if stats.hits.shape != (config.num_layers, config.num_experts):
        raise ArgumentError(f"routing statistics of shape {list(stats.hits.shape)}, expected [{config.num_layers}, "
                            f"{config.num_experts}] (layers, experts) for this model")  # fmt: skip
    return stats.hits.astype(np.float64)


def balance_experts(load: np.ndarray, gpus: int, redundant: int) -> tuple[list[int], float]:
    """One layer's physical slots: every expert once and `redundant` replicas, each given to the expert whose load
    per replica is then highest; the slots packed onto `gpus` GPUs of (E + R) / gpus slots each, heaviest first onto
    the least loaded GPU with room, then improved by swaps between the most and the least loaded GPU. SGLang's own
    map (slot p holds expert p % E) is kept where it is better. Returns the slot -> logical expert map (GPU g holds
    slots g*n..g*n+n-1) and the predicted max / mean load over the GPUs."""
    n_experts = len(load)
    per_gpu = (n_experts + redundant) // gpus

    def ratio(slots: list[list[int]], replicas: np.ndarray) -> float:
        totals = [sum(load[e] / replicas[e] for e in s) for s in slots]
        mean = sum(totals) / gpus
        return max(totals) / mean if mean > 0 else 1.0

    replicas = np.ones(n_experts, dtype=np.int64)
    for _ in range(redundant):
        replicas[int(np.argmax(load / replicas))] += 1  # ties to the lower id
    items = sorted(((load[e] / replicas[e], e) for e in range(n_experts) for _ in range(replicas[e])),
                   key=lambda it: (-it[0], it[1]))  # fmt: skip
    slots: list[list[int]] = [[] for _ in range(gpus)]
    totals = [0.0] * gpus
    for share, e in items:
        g = min((g for g in range(gpus) if len(slots[g]) < per_gpu), key=lambda g: (totals[g], g))
        slots[g].append(e)
        totals[g] += share
    for _ in range(4 * n_experts):  # swaps that lower the larger of the two loads
        hi, lo = max(range(gpus), key=lambda g: totals[g]), min(range(gpus), key=lambda g: totals[g])
        best = None  # the swap that brings the two loads closest to their middle
        gap = totals[hi] - totals[lo]
        for i, a in enumerate(slots[hi]):
            for j, b in enumerate(slots[lo]):
                d = load[a] / replicas[a] - load[b] / replicas[b]
                if 0 < d < gap - 1e-12 and (best is None or abs(d - gap / 2) < best[0]):
                    best = (abs(d - gap / 2), i, j, d)
        if best is None:
            break
        _, i, j, d = best
        slots[hi][i], slots[lo][j] = slots[lo][j], slots[hi][i]
        totals[hi] -= d
        totals[lo] += d
    trivial_rep = np.bincount(np.arange(n_experts + redundant) % n_experts, minlength=n_experts)
    trivial = [[p % n_experts for p in range(g * per_gpu, (g + 1) * per_gpu)] for g in range(gpus)]
    if ratio(trivial, trivial_rep) < ratio(slots, replicas):
        slots, replicas = trivial, trivial_rep
    return [e for s in slots for e in sorted(s)], ratio(slots, replicas)


@dataclass
class EngineExport:
    format: str
    document: dict | None  # the file to write (JSON), or None where the format is arguments only
    args: list[str]
    not_expressible: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    balance: dict | None = None  # predicted max / mean GPU load per layer, and over all layers

    def to_dict(self) -> dict:
        return {"format": self.format, "args": self.args, "command_line": shlex.join(self.args),
                "document": self.document, "balance": self.balance, "not_expressible": self.not_expressible,
                "notes": self.notes}  # fmt: skip


def _check_ep(config: ModelConfig, gpus: int | None, redundant: int, engine: str) -> None:
    if gpus is not None and not 1 <= gpus <= 4096:
        raise ArgumentError(f"--gpus {gpus}: expected 1..4096")
    if not 0 <= redundant <= 1023:
        raise ArgumentError(f"--redundant {redundant}: expected 0..1023")
    if gpus is not None and (config.num_experts + redundant) % gpus:
        raise ArgumentError(f"{engine} needs the experts and their replicas ({config.num_experts} + {redundant}) to "
                            f"divide evenly over --gpus {gpus}")  # fmt: skip


def to_sglang(placement: Placement, config: ModelConfig, stats: RoutingStats | None, gpus: int | None = None,
              redundant: int = 0) -> EngineExport:  # fmt: skip
    """SGLang's --init-expert-location: logical_count (SGLang balances), or with gpus a physical_to_logical_map
    balanced here from the routing statistics."""
    _check_ep(config, gpus, redundant, "SGLang")
    load = _layer_loads(stats, config)
    notes = [f"{d} is a device here; SGLang spreads experts over its own EP ranks"
             for d in sorted(_gpu_devices(placement))]  # fmt: skip
    not_expressible = ["the placement itself: SGLang places experts by load over its EP GPUs, not on named devices"]
    if stats is None:
        notes.append("no routing statistics in the profile: every expert counted as equally hot")
    moe = [config.is_moe_layer(layer) for layer in range(config.num_layers)]
    if gpus is None:
        counts = [[int(v) for v in load[layer]] if moe[layer] else [0] * config.num_experts
                  for layer in range(config.num_layers)]  # fmt: skip
        args = ["--init-expert-location", "FILE.json", "--ep-num-redundant-experts", str(redundant)]
        return EngineExport("sglang", {"logical_count": counts}, args, not_expressible, notes)
    rows, ratios = [], []
    for layer in range(config.num_layers):
        if not moe[layer]:  # a row must exist; SGLang never reads a dense layer's
            rows.append([p % config.num_experts for p in range(config.num_experts + redundant)])
            continue
        row, ratio = balance_experts(load[layer], gpus, redundant)
        rows.append(row)
        ratios.append(ratio)
    balance = {"max_over_mean_per_layer": ratios, "worst": max(ratios, default=1.0),
               "mean": float(np.mean(ratios)) if ratios else 1.0}  # fmt: skip
    args = ["--init-expert-location", "FILE.json", "--ep-size", str(gpus), "--ep-num-redundant-experts",
            str(redundant), "--ep-dispatch-algorithm", "static"]  # fmt: skip
    notes.append("static dispatch needs an all-to-all backend (e.g. --moe-a2a-backend deepep); SGLang refuses it "
                 "with none")  # fmt: skip
    return EngineExport("sglang", {"physical_to_logical_map": rows}, args, not_expressible, notes, balance)


def to_vllm(placement: Placement, config: ModelConfig, gpus: int | None, redundant: int) -> EngineExport:
    _check_ep(config, gpus, redundant, "vLLM")
    args = ["--enable-expert-parallel", "--enable-eplb", "--eplb-config",
            json.dumps({"num_redundant_experts": redundant}, separators=(",", ":"))]  # fmt: skip
    not_expressible = [
        "the initial placement: vLLM starts from its own map (experts in order, replicas of experts "
        f"0..{redundant - 1 if redundant else 0}) and rebalances from measured load; it reads no map"
    ]
    notes = [] if gpus is None else [f"for {gpus} GPUs: -dp/-tp so that their product is {gpus}"]
    return EngineExport("vllm", None, args, not_expressible, notes)


def _hot_on(placement: Placement, layer: int, devices: set[str], load: np.ndarray) -> list[int]:
    row = placement.owners[layer]
    hot = [e for e, d in enumerate(row) if d in devices]
    return sorted(hot, key=lambda e: (-load[layer][e], e))


def to_lucebox(placement: Placement, config: ModelConfig, stats: RoutingStats | None) -> EngineExport:
    load = _layer_loads(stats, config)
    gpus = _gpu_devices(placement)
    hot = [_hot_on(placement, layer, gpus, load) if config.is_moe_layer(layer) else [] for layer in
           range(config.num_layers)]  # fmt: skip
    doc = {"arch": "moe_hybrid", "version": 1, "n_layer": config.num_layers, "n_expert": config.num_experts,
           "n_expert_used": config.top_k, "total_hot": sum(map(len, hot)), "hot_counts": [len(h) for h in hot],
           "hot_expert_ids": hot}  # fmt: skip
    notes = ["lucebox's server ranks experts from the hotness CSV (--format hotness-csv; DFLASH_QWEN35MOE_HOTNESS or "
             "DFLASH_LAGUNA_HOTNESS) and fills its GPU budget from that ranking; this JSON is what its remote expert "
             "daemon and DFLASH_*_NEXT_PLACEMENT_OUT use"]  # fmt: skip
    if len(gpus) > 1:
        notes.append(f"{', '.join(sorted(gpus))} all count as lucebox's one GPU")
    not_expressible = [f"lucebox runs qwen35moe, laguna, deepseek4 and others, not {config.architecture}: the file "
                       "has the shape lucebox checks (n_layer, n_expert, n_expert_used, ids in range) for a model "
                       "of this one's sizes"]  # fmt: skip
    return EngineExport("lucebox", doc, [], not_expressible, notes)


def to_ktransformers(placement: Placement, config: ModelConfig) -> EngineExport:
    gpus = _gpu_devices(placement)
    moe = [layer for layer in range(config.num_layers) if config.is_moe_layer(layer)]
    on_gpu = [[e for e, d in enumerate(placement.owners[layer]) if d in gpus] for layer in moe]
    counts = {len(h) for h in on_gpu}
    prefix = all(h == list(range(len(h))) for h in on_gpu)
    notes, not_expressible = [], []
    if len(gpus) > 1:
        notes.append(f"{', '.join(sorted(gpus))} are all ktransformers' GPU side")
    if len(counts) == 1 and prefix:
        n = counts.pop()
        args = ["--kt-num-gpu-experts", str(n), "--kt-expert-placement-strategy", "uniform"]
    else:
        total = sum(map(len, on_gpu))
        n = round(total / max(1, len(moe)))
        args = ["--kt-num-gpu-experts", str(n), "--kt-expert-placement-strategy", "frequency",
                "--init-expert-location", "FILE.pt"]  # fmt: skip
        not_expressible.append(f"which experts: ktransformers keeps experts 0..N-1 of every layer (uniform) or the "
                               f"{n * len(moe)} most used overall (frequency, from a torch .pt of logical_count, "
                               f"which this export cannot write); the profile keeps {total} chosen ones")  # fmt: skip
    whole = [layer for layer, h in zip(moe, on_gpu, strict=True) if len(h) == config.num_experts]
    note = family(config.architecture).ktransformers_note(whole)
    if note is None and whole:  # ktransformers' YAML optimize rules place whole layers' experts (DeepSeek's rules)
        note = (
            f"layers {', '.join(map(str, whole))} have every expert on the GPU: ktransformers' YAML optimize "
            "rules can place a whole layer's experts (KTransformersExperts with generate_op KExpertsMarlin)"
        )
    if note is not None:
        notes.append(note)
    return EngineExport("ktransformers", None, args, not_expressible, notes)


# The engines whose export is an EngineExport: format name -> (its name in words, the export of a placement, a config
# and routing statistics, with the expert-parallel GPUs and replicas where the engine takes them)
ENGINE_EXPORTS = {
    "sglang": ("SGLang", lambda placement, config, stats, gpus, redundant: to_sglang(placement, config, stats, gpus,
                                                                                   redundant)),
    "vllm": ("vLLM", lambda placement, config, stats, gpus, redundant: to_vllm(placement, config, gpus, redundant)),
    "lucebox": ("lucebox", lambda placement, config, stats, gpus, redundant: to_lucebox(placement, config, stats)),
    "ktransformers": ("ktransformers", lambda placement, config, stats, gpus, redundant: to_ktransformers(placement,
                                                                                                        config)),
}  # fmt: skip


def export_to(fmt: str, placement: Placement, config: ModelConfig, stats: RoutingStats | None = None,
              gpus: int | None = None, redundant: int = 0) -> EngineExport:  # fmt: skip
    """The export of ENGINE_EXPORTS[fmt] (ArgumentError naming the formats for an unknown one)."""
    if fmt not in ENGINE_EXPORTS:
        raise ArgumentError(f"export format {fmt!r:.40} is unknown: expected one of {', '.join(ENGINE_EXPORTS)}")
    return ENGINE_EXPORTS[fmt][1](placement, config, stats, gpus, redundant)


def import_routing(path, fmt: str, config: ModelConfig) -> RoutingStats:
    """Another engine's routing statistics for a model of this config, checked against its shape."""
    from ..core.errors import CheckpointError

    if fmt == "sglang":
        stats = RoutingStats.read_sglang_logical_count(path, config.top_k)
    else:
        stats = RoutingStats.read_hotness_csv(path)
    want = (config.num_layers, config.num_experts)
    if stats.hits.shape != want:
        raise CheckpointError(f"'{path}': statistics of {stats.hits.shape[0]} layers x {stats.hits.shape[1]} experts, "
                              f"but the model has {want[0]} layers x {want[1]} experts")  # fmt: skip
    if stats.top_k != config.top_k:
        raise CheckpointError(f"'{path}': n_expert_used = {stats.top_k}, but the model routes {config.top_k} experts "
                              "per token")  # fmt: skip
    dense = [layer for layer in range(config.num_layers) if not config.is_moe_layer(layer) and stats.hits[layer].any()]
    if dense:
        raise CheckpointError(f"'{path}': counts for layer {dense[0]}, which is a dense layer of this model")
    return stats
