"""A cost model of decoding: predicted tokens/s of a placement from measured device rates.

One decode step (one token, or n for a verification batch) costs, on the primary, a fixed time for everything
that is not an expert (attention, router, norms, embeddings, lm_head, the host loop), then per MoE layer the
slowest of the devices that run experts in it (the scheduler runs every owner's branch at once and joins):

    step = fixed + sum over MoE layers of max over devices d of  t_d
    t_d  = expected expert bytes d reads in the layer / bandwidth_d
           + P(d runs any expert in the layer) * join_seconds_d          (peers only, not the primary)

Expected bytes come from routing statistics (the share of tokens each expert serves; uniform top_k/E without
them): a batch of n tokens reads expert e once if any token picks it, 1 - (1 - p_e)^n. The chance that a device
is involved at all is approximated by 1 - (1 - m/k)^(k*n), m its expected picks per token (exact for a device
that owns the whole layer). Using expected times inside the max slightly flatters mixed layers.

A Calibration holds the measured figures: fixed seconds per step, and per device the expert weight bandwidth
(bytes/s) and the per-join latency. calibrate() measures them with the engine on the real devices (one short
decode with every expert on the primary, and one with every expert on each peer, reading the engine's busy-time
counters); everything else here is a pure function of fixed figures, so tests check the logic without timing.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .checkpoint import Checkpoint, ModelConfig
from .errors import ArgumentError
from .placement import Placement
from .routing import RoutingStats


@dataclass(frozen=True)
class ModelShape:
    """What the cost model and the strategies need to know about a model."""

    num_layers: int
    moe_layers: tuple[int, ...]
    num_experts: int
    top_k: int
    expert_bytes: int  # weights of one expert (gate, up and down projections)

    @property
    def layer_bytes(self) -> int:
        return self.expert_bytes * self.num_experts

    @property
    def total_bytes(self) -> int:
        return self.layer_bytes * len(self.moe_layers)

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> ModelShape:
        """From the tensor table (no engine needed): the bytes of every expert tensor of the first MoE layer."""
        cfg = checkpoint.config
        _require_moe(cfg)
        first = cfg.moe_layers[0]
        prefix = f"model.layers.{first}.mlp.experts."
        nbytes = sum(t.nbytes for name, t in checkpoint.tensors.items() if name.startswith(prefix))
        return cls.from_config(cfg, nbytes // cfg.num_experts)

    @classmethod
    def from_config(cls, config: ModelConfig, expert_bytes: int) -> ModelShape:
        _require_moe(config)
        return cls(config.num_layers, tuple(config.moe_layers), config.num_experts, config.top_k, int(expert_bytes))

    @classmethod
    def from_model(cls, model) -> ModelShape:
        cfg = model.config
        _require_moe(cfg)
        return cls.from_config(cfg, model.info["expert_bytes"] // (len(cfg.moe_layers) * cfg.num_experts))

    def empty_placement(self, device: str) -> Placement:
        moe = set(self.moe_layers)
        return Placement([[device if layer in moe else None] * self.num_experts for layer in range(self.num_layers)])


def _require_moe(cfg: ModelConfig) -> None:
    if cfg.num_experts <= 0 or not cfg.moe_layers:
        raise ArgumentError("this model has no experts: there is no placement to plan or predict")


@dataclass(frozen=True)
class DeviceRate:
    bandwidth: float  # expert weight bytes read per second
    join_seconds: float = 0.0  # per MoE layer step in which this device runs experts for the primary


@dataclass(frozen=True)
class Calibration:
    primary: str
    fixed_seconds: float  # per decode step, besides the experts
    devices: dict[str, DeviceRate] = field(default_factory=dict)
    measured: dict = field(default_factory=dict, compare=False)  # what calibrate() saw, for the record

    def rate(self, device: str) -> DeviceRate:
        try:
            return self.devices[device]
        except KeyError:
            raise ArgumentError(f"no calibration for device {device!r} (calibrated: "
                                f"{', '.join(self.devices) or 'none'})") from None  # fmt: skip

    def to_dict(self) -> dict:
        return {"primary": self.primary, "fixed_seconds": self.fixed_seconds,
                "devices": {d: asdict(r) for d, r in self.devices.items()}, "measured": self.measured}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict) -> Calibration:
        return cls(data["primary"], float(data["fixed_seconds"]),
                   {d: DeviceRate(**r) for d, r in data["devices"].items()}, data.get("measured", {}))  # fmt: skip


# ---- prediction -------------------------------------------------------------------------------------------


def expert_shares(shape: ModelShape, stats: RoutingStats | None = None) -> np.ndarray:
    """[num_layers, num_experts]: the probability that a token picks each expert (rows sum to top_k on MoE layers).
    Uniform without statistics, and for MoE layers the statistics saw no token of."""
    shares = np.zeros((shape.num_layers, shape.num_experts))
    uniform = shape.top_k / shape.num_experts
    if stats is not None and stats.hits.shape != (shape.num_layers, shape.num_experts):
        raise ArgumentError(f"routing statistics of shape {stats.hits.shape} do not fit a model of "
                            f"{shape.num_layers} layers x {shape.num_experts} experts")  # fmt: skip
    measured = stats.share() if stats is not None else None
    for layer in shape.moe_layers:
        if measured is not None and stats.tokens[layer] > 0:
            shares[layer] = np.minimum(measured[layer], 1.0)
        else:
            shares[layer] = uniform
    return shares


def layer_seconds(
    shape: ModelShape,
    owners: list[str | None],
    shares: np.ndarray,
    calibration: Calibration,
    tokens_per_step: int = 1,
) -> float:
    """Predicted time of one MoE layer step, given the owner of each expert and each expert's pick share."""
    picks: dict[str, float] = {}
    distinct: dict[str, float] = {}
    for device, p in zip(owners, shares, strict=True):
        picks[device] = picks.get(device, 0.0) + p
        distinct[device] = distinct.get(device, 0.0) + (1.0 - (1.0 - p) ** tokens_per_step)
    return _layer_time(shape, picks, distinct, calibration, tokens_per_step)


def _layer_time(shape: ModelShape, picks: dict, distinct: dict, cal: Calibration, n: int) -> float:
    worst = 0.0
    for device, m in picks.items():
        if m <= 0.0:
            continue
        rate = cal.rate(device)
        t = distinct[device] * shape.expert_bytes / rate.bandwidth
        if device != cal.primary:
            t += (1.0 - max(0.0, 1.0 - m / shape.top_k) ** (shape.top_k * n)) * rate.join_seconds
        worst = max(worst, t)
    return worst


def step_seconds(
    shape: ModelShape,
    placement: Placement,
    calibration: Calibration,
    stats: RoutingStats | None = None,
    tokens_per_step: int = 1,
) -> float:
    """Predicted seconds of one decode step (tokens_per_step tokens through every layer)."""
    shares = expert_shares(shape, stats)
    total = calibration.fixed_seconds
    for layer in shape.moe_layers:
        total += layer_seconds(shape, placement.owners[layer], shares[layer], calibration, tokens_per_step)
    return total


def predict_tokens_per_second(
    shape: ModelShape,
    placement: Placement,
    calibration: Calibration,
    stats: RoutingStats | None = None,
    tokens_per_step: int = 1,
) -> float:
    """Predicted decode tokens/s (tokens_per_step tokens per step: 1 for plain greedy decoding)."""
    return tokens_per_step / step_seconds(shape, placement, calibration, stats, tokens_per_step)


# ---- calibration ------------------------------------------------------------------------------------------


def measure_decode(model, placement: Placement | str, tokens: int = 32, repeats: int = 3, prompt=None) -> dict:
    """Greedy-decode `tokens` steps after a prompt `repeats` times (after one warm-up) under a placement.

    Returns medians per step: seconds, and per device busy_seconds and experts_run (from the engine's counters,
    over the decode steps only), plus every repeat's seconds per step."""
    model.set_placement(placement)
    ids = list(prompt) if prompt is not None else _default_prompt(model)
    runs = []
    with model.context(len(ids) + tokens + 1) as ctx:
        for r in range(repeats + 1):
            ctx.truncate(0)
            token = int(np.argmax(ctx.prefill(ids, all_rows=False)))
            before = model.counters()["devices"]
            t0 = time.perf_counter()
            for _ in range(tokens):
                token = int(np.argmax(ctx.decode([token])[0]))
            seconds = time.perf_counter() - t0
            after = model.counters()["devices"]
            if r == 0:
                continue  # warm-up: page cache, staging arenas
            runs.append({"seconds": seconds / tokens,
                         "busy": {d: (after[d]["busy_seconds"] - before[d]["busy_seconds"]) / tokens for d in after},
                         "experts": {d: (after[d]["experts_run"] - before[d]["experts_run"]) / tokens
                                     for d in after}})  # fmt: skip
    devices = runs[0]["busy"].keys()
    return {
        "seconds": statistics.median(r["seconds"] for r in runs),
        "busy": {d: statistics.median(r["busy"][d] for r in runs) for d in devices},
        "experts": {d: statistics.median(r["experts"][d] for r in runs) for d in devices},
        "samples": [r["seconds"] for r in runs],
    }


def _default_prompt(model) -> list[int]:
    from .demo import DEMO_PROMPTS

    if model.tokenizer is not None:
        return model.encode(DEMO_PROMPTS[0])
    return [(7 * i + 3) % model.config.vocab_size for i in range(12)]


def calibrate(model, devices: list[str] | None = None, tokens: int = 32, repeats: int = 3) -> Calibration:
    """Measure the figures of the cost model on the real devices (the model's placement is restored after).

    Run A puts every expert on the primary P; run B_d every expert on peer d. The engine's busy time of P in A
    minus that in B (same dense work, no experts) is P's expert time; fixed = step(A) - that. A peer's bandwidth
    is its expert bytes over its busy time in B_d; its join latency is what remains of step(B_d) after fixed and
    its expert time, per MoE layer. With no peer, the primary's bytes per token over step(A) stand for both."""
    shape = ModelShape.from_model(model)
    primary = model.device
    peers = [d for d in (devices or [x.name for x in model.engine.devices]) if d != primary]
    saved = model.placement
    try:
        a = measure_decode(model, shape.empty_placement(primary), tokens, repeats)
        b = {d: measure_decode(model, shape.empty_placement(d), tokens, repeats) for d in peers}
    finally:
        model.set_placement(saved)
    n_moe = len(shape.moe_layers)
    expert_bytes_a = a["experts"][primary] * shape.expert_bytes
    rates: dict[str, DeviceRate] = {}
    if b:
        dense_busy = statistics.median(m["busy"][primary] for m in b.values())
        expert_time = max(a["busy"][primary] - dense_busy, 1e-9)
        fixed = max(a["seconds"] - expert_time, 0.0)
    else:
        total_bytes = model.info["bytes_per_token"]
        bandwidth = total_bytes / a["seconds"]
        expert_time = expert_bytes_a / bandwidth
        fixed = a["seconds"] - expert_time
    rates[primary] = DeviceRate(expert_bytes_a / expert_time, 0.0)
    for d, m in b.items():
        busy = max(m["busy"][d], 1e-9)
        join = max((m["seconds"] - fixed - busy) / n_moe, 0.0)
        rates[d] = DeviceRate(m["experts"][d] * shape.expert_bytes / busy, join)
    measured = {"tokens": tokens, "repeats": repeats, "all_on_primary": a, "all_on_peer": b}
    return Calibration(primary, fixed, rates, measured)
