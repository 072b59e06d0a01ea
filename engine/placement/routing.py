"""Routing statistics: how often the router picks each expert of each MoE layer.

RoutingStats come from a profiling pass (decode runs over a prompt set; the core counts every routed pair) or
from a hotness CSV as other tools write it:

    # hotness table: n_layer=3 n_expert=8 n_expert_used=2
    12,0,7,...        one row of n_expert counts per layer (dense layers: zeros)

The placement strategies and the heat map read them.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import ArgumentError, CheckpointError
from ..core.files import atomic_write

_HEADER = re.compile(r"^#\s*hotness table:\s*n_layer=(\d+)\s+n_expert=(\d+)\s+n_expert_used=(\d+)\s*$", re.ASCII)
_COUNT = re.compile(r"[0-9]+", re.ASCII)  # not str.isdigit: it takes '²' and other Unicode digits
# A count, and a layer's sum of counts, below 2**53: exact as a float (JSON readers, numpy's sums) and far beyond
# any run (2**53 routed tokens is years of decoding at a million tokens/s).
MAX_COUNT = (1 << 53) - 1
MAX_TABLE_SIDE = 1 << 16  # layers or experts a table may declare (no model has more; checked before allocating)


MAX_HOTNESS_BYTES = 64 << 20  # far more than any table's counts (a thousand layers of a thousand experts: ~20 MiB)


@dataclass
class RoutingStats:
    hits: np.ndarray  # uint64 [layers, experts]
    tokens: np.ndarray  # uint64 [layers]: tokens routed per layer (0 for dense layers)
    top_k: int

    @property
    def num_layers(self) -> int:
        return self.hits.shape[0]

    @property
    def num_experts(self) -> int:
        return self.hits.shape[1]

    def share(self) -> np.ndarray:
        """Fraction of each layer's tokens that each expert served (0 where a layer routed nothing)."""
        t = self.tokens.astype(np.float64)[:, None]
        return np.divide(self.hits.astype(np.float64), t, out=np.zeros(self.hits.shape), where=t > 0)

    @classmethod
    def from_hits(cls, hits, top_k: int) -> RoutingStats:
        """Statistics from hit counts alone ([layers, experts] of whole non-negative numbers): each layer's tokens
        are its selections over top_k. ArgumentError for anything else."""
        arr = np.asarray(hits, dtype=np.float64)
        if arr.ndim != 2 or not np.isfinite(arr).all() or (arr < 0).any() or (arr != np.floor(arr)).any():
            raise ArgumentError(f"routing counts of shape {list(arr.shape)}: expected [layers, experts] of whole "
                                "non-negative numbers")  # fmt: skip
        counts = arr.astype(np.uint64)
        top_k = max(int(top_k), 1)
        return cls(counts, (counts.sum(axis=1) // np.uint64(top_k)).astype(np.uint64), top_k)

    def heat(self) -> np.ndarray:
        """Each expert's hits relative to the hottest expert of its layer (0..1; 0 where a layer routed nothing):
        what the heat map and the placement chips colour by."""
        counts = self.hits.astype(np.float64)
        top = counts.max(axis=1, keepdims=True) if counts.size else counts
        return np.divide(counts, top, out=np.zeros_like(counts), where=top > 0)

    @property
    def tokens_counted(self) -> int:
        """Tokens routed through the MoE layers (the most any layer routed: every MoE layer routes each token)."""
        return int(self.tokens.max()) if self.tokens.size else 0

    def __add__(self, other: RoutingStats) -> RoutingStats:
        if self.hits.shape != other.hits.shape or self.top_k != other.top_k:
            raise ArgumentError(f"cannot add routing statistics of shape {self.hits.shape} and {other.hits.shape}")
        return RoutingStats(self.hits + other.hits, self.tokens + other.tokens, self.top_k)

    @classmethod
    def from_model(cls, model) -> RoutingStats:
        hits, tokens = model.routing_counts()
        return cls(hits, tokens, model.config.top_k)

    @classmethod
    def read_sglang_logical_count(cls, path: str | os.PathLike, top_k: int) -> RoutingStats:
        """SGLang's expert distribution counts in JSON form: {"logical_count": [layers][experts]} or [steps][layers]
        [experts] (its recorder's dump, summed over the steps as SGLang's EPLB does); its .pt dump holds the same key
        (json.dump(torch.load(f)["logical_count"].sum(0).tolist()) turns one into the other). Tokens per layer are the
        layer's selections over top_k."""
        path = Path(path)
        try:
            if not path.is_file():
                raise CheckpointError(f"'{path}': not a regular file (expected SGLang's logical_count JSON)")
            if path.suffix == ".pt":
                recipe = '{"logical_count": torch.load(f)["logical_count"].sum(0).tolist()}'
                raise CheckpointError(f"'{path}': a torch file; write its logical_count as JSON first: {recipe}")
            with path.open("rb") as f:
                data = f.read(MAX_HOTNESS_BYTES + 1)
            if len(data) > MAX_HOTNESS_BYTES:
                raise CheckpointError(f"'{path}': larger than {MAX_HOTNESS_BYTES >> 20} MiB")
            doc = json.loads(data)
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise CheckpointError(f"'{path}': not SGLang's logical_count JSON: {exc}") from None
        counts = doc.get("logical_count") if isinstance(doc, dict) else None
        if counts is None:
            raise CheckpointError(f"'{path}': no 'logical_count' key (expected SGLang's expert distribution counts)")
        bad = _first_bad_count(counts)
        if bad is not None:
            at, value = bad
            raise CheckpointError(f"'{path}': 'logical_count'{at} = {repr(value)[:40]}: expected a whole count "
                                  f"0..{MAX_COUNT} (non-negative whole counts: JSON integers below 2^53)")  # fmt: skip
        try:
            arr = np.array(counts, dtype=np.uint64)
        except (ValueError, TypeError, OverflowError):
            raise CheckpointError(f"'{path}': 'logical_count' is not a rectangular array of counts") from None
        if arr.ndim == 3:
            arr = _checked_sum(arr, path, axis=0)
        if arr.ndim != 2:
            raise CheckpointError(f"'{path}': 'logical_count' of shape {list(arr.shape)}: expected [layers, experts] "
                                  "or [steps, layers, experts] of non-negative whole counts")  # fmt: skip
        hits = arr
        return cls(hits, _checked_sum(hits, path, axis=1) // np.uint64(max(1, top_k)), top_k)

    def to_hotness_csv(self) -> str:
        lines = [f"# hotness table: n_layer={self.num_layers} n_expert={self.num_experts} n_expert_used={self.top_k}"]
        lines += [",".join(str(int(v)) for v in row) for row in self.hits]
        return "\n".join(lines) + "\n"

    def write_hotness_csv(self, path: str | os.PathLike) -> None:
        atomic_write(path, self.to_hotness_csv())

    @classmethod
    def read_hotness_csv(cls, path: str | os.PathLike) -> RoutingStats:
        path = Path(path)
        try:  # a regular file of bounded size: a FIFO or /dev/zero would be read forever
            if not path.is_file():
                raise CheckpointError(f"'{path}': not a regular file (expected a hotness table)")
            with path.open("rb") as f:
                data = f.read(MAX_HOTNESS_BYTES + 1)
            if len(data) > MAX_HOTNESS_BYTES:
                raise CheckpointError(f"'{path}': larger than {MAX_HOTNESS_BYTES >> 20} MiB, expected a hotness table")
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"'{path}': cannot read: {exc}") from None
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines or not (m := _HEADER.match(lines[0].strip())):
            raise CheckpointError(
                f"'{path}':1: expected '# hotness table: n_layer=N n_expert=N n_expert_used=N', got {lines[0][:80]!r}"
                if lines
                else f"'{path}': empty file, expected a hotness table"
            )
        n_layer, n_expert, used = (int(g) for g in m.groups())
        for name, value in (("n_layer", n_layer), ("n_expert", n_expert), ("n_expert_used", used)):
            if value > MAX_TABLE_SIDE:
                raise CheckpointError(f"'{path}':1: {name}={value}: expected at most {MAX_TABLE_SIDE}")
        rows = [ln for ln in lines[1:] if not ln.lstrip().startswith("#")]  # lucebox adds a '# format:' line
        if len(rows) != n_layer:
            raise CheckpointError(f"'{path}': {len(rows)} rows of counts, expected n_layer={n_layer}")
        hits = np.zeros((n_layer, n_expert), dtype=np.uint64)
        for i, row in enumerate(rows):
            cells = [c for c in re.split(r"[,\s]+", row.strip()) if c]
            if len(cells) != n_expert:
                raise CheckpointError(f"'{path}':{i + 2}: {len(cells)} counts, expected n_expert={n_expert}")
            for j, c in enumerate(cells):
                if not _COUNT.fullmatch(c) or int(c) > MAX_COUNT:
                    where = f"'{path}':{i + 2}"
                    raise CheckpointError(f"{where}: count {c[:40]!r} is not a non-negative integer below 2^53")
                hits[i, j] = int(c)
        # each routed token picks n_expert_used experts, so a layer's tokens are its hits / n_expert_used
        tokens = _checked_sum(hits, path, axis=1) // np.uint64(max(used, 1))
        return cls(hits, tokens.astype(np.uint64), used)


def _first_bad_count(value, where: str = "") -> tuple[str, object] | None:
    """The first element of nested lists that is not a whole count 0..MAX_COUNT (an int; not a bool, a float such as
    1e30, a string), as (its index path, it); None if every one is."""
    stack = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, list):
            stack.extend((x, f"{at}[{i}]") for i, x in reversed(list(enumerate(v))))
        elif isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_COUNT:
            return at, v
    return None


def _checked_sum(counts: np.ndarray, path, axis: int) -> np.ndarray:
    """counts summed over an axis, refused where a sum passes MAX_COUNT (uint64 sums would wrap silently)."""
    sums = counts.astype(object).sum(axis=axis) if counts.size else counts.sum(axis=axis)
    if counts.size and max(int(s) for s in np.ravel(sums)) > MAX_COUNT:
        raise CheckpointError(f"'{path}': the counts sum past {MAX_COUNT} (2^53 - 1): not a recorded run's")
    return np.asarray(sums, dtype=np.uint64)


def profile(model, prompts: list[list[int]], tokens_per_prompt: int = 32) -> RoutingStats:
    """Route the prompts and greedy continuations through the model and count every expert pick."""
    if not prompts:
        raise ArgumentError("profiling needs at least one prompt")
    model.reset_routing()
    for ids in prompts:
        with model.context(min(model.config.max_position_embeddings, len(ids) + tokens_per_prompt + 1)) as ctx:
            ctx.generate(ids, tokens_per_prompt)
    return RoutingStats.from_model(model)
