"""transformers as the oracle of the weight gradients: for the families whose blocks normalise
each expert's output (Ergo) and their nearest kin, the gradient of sum(output) w.r.t. every
parameter of the generated layer equals transformers' own, read through the same map as the
weights (tests/support/oracle/families.py), replicated and over the ragged all-to-all. The
oracle test holds the output and the input gradient; the norms' weights are trained
parameters, so their gradients are held here too. A selection bias, a buffer in transformers,
gets none there and exactly zero here.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracle_gate import require_oracle

require_oracle()  # torch and transformers, or this module skipped (CI: failed)

from oracle import moegen_side  # noqa: E402
from oracle.families import BATCH, BY_NAME, EMBED, SEQ_LEN  # noqa: E402
from oracle.hf_blocks import as_numpy, build_block, run_block, weight_gradients  # noqa: E402
from test_transformers_oracle import relative_error, spec_choices  # noqa: E402

TOLERANCE = 1e-5
SEED = 2
# Ergo; Nemotron-H, its relu^2 layer without the norms; A.X-K1, the layer's output norm
NAMES = ("ergo", "nemotron_h", "axk1")
moegen_side.provide_cpu_devices(4)


@pytest.mark.parametrize("strategy", ["replicated", "a2a"])
@pytest.mark.parametrize("name", NAMES)
def test_weight_gradients_match_transformers(name: str, strategy: str) -> None:
    family = BY_NAME[name]
    module_name = f"weight_grads_{name}_{strategy}"
    module = moegen_side.import_source(
        moegen_side.rendered_source(spec_choices(family, strategy), module_name), module_name
    )
    block = build_block(
        family.config, family.config_kwargs, family.block, family.block_args, family.init, SEED
    )
    weights = as_numpy(family.weights(block))
    x = np.random.default_rng(SEED).standard_normal((BATCH, SEQ_LEN, EMBED)).astype(np.float32)
    run_block(block, x)
    want = as_numpy(weight_gradients(block, family.weights))
    got = moegen_side.weight_gradients(module, weights, x)
    assert set(got) == set(want) == set(module.PARAM_SHAPES)
    errors = {}
    for param, value in want.items():
        if not value.any():  # the selection bias: no gradient in either
            assert param == "routing_bias" and not got[param].any(), param
            continue
        errors[param] = relative_error(got[param], value)
    report = ", ".join(f"{param} {error:.2e}" for param, error in errors.items())
    print(f"{name} {strategy}: {report}")
    assert all(error < TOLERANCE for error in errors.values()), report
