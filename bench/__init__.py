"""Generated layers against plain-JAX baselines (not a timed test): python -m bench.run.

run: the command; measure: the measurements (children: its child processes); report: the
markdown; baselines: the plain-JAX layers; validate_worst: the validator's worst case.
"""
