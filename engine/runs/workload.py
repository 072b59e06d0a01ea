"""What a run decodes besides the built-in prompts: the user's own prompts from a file, synthetic prompts of a stated
length, and a context of a stated depth before each prompt (as llama-bench's `-p N` and `-d D` state the work).

A prompt file is UTF-8 text, one prompt per non-empty line, or JSON Lines (a `.jsonl` file, or one whose first
non-empty line starts with '{'), one object per line with a string `prompt`. Synthetic tokens are the built-in
prompts' text as the model's tokenizer reads it, repeated: ordinary text, so that the routing they give is a text's.
A chat prompt is the model's own chat template (a folder's chat_template.jinja or tokenizer_config.json
`chat_template`, a GGUF file's `tokenizer.chat_template`) applied to one user message, as transformers applies it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..checkpoints.checkpoint import parse_json
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


def chat_template(checkpoint) -> str | None:
    """A checkpoint's chat template (Jinja source), None when it has none: a GGUF file's `tokenizer.chat_template`;
    a folder's chat_template.jinja, else its tokenizer_config.json `chat_template` (a text, or a list of named
    templates of which 'default' is taken)."""
    folder = Path(checkpoint.folder)
    if folder.is_file():
        text = checkpoint.raw_config.get("tokenizer.chat_template")
        return text if isinstance(text, str) and text else None
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8") or None
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None
    data = parse_json(config.read_bytes(), config, "a tokenizer config")
    text = data.get("chat_template") if isinstance(data, dict) else None
    if isinstance(text, list):
        named = {t.get("name"): t.get("template") for t in text if isinstance(t, dict)}
        text = named.get("default")
    return text if isinstance(text, str) and text else None


def apply_chat_template(model, prompt: str) -> str:
    """The prompt as one user message in the model's chat template, with the generation prompt after it (the
    assistant's turn begins); ArgumentError naming the model for one without a template or whose template fails."""
    source = chat_template(model.checkpoint)
    where = model.checkpoint.folder
    if source is None:
        raise ArgumentError(f"model '{where}' has no chat template (a GGUF file's tokenizer.chat_template, a "
                            "folder's chat_template.jinja or tokenizer_config.json chat_template): run without "
                            "--chat")  # fmt: skip
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ArgumentError("--chat needs the jinja2 package (pip install jinja2): chat templates are Jinja") from None

    def refuse(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals.update(raise_exception=refuse, strftime_now=lambda fmt: time.strftime(fmt))
    tokenizer = model.tokenizer

    def token(i):
        return tokenizer.id_to_token(i) if tokenizer is not None and i is not None else None

    eos = model.config.eos_token_id  # (a tuple: the first is the one a template writes)
    try:
        return env.from_string(source).render(
            messages=[{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            bos_token=token(model.config.bos_token_id) or "",
            eos_token=token(eos[0] if eos else None) or "",
        )
    except TemplateError as exc:
        line = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
        raise ArgumentError(f"model '{where}': its chat template fails{line}: {exc}") from None
