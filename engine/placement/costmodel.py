"""A cost model of decoding: predicted tokens/s of a placement from measured device rates.

One decode step (one token, or n for a verification batch) costs, on the primary, a fixed time for everything
that is not an expert (attention, router, norms, embeddings, lm_head, the host loop), then per MoE layer the
slowest of the devices that run experts in it (the scheduler runs every owner's branch at once and joins):

    step = fixed + sum over MoE layers of max over devices d of  t_d
    t_d  = expert bytes d reads in the layer / bandwidth_d
           + [d runs any expert in the layer] * (dispatch_seconds_d + join_seconds_d (peers only))

The shares come from routing statistics (the share of tokens each expert serves; uniform top_k/E without them).
For one token per step the max is taken per draw: the token's top_k picks fall on the devices as a multinomial
draw with each device's share of the layer, and the layer waits for the device that got the most work this time
(taking the max of average times instead would flatter layers split across devices by 10-25 %). For a batch of
n tokens: expert e is read once if any token picks it, 1 - (1 - p_e)^n, a peer is involved with probability
1 - (1 - m/k)^(k*n) (m its expected picks per token), and the max is taken over those expected times.

KV cache reads are not a term of their own in the formula above: attention runs on the primary whatever the
placement, so its reads are inside `fixed`, measured by calibrate() at one context length (the calibration prompt plus
half the decoded tokens). What changes with the context is only that part of fixed, so a prediction for another
context (`context=`) adds the difference of the KV bytes read per step at the two contexts, at the primary's
bandwidth: a full-attention layer reads every position of its cache, a sliding-window layer (gpt-oss) at most its
window, min(window, context) positions (ModelShape.kv_read_bytes). Without a context, or with a calibration that does
not know its own (older files), the prediction is fixed's, as before; the KV term never changes which placement is
faster, only the tokens/s predicted at a context.

A Calibration holds the measured figures: fixed seconds per step, and per device the expert weight bandwidth
(bytes/s), the dispatch time per layer step it runs experts in, and (peers) the per-join latency. calibrate()
measures them with the engine on the real devices (short decodes with every expert on the primary, and with as
many expert layers as fit on each peer, one and four positions per step, reading the engine's busy-time and
expert counters);
everything else here is a pure function of fixed figures, so tests check the logic without timing.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from ..checkpoints.checkpoint import Checkpoint, ModelConfig
from ..core.errors import ArgumentError
from ..core.greedy import greedy_choice
from ..families import family
from .placement import Placement, expert_room, mib
from .routing import RoutingStats


@dataclass(frozen=True)
class ModelShape:
    """What the cost model and the strategies need to know about a model."""

    num_layers: int
    moe_layers: tuple[int, ...]
    num_experts: int
    top_k: int
    expert_bytes: int  # weights of one expert (gate, up and down projections), the mean over the MoE layers
    # per layer (0 for dense layers): quantized files store the layers' experts in different formats (a Q4_K_M's down
    # projections are Q6_K in some layers, Q4_K in others); empty when every layer's are expert_bytes
    layer_expert_bytes: tuple[int, ...] = ()
    # the shared experts of one MoE layer (DeepSeek-V3): read on the primary every step, beside its routed experts
    # and while the peers run theirs (the mean over the MoE layers; 0 without any)
    shared_bytes: int = 0
    # the KV cache: bytes per position and layer (the core's f32 cache: keys and values, or MLA's latent and rope
    # key; 0: unknown), and per layer its attention window (0: full attention; empty: every layer full)
    kv_row_bytes: int = 0
    layer_windows: tuple[int, ...] = ()
    # a family's own count of the state a step reads at a context (Family.kv_read_bytes, bound to the config; None:
    # every row of a full-attention layer, its window's of a sliding one)
    kv_reader: Callable[[float], float] | None = field(default=None, compare=False, repr=False)

    def bytes_of(self, layer: int) -> int:
        """The weights of one expert of this layer."""
        return self.layer_expert_bytes[layer] if self.layer_expert_bytes else self.expert_bytes

    def layer_bytes_of(self, layer: int) -> int:
        return self.bytes_of(layer) * self.num_experts

    @property
    def layer_bytes(self) -> int:
        """The largest MoE layer's experts."""
        return max((self.layer_bytes_of(layer) for layer in self.moe_layers), default=0)

    @property
    def total_bytes(self) -> int:
        return sum(self.layer_bytes_of(layer) for layer in self.moe_layers)

    def window_of(self, layer: int) -> int:
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def kv_bytes_per_token(self) -> int:
        """The KV cache's growth per position: the full-attention layers' rows (the model info's figure)."""
        return self.kv_row_bytes * sum(1 for layer in range(self.num_layers) if not self.window_of(layer))

    @property
    def kv_window_bytes(self) -> int:
        """The sliding-window layers' caches at their windows, whatever the context (the model info's figure)."""
        return self.kv_row_bytes * sum(self.window_of(layer) for layer in range(self.num_layers))

    def kv_read_bytes(self, context: float) -> float:
        """KV cache bytes one decode step reads at a context of this many positions: every position in a
        full-attention layer, min(window, context) in a sliding-window layer (or the family's own count)."""
        if self.kv_reader is not None:
            return self.kv_reader(context)
        context = max(float(context), 0.0)
        return self.kv_row_bytes * sum(min(float(w), context) if (w := self.window_of(layer)) else context
                                       for layer in range(self.num_layers))  # fmt: skip

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> ModelShape:
        """From the tensor table (no engine needed): the bytes of every expert tensor, layer by layer."""
        cfg = checkpoint.config
        _require_moe(cfg)
        per_layer, shared = [0] * cfg.num_layers, 0
        for name, t in checkpoint.tensors.items():
            for part, kind in ((".mlp.experts.", "routed"), (".mlp.shared_experts.", "shared"),
                               (".ffn.experts.", "routed"), (".ffn.shared_experts.", "shared")):  # fmt: skip
                head, sep, rest = name.partition(part)
                if sep and head.startswith("model.layers."):
                    layer = int(head.rsplit(".", 1)[1])
                    if 0 <= layer < cfg.num_layers and cfg.is_moe_layer(layer):
                        if kind == "routed":
                            per_layer[layer] += t.nbytes
                        else:
                            shared += t.nbytes
        per_expert = [b // cfg.num_experts for b in per_layer]
        mean = sum(per_expert) // len(cfg.moe_layers)
        uniform = len({per_expert[layer] for layer in cfg.moe_layers}) == 1
        return cls(cfg.num_layers, tuple(cfg.moe_layers), cfg.num_experts, cfg.top_k, mean,
                   () if uniform else tuple(per_expert), shared // len(cfg.moe_layers), kv_row_bytes(cfg),
                   tuple(cfg.layer_windows), kv_reader(cfg))  # fmt: skip

    @classmethod
    def from_config(cls, config: ModelConfig, expert_bytes: int) -> ModelShape:
        _require_moe(config)
        return cls(config.num_layers, tuple(config.moe_layers), config.num_experts, config.top_k, int(expert_bytes),
                   kv_row_bytes=kv_row_bytes(config), layer_windows=tuple(config.layer_windows),
                   kv_reader=kv_reader(config))  # fmt: skip

    @classmethod
    def from_model(cls, model) -> ModelShape:
        return cls.from_checkpoint(model.checkpoint)

    def empty_placement(self, device: str) -> Placement:
        moe = set(self.moe_layers)
        return Placement([[device if layer in moe else None] * self.num_experts for layer in range(self.num_layers)])


def kv_row_bytes(cfg: ModelConfig) -> int:
    """Bytes of one position of one layer's KV cache as the core holds it (f32): the keys and values of the KV
    heads, or under MLA (DeepSeek-V3) the compressed latent and the rope key, or the family's own per-position
    state (DeepSeek-V4's, Family.kv_row_bytes)."""
    own = family(cfg.architecture).kv_row_bytes
    if own is not None:
        return own(cfg)
    if cfg.kv_lora_rank:
        return 4 * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    return 4 * 2 * cfg.num_kv_heads * cfg.head_dim


def kv_reader(cfg: ModelConfig) -> Callable[[float], float] | None:
    """The family's count of the state a step reads at a context, bound to this config (None: the general rule)."""
    own = family(cfg.architecture).kv_read_bytes
    return None if own is None else functools.partial(own, cfg)


def _require_moe(cfg: ModelConfig) -> None:
    if cfg.num_experts <= 0 or not cfg.moe_layers:
        raise ArgumentError("this model has no experts: there is no placement to plan or predict")


@dataclass(frozen=True)
class DeviceRate:
    bandwidth: float  # expert weight bytes read per second
    join_seconds: float = 0.0  # per MoE layer step in which this device runs experts for the primary (peers)
    dispatch_seconds: float = 0.0  # per MoE layer step in which it runs any expert: waking threads, launching


@dataclass(frozen=True)
class Calibration:
    primary: str
    fixed_seconds: float  # per decode step, besides the experts
    devices: dict[str, DeviceRate] = field(default_factory=dict)
    measured: dict = field(default_factory=dict, compare=False)  # what calibrate() saw, for the record
    # the mean number of cached positions over the calibrated decode steps (their KV reads are in fixed_seconds);
    # 0: unknown, and no KV term in the predictions
    context: float = 0.0

    def rate(self, device: str) -> DeviceRate:
        try:
            return self.devices[device]
        except KeyError:
            raise ArgumentError(f"no calibration for device {device!r} (calibrated: "
                                f"{', '.join(self.devices) or 'none'})") from None  # fmt: skip

    def to_dict(self) -> dict:
        return {"primary": self.primary, "fixed_seconds": self.fixed_seconds,
                "devices": {d: asdict(r) for d, r in self.devices.items()}, "measured": self.measured,
                "context": self.context}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict) -> Calibration:
        return cls(data["primary"], float(data["fixed_seconds"]),
                   {d: DeviceRate(**r) for d, r in data["devices"].items()}, data.get("measured", {}),
                   float(data.get("context", 0.0)))  # fmt: skip

    def fixed_at(self, shape: ModelShape, context: float | None = None) -> float:
        """fixed_seconds at another context: plus the KV bytes read beyond (or short of) those at the calibrated
        context, at the primary's bandwidth; fixed_seconds itself without a context or a calibrated one."""
        if context is None or self.context <= 0 or not shape.kv_row_bytes:
            return self.fixed_seconds
        more = shape.kv_read_bytes(context) - shape.kv_read_bytes(self.context)
        return max(self.fixed_seconds + more / self.rate(self.primary).bandwidth, 0.0)


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
    layer: int,
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
    return layer_time(shape, picks, distinct, calibration, tokens_per_step, layer)


def layer_time(shape: ModelShape, picks: dict, distinct: dict, cal: Calibration, n: int, layer: int) -> float:
    devices = [d for d, m in picks.items() if m > 1e-12]
    shared = shape.shared_bytes / cal.rate(cal.primary).bandwidth if shape.shared_bytes else 0.0
    if shared and cal.primary not in devices:  # the primary runs the shared experts whatever it owns
        devices.append(cal.primary)
        picks, distinct = {**picks, cal.primary: 0.0}, {**distinct, cal.primary: 0.0}
    if n == 1 and len(devices) > 1 and math.comb(shape.top_k + len(devices) - 1, len(devices) - 1) <= 5000:
        return _expected_max(shape, devices, picks, cal, shape.bytes_of(layer), shared)
    worst = 0.0
    for device in devices:
        rate = cal.rate(device)
        involved = 1.0 - max(0.0, 1.0 - picks[device] / shape.top_k) ** (shape.top_k * n)
        fixed = rate.dispatch_seconds + (rate.join_seconds if device != cal.primary else 0.0)
        own = shared if device == cal.primary else 0.0
        worst = max(worst, distinct[device] * shape.bytes_of(layer) / rate.bandwidth + involved * fixed + own)
    return worst


def _expected_max(shape: ModelShape, devices: list[str], picks: dict, cal: Calibration, expert_bytes: int,
                  shared: float = 0.0) -> float:  # fmt: skip
    """E[max over devices] for one token whose top_k picks fall on the devices as a multinomial draw with the
    devices' shares: the layer waits for whichever device got the most work this token, not the average (the
    primary's time includes its shared experts' seconds, picked or not)."""
    k = shape.top_k
    probs = [min(max(picks[d] / k, 0.0), 1.0) for d in devices]
    rates = [cal.rate(d) for d in devices]
    joins = [r.dispatch_seconds + (0.0 if d == cal.primary else r.join_seconds)
             for d, r in zip(devices, rates, strict=True)]  # fmt: skip
    per_expert = [expert_bytes / r.bandwidth for r in rates]
    always = [shared if d == cal.primary else 0.0 for d in devices]
    total = 0.0

    def walk(i: int, left: int, prob: float, worst: float) -> None:
        nonlocal total
        if i == len(devices) - 1:
            c = left
            t = (c * per_expert[i] + joins[i] if c else 0.0) + always[i]
            total += prob * probs[i] ** c / math.factorial(c) * max(worst, t)
            return
        for c in range(left + 1):
            t = (c * per_expert[i] + joins[i] if c else 0.0) + always[i]
            walk(i + 1, left - c, prob * probs[i] ** c / math.factorial(c), max(worst, t))

    walk(0, k, float(math.factorial(k)), 0.0)
    return total


def step_seconds(
    shape: ModelShape,
    placement: Placement,
    calibration: Calibration,
    stats: RoutingStats | None = None,
    tokens_per_step: int = 1,
    context: float | None = None,
) -> float:
    """Predicted seconds of one decode step (tokens_per_step tokens through every layer); at a context of this
    many cached positions, the KV reads of that context (Calibration.fixed_at; the verification batch's rows share
    one read of the cache, as they share the weights)."""
    shares = expert_shares(shape, stats)
    total = calibration.fixed_at(shape, context)
    for layer in shape.moe_layers:
        total += layer_seconds(shape, layer, placement.owners[layer], shares[layer], calibration, tokens_per_step)
    return total


def predict_tokens_per_second(
    shape: ModelShape,
    placement: Placement,
    calibration: Calibration,
    stats: RoutingStats | None = None,
    tokens_per_step: int = 1,
    context: float | None = None,
) -> float:
    """Predicted decode tokens/s (tokens_per_step tokens per step: 1 for plain greedy decoding), at a context of
    this many cached positions when given (else at the calibration's)."""
    return tokens_per_step / step_seconds(shape, placement, calibration, stats, tokens_per_step, context)


# ---- calibration ------------------------------------------------------------------------------------------


def measure_decode(model, placement: Placement | str, tokens: int = 32, repeats: int = 3, prompt=None,
                   warmup_seconds: float = 0.5, batch: int = 1) -> dict:  # fmt: skip
    """Greedy-decode `tokens` steps after a prompt `repeats` times under a placement, after warming up (at least
    one pass, and at least warmup_seconds: page cache, staging arenas, and a GPU's clocks, which idle low).
    batch > 1 feeds that many positions per step (the greedy token and copies of it), like a verification pass.

    Returns medians per step: seconds, and per device busy_seconds and experts_run (from the engine's counters,
    over the decode steps only), plus every repeat's seconds per step."""
    model.set_placement(placement)
    ids = list(prompt) if prompt is not None else _default_prompt(model)
    runs = []
    with model.routing_paused(), model.context(len(ids) + tokens * batch + 1) as ctx:  # measuring, not the workload
        warm_until = time.perf_counter() + warmup_seconds
        r = 0
        while len(runs) < repeats:
            ctx.truncate(0)
            token = greedy_choice(ctx.prefill(ids, all_rows=False), 0, len(ids) - 1)
            before = model.counters()["devices"]
            t0 = time.perf_counter()
            for step in range(1, tokens + 1):
                token = greedy_choice(ctx.decode([token] * batch)[-1], step, ctx.position - 1)
            seconds = time.perf_counter() - t0
            after = model.counters()["devices"]
            r += 1
            if r == 1 or time.perf_counter() < warm_until:
                continue
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
    from ..checkpoints.demo import DEMO_PROMPTS

    if model.tokenizer is not None:
        return model.encode(DEMO_PROMPTS[0])
    return [(7 * i + 3) % model.config.vocab_size for i in range(12)]


# A primary (a CPU device) that seems to read expert weights faster than this was mis-measured.
PLAUSIBLE_PRIMARY_BANDWIDTH = 2e12


def _layers_that_fit(model, shape: ModelShape, device: str) -> int:
    """How many MoE layers' experts a peer can hold for a calibration run: all of them on a device that reads the
    mapped checkpoint (a CPU device), else as many as its room for this model's experts allows
    (engine.placement.placement's ExpertRoom: its free memory plus what the model's experts hold there now, which the
    first measurement moves off, less the staging reserve)."""
    info = {d.name: d for d in model.engine.devices}.get(device)
    if info is None:
        raise ArgumentError(f"calibration: no device named {device!r}")
    n_moe = len(shape.moe_layers)
    room = expert_room(info, model.placement_bytes(model.placement).get(device, 0))
    if room.unlimited:
        return n_moe
    k = min(n_moe, room.room // max(shape.layer_bytes, 1))
    if k < 1:
        raise ArgumentError(f"calibration: {device} cannot hold one MoE layer's experts to be measured: it needs "
                            f"{mib(shape.layer_bytes)}; {room.explain()}")  # fmt: skip
    return int(k)


def _first_layers_on(shape: ModelShape, primary: str, device: str, k: int) -> Placement:
    placement = shape.empty_placement(primary)
    for layer in shape.moe_layers[:k]:
        placement.owners[layer] = [device] * shape.num_experts
    return placement


def calibrate(model, devices: list[str] | None = None, tokens: int = 32, repeats: int = 3,
              warmup_seconds: float = 0.5) -> Calibration:  # fmt: skip
    """Measure the figures of the cost model on the real devices (the model's placement is restored after).

    Run A puts every expert on the primary P; run B_d puts the first k_d MoE layers' experts on peer d (every
    layer when they fit, as many as fit otherwise: a GPU smaller than the model is the usual case) and the rest on
    P; each at one and at four positions per step. Per layer only one device works, so P's expert time for all
    layers is (busy_P(A) - busy_P(B_d)) x layers / k_d; a peer's is its busy time in B_d. Per device, expert time
    = layers run x dispatch + experts run x expert bytes / bandwidth, at two numbers of experts run (the counters
    count them), gives dispatch and bandwidth. fixed = step(A) - P's expert time; a peer's join latency is what
    remains of step(B_d) after fixed, P's share of B_d and the peer's expert time, per layer it ran. With no
    peer, the primary's bytes per token over step(A) stand for the bandwidth."""
    shape = ModelShape.from_model(model)
    primary = model.device
    peers = [d for d in (devices or [x.name for x in model.engine.devices]) if d != primary]
    layers = {d: _layers_that_fit(model, shape, d) for d in peers}
    n_moe = len(shape.moe_layers)
    saved = model.placement

    def measure(device: str, batch: int) -> dict:
        placement = _first_layers_on(shape, primary, device, layers.get(device, n_moe))
        return measure_decode(model, placement, tokens, repeats, None, warmup_seconds, batch)

    try:
        a = {n: measure(primary, n) for n in (1, 4)}
        b = {d: {n: measure(d, n) for n in (1, 4)} for d in peers}
    finally:
        model.set_placement(saved)
    rates: dict[str, DeviceRate] = {}
    if b:
        expert_time = {n: max(statistics.median((a[n]["busy"][primary] - m[n]["busy"][primary]) * n_moe / layers[d]
                                                for d, m in b.items()), 1e-9) for n in (1, 4)}  # fmt: skip
        rates[primary] = _rate(shape, {n: a[n]["experts"][primary] for n in (1, 4)}, expert_time, 0.0)
    if not b or rates[primary].bandwidth > PLAUSIBLE_PRIMARY_BANDWIDTH:
        # No peer, or noise swamped the difference of busy times (small experts, a busy machine): the primary's
        # bytes per token over the whole step stand for its bandwidth.
        rates[primary] = DeviceRate(model.info["bytes_per_token"] / a[1]["seconds"])
        expert_time = {n: a[n]["experts"][primary] * shape.expert_bytes / rates[primary].bandwidth for n in (1, 4)}
    # the shared experts (read on the primary in every MoE layer) are part of the layers' time, not of fixed
    shared_time = n_moe * shape.shared_bytes / rates[primary].bandwidth
    fixed = max(a[1]["seconds"] - expert_time[1] - shared_time, 0.0)
    for d, m in b.items():
        k = layers[d]
        busy = {n: max(m[n]["busy"][d], 1e-9) for n in (1, 4)}
        # P's experts and shared experts in the layers d did not hold (in its layers the shared ones overlap it)
        rest = (expert_time[1] + shared_time) * (n_moe - k) / n_moe
        join = max((m[1]["seconds"] - fixed - rest - busy[1]) / k, 0.0)
        rates[d] = _rate(shape, {n: m[n]["experts"][d] for n in (1, 4)}, busy, join, k)
    measured = {"tokens": tokens, "repeats": repeats, "peer_layers": layers, "all_on_primary": a, "on_peer": b}
    # fixed holds the KV reads of these steps: step i of the decode attends to the prompt and i + 1 more positions
    context = len(_default_prompt(model)) + (tokens + 1) / 2
    return Calibration(primary, fixed, rates, measured, context)


def _rate(shape: ModelShape, experts: dict, seconds: dict, join: float, layers: int | None = None) -> DeviceRate:
    """Solve seconds[n] = layers * dispatch + experts[n] * expert_bytes / bandwidth from n = 1 and n = 4 (layers:
    the MoE layers the device ran experts in; all by default); when noise makes that meaningless (no more
    experts, a negative part), all of the time counts as bandwidth."""
    n_moe = layers if layers is not None else len(shape.moe_layers)
    more = experts[4] - experts[1]
    if more > 0.5 * n_moe and seconds[4] > seconds[1]:
        per_expert = (seconds[4] - seconds[1]) / more
        dispatch = (seconds[1] - experts[1] * per_expert) / n_moe
        if dispatch >= 0.0:
            return DeviceRate(shape.expert_bytes / per_expert, join, dispatch)
    return DeviceRate(experts[1] * shape.expert_bytes / seconds[1], join, 0.0)
