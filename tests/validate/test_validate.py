"""Stage 2, `moegen.validate`: the rule registry (every rule has cases and a docstring) and `check_rules` / `validate` over whole specs."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_validate_activation import CASES as ACTIVATION_CASES
from test_validate_group_limit import CASES as GROUP_LIMIT_CASES
from test_validate_latent import CASES as LATENT_CASES
from test_validate_mesh import CASES as MESH_CASES
from test_validate_mesh_roles import CASES as MESH_ROLE_CASES
from test_validate_output_norms import CASES as OUTPUT_NORM_CASES
from test_validate_overlap import CASES as OVERLAP_CASES
from test_validate_replicas import CASES as REPLICA_CASES
from test_validate_router import CASES as ROUTER_CASES
from test_validate_shape_variants import CASES as SHAPE_VARIANT_CASES
from test_validate_shared_weighting import CASES as SHARED_WEIGHTING_CASES
from test_validate_sizes import CASES as SIZES_CASES
from test_validate_slices import CASES as SLICES_CASES
from test_validate_te import CASES as TE_CASES
from test_validate_tiles import CASES as TILES_CASES
from test_validate_topology import CASES as TOPOLOGY_CASES
from validate_cases import REPO_ROOT, RULES_BY_NAME, case_yaml, loaded_spec, position

from moegen.diagnostics import SpecError
from moegen.load import load_spec, load_spec_bytes
from moegen.validate import RULES, check_rules, validate

# Every rule's cases, gathered from the files that test them by subject.
CASES = {
    **ROUTER_CASES,
    **ACTIVATION_CASES,
    **GROUP_LIMIT_CASES,
    **MESH_CASES,
    **MESH_ROLE_CASES,
    **OVERLAP_CASES,
    **TE_CASES,
    **TILES_CASES,
    **TOPOLOGY_CASES,
    **SLICES_CASES,
    **SIZES_CASES,
    **SHAPE_VARIANT_CASES,
    **SHARED_WEIGHTING_CASES,
    **REPLICA_CASES,
    **LATENT_CASES,
    **OUTPUT_NORM_CASES,
}


def test_every_rule_has_cases() -> None:
    assert sorted(CASES) == sorted(RULES_BY_NAME), "add CASES for every rule in RULES"
    assert len(RULES_BY_NAME) == len(RULES), "two rules share a name"
    for name, cases in CASES.items():
        assert any(not expected for _, expected in cases), f"{name}: no passing case"
        assert any(expected for _, expected in cases), f"{name}: no failing case"


def test_every_rule_is_documented() -> None:
    for rule in RULES:
        assert rule.__doc__ and rule.__doc__.strip(), rule.__name__


def test_check_rules_reports_several_violations_at_once() -> None:
    choices = {
        "experts": 4,
        "top_k": 1,
        "renormalize": True,
        "embed": 66,
        "batch": 6,
        "axes": {"data": 2, "fsdp": 4},
        "batch_axes": ["data", "fsdp", "data"],
        "overlap_chunks": 3,
    }
    loaded = loaded_spec(choices)
    diagnostics = check_rules(loaded)
    fields = [
        "layer.embed_dim",
        "router.renormalize",
        "shapes.batch",
        "mesh.batch_axes[2]",
        "parallelism.overlap_chunks",
    ]
    assert sorted((d.line, d.column, d.field) for d in diagnostics) == sorted(
        (*position(choices, field), field) for field in fields
    )
    with pytest.raises(SpecError) as info:
        validate(loaded)
    # SpecError keeps every diagnostic, in file order.
    assert info.value.diagnostics == sorted(
        diagnostics, key=lambda d: (d.file, d.line, d.column, d.field)
    )
    assert str(info.value).splitlines() == [d.text() for d in info.value.diagnostics]


def test_validate_returns_a_valid_spec_unchanged() -> None:
    loaded = loaded_spec()
    assert check_rules(loaded) == []
    assert validate(loaded) is loaded


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "specs").glob("*.yaml")), ids=lambda p: p.stem)
def test_example_specs_pass_every_rule(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    loaded = load_spec(path.relative_to(REPO_ROOT))
    assert check_rules(loaded) == []


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("0", "must be > 0, got 0"),
        ("-1.0e-6", "must be > 0, got -1e-06"),
        ("1.5", "must be <= 1, got 1.5"),
        (".nan", "must be a finite number, got nan"),
        (".inf", "must be a finite number, got inf"),
        ("small", "must be a number, got 'small'"),
        ("true", "must be a number, got true"),
    ],
)
def test_a_bad_output_norm_epsilon_is_refused_where_it_is_written(written, message) -> None:
    choices = {"output_norm_eps": 0.5}
    text = case_yaml(choices).replace("output_norm_eps: 0.5", f"output_norm_eps: {written}")
    line, column = position(choices, "layer.output_norm_eps")
    with pytest.raises(SpecError) as info:
        validate(load_spec_bytes(text.encode(), "specs/layer.yaml", "layer"))
    assert [d.text() for d in info.value.diagnostics] == [
        f"specs/layer.yaml:{line}:{column}: layer.output_norm_eps: {message}"
    ]
