import pytest
from fixture_paths import FIXTURES

from engine.checkpoints.demo import ensure_demo_pair


@pytest.fixture(scope="session")
def fixtures():
    return FIXTURES


@pytest.fixture(scope="session")
def xdg_cache(tmp_path_factory):
    """One cache folder ($XDG_CACHE_HOME) for every test file, the default demo pair built in it once per session."""
    cache = tmp_path_factory.getbasetemp() / "xdg-cache"
    ensure_demo_pair("default", cache_dir=cache / "expertbench")
    return cache


@pytest.fixture(autouse=True)
def xdg_data(tmp_path_factory, monkeypatch):
    """Each test its own user data folder ($XDG_DATA_HOME: the run histories the window keeps), never the user's."""
    data = tmp_path_factory.mktemp("xdg-data")
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    return data


@pytest.fixture
def refused_before_loading(tmp_path, monkeypatch, capsys):
    """check(argv, message): `expertbench argv` exits 2 with one line of error holding message, and builds nothing
    in an empty cache (the arguments were refused before any model loaded)."""
    from engine.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty cache: nothing may get built

    def check(argv: list[str], message: str) -> None:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("expertbench: error: ") and message in err and err.count("\n") == 1, err
        assert not (tmp_path / "expertbench").exists()

    return check
