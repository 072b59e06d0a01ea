"""Where the test fixtures are (a plain module: `conftest` names clash between test folders). Every fixture with its
reference is listed in tests/fixture_registry.py."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
