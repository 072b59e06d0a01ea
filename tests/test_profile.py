"""Profiles: strict reading with file:line errors, lossless round trips, atomic saves, fingerprints."""

import os
import shutil
from pathlib import Path

import pytest
from fixture_paths import FIXTURES

from engine.checkpoints.checkpoint import Checkpoint
from engine.core.errors import ArgumentError
from engine.placement.placement import Placement
from engine.profiles import profile as P
from engine.profiles.profile import Profile, ProfileError

EXAMPLES = Path(__file__).resolve().parent.parent / "profiles"

FULL = """\
expertbench_profile: 1
description: every key once
model:
  path: ../models/target
  fingerprint: sha256:{fp}
draft:
  demo: default
  device: cpu:1
devices:
  cpu: {{devices: 2, threads: 1}}
  hostsim: 1
primary: cpu:0
placement:
  default: cpu:0
  layers:
    0: cpu:1
    2-3: hostsim:0
  experts:
    2: {{0-1: cpu:0, 7: cpu:1}}
run:
  prompts: ["a: b, c", [1, 2, 3]]
  tokens: 8
  repeats: 2
  q: 3
  mode: owner_local
  precision: q8
  weights: map
expectations:
  output_sha256: ["{h}", "{h}"]
  min_accept_rate: 0.5
  speed: {{baseline: base.yaml, min_ratio: 0.8}}
routing:
  top_k: 2
  tokens: [3, 0]
  hits:
    - [1, 2, 3]
    - [0, 0, 0]
""".format(fp="a" * 64, h="0123456789abcdef" * 4)


IDS, GAPS = "AQAAAAIAAAA=", "jhYAPA=="  # ids [1, 2], gaps [0.0016, 1.0]
OUT = """\
expertbench_profile: {v}
model: {{demo: default}}
run: {{prompts: [[7, 8]], tokens: 2}}
expectations:
  output_sha256: [34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f]
  outputs:
    settings: {{placement: '0-7=cpu:0', mode: reference, precision: f32, q: 2, kernels: avx2}}
    prompts:
      - {{ids: {ids}, gaps: {gaps}}}
"""


def test_recorded_outputs_round_trip_and_ask_for_format_4(tmp_path):
    p = P.load(write(tmp_path, OUT.format(v=4, ids=IDS, gaps=GAPS)))
    e = p.expectations
    assert e.outputs[0].ids.tolist() == [1, 2] and e.outputs[0].gaps.tolist() == pytest.approx([0.0016, 1.0], rel=1e-3)
    assert e.outputs_settings == {"placement": "0-7=cpu:0", "mode": "reference", "precision": "f32", "q": 2,
                                  "kernels": "avx2"}  # fmt: skip
    p.save(tmp_path / "again.yaml")
    assert P.load(tmp_path / "again.yaml") == p and p.needed_version() == 4
    assert "- ids: AQAAAAIAAAA=\n" in (tmp_path / "again.yaml").read_text()


def write(tmp_path, text, name="p.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_full_profile_round_trip_is_lossless(tmp_path):
    first = P.load(write(tmp_path, FULL))
    assert first.placement.layers == [(0, 0, "cpu:1"), (2, 3, "hostsim:0")]
    assert first.placement.experts == [(2, 0, 1, "cpu:0"), (2, 7, 7, "cpu:1")]
    assert first.run.prompts == ["a: b, c", [1, 2, 3]]
    assert first.run.weights == "map" and first.run.resolved()["weights"] == "map"
    assert first.run.precision == "q8" and first.run.resolved()["precision"] == "q8"
    assert first.devices["cpu"].threads == 1 and first.devices["hostsim"].devices == 1
    saved = first.save(tmp_path / "again.yaml")
    second = P.load(saved)
    assert second == first
    text = saved.read_text()
    second.save(tmp_path / "third.yaml")
    assert (tmp_path / "third.yaml").read_text() == text  # the canonical form is a fixed point
    assert "  mode: owner_local\n  precision: q8\n  weights: map\n" in text  # beside the mode, as written


@pytest.mark.parametrize("name", ["cpu-only.yaml", "split.yaml", "cold-layers.yaml", "gguf-q8.yaml"])
def test_example_profiles_round_trip(tmp_path, name):
    original = P.load(EXAMPLES / name)
    copy = original.save(tmp_path / name)
    assert P.load(copy) == original
    assert copy.read_text() == (EXAMPLES / name).read_text()  # the examples are stored in the canonical form


GGUF_DEMO = """\
expertbench_profile: 2
model:
  demo: default
  format: gguf
  quant: mxfp4
draft:
  demo: default
  format: gguf
run:
  precision: q8
"""


def test_the_gguf_demo_pair_round_trip(tmp_path):
    first = P.load(write(tmp_path, GGUF_DEMO))
    assert (first.model.demo, first.model.format, first.model.quant) == ("default", "gguf", "mxfp4")
    assert first.model.demo_format() == ("gguf", "mxfp4")
    assert (first.draft.format, first.draft.quant) == ("gguf", None)  # as written: the default quantization
    assert first.draft.demo_format() == ("gguf", "q8_0") and first.version == 2
    saved = first.save(tmp_path / "again.yaml")
    assert P.load(saved) == first
    assert saved.read_text() == "# expertbench profile, format 2 (see profiles/README.md)\n" + GGUF_DEMO


def test_the_version_written_is_the_oldest_that_says_it_all(tmp_path):
    """Format 1 readers refuse `format`/`quant`; a profile that holds them is written as format 2, any other as 1."""
    folder = Profile(model=P.ModelRef(demo="default"))
    assert folder.to_data()["expertbench_profile"] == 1 and folder.model.demo_format() == ("safetensors", None)
    gguf = Profile(model=P.ModelRef(demo="default"), draft=P.ModelRef(demo="default", format="gguf", quant="q8_0"))
    assert gguf.to_data()["expertbench_profile"] == 2
    assert gguf.to_yaml().startswith("# expertbench profile, format 2")
    assert P.loads(gguf.to_yaml()).draft == gguf.draft
    # a format-2 file without the new keys stays format 2 (load-save-load is lossless)
    two = P.load(write(tmp_path, "expertbench_profile: 2\nmodel: {demo: default}\n"))
    assert two.to_data() == {"expertbench_profile": 2, "model": {"demo": "default"}}


def test_minimal_profile_defaults(tmp_path):
    p = P.load(write(tmp_path, "expertbench_profile: 1\nmodel: {demo: default}\n"))
    assert p.primary_device == "cpu:0" and p.device_names() == ["cpu:0"] and p.draft is None
    settings = p.run.resolved()
    assert settings["tokens_per_prompt"] == 32 and settings["repeats"] == 3 and settings["mode"] == "reference"
    assert settings["precision"] == "f32" and p.run.precision is None  # the reference, and none written back
    assert p.to_data() == {"expertbench_profile": 1, "model": {"demo": "default"}}


BAD = [
    ("expertbench_profile: 1\nmodel: {demo: default}\ncolour: red\n", 3, "unknown key 'colour'"),
    ("model: {demo: default}\n", 1, "'expertbench_profile' is missing"),
    (f"expertbench_profile: {P.FORMAT_VERSION + 1}\nmodel: {{demo: default}}\n", 1,
     f"format {P.FORMAT_VERSION + 1} is newer than this expertbench reads ({P.FORMAT_VERSION})"),
    ("expertbench_profile: 0\nmodel: {demo: default}\n", 1, f"expected a format version 1..{P.FORMAT_VERSION}, got 0"),
    ("expertbench_profile: 1\n", 1, "'model' is missing"),
    ("expertbench_profile: 1\nmodel: {demo: default, path: x}\n", 2, "exactly one of 'path'"),
    ("expertbench_profile: 1\nmodel: {demo: huge}\n", 2, "unknown demo size 'huge'"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nrun:\n  tokens: many\n", 4, "run.tokens: expected an integer"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nrun:\n  repeats: 0\n", 4, "got 0"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nrun:\n  q: 2\n", 4, "run.q: a draft length needs a 'draft'"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nrun:\n  mode: fast\n", 4, "got 'fast'"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nrun:\n  tokens: 8\n  precision: Q8\n", 5,
     "run.precision: expected one of f32, q8 (f32: the reference; q8: int8 activations as llama.cpp), got 'Q8'"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nrun:\n  precision: [q8]\n", 4,
     "run.precision: expected a single value, got a list"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nrun:\n  weights: mmap\n", 4,
     "run.weights: expected one of auto, map, copy, got 'mmap'"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nrun:\n  prompts: []\n", 4, "run.prompts: empty"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nrun:\n  prompts: [[1, -2]]\n", 4, "token id"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nplacement:\n  layers:\n    0-3: cpu:1\n", 5,
     "device 'cpu:1' is not among the profile's devices (cpu:0)"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nplacement:\n  layers:\n    0: gpu\n", 5,
     "expected a device name RUNTIME:INDEX"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nplacement:\n  layers:\n    3-1: cpu:0\n", 5,
     "FIRST <= LAST"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nplacement:\n  layers:\n    0-3: cpu:0\n    2: cpu:0\n", 6,
     "layer 2 is listed twice (also on line 5)"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nplacement:\n  experts:\n    1: {0-3: cpu:0, 2: cpu:0}\n", 5,
     "expert 2 is listed twice"),
    ("expertbench_profile: 1\nmodel: {demo: default}\ndevices:\n  tpu: 1\n", 4, "unknown runtime 'tpu'"),
    ("expertbench_profile: 1\nmodel: {demo: default}\ndevices:\n  cuda: {devices: 1, threads: 4}\n", 4,
     "only cpu and hostsim devices have worker threads"),
    ("expertbench_profile: 1\nmodel: {demo: default}\ndevices:\n  cuda: 1\n", 1,
     "the default 'cpu:0' is not among the profile's devices"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nmodel: {demo: bench}\n", 3, "key 'model' appears twice"),
    ("expertbench_profile: 1\nmodel: {demo: default, fingerprint: abc}\n", 2, "'sha256:' and 64 lowercase hex"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nexpectations:\n  output_sha256: [abc]\n", 4,
     "64 lowercase hex digits, got 'abc'"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nexpectations:\n  output_sha256: [" + "a" * 64 + "]\n", 4,
     "1 hashes, expected one per prompt (4)"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nexpectations:\n  min_accept_rate: 0.5\n", 4,
     "acceptance needs a 'draft'"),
    ("expertbench_profile: 1\nmodel: {demo: default}\ndraft: {demo: default}\nexpectations:\n"
     "  min_accept_rate: 1.5\n", 5, "expected a number 0.0..1.0, got 1.5"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nexpectations:\n  speed: {min_ratio: 0.5}\n", 4,
     "'baseline' is missing"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nexpectations:\n  speed: {baseline: b.yaml, min_ratio: 0}\n",
     4, "expected a number > 0.0, got 0"),
    ("expertbench_profile: 1\nmodel: {demo: default}\nrouting:\n  top_k: 2\n  tokens: [1]\n  hits: [[1], [2]]\n",
     6, "2 rows, expected one per layer"),
    # the recorded outputs (format 4): per prompt the ids and their top-2 gaps, base64, as many as run.tokens
    (OUT.format(v=3, ids=IDS, gaps=GAPS), 7, "expectations.outputs: the recorded outputs need format version 4"),
    (OUT.format(v=4, ids=IDS, gaps="AAA="), 9,
     "expectations.outputs.prompts[0].gaps: 1 gaps, expected 2 (one per id in expectations.outputs.prompts[0].ids)"),
    (OUT.format(v=4, ids="AQAAAA==", gaps="AAA="), 9,
     "expectations.outputs.prompts[0].ids: 1 ids, expected 2 (one per generated token)"),
    (OUT.format(v=4, ids="[1, 2]", gaps=GAPS), 9,
     "expectations.outputs.prompts[0].ids: expected a single value, got a list"),
    (OUT.format(v=4, ids=3, gaps=GAPS), 9,
     "expectations.outputs.prompts[0].ids: expected base64 text of int32 token ids, got int 3"),
    (OUT.format(v=4, ids="AQAAAAMAAAA=", gaps=GAPS), 9,
     "expectations.outputs.prompts[0].ids: they do not hash to expectations.output_sha256[0]"),
    (OUT.format(v=4, ids=IDS, gaps=GAPS).replace("      - {ids", "      - {why: 1, ids"), 9,
     "expectations.outputs.prompts[0]: unknown key 'why' (expected one of ids, gaps)"),
    (OUT.format(v=4, ids=IDS, gaps=GAPS) + "      - {ids: " + IDS + ", gaps: " + GAPS + "}\n", 9,
     "expectations.outputs.prompts: 2 entries, expected one per prompt (1)"),
    (OUT.format(v=4, ids=IDS, gaps=GAPS).replace("q: 2", "q: two"), 7,
     "expectations.outputs.settings.q: expected an integer >= 1, got 'two'"),
    (OUT.format(v=4, ids=IDS, gaps=GAPS).replace("    prompts:", "    prompt:"), 8,
     "expectations.outputs: unknown key 'prompt'"),
    # the demo pair's file format and quantization (format 2)
    ("expertbench_profile: 2\nmodel:\n  demo: default\n  format: ggml\n", 4,
     "model.format: demo model format 'ggml' is unknown: expected one of safetensors, gguf"),
    ("expertbench_profile: 2\nmodel:\n  demo: default\n  format: gguf\n  quant: q4_k\n", 5,
     "model.quant: demo quantization 'q4_k' is unknown: expected one of q8_0, mxfp4"),
    ("expertbench_profile: 2\nmodel:\n  demo: default\n  quant: q8_0\n", 4,
     "model.quant: demo quantization 'q8_0': only the GGUF demo is quantized (format 'gguf')"),
    ("expertbench_profile: 2\nmodel:\n  demo: default\n  format: safetensors\n  quant: mxfp4\n", 5,
     "model.quant: demo quantization 'mxfp4': only the GGUF demo is quantized"),
    ("expertbench_profile: 2\nmodel:\n  path: m.gguf\n  format: gguf\n", 4,
     "model.format: only a demo model takes a format ('demo: SIZE' beside it)"),
    ("expertbench_profile: 2\nmodel:\n  path: m.gguf\n  quant: q8_0\n", 4, "model.quant: only a demo model"),
    ("expertbench_profile: 2\nmodel: {demo: default}\ndraft:\n  demo: default\n  format: gguf\n  quant: Q8_0\n", 6,
     "draft.quant: demo quantization 'Q8_0' is unknown"),
    ("expertbench_profile: 2\nmodel:\n  demo: default\n  format: [gguf]\n", 4, "model.format: expected a single"),
    ("expertbench_profile: 2\nmodel: {demo: default, format: gguf, format: gguf}\n", 2, "key 'format' appears twice"),
    ("expertbench_profile: 1\nmodel:\n  demo: default\n  format: gguf\n", 4,
     "model.format: the demo's format and quant need format version 2 ('expertbench_profile: 2'; this file says 1)"),
    ("expertbench_profile: 1\nmodel: !!python/object/apply:os.system [echo owned]\n", 2, "expected a mapping"),
    ("expertbench_profile: 1\nmodel: {demo: !!python/name:os.system ''}\n", 2, "tag 'tag:yaml.org,2002:python/name"),
    ("expertbench_profile: 1\nmodel: {demo: default\n", 3, "not valid YAML"),
    ("", 1, "the file is empty"),
    ("- a list\n", 1, "profile: expected a mapping"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "line", "message"), BAD, ids=[f"{i}:{m[:30]}" for i, (_, _, m) in enumerate(BAD)])
def test_schema_errors_name_file_line_and_value(tmp_path, text, line, message):
    path = write(tmp_path, text)
    with pytest.raises(ProfileError) as err:
        P.load(path)
    assert str(err.value).startswith(f"{path}:{line}: "), str(err.value)
    assert message in str(err.value)


def test_no_object_is_constructed_from_tags(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a))
    with pytest.raises(ProfileError):
        P.load(write(tmp_path, "expertbench_profile: 1\nmodel: !!python/object/apply:os.system [echo owned]\n"))
    assert calls == []


def test_missing_file(tmp_path):
    with pytest.raises(ProfileError, match="no such profile file"):
        P.load(tmp_path / "nope.yaml")


MODEL_CHECKS = [
    ("placement:\n  layers:\n    5: cpu:0\n", 6, "layer 5 out of range: the model has layers 0..2"),
    ("placement:\n  layers:\n    1: cpu:0\n", 6, "1 holds no MoE layer (MoE layers: 0, 2)"),
    ("placement:\n  experts:\n    1: {0: cpu:0}\n", 6, "layer 1 is not an MoE layer"),
    ("placement:\n  experts:\n    2: {6-9: cpu:0}\n", 6, "expert 9 out of range: the model has experts 0..7"),
    ("routing:\n  top_k: 2\n  tokens: [1]\n  hits: [[1, 1]]\n", 4, "routing: 1 layers x 2 experts"),
]


@pytest.mark.parametrize(("text", "line", "message"), MODEL_CHECKS)
def test_model_checks_name_file_and_line(tmp_path, text, line, message):
    path = write(tmp_path, "expertbench_profile: 1\nmodel:\n  path: m\n" + text)
    profile = P.load(path)
    config = Checkpoint.open(FIXTURES / "qwen3moe-f32").config
    with pytest.raises(ProfileError) as err:
        profile.check_model(config)
    assert str(err.value).startswith(f"{path}:{line}: ") and message in str(err.value), str(err.value)


def test_placement_spec_round_trip_on_the_fixture():
    config = Checkpoint.open(FIXTURES / "qwen3moe-f32").config
    placement = Placement.parse("0=cpu:1; 2=hostsim:0; 2.1-2=cpu:0; 0.7=cpu:0", config)
    spec = P.PlacementSpec.from_placement(placement)
    assert spec.layers == [(0, 0, "cpu:1"), (2, 2, "hostsim:0")]
    assert spec.experts == [(0, 7, 7, "cpu:0"), (2, 1, 2, "cpu:0")]
    assert spec.to_placement(config, "cpu:0") == placement
    # adjacent MoE layers (the dense layer 1 in between) with one owner merge into a range
    assert P.PlacementSpec.from_placement(Placement.parse("*=cpu:1", config)).layers == [(0, 2, "cpu:1")]


# ---- atomic save --------------------------------------------------------------------------------------------


def _saved_profile(tmp_path) -> tuple[Profile, Path, str]:
    path = write(tmp_path, FULL)
    profile = P.load(path)
    profile.save()
    old = path.read_text()
    profile.description = "changed " * 2000  # a long write, so a crash can come mid-file
    return profile, path, old


def _leftovers(tmp_path, path):
    return sorted(p.name for p in tmp_path.iterdir() if p.name != path.name)


def test_a_crash_before_the_rename_leaves_the_old_file_whole(tmp_path, monkeypatch):
    profile, path, old = _saved_profile(tmp_path)

    def crash(src, dst):
        raise OSError(5, "simulated crash")

    monkeypatch.setattr(P.os, "replace", crash)
    with pytest.raises(ArgumentError, match=rf"cannot write '{path}': simulated crash \(the file is unchanged\)"):
        profile.save()
    assert path.read_text() == old
    assert _leftovers(tmp_path, path) == []  # the temp file is removed
    assert P.load(path).description == "every key once"


def test_a_crash_mid_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    profile, path, old = _saved_profile(tmp_path)
    real_fdopen = os.fdopen

    class Torn:
        def __init__(self, f):
            self.f = f

        def write(self, text):
            self.f.write(text[: len(text) // 2])
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(P.os, "fdopen", lambda fd, *a, **k: Torn(real_fdopen(fd, *a, **k)))
    with pytest.raises(ArgumentError, match=rf"cannot write '{path}': No space left on device \(the file is unchanged"):
        profile.save()
    assert path.read_text() == old
    assert _leftovers(tmp_path, path) == []


def test_saving_through_a_symbolic_link_writes_its_target_and_keeps_the_link(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    target = write(real, FULL)
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    profile = P.load(link)
    profile.description = "through the link"
    profile.save()
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert P.load(target).description == "through the link"
    assert _leftovers(real, target) == []


def test_temp_files_of_a_killed_save_are_removed_by_the_next_save(tmp_path):
    profile, path, _old = _saved_profile(tmp_path)
    dead = tmp_path / f".{path.name}.999999999.abc123.tmp"  # no such process
    dead.write_text("half a profi")
    alive = tmp_path / f".{path.name}.{os.getpid()}.def456.tmp"  # a save in progress (this process): kept
    alive.write_text("being written")
    other = tmp_path / ".other.yaml.999999999.x.tmp"  # another profile's: not this save's business
    other.write_text("x")
    profile.save()
    assert not dead.exists() and alive.exists() and other.exists()


def test_save_keeps_permissions_and_replaces_whole(tmp_path):
    profile, path, _old = _saved_profile(tmp_path)
    path.chmod(0o640)
    profile.save()
    assert path.stat().st_mode & 0o777 == 0o640
    assert P.load(path).description == profile.description


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_the_users_umask_not_mkstemps_0600(tmp_path, umask, mode):
    """Profiles, traces and history exports are written through a temp file (mkstemp: 0600); the file a user finds is
    the one open() would have made."""
    from app import history
    from engine.core.files import atomic_write, new_file_mode
    from engine.core.trace import write_chrome_trace

    old = os.umask(umask)
    try:
        assert new_file_mode() == mode
        atomic_write(tmp_path / "new.yaml", "a: 1\n")
        write_chrome_trace(tmp_path / "t.json", [])
        history.write_csv(tmp_path / "runs.csv", [])
    finally:
        os.umask(old)
    for name in ("new.yaml", "t.json", "runs.csv"):
        assert (tmp_path / name).stat().st_mode & 0o777 == mode, name
    assert (tmp_path / "runs.csv").read_text().startswith("run,time,")  # the header row, written whole


# ---- fingerprint --------------------------------------------------------------------------------------------


def test_fingerprint_follows_the_model_not_its_packaging(tmp_path):
    f32 = P.fingerprint(FIXTURES / "qwen3moe-f32")
    assert f32.startswith("sha256:") and len(f32) == 71
    assert f32 == P.fingerprint(FIXTURES / "qwen3moe-f32")
    assert f32 != P.fingerprint(FIXTURES / "qwen3moe-bf16")  # dtype in the headers
    copy = tmp_path / "copy"
    shutil.copytree(FIXTURES / "qwen3moe-f32", copy)
    config = (copy / "config.json").read_text()
    (copy / "config.json").write_text(config.replace('"transformers_version"', '"_name_or_path": "x", '
                                                     '"transformers_version"', 1))  # fmt: skip
    assert P.fingerprint(copy) == f32  # bookkeeping keys do not count
    (copy / "config.json").write_text(config.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-05'))
    assert P.fingerprint(copy) != f32


def test_example_profiles_fit_a_freshly_built_demo_pair(tmp_path_factory, monkeypatch):
    """What 'expertbench regress profiles/*.yaml' checks before running, on the demo pairs built here and now (the
    folder pair, and the GGUF pair of the examples that name one)."""
    from engine.checkpoints.demo import ensure_demo_pair

    cache = tmp_path_factory.getbasetemp() / "xdg-cache"  # shared with the other test files
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    formats, families = set(), set()
    for path in sorted(EXAMPLES.glob("*.yaml")):
        profile = P.load(path)
        fmt, quant = profile.model.demo_format()
        assert profile.draft.demo_format() == (fmt, quant), path.name
        formats.add((fmt, quant))
        assert profile.draft.demo_family() == profile.model.demo_family(), path.name
        families.add(profile.model.demo_family())
        pair = ensure_demo_pair(profile.model.demo, cache_dir=cache / "expertbench", format=fmt, quant=quant,
                                family=profile.model.demo_family())  # fmt: skip
        assert profile.model_folder() == pair.target and profile.model_folder(profile.draft, "draft") == pair.draft
        assert profile.model.fingerprint == P.fingerprint(pair.target), path.name
        assert profile.draft.fingerprint == P.fingerprint(pair.draft), path.name
        assert len(profile.expectations.output_sha256) == 4
        profile.placement_for(Checkpoint.open(pair.target).config)
        assert profile.routing_stats().hits.shape == (8, 16)
    assert formats == {("safetensors", None), ("gguf", "q8_0")}
    assert families == {"qwen3", "deepseek", "gpt-oss"}


def test_the_full_example_in_the_readme_is_a_valid_profile(tmp_path):
    import re

    text = (EXAMPLES / "README.md").read_text()
    block = re.search(r"## A full example.*?```yaml\n(.*?)```", text, re.S).group(1)
    profile = P.loads(block, tmp_path / "example.yaml")
    assert profile.placement.experts == [(12, 0, 3, "cpu:0"), (12, 17, 17, "cpu:0")]
    assert profile.run.mode == "reference" and profile.run.precision == "f32"  # every run key is shown
    assert P.loads(profile.to_yaml()) == profile


def _every_character(step: int = 1):
    """Every Unicode scalar value (no surrogates: they are not text), in chunks of 4096, as test strings."""
    chars = [chr(c) for c in range(0, 0x110000, step) if not 0xD800 <= c <= 0xDFFF]
    return ["".join(chars[i : i + 4096]) for i in range(0, len(chars), 4096)]


def test_load_save_load_keeps_every_character_of_descriptions_and_prompts(tmp_path):
    """NEL (U+0085), the line and paragraph separators and the rest: YAML reads some of them as line breaks, which
    a single-quoted or folded scalar turns into spaces; a saved profile keeps every character."""
    base = P.load(write(tmp_path, FULL))
    texts = _every_character()
    texts += ["a\x85b", "\u2028", "x\u2029y", "\ufeffz", "tab\tand\nnewline \x85" * 20, " lead", "trail "]
    for i, text in enumerate(texts):
        base.description = text
        base.run.prompts = [text, "plain"]
        saved = base.save(tmp_path / f"p{i}.yaml")
        again = P.load(saved)
        assert again.description == text, f"chunk {i}: description changed"
        assert again.run.prompts == [text, "plain"], f"chunk {i}: prompt changed"
        assert again == base


def test_a_self_referential_alias_is_refused_with_its_line(tmp_path):
    path = write(tmp_path, "expertbench_profile: 2\nmodel: &a {path: *a}\n")
    with pytest.raises(ProfileError, match=r"p\.yaml:2: .*alias refers to the value that contains it"):
        P.load(path)
    deep = write(tmp_path, "expertbench_profile: 2\nmodel: {path: x}\nrun: &r\n  prompts: [[*r]]\n")
    with pytest.raises(ProfileError, match=r":3: .*a cycle"):
        P.load(deep)
