"""The versions that shape what moegen verifies: the jax and libtpu it pins in pyproject.toml
(tests hold the two equal), and the jax its TPU device check runs generated layers on
(scripts/tpu_check.sh; the lent TPU v5e chip's own jax, bench/TPU_CHECK.md).
"""

from __future__ import annotations

JAX = "0.12.0.1"
LIBTPU = "0.0.51"
CHIP_JAX = "0.10.2"  # jax on the chip where scripts/tpu_check.sh last ran (a TPU v5e)
CHIP = "a TPU v5e chip"
