"""Router and expert features, each through the whole pipeline: validate, plan, render, and
the verify step's twin parity (forward, aux counts and losses, gradients of every parameter
and the input) against the independent dense reference.

One spec per feature or realistic combination, on the smallest mesh that exercises its code
path; each case is one verify run (a child process, a few seconds).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import assert_twin_parity
from expert_output_norm_cases import EXPERT_OUTPUT_NORM_CASES
from identity_expert_cases import IDENTITY_CASES
from latent_cases import LATENT_CASES
from output_norm_cases import OUTPUT_NORM_CASES
from replica_cases import REPLICA_CASES
from router_feature_cases import BASE, CASES
from shared_weighting_cases import SHARED_WEIGHTING_CASES

from moegen.pipeline import generate
from moegen.verify import verify

# Code that belongs to one feature only: a module without the feature must not carry it.
FEATURE_CODE = {
    "_drop_over_capacity": lambda r, layer: "capacity" in r,
    "_limit_to_groups": lambda r, layer: "group_limit" in r,
    "_split_zero_computation": lambda r, layer: bool(
        r.get("identity_experts", 0) or r.get("zero_experts", 0)
    ),
    "_shared_expert": lambda r, layer: "shared_ffn_dim" in layer,
    "update_routing_bias": lambda r, layer: r.get("routing_bias", False),
    "_load_balance_loss": lambda r, layer: r.get("load_balance_loss", 0) > 0,
    "_router_z_loss": lambda r, layer: r.get("z_loss", 0) > 0,
    "_row_experts": lambda r, layer: (
        layer.get("ffn_bias", False) or "expert_output_norm_eps" in layer
    ),
    '"w_gate"': lambda r, layer: layer.get("activation", "swiglu") in ("swiglu", "geglu"),
    "_latent_in": lambda r, layer: "latent_dim" in layer,
    "\nOUTPUT_NORM_EPS": lambda r, layer: "output_norm_eps" in layer,
    "_expert_output_norm": lambda r, layer: "expert_output_norm_eps" in layer,
    "SHARED_OUTPUT_NORM_EPS": lambda r, layer: "shared_output_norm_eps" in layer,
}


def _spec(overrides: dict) -> dict:
    spec = {key: (dict(value) if isinstance(value, dict) else value) for key, value in BASE.items()}
    for key, value in overrides.items():
        spec[key] = value
    return spec


ALL_CASES = {
    **CASES,
    **IDENTITY_CASES,
    **SHARED_WEIGHTING_CASES,
    **REPLICA_CASES,
    **LATENT_CASES,
    **OUTPUT_NORM_CASES,
    **EXPERT_OUTPUT_NORM_CASES,
}


@pytest.mark.parametrize("name", sorted(ALL_CASES))
@pytest.mark.slow
def test_feature_matches_dense_reference(name, tmp_path, monkeypatch):
    overrides, expected_code = ALL_CASES[name]
    spec = _spec(overrides)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    generated = generate(Path(path.name))
    for code in expected_code:
        assert code in generated.source, code
    router, layer = spec["router"], spec["layer"]
    for code, present in FEATURE_CODE.items():
        assert (code in generated.source) == bool(present(router, layer)), code

    # The twins are the point here; full-size compiles are covered by the example specs.
    report = verify(generated.loaded, generated.source, run_compiles=False)
    parity = assert_twin_parity(report)
    if "capacity" in router:
        random_case = parity[0]["cases"][0]
        assert random_case["dropped"] > 0, "the twin must really drop copies"
    past = router.get("identity_experts", 0) + router.get("zero_experts", 0)
    if past:  # copies really go past the experts
        for case in parity[0]["cases"]:
            if case["case"] == "skewed to the replicas":
                continue  # routed to chosen experts on purpose
            counts = case["tokens_per_expert"][layer["num_experts"] :]
            assert len(counts) == past and sum(counts) > 0, case
    if "redundant_experts" in spec.get("parallelism", {}):  # the skewed case ran too
        assert [case["case"] for case in parity[0]["cases"]][-1] == "skewed to the replicas"
