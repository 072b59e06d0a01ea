"""A weight file truncated or rewritten while a model holds it memory-mapped: the process survives (no SIGBUS), the
step says which file changed, and the model refuses every later step until it is loaded again."""

import os
import shutil

import numpy as np
import pytest
from fixture_paths import FIXTURES

from engine.core.errors import CheckpointError
from engine.model import Engine

TOKENS = [3, 17, 42, 5]


def copy(tmp_path, name="qwen3moe-f32"):
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst, dst / "model.safetensors"


@pytest.mark.parametrize("change", ["truncated", "cut to nothing", "rewritten in place"])
def test_a_mapped_file_changed_under_the_model_is_refused_by_name_and_the_process_survives(tmp_path, change):
    folder, st = copy(tmp_path)
    with Engine(cpu_devices=1, cpu_threads=1) as eng:
        model = eng.load(folder, weights="map")
        assert model.info["weights"] == "map"
        with model.context(16) as ctx:
            before = ctx.prefill(TOKENS)
            assert np.isfinite(before).all()
            size = st.stat().st_size
            if change == "truncated":
                os.truncate(st, size // 2)  # the later half of the weights, past the new end, would raise SIGBUS
            elif change == "cut to nothing":
                os.truncate(st, 0)
            else:  # same size, other bytes: no fault, but the file is not what was loaded
                with open(st, "r+b") as f:
                    f.seek(size // 2)
                    f.write(b"\x7f" * 64)
                os.utime(st, ns=(st.stat().st_atime_ns, st.stat().st_mtime_ns + 1_000_000_000))
            with pytest.raises(CheckpointError, match=rf"'{st}' changed while the model held it memory-mapped"):
                ctx.decode([1])
            with pytest.raises(CheckpointError, match="load the model again"):  # and every step after it
                ctx.decode([2])
            with pytest.raises(CheckpointError, match="changed while the model held it"):
                ctx.generate([1, 2], 4)
        model.close()
        # the file put back: a new load runs again
        shutil.copy(FIXTURES / "qwen3moe-f32" / "model.safetensors", st)
        with eng.load(folder, weights="map") as again, again.context(16) as ctx:
            assert np.array_equal(ctx.prefill(TOKENS), before)


def test_a_copied_model_does_not_care_what_happens_to_its_files(tmp_path):
    folder, st = copy(tmp_path)
    with (
        Engine(cpu_devices=1, cpu_threads=1) as eng,
        eng.load(folder, weights="copy") as model,
        model.context(16) as ctx,
    ):
        before = ctx.prefill(TOKENS)
        os.truncate(st, 0)
        ctx.truncate(0)
        assert np.array_equal(ctx.prefill(TOKENS), before)


def test_reading_past_the_new_end_of_a_mapped_file_is_survived(tmp_path):
    """Moving experts to hostsim copies their weights out of the mapping: with the file cut to nothing those reads
    fault (SIGBUS) before any check could run; the guard maps zeros there, the placement is refused by the file's
    name and the old one stays."""
    folder, st = copy(tmp_path)
    with Engine(runtimes=("cpu", "hostsim"), cpu_devices=1, cpu_threads=1) as eng:
        model = eng.load(folder, weights="map")
        before = model.placement.describe()
        os.truncate(st, 0)
        with pytest.raises(CheckpointError, match=rf"'{st}' changed while the model held it memory-mapped"):
            model.set_placement("*=hostsim:0")
        assert model.placement.describe() == before
        with pytest.raises(CheckpointError, match="load the model again"), model.context(8) as ctx:
            ctx.decode([1])
        model.close()


SCRIPT = """
import resource, sys
from engine.core.errors import EngineError
from engine.model import Engine

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))  # each mapped file keeps its descriptor
with Engine(cpu_devices=1, cpu_threads=1) as eng:
    models = []
    try:
        for _ in range(4200):
            models.append(eng.load(sys.argv[1], weights="map"))
    except EngineError as exc:
        print("refused after", len(models), type(exc).__name__, exc)
    else:
        print("loaded all", len(models))
    with models[0].context(8) as ctx:  # the guarded ones still run
        ctx.prefill([3, 17])
    for m in models[:10]:
        m.close()
    models.append(eng.load(sys.argv[1], weights="map"))  # room again once models are closed
    copied = eng.load(sys.argv[1], weights="copy")  # a copy is never mapped: no guard needed
    print("after closing: ok")
"""


def test_past_the_guard_tables_size_a_mapped_load_is_refused_not_left_unguarded(tmp_path):
    """4096 files mapped at once are guarded against truncation; the next mapped load is refused with the file and
    the limit (unguarded, a truncation would kill the process), and closing models makes room."""
    import resource
    import subprocess
    import sys

    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 4200:
        pytest.skip("the hard limit on open files is under 4200: the guard's limit cannot be reached")
    folder = FIXTURES / "qwen3-f32"  # one weight file
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(folder)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused after 4096 " in proc.stdout, proc.stdout
    assert "weight files are memory-mapped already" in proc.stdout and "model.safetensors" in proc.stdout
    assert "after closing: ok" in proc.stdout
