"""Decode runs: greedy and speculative generation, their outputs, history, divergence and quality."""
