"""Checkpoints for benchmarks: the demo target in another dtype (written once into the demo cache)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from engine.checkpoints.checkpoint import Checkpoint
from engine.checkpoints.demo import ensure_demo_pair


def _as_f32(raw: bytes, dtype: str) -> np.ndarray:
    if dtype == "F32":
        return np.frombuffer(raw, dtype=np.float32)
    if dtype == "F16":
        return np.frombuffer(raw, dtype=np.float16).astype(np.float32)
    if dtype == "BF16":
        return (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    raise ValueError(f"cannot convert {dtype}")


def convert(src: Path, dst: Path, dtype: str) -> Path:
    """A copy of the checkpoint in src with every tensor in dtype ("f32"); kept when already there."""
    if dtype != "f32":
        raise ValueError(f"only f32 copies are made here, not {dtype}")
    done = dst / ".complete"
    if done.exists():
        return dst
    ckpt = Checkpoint.open(src)
    tmp = dst.with_name(dst.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, tmp / name)
    config = json.loads((tmp / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "float32"
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    weight_map, shard, shard_bytes, index = {}, {}, 0, 0

    def flush():
        nonlocal shard, shard_bytes, index
        if shard:
            index += 1
            name = f"model-{index:05d}.safetensors"
            save_file(shard, str(tmp / name))
            weight_map.update(dict.fromkeys(shard, name))
            shard, shard_bytes = {}, 0

    for t in ckpt.tensors.values():
        with open(t.file, "rb") as f:
            f.seek(t.offset)
            shard[t.name] = _as_f32(f.read(t.nbytes), t.dtype).reshape(t.shape)
        shard_bytes += shard[t.name].nbytes
        if shard_bytes > 1 << 30:
            flush()
    flush()
    (tmp / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    (dst / ".complete").write_text("")
    return dst


def demo_target(size: str, dtype: str, family: str | None = None) -> Path:
    """The demo target of a size (and family: engine.checkpoints.demo's, the default one when None) in bf16 (as built)
    or f32 (converted once, next to it in the cache)."""
    target = ensure_demo_pair(size, family=family).target
    if dtype == "bf16":
        return target
    return convert(target, target.parent / f"target-{dtype}", dtype)
