"""Unit tests of stage 1, `moegen.load`: YAML bytes to a frozen, located `Spec`."""

from __future__ import annotations

import dataclasses
import hashlib

import pydantic
import pytest
from load_cases import MINIMAL, VALID, errors, load

from moegen.diagnostics import Diagnostic
from moegen.load import (
    Locations,
    describe,
    dotted,
)

# ---------------------------------------------------------------------------------------
# dotted, describe


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ((), ""),
        (("layer",), "layer"),
        (("layer", "embed_dim"), "layer.embed_dim"),
        (("mesh", "batch_axes", 1), "mesh.batch_axes[1]"),
        (("mesh", "axes", "data"), "mesh.axes.data"),
        (("a", 0, 2, "b"), "a[0][2].b"),
    ],
)
def test_dotted(path, expected) -> None:
    assert dotted(path) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "null"),
        (True, "true"),
        (False, "false"),
        ({"a": 1}, "a mapping"),
        ([1, 2], "a list"),
        (8, "8"),
        (8.5, "8.5"),
        ("8", "'8'"),
        ("x" * 58, repr("x" * 58)),  # 60 characters with quotes: kept whole
        ("x" * 100, "'" + "x" * 56 + "..."),  # cut to 60 characters
    ],
)
def test_describe(value, expected) -> None:
    assert describe(value) == expected
    assert len(describe(value)) <= 60


# ---------------------------------------------------------------------------------------
# Locations


def test_locations_of_nested_keys_and_values() -> None:
    loc = load(VALID).locations
    assert loc.of_key(("version",)) == (1, 1)
    assert loc.of_value(("version",)) == (1, 10)
    assert loc.of_key(("layer",)) == (3, 1)
    assert loc.of_value(("layer",)) == (4, 3)  # a block mapping starts at its first key
    assert loc.of_key(("layer", "embed_dim")) == (5, 3)
    assert loc.of_value(("layer", "embed_dim")) == (5, 14)
    assert loc.of_key(("mesh", "axes", "fsdp")) == (20, 5)
    assert loc.of_value(("mesh", "axes", "fsdp")) == (20, 11)
    assert loc.of_key(("mesh", "batch_axes")) == (21, 3)
    assert loc.of_value(("mesh", "batch_axes")) == (21, 15)
    assert loc.of_value(("mesh", "batch_axes", 0)) == (21, 16)
    assert loc.of_value(("mesh", "batch_axes", 1)) == (21, 22)
    assert loc.of_value(("target", "kernel")) == (27, 11)


def test_locations_in_flow_style() -> None:
    loc = load(MINIMAL).locations
    assert loc.of_key(("layer", "ffn_dim")) == (2, 40)
    assert loc.of_value(("layer", "ffn_dim")) == (2, 49)
    assert loc.of_value(("mesh", "axes")) == (5, 14)
    assert loc.of_key(("mesh", "axes", "data")) == (5, 24)


def test_locations_fall_back_to_the_nearest_parent() -> None:
    loc = load(MINIMAL).locations
    # Defaults have no location of their own: they point at their section, or the document.
    assert loc.of_value(("router", "score")) == loc.of_value(("router",)) == (3, 9)
    assert loc.of_key(("router", "score")) == (3, 9)
    assert loc.of_value(("dtypes", "params")) == loc.of_value(()) == (1, 1)
    assert Locations({}, {}).of_value(("a", "b")) == (1, 1)
    assert Locations({}, {}).of_key(("a",)) == (1, 1)


def test_loaded_diagnostic_points_at_value_or_key() -> None:
    loaded = load(VALID)
    at_value = loaded.diagnostic(("router", "top_k"), "too big")
    assert at_value == Diagnostic("spec.yaml", 8, 10, "router.top_k", "too big")
    at_key = loaded.diagnostic(("router", "top_k"), "too big", at_key=True)
    assert (at_key.line, at_key.column) == (8, 3)
    assert at_value.text() == "spec.yaml:8:10: router.top_k: too big"


# ---------------------------------------------------------------------------------------
# A valid spec: values, defaults, source


def test_valid_spec_values_and_source() -> None:
    loaded = load(VALID, name="small_layer")
    spec = loaded.spec
    assert spec.description == "a small layer"
    assert (spec.layer.num_experts, spec.layer.embed_dim, spec.layer.ffn_dim) == (8, 64, 128)
    assert (spec.router.top_k, spec.router.score, spec.router.renormalize) == (2, "sigmoid", True)
    assert (spec.dtypes.params, spec.dtypes.compute) == ("bfloat16", "float32")
    assert spec.mesh.axes == {"data": 2, "fsdp": 2}
    assert spec.batch_axes == ("data", "fsdp")
    assert loaded.source.name == "small_layer"
    assert loaded.source.display == "spec.yaml"
    assert loaded.source.text == VALID
    assert loaded.source.sha256 == hashlib.sha256(VALID.encode()).hexdigest()


def test_defaults_applied() -> None:
    spec = load(MINIMAL).spec
    assert spec.description == ""
    assert spec.layer.activation == "swiglu"
    assert spec.layer.ffn_bias is False
    assert spec.layer.shared_ffn_dim is None
    assert spec.router.score == "softmax"
    assert spec.router.score_after_top_k is False
    assert spec.router.renormalize is False
    assert spec.router.routed_scaling == 1.0
    assert spec.router.group_limit is None
    assert spec.router.routing_bias is False
    assert (spec.router.load_balance_loss, spec.router.z_loss) == (0.0, 0.0)
    assert spec.router.capacity is None  # dropless
    assert spec.dtypes.params == "float32"
    assert spec.dtypes.compute == "bfloat16"
    assert spec.parallelism.experts == "replicated"
    assert spec.parallelism.overlap_chunks == 1
    assert spec.target.hardware == "cpu"
    assert spec.target.kernel == "xla"
    assert spec.mesh.batch_axes is None
    # Default batch axes: every mesh axis, in the order the spec lists them.
    assert spec.batch_axes == ("fsdp", "data")


# DeepSeek-V3's layer (scaled down): every router and expert feature written out.
FEATURES = """\
version: 1
description: DeepSeek-V3-like
layer:
  num_experts: 16
  embed_dim: 64
  ffn_dim: 32
  activation: geglu
  ffn_bias: true
  shared_ffn_dim: 96
router:
  top_k: 4
  score: sqrtsoftplus
  renormalize: true
  routed_scaling: 2.5
  group_limit:
    groups: 4
    keep: 2
  routing_bias: true
  load_balance_loss: 1e-4
  z_loss: 0.001
  capacity: {factor: 1.25, drop: position}
shapes: {batch: 2, seq_len: 8}
mesh: {axes: {data: 2}}
"""


def test_router_and_expert_features_load() -> None:
    spec = load(FEATURES).spec
    layer, router = spec.layer, spec.router
    assert (layer.activation, layer.ffn_bias, layer.shared_ffn_dim) == ("geglu", True, 96)
    assert (router.score, router.score_after_top_k, router.renormalize) == (
        "sqrtsoftplus",
        False,
        True,
    )
    assert router.routed_scaling == 2.5
    assert (router.group_limit.groups, router.group_limit.keep) == (4, 2)
    assert router.routing_bias is True
    # YAML 1.2 floats: an exponent needs no dot
    assert (router.load_balance_loss, router.z_loss) == (1e-4, 0.001)
    assert (router.capacity.factor, router.capacity.drop) == (1.25, "position")


@pytest.mark.parametrize("activation", ["swiglu", "geglu", "gelu", "relu"])
def test_every_activation_loads(activation: str) -> None:
    text = FEATURES.replace("activation: geglu", f"activation: {activation}")
    assert load(text).spec.layer.activation == activation


def test_feature_defaults_inside_sections() -> None:
    """capacity drops by probability unless told; an integer is a float where one is wanted."""
    text = FEATURES.replace("{factor: 1.25, drop: position}", "{factor: 2}").replace(
        "routed_scaling: 2.5", "routed_scaling: 1"
    )
    router = load(text).spec.router
    assert (router.capacity.factor, router.capacity.drop) == (2.0, "probability")
    assert router.routed_scaling == 1.0
    for no_shared in ("", "  shared_ffn_dim: null\n"):  # omitted or null: no shared expert
        text = FEATURES.replace("  shared_ffn_dim: 96\n", no_shared)
        assert load(text).spec.layer.shared_ffn_dim is None


# Schema errors of the feature fields, each at the value (or the mapping) that is wrong.
FEATURE_ERRORS = [
    # (old, new, line, column, field, message)
    ("activation: geglu", "activation: silu", 7, 15, "layer.activation",
     "must be 'swiglu', 'geglu', 'gelu', 'relu' or 'relu2', got 'silu'; did you mean 'swiglu'?"),
    ("activation: geglu", "activation: gegelu", 7, 15, "layer.activation",
     "must be 'swiglu', 'geglu', 'gelu', 'relu' or 'relu2', got 'gegelu'; did you mean 'geglu'?"),
    ("ffn_bias: true", "ffn_bias: 1", 8, 13, "layer.ffn_bias", "must be true or false, got 1"),
    ("shared_ffn_dim: 96", "shared_ffn_dim: 0", 9, 19, "layer.shared_ffn_dim",
     "must be > 0, got 0"),
    ("shared_ffn_dim: 96", "shared_ffn_dim: 96.0", 9, 19, "layer.shared_ffn_dim",
     "must be an integer, got 96.0"),
    ("score: sqrtsoftplus", "score: softplus", 12, 10, "router.score",
     "must be 'softmax', 'sigmoid' or 'sqrtsoftplus', got 'softplus'; did you mean 'sqrtsoftplus'?"),
    ("score: sqrtsoftplus", "score: tanh", 12, 10, "router.score",
     "must be 'softmax', 'sigmoid' or 'sqrtsoftplus', got 'tanh'"),
    ("renormalize: true", "score_after_top_k: yes", 13, 22, "router.score_after_top_k",
     "must be true or false, got 'yes'"),
    ("routed_scaling: 2.5", "routed_scaling: 0", 14, 19, "router.routed_scaling",
     "must be > 0, got 0"),
    ("routed_scaling: 2.5", "routed_scaling: .nan", 14, 19, "router.routed_scaling",
     "must be a finite number, got nan"),
    # a missing key: at the mapping that lacks it
    ("    keep: 2\n", "", 16, 5, "router.group_limit", "required key 'keep' is missing"),
    ("keep: 2", "keep: 0", 17, 11, "router.group_limit.keep", "must be > 0, got 0"),
    ("routing_bias: true", "routing_bias: 0.001", 18, 17, "router.routing_bias",
     "must be true or false, got 0.001"),
    ("z_loss: 0.001", "z_loss: .inf", 20, 11, "router.z_loss",
     "must be a finite number, got inf"),
    ("{factor: 1.25, drop: position}", "{factor: 0}", 21, 22, "router.capacity.factor",
     "must be > 0, got 0"),
    ("{factor: 1.25, drop: position}", "{factor: -1.5}", 21, 22, "router.capacity.factor",
     "must be > 0, got -1.5"),
    ("{factor: 1.25, drop: position}", "{factor: 2048}", 21, 22, "router.capacity.factor",
     "must be <= 1024, got 2048"),
    ("drop: position", "drop: postion", 21, 34, "router.capacity.drop",
     "must be 'probability' or 'position', got 'postion'; did you mean 'position'?"),
    ("drop: position", "drop: random", 21, 34, "router.capacity.drop",
     "must be 'probability' or 'position', got 'random'"),
    ("capacity: {factor: 1.25, drop: position}", "capacity: 1.25", 21, 13, "router.capacity",
     "must be a mapping, got 1.25"),
    # other tools' flat key: not close enough to 'capacity' for a hint, so the keys are listed
    ("capacity: {factor: 1.25, drop: position}", "capacity_factor: 1.25", 21, 3, "router",
     "unknown key 'capacity_factor'; expected one of: top_k, score, score_after_top_k, "
     "input_norm_eps, per_expert_scale, logit_softcap, linear_bias, renormalize, "
     "renormalize_epsilon, routed_scaling, group_limit, identity_experts, zero_experts, "
     "weighs_shared_experts, learned_scale, routing_bias, routing_bias_on, "
     "weighting, load_balance_loss, load_balance_form, z_loss, capacity"),
    ("routing_bias: true", "routing_bais: true", 18, 3, "router",
     "unknown key 'routing_bais'; did you mean 'routing_bias'?"),
    ("shared_ffn_dim: 96", "shared_ffn: 96", 9, 3, "layer",
     "unknown key 'shared_ffn'; did you mean 'shared_ffn_dim'?"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "line", "col", "field", "message"),
    FEATURE_ERRORS,
    ids=[f"{field}-{new.split(':')[-1].strip()}" for _, new, _, _, field, _ in FEATURE_ERRORS],
)
def test_feature_schema_errors_are_located(old, new, line, col, field, message) -> None:
    assert old in FEATURES
    assert errors(FEATURES.replace(old, new)) == [(line, col, field, message)]


@pytest.mark.parametrize(
    ("old", "new", "line", "col", "field", "message"),
    [
        ("keep: 2", "keep: 2\n    top_k: 4", 18, 5, "router.group_limit",
         "unknown key 'top_k'; expected one of: groups, keep, top_per_group"),
        ("drop: position", "drop: position, policy: x", 21, 44, "router.capacity",
         "unknown key 'policy'; expected one of: factor, copies, per, drop"),
        # 'drop' is already written: suggesting it would make a duplicate key
        ("drop: position", "drop: position, dorp: x", 21, 44, "router.capacity",
         "unknown key 'dorp'; expected one of: factor, copies, per, drop"),
        # the typo alone is a misspelt 'drop'
        ("drop: position", "dorp: x", 21, 28, "router.capacity",
         "unknown key 'dorp'; did you mean 'drop'?"),
    ],
)  # fmt: skip
def test_unknown_key_in_an_optional_section_gets_a_hint(old, new, line, col, field, message):
    found = errors(FEATURES.replace(old, new))
    assert (line, col, field, message) in found, found


@pytest.mark.parametrize(
    ("old", "new", "line", "col", "field", "got"),
    [
        ("routed_scaling: 2.5", "routed_scaling: true", 14, 19, "router.routed_scaling", "true"),
        ("z_loss: 0.001", 'z_loss: "0.001"', 20, 11, "router.z_loss", "'0.001'"),
        ("factor: 1.25", "factor: [1.25]", 21, 22, "router.capacity.factor", "a list"),
    ],
)
def test_float_field_given_a_non_number_says_must_be_a_number(old, new, line, col, field, got):
    assert errors(FEATURES.replace(old, new)) == [
        (line, col, field, f"must be a number, got {got}")
    ]


@pytest.mark.parametrize(
    ("old", "new", "line", "col", "field"),
    [
        ("load_balance_loss: 1e-4", "load_balance_loss: -0.01", 19, 22, "router.load_balance_loss"),
        ("z_loss: 0.001", "z_loss: -1", 20, 11, "router.z_loss"),
    ],
)
def test_negative_loss_weight_says_must_be_at_least_0(old, new, line, col, field) -> None:
    [(found_line, found_col, found_field, message)] = errors(FEATURES.replace(old, new))
    assert (found_line, found_col, found_field) == (line, col, field)
    assert message == f"must be >= 0, got {new.split(': ')[1]}"


def test_utf8_bom_and_comments_are_accepted() -> None:
    text = "# leading comment\n" + MINIMAL + "# trailing comment\n"
    assert load(b"\xef\xbb\xbf" + text.encode()).spec.layer.ffn_dim == 64


def test_spec_is_frozen() -> None:
    loaded = load(VALID)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        loaded.spec.layer.embed_dim = 128  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        loaded.spec.router = loaded.spec.router  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded.spec = loaded.spec  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded.source.text = ""  # type: ignore[misc]
    assert loaded.spec.layer.embed_dim == 64


def test_spec_containers_are_immutable() -> None:
    spec = load(VALID).spec
    with pytest.raises(TypeError):
        spec.mesh.axes["data"] = 1024  # type: ignore[index]
    with pytest.raises((TypeError, AttributeError)):
        spec.mesh.batch_axes.append("data")  # type: ignore[union-attr]
