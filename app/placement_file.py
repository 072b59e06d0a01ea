"""The placement file the window reads and writes.

The placement file is a stand-in for the versioned profile (engine.profile, issue 7): one YAML mapping with
the placement's text form, plus the model it was made for, for the reader's information only:

    # expertbench placement
    model: /home/me/models/Qwen3-30B-A3B
    placement: "0-23=cuda:0; 24-47=cpu:0"
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml

from engine.checkpoint import ModelConfig
from engine.placement import Placement


class PlacementFileError(ValueError):
    """A placement file that cannot be read; the message names the file and what is wrong."""


def _atomic_write(path: Path, text: str) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_placement(path: str | os.PathLike, placement: Placement, model: str | None = None) -> None:
    lines = ["# expertbench placement (profiles with run settings come with engine.profile)"]
    if model:
        lines.append(f"model: {yaml.safe_dump(str(model), default_style=chr(34)).strip()}")
    lines.append(f"placement: {yaml.safe_dump(placement.describe(), default_style=chr(34)).strip()}")
    _atomic_write(Path(path), "\n".join(lines) + "\n")


def read_placement_text(path: str | os.PathLike) -> str:
    """The placement text stored in a file (not yet checked against a model)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlacementFileError(f"cannot read '{path}': {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise PlacementFileError(f"'{path}{where}' is not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict) or "placement" not in data:
        raise PlacementFileError(f"'{path}' has no 'placement:' entry (expected e.g. placement: \"0-3=cpu:0\")")
    text = data["placement"]
    if not isinstance(text, str):
        raise PlacementFileError(f"'{path}': 'placement' must be a text such as \"0-3=cpu:0\", got {text!r}")
    return text


def open_placement(path: str | os.PathLike, config: ModelConfig, default: str) -> Placement:
    """Read and parse a placement file for a model (engine errors name the bad rule)."""
    return Placement.parse(read_placement_text(path), config, default=default)
