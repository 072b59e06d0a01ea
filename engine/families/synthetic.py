"""The seeded synthetic weights the families' demo recipes are made of (engine/checkpoints/demo.py writes them).

A tensor is a name, a shape and a maker of its float32 values; values depend only on (SEED, key), so the draft's
copy of a target tensor is bit-identical to it, and a recipe is its code: a manifest with another recipe is rebuilt.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

FORMAT_VERSION = 1
SEED = 20240604
INIT_STD = 0.1  # of every weight matrix; larger than usual so a random model's greedy output varies
NORM_STD = 0.1  # RMSNorm weights are 1 + NORM_STD * N(0, 1), so the norms are not all ones

# A tensor to write: its name, shape and a function producing its float32 values (called once, when written).
Tensor = tuple[str, tuple[int, ...], Callable[[], np.ndarray]]


class RawTensor:
    """The maker of a tensor written as the values it makes (uint8: MXFP4 blocks and scales), not rounded to bf16."""

    dtype = "U8"

    def __init__(self, make: Callable[[], np.ndarray]):
        self.make = make

    def __call__(self) -> np.ndarray:
        return self.make()


def rng(key: str) -> np.random.Generator:
    """The generator of one key's values: seeded by SEED and the key's hash, whatever was made before."""
    digest = hashlib.sha256(key.encode()).digest()
    return np.random.default_rng([SEED, int.from_bytes(digest[:8], "little")])


def normal(key: str, shape: tuple[int, ...], std: float = INIT_STD) -> np.ndarray:
    a = rng(key).standard_normal(shape, dtype=np.float32)
    a *= np.float32(std)
    return a


def matrix(key: str, shape, scale: float = 1.0) -> Callable[[], np.ndarray]:
    return lambda: normal(key, shape, INIT_STD * scale)


def norm_weight(key: str, n: int) -> Callable[[], np.ndarray]:
    def make() -> np.ndarray:
        w = normal(f"norm.{key}", (n,), NORM_STD)
        w += np.float32(1.0)
        return w

    return make


@functools.lru_cache(maxsize=4)
def base_matrix(key: str, shape: tuple[int, ...]) -> np.ndarray:
    """A layer's base MLP matrix, read-only: every expert of the layer adds its deviation to it (kept for the next
    expert: the experts of a layer are written one after the other)."""
    a = normal(key, shape)
    a.flags.writeable = False
    return a


def expert(layer: int | str, e: int, proj: str, shape, deviation: float, scale: float) -> Callable[[], np.ndarray]:
    """Expert e's matrix of a layer: the layer's base MLP matrix plus its own deviation (deviation x INIT_STD), times
    scale."""

    def make() -> np.ndarray:
        w = base_matrix(f"{layer}.base.{proj}", tuple(shape)).copy()
        w += normal(f"{layer}.expert.{e}.{proj}", shape, INIT_STD * deviation)
        if scale != 1.0:
            w *= np.float32(scale)
        return w

    return make


def vector(key: str, n: int, std: float) -> Callable[[], np.ndarray]:
    return lambda: normal(key, (n,), std)


def evenly_spaced(num_layers: int, draft_layers: int) -> list[int]:
    """Target layer carried by each draft layer: evenly spaced, the first and last included."""
    if draft_layers == 1:
        return [0]
    return [round(j * (num_layers - 1) / (draft_layers - 1)) for j in range(draft_layers)]


@dataclass(frozen=True)
class DemoRecipe:
    """A family's built-in synthetic pair (engine/checkpoints/demo.py builds and caches it): its name there
    ('deepseek'), the target and the draft in words, the file formats it is written in, its sizes (name -> a frozen
    dataclass, whose fields are part of the recipe), config(size, role, eos_id) -> config.json, tensors(size, role) ->
    the tensors in file order, layer_map(size) -> the target layer each draft layer carries, what its folders' weights
    are where not all BF16, and whether its folders carry a tokenizer_config.json
    (engine.checkpoints.demo.TOKENIZER_CONFIG)."""

    name: str
    target: str
    draft: str
    formats: tuple[str, ...]
    sizes: Mapping[str, Any]
    config: Callable[[Any, str, int], dict]
    tensors: Callable[[Any, str], Any]
    layer_map: Callable[[Any], list[int]]
    folder_weights: str | None = None
    tokenizer_config: bool = False
