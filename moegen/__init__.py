"""moegen: turn a short YAML description of one MoE layer into a verified JAX module."""

__version__ = "0.1.0"
