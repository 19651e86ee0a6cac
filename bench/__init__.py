"""Generated layers against plain-JAX baselines (not a timed test): python -m bench.run."""
