"""Profiles written to hurt: alias fan-outs, absurd ranges, endless files, tags and numbers that do not fit, deep
nesting. Each is a ProfileError with file:line (said once), quickly, and `expertbench regress` exits 2 on it
without a traceback."""

import os
import shutil
import stat
from pathlib import Path

import pytest

from engine.cli import main as cli_main
from engine.profiles import profile as P
from engine.profiles.profile import ProfileError

HEAD = "expertbench_profile: 1\nmodel: {demo: default}\n"


def write(tmp_path, text, name="p.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_alias_fan_out_is_refused_before_it_expands(tmp_path):
    # ten levels of nine aliases each: 9**10 values once expanded, from a file of under a kilobyte
    bomb = "bombs:\n" + "".join(f"  - &b{i} [" + ", ".join([f"*b{i - 1}" if i else "0"] * 9) + "]\n" for i in range(10))
    path = write(tmp_path, HEAD + bomb)
    with pytest.raises(ProfileError, match=rf"^{path}:1: not a profile: its aliases expand it to \d+ values"):
        P.load(path)
    # a few aliases are read as YAML reads them (and then checked as usual)
    text = HEAD + "routing:\n  top_k: 1\n  tokens: [1]\n  hits: &a0 [0, 0, 0, 0, 0, 0, 0, 0, 0]\n"
    text += "expectations:\n  output_sha256: [" + ", ".join(["*a0"] * 9) + "]\n"
    path = write(tmp_path, text, "small.yaml")
    with pytest.raises(ProfileError, match=rf"^{path}:\d+: expectations.output_sha256"):
        P.load(path)


def test_a_layer_range_beyond_any_model_is_refused_at_once(tmp_path):
    path = write(tmp_path, HEAD + "placement:\n  layers:\n    0-99999999999: cpu:0\n")
    with pytest.raises(ProfileError, match=rf"^{path}:5: placement.layers: key: index 99999999999 is beyond any"):
        P.load(path)
    path = write(tmp_path, HEAD + "placement:\n  experts:\n    0: {0-70000: cpu:0}\n")
    with pytest.raises(ProfileError, match=rf"^{path}:5: placement.experts.0: key: index 70000 is beyond any"):
        P.load(path)


@pytest.mark.parametrize(
    ("value", "message"),
    [("!!int 'abc'", "'abc' is not a valid int"), (str(2**70), f"{2**70} does not fit in 64 bits"),
     ("!!float 'x'", "'x' is not a valid float"), (str(-(2**64)), f"{-(2**64)} does not fit in 64 bits")],
)  # fmt: skip
def test_tags_and_numbers_that_do_not_fit(tmp_path, value, message):
    path = write(tmp_path, HEAD + f"run:\n  tokens: {value}\n")
    with pytest.raises(ProfileError, match=rf"^{path}:4: run.tokens: {message}"):
        P.load(path)


def test_nesting_a_thousand_deep(tmp_path):
    path = write(tmp_path, HEAD + "description: " + "[" * 1000 + "]" * 1000 + "\n")
    with pytest.raises(ProfileError, match=rf"^{path}:1: not a profile: nested too deeply"):
        P.load(path)


def test_a_hotness_table_that_is_not_a_regular_file_is_not_read(tmp_path):
    path = write(tmp_path, HEAD + "routing: {hotness_csv: /dev/zero}\n")
    profile = P.load(path)
    with pytest.raises(ProfileError, match=rf"^{path}:3: routing: '/dev/zero': not a regular file") as err:
        profile.routing_stats()
    assert str(err.value).count(f"{path}:") == 1  # the place is said once
    big = tmp_path / "big.csv"
    with open(big, "wb") as f:
        f.truncate((64 << 20) + 1)  # sparse: larger than the cap, costs no disk
    path = write(tmp_path, HEAD + f"routing: {{hotness_csv: {big}}}\n", "big.yaml")
    with pytest.raises(ProfileError, match="larger than 64 MiB"):
        P.load(path).routing_stats()
    os.unlink(big)


@pytest.mark.parametrize(
    ("ref", "message"),
    [("{demo: default, format: FORMAT}", "model.format: demo model format 'xxxxx"),
     ("{demo: default, format: gguf, quant: FORMAT}", "model.quant: demo quantization 'xxxxx"),
     ("{demo: FORMAT}", "model.demo: unknown demo size 'xxxxx"),
     ("{demo: default, format: ~}", "model.format: expected a non-empty string, got None"),
     ("{demo: default, format: gguf, quant: 8}", "model.quant: expected a non-empty string, got 8"),
     ("{demo: default, format: !!binary Z2d1Zg==}", "model.format: tag 'tag:yaml.org,2002:binary' is not allowed")],
)  # fmt: skip
def test_a_demo_format_or_quantization_that_is_no_name(tmp_path, ref, message):
    """A megabyte where a demo's size, format or quantization goes: the error shows its start, not all of it."""
    path = write(tmp_path, "expertbench_profile: 2\nmodel: " + ref.replace("FORMAT", "x" * (1 << 20)) + "\n")
    with pytest.raises(ProfileError) as err:
        P.load(path)
    assert str(err.value).startswith(f"{path}:2: {message}") and len(str(err.value)) < 400, str(err.value)[:400]


@pytest.mark.parametrize(
    "body",
    ["run:\n  tokens: !!int 'abc'\n", "placement:\n  layers:\n    0-99999999999: cpu:0\n",
     "description: " + "[" * 1000 + "]" * 1000 + "\n", "run:\n  tokens: " + str(2**70) + "\n",
     "routing: {hotness_csv: /dev/zero}\nexpectations: {output_sha256: [" + "ab" * 32 + "]}\n"],
)  # fmt: skip
def test_regress_on_a_hostile_profile_exits_2_with_one_line(tmp_path, capsys, body, xdg_cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg_cache))
    path = write(tmp_path, HEAD + body)
    assert cli_main(["regress", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count(f"{path}:") == 1, err


def _fifo_and_link(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link-to-pipe"
    link.symlink_to(fifo)
    return fifo, link


def test_files_the_tool_writes_never_replace_a_fifo_or_block_on_it(tmp_path):
    """atomic_write (profiles, traces, history and exports) and every command's output path: a path that exists and
    is not a regular file (a device node, a FIFO; through a link too) is refused, and stays what it was."""
    from engine.core.errors import ArgumentError
    from engine.core.files import atomic_write

    fifo, link = _fifo_and_link(tmp_path)
    for target in (fifo, link):
        with pytest.raises(ArgumentError, match=rf"cannot write '{target}': it is a FIFO; expected a regular file"):
            atomic_write(target, "text")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link-to-pipe", "pipe"]  # no temp file left
    with pytest.raises(ProfileError, match="not a regular file: expected a profile file"):
        P.load(fifo)  # read, it would block forever


@pytest.mark.parametrize(
    "argv",
    [["run", "--trace", "OUT", "-n", "4", "--repeats", "1"],
     ["tune", "--out", "OUT"],
     ["regress", "PROFILE", "--report-json", "OUT"],
     ["regress", "PROFILE", "--junit", "OUT"],
     ["export", "PROFILE", "--format", "llama.cpp", "-o", "OUT"],
     ["export", "PROFILE", "--format", "sglang", "-o", "OUT"],
     ["import-routing", "CSV", "--format", "lucebox", "--into", "OUT"]],
)  # fmt: skip
def test_each_commands_output_path_refuses_a_fifo_with_one_line(tmp_path, capsys, argv, xdg_cache):
    fifo, link = _fifo_and_link(tmp_path)
    profile = tmp_path / "split.yaml"
    shutil.copy(Path(__file__).resolve().parent.parent / "profiles" / "split.yaml", profile)
    csv = tmp_path / "hot.csv"
    csv.write_text("# hotness table: n_layer=8 n_expert=8 n_expert_used=2\n" + "1,1,1,1,1,1,1,1\n" * 8)
    for target in (fifo, link):
        args = [{"OUT": str(target), "PROFILE": str(profile), "CSV": str(csv)}.get(a, a) for a in argv]
        assert cli_main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ("not a regular file" in err or "it is a FIFO" in err), err
        assert stat.S_ISFIFO(os.stat(fifo).st_mode) and link.is_symlink()
