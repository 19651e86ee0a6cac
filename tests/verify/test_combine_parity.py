"""The combine weights on the hidden rows (moegen.plan.combine), through the whole pipeline:
the twin, planned with the full-size layer's combine whatever its own widths, against the
dense reference (forward, aux, the gradients of every parameter and of the input) on the
paths that take it."""

from __future__ import annotations

import pytest
from conftest import assert_twin_parity, generated_from
from spec_builder import tiny

from moegen.verify import verify

# Fine-grained layers (FFN narrower than embed), replicated, every copy kept.
NARROW = {"embed": 128, "ffn": 64, "top_k": 2}
CASES = {
    "fsdp, balance loss, shared expert": {
        "axes": {"data": 2, "fsdp": 2},
        "shared_ffn": 32,
        "load_balance_loss": 0.01,
    },
    "token chunks, bfloat16 compute": {
        "axes": {"data": 2},
        "token_chunks": 2,
        "compute_dtype": "bfloat16",
    },
    "sigmoid scores, top 4, scaled": {
        "axes": {"data": 2},
        "score": "sigmoid",
        "top_k": 4,
        "routed_scaling": 2.5,
    },
    "pallas, interpreted": {
        "embed": 256,
        "ffn": 128,
        "axes": {"data": 4},
        "hardware": "tpu-v5e",
        "topology": "2x2",
        "kernel": "pallas",
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_weights_on_the_hidden_rows_match_the_dense_reference(case, tmp_path, monkeypatch):
    generated = generated_from(tiny(**(NARROW | CASES[case])), tmp_path, monkeypatch)
    assert generated.plan.experts.combine.weights_on_hidden, generated.plan.experts.combine.why
    report = verify(generated.loaded, generated.source, run_compiles=False)
    assert_twin_parity(report)
