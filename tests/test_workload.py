"""The work a run states (engine.runs.workload, `run --prompt-file / --prompt-tokens / --depth`): the user's own
prompts from a file, a synthetic prompt of N tokens, and decoding at a depth of context; bad values refused by name
before any model loads."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.cli import main
from engine.core.errors import ArgumentError, RangeError
from engine.model import Engine, Model
from engine.runs.run import DecodeRun
from engine.runs.speculative import GreedyDecoder
from engine.runs.workload import read_prompt_file, synthetic_ids

QWEN, DRAFT = FIXTURES / "qwen3moe-f32", FIXTURES / "qwen3-f32"


@pytest.fixture(scope="module")
def pair():
    with Engine() as eng:
        yield eng.load(QWEN), eng.load(DRAFT)


# ---- prompt files -------------------------------------------------------------------------------------------


def test_a_text_file_is_one_prompt_per_line_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("\ufeffThe first prompt\n\n   \nsecond: with { and } inside\r\nthird ünïcode ✓\n", encoding="utf-8")
    assert read_prompt_file(path) == ["The first prompt", "second: with { and } inside", "third ünïcode ✓"]


def test_json_lines_take_each_objects_prompt(tmp_path):
    path = tmp_path / "work.jsonl"
    path.write_text('{"prompt": "one\\nwith a newline", "id": 7}\n\n{"prompt": "two"}\n', encoding="utf-8")
    assert read_prompt_file(path) == ["one\nwith a newline", "two"]
    braces = tmp_path / "work.txt"  # not .jsonl, but its first line is an object: JSON Lines
    braces.write_text('{"prompt": "three"}\n', encoding="utf-8")
    assert read_prompt_file(braces) == ["three"]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("missing.txt", None, r"missing\.txt: no such file"),
        ("binary.txt", b"a prompt\n\x00\x01\x02", r"binary\.txt: a binary file \(a NUL byte at offset 9\)"),
        ("latin1.txt", b"fine\ncaf\xe9\n", r"latin1\.txt:2: not UTF-8 text \(byte 0xe9 at offset 8\)"),
        ("empty.txt", b"\n  \n", r"empty\.txt: no prompts in it"),
        ("bad.jsonl", b'{"prompt": "ok"}\n{"prompt": \n', r"bad\.jsonl:2: not JSON"),
        ("nokey.jsonl", b'{"prompt": "ok"}\n{"text": "x"}\n', r"nokey\.jsonl:2: no 'prompt'"),
        ("number.jsonl", b'{"prompt": 3}\n', r"number\.jsonl:1: 'prompt' 3: expected an object with a non-empty"),
        ("list.jsonl", b'["prompt"]\n', r"list\.jsonl:1: no 'prompt'"),
        ("blank.jsonl", b'{"prompt": ""}\n', r"blank\.jsonl:1: 'prompt' '': expected"),
    ],
)
def test_a_bad_prompt_file_is_refused_naming_the_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ArgumentError, match=message):
        read_prompt_file(path)


def test_a_folder_is_not_a_prompt_file(tmp_path):
    with pytest.raises(ArgumentError, match="not a regular file"):
        read_prompt_file(tmp_path)


# ---- synthetic tokens and depth -----------------------------------------------------------------------------


def test_synthetic_tokens_are_text_that_reads_on_from_an_offset(pair):
    target, _ = pair
    whole = synthetic_ids(target, 300)
    assert len(whole) == 300 and all(0 <= i < target.config.vocab_size for i in whole)
    assert synthetic_ids(target, 300) == whole  # deterministic
    assert synthetic_ids(target, 120, offset=180) == whole[180:]
    assert len(set(whole)) > 20  # text, not one token repeated
    with pytest.raises(ArgumentError):
        synthetic_ids(target, -1)


def test_a_run_at_a_depth_gives_the_outputs_of_its_context_and_prompt_as_one_prompt(pair):
    target, draft = pair
    prompt = synthetic_ids(target, 12, offset=40)
    at_depth = DecodeRun(target, prompts=[prompt], tokens_per_prompt=10, depth=40).run()
    context = synthetic_ids(target, 40)
    whole = DecodeRun(target, prompts=[context + prompt], tokens_per_prompt=10).run()
    assert at_depth.depth == 40 and whole.depth == 0
    assert at_depth.prompts[0].generated_ids == whole.prompts[0].generated_ids
    assert at_depth.prompts[0].prompt_tokens == 12  # the context is not the prompt
    assert at_depth.repeat_results[0].prefill_tokens == 12  # nor part of what the prefill figure counts
    spec = DecodeRun(target, draft, prompts=[prompt], tokens_per_prompt=10, depth=40, q=3, repeats=2).run()
    assert spec.prompts[0].generated_ids == at_depth.prompts[0].generated_ids and spec.repeats_agree
    assert spec.drafted_tokens > 0


def begins_counted(monkeypatch) -> list[int]:
    """GreedyDecoder.begin (the context's prefill before a prompt, SpeculativeDecoder's too) counted."""
    calls = []
    real = GreedyDecoder.begin

    def begin(self, context_ids):
        calls.append(len(context_ids))
        real(self, context_ids)

    monkeypatch.setattr(GreedyDecoder, "begin", begin)
    return calls


def same_logits(run, whole) -> bool:
    """Whether every repeat of run gave each prompt the tokens and top-2 logits (the bits) of whole's one repeat."""
    one = whole.trails[0]
    assert all(t.logits is not None for rep in (one, *run.trails) for t in rep)  # what is compared is there
    return all(
        len(rep) == len(one) and all(np.array_equal(a.logits, b.logits) and np.array_equal(a.ids, b.ids)
                                     for a, b in zip(rep, one, strict=True))
        for rep in run.trails
    )  # fmt: skip


def test_a_depth_s_context_is_prefilled_once_and_kept_for_every_prompt(pair, monkeypatch):
    """Without sliding-window layers each prompt truncates back to the context prefilled before the first: the same
    tokens as the context and the prompt given as one prompt, for every prompt and repeat, speculative or not."""
    target, draft = pair
    prompts = [synthetic_ids(target, 9, offset=40), synthetic_ids(target, 14, offset=90)]
    context = synthetic_ids(target, 40)
    whole = DecodeRun(target, prompts=[context + p for p in prompts], tokens_per_prompt=10).run()
    calls = begins_counted(monkeypatch)
    for d in (None, draft):
        run = DecodeRun(target, d, prompts=prompts, tokens_per_prompt=10, depth=40, q=3, repeats=2).run()
        assert same_logits(run, whole)
    assert calls == [40, 40]  # once a run


def test_a_depth_s_context_is_prefilled_again_where_a_prompt_overwrites_a_ring(monkeypatch):
    """gpt-oss's sliding-window layers keep window + n_batch - 1 rows: with contexts of 8-token batches a prompt and
    its tokens overwrite the context's last rows, so each prompt starts from the context prefilled anew, and gives
    the tokens of the context and the prompt as one prompt; with 512-token batches nothing is overwritten and the
    context is prefilled once."""
    with Engine() as eng:
        model = eng.load(FIXTURES / "gpt-oss-bf16")
        assert max(model.config.layer_windows) == 8
        prompts = [synthetic_ids(model, 9, offset=30), synthetic_ids(model, 12, offset=60)]
        context = synthetic_ids(model, 30)
        whole = DecodeRun(model, prompts=[context + p for p in prompts], tokens_per_prompt=12).run()
        calls = begins_counted(monkeypatch)
        run = DecodeRun(model, prompts=prompts, tokens_per_prompt=12, depth=30, repeats=2).run()
        assert same_logits(run, whole)
        assert calls == [30]
        real = Model.context
        monkeypatch.setattr(
            Model, "context", lambda self, n_ctx=None, n_batch=8, kv="f32": real(self, n_ctx, n_batch, kv)
        )
        calls.clear()
        run = DecodeRun(model, prompts=prompts, tokens_per_prompt=12, depth=30, repeats=2).run()
        assert same_logits(run, whole)
        assert calls == [30] * 4


@pytest.mark.parametrize("depth", [-1, 1.5, True, "8", None])
def test_a_depth_that_is_not_a_count_is_refused(pair, depth):
    with pytest.raises(ArgumentError, match="depth"):
        DecodeRun(pair[0], prompts=["hello"], tokens_per_prompt=4, depth=depth)


def test_a_depth_beyond_the_models_positions_is_refused_naming_it(pair):
    with pytest.raises(RangeError, match=r"a depth of 250 tokens, the longest prompt and 8 generated tokens need"):
        DecodeRun(pair[0], prompts=["hello there"], tokens_per_prompt=8, depth=250)
    with pytest.raises(RangeError, match="depth of 2361183241434822606848 tokens"):
        DecodeRun(pair[0], prompts=["hello"], tokens_per_prompt=8, depth=2**71)  # refused before any allocation


# ---- the command line ---------------------------------------------------------------------------------------


def test_run_reads_a_prompt_file_and_names_its_tests(tmp_path, capsys):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "The quick brown fox"}\n{"prompt": "Mixture of experts"}\n', encoding="utf-8")
    assert main(["run", "--model", str(QWEN), "--prompt-file", str(path), "-n", "6", "--repeats", "1",
                 "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert [p["prompt"] for p in report["prompts"]] == ["The quick brown fox", "Mixture of experts"]
    lengths = [p["prompt_tokens"] for p in report["prompts"]]
    mean = round(sum(lengths) / 2)
    assert report["tests"][0]["test"] == (f"pp{mean}" if len(set(lengths)) == 1 else f"pp~{mean}")
    assert report["tests"][1]["test"] == "tg5" and report["depth"] == 0


def test_run_with_prompt_tokens_at_a_depth_prints_llama_bench_rows(capsys):
    args = ["run", "--model", str(QWEN), "--draft", str(DRAFT), "--prompt-tokens", "24", "--depth", "32", "-n", "9"]
    assert main(args + ["--repeats", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["depth"] == 32 and [t["test"] for t in report["tests"]] == ["pp24 @ d32", "tg8 @ d32"]
    assert report["prompts"][0]["prompt"] == "<24 synthetic tokens>" and report["prompts"][0]["prompt_tokens"] == 24
    assert all(t["tokens_per_second"] > 0 for t in report["tests"])
    assert main(args + ["--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "after 32 tokens of context" in out and "pp24 @ d32" in out and "tg8 @ d32" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--prompt-tokens", "0"], "--prompt-tokens 0: expected a positive number"),
        (["--depth", "-3"], "--depth -3: expected a number of context tokens >= 0"),
        (["--depth", "300"], "a depth of 300 tokens"),
        (["--prompt-file", "{missing}"], "no such file"),
        (["--prompt-file", "{binary}"], "a binary file"),
    ],
)
def test_bad_workload_options_exit_2_naming_them(tmp_path, capsys, extra, message):
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"\x7fELF\x00\x00")
    extra = [e.format(missing=tmp_path / "none.txt", binary=binary) for e in extra]
    assert main(["run", "--model", str(QWEN), "-n", "4", "--repeats", "1", *extra]) == 2
    assert message in capsys.readouterr().err


def test_prompt_sources_are_one_at_a_time(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--model", str(QWEN), "--prompt", "x", "--prompt-tokens", "8"])
    assert exit_.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


# ---- chat templates -----------------------------------------------------------------------------------------

GGUF = FIXTURES / "qwen3moe-gguf" / "model-f32.gguf"


def folder_with(tmp_path, **files):
    """The f32 fixture's folder (its files linked) with the given files beside them."""
    folder = tmp_path / "model"
    folder.mkdir()
    for f in QWEN.iterdir():
        (folder / f.name).symlink_to(f)
    for name, text in files.items():
        (folder / name.replace("__", ".")).write_text(text, encoding="utf-8")
    return folder


def test_chat_wraps_each_prompt_in_the_gguf_files_template(capsys):
    assert main(["run", "--model", str(GGUF), "--chat", "--prompt", "Hello there", "-n", "6", "--repeats", "1",
                 "--no-draft", "--json"]) == 0  # fmt: skip
    (prompt,) = json.loads(capsys.readouterr().out)["prompts"]
    assert prompt["prompt"] == "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
    with Engine() as eng:
        model = eng.load(GGUF)
        assert prompt["prompt_tokens"] == len(model.encode(prompt["prompt"]))
        assert model.encode("<|im_start|>") == [model.tokenizer.token_to_id("<|im_start|>")]  # one special token


ROLES = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<bot>"
NAMED = [{"name": "tool_use", "template": "no"}, {"name": "default", "template": ROLES}]


@pytest.mark.parametrize(
    "files",
    [{"chat_template__jinja": ROLES}, {"tokenizer_config__json": json.dumps({"chat_template": NAMED})}],
    ids=["jinja-file", "named-list"],
)
def test_a_folders_template_is_its_jinja_file_or_its_tokenizer_configs(tmp_path, capsys, files):
    folder = folder_with(tmp_path, **files)
    assert main(["run", "--model", str(folder), "--chat", "--prompt", "hi", "-n", "4", "--repeats", "1",
                 "--no-draft", "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["prompts"][0]["prompt"] == "<user>hi<bot>"


@pytest.mark.parametrize(
    "files, message",
    [
        ({}, "has no chat template"),
        ({"chat_template__jinja": "{% for m in messages %}{{ m.content }"}, "its chat template fails (line 1)"),
        ({"chat_template__jinja": "{{ raise_exception('system messages only') }}"}, "system messages only"),
        ({"chat_template__jinja": "{{ ''.__class__.__mro__ }}"}, "its chat template fails"),  # the sandbox
        ({"tokenizer_config__json": "{not json"}, "tokenizer_config.json"),
    ],
    ids=["none", "syntax", "raise", "sandboxed", "damaged-config"],
)
def test_a_missing_or_failing_chat_template_exits_2_naming_the_model(tmp_path, capsys, files, message):
    folder = folder_with(tmp_path, **files)
    assert main(["run", "--model", str(folder), "--chat", "-n", "4", "--repeats", "1", "--no-draft"]) == 2
    assert message in capsys.readouterr().err


def test_chat_and_a_synthetic_prompt_are_refused_together(capsys):
    assert main(["run", "--model", str(GGUF), "--chat", "--prompt-tokens", "8", "-n", "4"]) == 2
    assert "--chat with --prompt-tokens" in capsys.readouterr().err
