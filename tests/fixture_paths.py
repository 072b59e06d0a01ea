"""Where the test fixtures are (a plain module: `conftest` names clash between test folders)."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODELS = ["qwen3moe-f32", "qwen3moe-bf16", "qwen3-f32", "qwen3-bf16"]
