"""What a run decodes besides the built-in prompts: the user's own prompts from a file, synthetic prompts of a stated
length, and a context of a stated depth before each prompt (as llama-bench's `-p N` and `-d D` state the work).

A prompt file is UTF-8 text, one prompt per non-empty line, or JSON Lines (a `.jsonl` file, or one whose first
non-empty line starts with '{'), one object per line with a string `prompt`. Synthetic tokens are the built-in
prompts' text as the model's tokenizer reads it, repeated: ordinary text, so that the routing they give is a text's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..checkpoints.demo import DEMO_PROMPTS
from ..core.errors import ArgumentError

MAX_PROMPT_FILE_BYTES = 64 << 20  # a workload of prompts, not a corpus
MAX_PROMPTS = 100_000


def read_prompt_file(path: str | os.PathLike) -> list[str]:
    """The prompts of a text or JSON Lines file (see the module docstring); ArgumentError naming the file (and the
    line) for one that is missing, not a regular file, too large, binary, not UTF-8, without prompts, or, as JSON
    Lines, with a line that is not an object holding a non-empty string `prompt`."""
    path = Path(path)
    if not path.exists():
        raise ArgumentError(f"prompt file {path}: no such file")
    if not path.is_file():
        raise ArgumentError(f"prompt file {path}: not a regular file: expected text, one prompt per line")
    size = path.stat().st_size
    if size > MAX_PROMPT_FILE_BYTES:
        raise ArgumentError(f"prompt file {path}: {size} bytes, more than a prompt file holds (at most "
                            f"{MAX_PROMPT_FILE_BYTES >> 20} MiB)")  # fmt: skip
    data = path.read_bytes()
    if b"\0" in data:
        raise ArgumentError(f"prompt file {path}: a binary file (a NUL byte at offset {data.index(0)}): expected text, "
                            "one prompt per line")  # fmt: skip
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ArgumentError(f"prompt file {path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                            f"{exc.start})") from None  # fmt: skip
    lines = [(no, line) for no, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise ArgumentError(f"prompt file {path}: no prompts in it: expected one prompt per line")
    if len(lines) > MAX_PROMPTS:
        raise ArgumentError(f"prompt file {path}: {len(lines)} prompts, more than a run takes (at most {MAX_PROMPTS})")
    if path.suffix.lower() != ".jsonl" and not lines[0][1].lstrip().startswith("{"):
        return [line for _, line in lines]
    prompts = []
    for no, line in lines:
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ArgumentError(f"prompt file {path}:{no}: not JSON ({exc.msg}): a JSON Lines prompt file holds one "
                                'object per line, {"prompt": "..."}') from None  # fmt: skip
        prompt = item.get("prompt") if isinstance(item, dict) else None
        if not isinstance(prompt, str) or not prompt:
            got = "no 'prompt'" if not isinstance(item, dict) or "prompt" not in item else f"'prompt' {prompt!r:.60}"
            raise ArgumentError(f"prompt file {path}:{no}: {got}: expected an object with a non-empty string 'prompt'")
        prompts.append(prompt)
    return prompts


def synthetic_ids(model, n: int, offset: int = 0) -> list[int]:
    """n token ids of ordinary text for `model`: the built-in prompts' text as its tokenizer reads it, repeated,
    starting `offset` tokens in (so a depth's context and the prompt after it read on as one text). A model
    without a tokenizer gets its vocabulary's ids in a fixed stride instead."""
    if n < 0 or offset < 0:
        raise ArgumentError(f"synthetic tokens: n {n} and offset {offset} must be >= 0")
    vocab = model.config.vocab_size
    if model.tokenizer is not None:
        cycle = model.encode(" " + " ".join(DEMO_PROMPTS))
    else:
        cycle = [(i * 7919 + 13) % vocab for i in range(vocab)]
    cycle = [i for i in cycle if 0 <= i < vocab] or [0]
    return [cycle[(offset + i) % len(cycle)] for i in range(n)]
