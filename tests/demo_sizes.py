"""A demo size far smaller than the built-in ones, for the tests that build demo pairs of their own (a plain module:
tests/ is on the path through tests/conftest.py)."""

from engine.checkpoints.demo import SIZES, DemoSize

# every width a multiple of 32, so that it is also written as GGUF (Q8_0 and MXFP4 store rows in blocks of 32)
TINY = DemoSize("tiny", vocab_size=512, hidden_size=64, num_layers=3, draft_layers=2, num_experts=4, top_k=2,
                moe_intermediate_size=32, num_heads=2, num_kv_heads=1, head_dim=32,
                max_position_embeddings=256)  # fmt: skip


def use_tiny(monkeypatch, cache_home) -> DemoSize:
    """Make 'tiny' a demo size and $XDG_CACHE_HOME cache_home (its pairs built there, never in the user's cache)."""
    monkeypatch.setitem(SIZES, "tiny", TINY)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    return TINY
