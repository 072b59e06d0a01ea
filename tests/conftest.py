import pytest
from fixture_paths import FIXTURES


@pytest.fixture(scope="session")
def fixtures():
    return FIXTURES
