from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODELS = ["qwen3moe-f32", "qwen3moe-bf16", "qwen3-f32", "qwen3-bf16"]


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return FIXTURES
