"""The engine's API and its binding of the native core: Engine, Model, Context, the formats table, errors."""
