"""Profiles: tuned placements saved as YAML, read back, and replayed as a regression gate."""
