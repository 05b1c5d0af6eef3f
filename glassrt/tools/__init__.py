"""Tools on top of the runtime: explain, profile, compare, check, the light model zoo."""
