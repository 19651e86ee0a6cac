"""Unit tests of stage 1, `moegen.load`: YAML bytes to a frozen, located `Spec`."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pydantic
import pytest

from moegen.diagnostics import Diagnostic, SpecError
from moegen.load import (
    MAX_SPEC_BYTES,
    Locations,
    describe,
    display_path,
    dotted,
    load_spec,
    load_spec_bytes,
)

VALID = """\
version: 1
description: a small layer
layer:
  num_experts: 8
  embed_dim: 64
  ffn_dim: 128
router:
  top_k: 2
  score: sigmoid
  renormalize: true
shapes:
  batch: 8
  seq_len: 16
dtypes:
  params: bfloat16
  compute: float32
mesh:
  axes:
    data: 2
    fsdp: 2
  batch_axes: [data, fsdp]
parallelism:
  experts: replicated
  overlap_chunks: 1
target:
  hardware: cpu
  kernel: xla
"""

MINIMAL = """\
version: 1
layer: {num_experts: 4, embed_dim: 32, ffn_dim: 64}
router: {top_k: 1}
shapes: {batch: 2, seq_len: 8}
mesh: {axes: {fsdp: 2, data: 1}}
"""


def load(text: str | bytes, name: str = "spec"):
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return load_spec_bytes(raw, "spec.yaml", name)


def errors(text: str | bytes, name: str = "spec") -> list[tuple[int, int, str, str]]:
    with pytest.raises(SpecError) as info:
        load(text, name)
    for d in info.value.diagnostics:
        assert d.file == "spec.yaml"
    return [(d.line, d.column, d.field, d.message) for d in info.value.diagnostics]


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
     "must be 'swiglu', 'geglu', 'gelu' or 'relu', got 'silu'; did you mean 'swiglu'?"),
    ("activation: geglu", "activation: gegelu", 7, 15, "layer.activation",
     "must be 'swiglu', 'geglu', 'gelu' or 'relu', got 'gegelu'; did you mean 'geglu'?"),
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
    ("{factor: 1.25, drop: position}", "{drop: position}", 21, 13, "router.capacity",
     "required key 'factor' is missing"),
    ("drop: position", "drop: postion", 21, 34, "router.capacity.drop",
     "must be 'probability' or 'position', got 'postion'; did you mean 'position'?"),
    ("drop: position", "drop: random", 21, 34, "router.capacity.drop",
     "must be 'probability' or 'position', got 'random'"),
    ("capacity: {factor: 1.25, drop: position}", "capacity: 1.25", 21, 13, "router.capacity",
     "must be a mapping, got 1.25"),
    # other tools' flat key: not close enough to 'capacity' for a hint, so the keys are listed
    ("capacity: {factor: 1.25, drop: position}", "capacity_factor: 1.25", 21, 3, "router",
     "unknown key 'capacity_factor'; expected one of: top_k, score, score_after_top_k, "
     "renormalize, routed_scaling, group_limit, routing_bias, load_balance_loss, z_loss, "
     "capacity"),
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
         "unknown key 'top_k'; expected one of: groups, keep"),
        ("drop: position", "drop: position, policy: x", 21, 44, "router.capacity",
         "unknown key 'policy'; expected one of: factor, drop"),
        # 'drop' is already written: suggesting it would make a duplicate key
        ("drop: position", "drop: position, dorp: x", 21, 44, "router.capacity",
         "unknown key 'dorp'; expected one of: factor, drop"),
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


# ---------------------------------------------------------------------------------------
# Strict types: nothing is coerced


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        ("num_experts: 8", 'num_experts: "8"', "layer.num_experts", "must be an integer, got '8'"),
        ("num_experts: 8", "num_experts: 8.0", "layer.num_experts", "must be an integer, got 8.0"),
        (
            "num_experts: 8",
            "num_experts: true",
            "layer.num_experts",
            "must be an integer, got true",
        ),
        (
            "renormalize: true",
            "renormalize: 1",
            "router.renormalize",
            "must be true or false, got 1",
        ),
        (
            "renormalize: true",
            'renormalize: "true"',
            "router.renormalize",
            "must be true or false, got 'true'",
        ),
        (
            "description: a small layer",
            "description: 12",
            "description",
            "must be a string, got 12",
        ),
        (
            "description: a small layer",
            "description: null",
            "description",
            "must be a string, got null",
        ),
        (
            "score: sigmoid",
            "score: 1",
            "router.score",
            "must be 'softmax', 'sigmoid' or 'sqrtsoftplus', got 1",
        ),
    ],
)
def test_strict_types_no_coercion(old, new, field, message) -> None:
    assert old in VALID
    found = errors(VALID.replace(old, new))
    assert [(f, m) for _, _, f, m in found] == [(field, message)]


def test_quoted_version_is_refused() -> None:
    [(line, col, field, message)] = errors(VALID.replace("version: 1", 'version: "1"'))
    assert (line, col, field) == (1, 10, "version")
    assert message.startswith("must be 1, the only spec version so far, got '1'")


def test_quoted_version_message_has_no_self_suggestion() -> None:
    [(*_, message)] = errors(VALID.replace("version: 1", 'version: "1"'))
    assert "did you mean" not in message


@pytest.mark.parametrize("version", ["true", "1.0"])
def test_version_must_be_the_integer_1(version: str) -> None:
    errors(VALID.replace("version: 1", f"version: {version}"))


# ---------------------------------------------------------------------------------------
# Spelling hints: other tools' names, typos, and what is too far to be a typo


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        # names other tools use for moegen's choices
        ("kernel: xla", "kernel: megablox", "target.kernel", "got 'megablox'; did you mean 'pallas'?"),
        ("kernel: xla", "kernel: ragged_dot", "target.kernel", "got 'ragged_dot'; did you mean 'xla'?"),
        ("params: bfloat16", "params: bf16", "dtypes.params", "got 'bf16'; did you mean 'bfloat16'?"),
        ("compute: float32", "compute: fp32", "dtypes.compute", "got 'fp32'; did you mean 'float32'?"),
        ("compute: float32", "compute: f32", "dtypes.compute", "got 'f32'; did you mean 'float32'?"),
        ("compute: float32", "compute: float", "dtypes.compute", "got 'float'; did you mean 'float32'?"),
        # typos at least 0.8 similar to one choice
        ("kernel: xla", "kernel: palas", "target.kernel", "got 'palas'; did you mean 'pallas'?"),
        ("score: sigmoid", "score: sigmod", "router.score", "got 'sigmod'; did you mean 'sigmoid'?"),
        # the same letters swapped, though less than 0.8 similar
        ("kernel: xla", "kernel: xal", "target.kernel", "got 'xal'; did you mean 'xla'?"),
        # too far from every choice: no hint
        ("kernel: xla", "kernel: triton", "target.kernel", "must be 'xla', 'pallas' or 'te', got 'triton'"),
    ],
)  # fmt: skip
def test_choice_hints(old: str, new: str, field: str, message: str) -> None:
    assert old in VALID
    [(_, _, found_field, found)] = errors(VALID.replace(old, new))
    assert found_field == field
    assert found.endswith(message), found
    assert found.count("did you mean") <= 1


@pytest.mark.parametrize(
    ("old", "new", "hint"),
    [
        ("kernel: xla", "kernal: xla", "unknown key 'kernal'; did you mean 'kernel'?"),  # 0.83
        ("seq_len: 16", "seqlen: 16", "unknown key 'seqlen'; did you mean 'seq_len'?"),  # 0.92
    ],
)
def test_key_typo_hints(old: str, new: str, hint: str) -> None:
    messages = [m for *_, m in errors(VALID.replace(old, new))]
    assert hint in messages, messages


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        # a shorter name the intended one contains (0.78 similar)
        ("num_experts: 8", "experts: 8", "layer", "unknown key 'experts'; did you mean 'num_experts'?"),
        ("overlap_chunks: 1", "chunks: 1", "parallelism", "unknown key 'chunks'; did you mean 'overlap_chunks'?"),
        ("experts: replicated", "experts: ring", "parallelism.experts", "got 'ring'; did you mean 'ring_of_experts'?"),
        # the same letters swapped (0.75 similar)
        ("fsdp: 2", "fdsp: 2", "mesh.axes.fdsp", "got 'fdsp'; did you mean 'fsdp'?"),
    ],
)  # fmt: skip
def test_near_misses_below_the_cutoff_keep_a_hint(
    old: str, new: str, field: str, message: str
) -> None:
    assert old in VALID
    found = [(f, m) for _, _, f, m in errors(VALID.replace(old, new))]
    assert any(f == field and m.endswith(message) for f, m in found), found
    assert all(m.count("did you mean") <= 1 for _, m in found), found


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        ("data: 2", "experts: 2", "mesh.axes.experts", "got 'experts'; did you mean 'expert'?"),
        ("experts: replicated", "experts: replicate", "parallelism.experts",
         "got 'replicate'; did you mean 'replicated'?"),
        ("experts: replicated", "experts: all_to_all", "parallelism.experts",
         "got 'all_to_all'; did you mean 'ragged_all_to_all'?"),
        # too far from every strategy: the choices only
        ("experts: replicated", "experts: ep", "parallelism.experts",
         "must be 'replicated', 'ragged_all_to_all', 'ring_of_experts' or 'auto', got 'ep'"),
    ],
)  # fmt: skip
def test_expert_parallel_spelling_hints(old: str, new: str, field: str, message: str) -> None:
    assert old in VALID
    [(_, _, found_field, found)] = errors(VALID.replace(old, new))
    assert found_field == field
    assert found.endswith(message), found


@pytest.mark.parametrize("extra", ["experts: 8", "embed_dm: 8"])
def test_no_hint_names_a_key_already_written(extra: str) -> None:
    [(line, _, field, message)] = errors(
        VALID.replace("  ffn_dim: 128\n", f"  ffn_dim: 128\n  {extra}\n")
    )
    assert (line, field) == (7, "layer")
    assert message.startswith(f"unknown key {extra.split(':')[0]!r}")
    assert "did you mean" not in message, message


def test_expert_is_a_mesh_axis() -> None:
    text = VALID.replace(
        "    fsdp: 2\n  batch_axes: [data, fsdp]", "    expert: 2\n  batch_axes: [data, expert]"
    )
    assert "expert: 2" in text
    spec = load(text).spec
    assert dict(spec.mesh.axes) == {"data": 2, "expert": 2}
    assert spec.mesh.batch_axes == ("data", "expert")


@pytest.mark.parametrize("value", ["[softmax]", "{a: 1}"])
def test_collection_where_a_choice_is_expected_is_located(value: str) -> None:
    [(line, _, field, message)] = errors(VALID.replace("score: sigmoid", f"score: {value}"))
    assert (line, field) == (9, "router.score")
    assert message.startswith("must be 'softmax', 'sigmoid' or 'sqrtsoftplus', got ")


# ---------------------------------------------------------------------------------------
# Every error kind is located, and all are reported together


def test_every_schema_error_kind_is_located_and_reported_together() -> None:
    text = """\
version: 3
description: [not, text]
layer:
  num_experts: "8"
  embed_dim: 0
  ffn_dim: 2147483648
  activation: gelu_tanh
  hidden: 3
router:
  renormalize: 1
shapes: [16, 256]
mesh:
  axes: {}
  batch_axes: data
parallelism:
  overlap_chunks: 1.5
targte:
  hardware: cpu
"""
    assert errors(text) == [
        (1, 10, "version", "must be 1, the only spec version so far, got 3"),
        (2, 14, "description", "must be a string, got a list"),
        (4, 16, "layer.num_experts", "must be an integer, got '8'"),
        (5, 14, "layer.embed_dim", "must be > 0, got 0"),
        (6, 12, "layer.ffn_dim", "must be <= 2147483647, got 2147483648"),
        (7, 15, "layer.activation", "must be 'swiglu', 'geglu', 'gelu' or 'relu', got 'gelu_tanh'"),
        (8, 3, "layer", ("unknown key 'hidden'; expected one of: num_experts, embed_dim, "
         "ffn_dim, activation, ffn_bias, shared_ffn_dim")),
        (10, 3, "router", "required key 'top_k' is missing"),
        (10, 16, "router.renormalize", "must be true or false, got 1"),
        (11, 9, "shapes", "must be a mapping, got a list"),
        (13, 9, "mesh.axes", "must not be empty"),
        (14, 15, "mesh.batch_axes", "must be a list, got 'data'"),
        (
            16,
            19,
            "parallelism.overlap_chunks",
            "must be an integer, got 1.5 (or auto, for `moegen tune` to choose)",
        ),
        (17, 1, "", "unknown key 'targte'; did you mean 'target'?"),
    ]  # fmt: skip


def test_yaml_structure_errors_are_reported_together() -> None:
    text = """\
version: 1
layer:
  num_experts: &n 8
  embed_dim: 64
  embed_dim: 64
  ffn_dim: !!binary aGVsbG8=
router:
  top_k: *n
  1: 2
"""
    assert errors(text) == [
        (5, 3, "layer.embed_dim", "duplicate key (first at 4:3)"),
        (6, 12, "layer.ffn_dim", tag_message("!!binary")),
        (8, 10, "router.top_k", "YAML aliases are not supported; write the value out"),
        (9, 3, "router", "keys must be strings, got 1; quote it"),
    ]


def test_mesh_axis_key_errors_point_at_the_key() -> None:
    text = MINIMAL.replace("{fsdp: 2, data: 1}", "{fsdp: 2, tensor: 2, dta: 1}")
    assert errors(text) == [
        (5, 24, "mesh.axes.tensor", "must be 'data', 'fsdp' or 'expert', got 'tensor'"),
        (
            5,
            35,
            "mesh.axes.dta",
            "must be 'data', 'fsdp' or 'expert', got 'dta'; did you mean 'data'?",
        ),
    ]


def test_dict_type_and_string_too_long() -> None:
    text = MINIMAL.replace("{axes: {fsdp: 2, data: 1}}", "{axes: [fsdp, data]}")
    text += "description: " + "x" * 501 + "\n"
    assert errors(text) == [
        (5, 14, "mesh.axes", "must be a mapping, got a list"),
        (6, 14, "description", "must be at most 500 characters"),
    ]


def test_missing_required_sections_point_at_the_document() -> None:
    text = "# header comment\nversion: 1\nlayer:\n  num_experts: 8\n"
    assert errors(text) == [
        (2, 1, "", "required key 'router' is missing"),
        (2, 1, "", "required key 'shapes' is missing"),
        (2, 1, "", "required key 'mesh' is missing"),
        (4, 3, "layer", "required key 'embed_dim' is missing"),
        (4, 3, "layer", "required key 'ffn_dim' is missing"),
    ]


def test_null_section_is_not_a_mapping() -> None:
    assert errors(MINIMAL.replace("router: {top_k: 1}", "router:")) == [
        (3, 8, "router", "must be a mapping, got null")
    ]


# ---------------------------------------------------------------------------------------
# Whole-file problems


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "spec is empty"),
        ("# nothing\n\n", "spec is empty"),
        ("[1, 2]\n", "spec must be a mapping of sections (version, layer, router, ...)"),
        ("just text\n", "spec must be a mapping of sections (version, layer, router, ...)"),
        ("null\n", "spec is empty"),
    ],
)
def test_document_must_be_a_mapping(text: str, message: str) -> None:
    assert errors(text) == [(1, 1, "", message)]


def test_lone_document_marker_is_an_empty_spec() -> None:
    assert errors("---\n") == [(1, 1, "", "spec is empty")]


@pytest.mark.parametrize(
    ("text", "line", "col", "problem"),
    [
        (
            "a: [1, 2\nb: 3\n",
            2,
            2,
            "expected ',' or ']', but got ':' (while parsing a flow sequence at 1:4)",
        ),
        ("a:\n\tb: 1\n", 2, 1, "tabs cannot indent YAML; use spaces"),
        ("a: 1\n  b: 2\n", 2, 4, "mapping values are not allowed here"),
        (
            "a: 1\n---\nb: 2\n",
            2,
            1,
            "a spec is one YAML document; remove the '---' line and what follows it",
        ),
        (
            "a: 'open\n",
            2,
            1,
            "found unexpected end of stream (while scanning a quoted scalar at 1:4)",
        ),
    ],
)
def test_yaml_syntax_errors_are_located(text: str, line: int, col: int, problem: str) -> None:
    assert errors(text) == [(line, col, "", f"invalid YAML: {problem}")]


def test_size_limit() -> None:
    padded = MINIMAL + "#" * (MAX_SPEC_BYTES - len(MINIMAL) - 1) + "\n"
    assert len(padded.encode()) == MAX_SPEC_BYTES
    assert load(padded).spec.layer.embed_dim == 32
    too_big = padded + "\n"
    assert errors(too_big) == [
        (1, 1, "", f"spec is {MAX_SPEC_BYTES + 1} bytes; at most {MAX_SPEC_BYTES} are accepted")
    ]


def test_not_utf8() -> None:
    assert errors(b"version: 1\ndescription: caf\xe9\n") == [
        (2, 17, "", "spec is not UTF-8 text (byte 0xe9)")
    ]
    assert errors(MINIMAL.encode("utf-16")) == [(1, 1, "", "spec is not UTF-8 text (byte 0xff)")]


@pytest.mark.parametrize("name", ["bad-name", "2fast", "_private", "my spec", "a.b"])
def test_module_name_must_be_an_identifier(name: str) -> None:
    [(line, col, field, message)] = errors(MINIMAL, name=name)
    assert (line, col, field) == (1, 1, "")
    assert message.startswith(f"file name {name!r} must be a Python identifier")


@pytest.mark.parametrize("name", ["class", "import", "None"])
def test_module_name_must_not_be_a_keyword(name: str) -> None:
    errors(MINIMAL, name=name)


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x1b"])
def test_control_character_is_a_located_diagnostic(char: str) -> None:
    found = errors(f"version: 1\ndescription: a{char}b\n")
    assert found[0][:2] == (2, 15)


# ---------------------------------------------------------------------------------------
# Unsafe YAML forms: aliases, merge keys, tags

ALIAS_MESSAGE = "YAML aliases are not supported; write the value out"


def test_aliases_refused_at_the_key_that_uses_them() -> None:
    text = MINIMAL.replace("{top_k: 1}", "&r {top_k: 1}") + "parallelism: *r\n"
    assert errors(text) == [(6, 14, "parallelism", ALIAS_MESSAGE)]


def test_alias_of_a_scalar_refused() -> None:
    text = MINIMAL.replace("num_experts: 4", "num_experts: &four 4").replace(
        "batch: 2", "batch: *four"
    )
    assert errors(text) == [(4, 17, "shapes.batch", ALIAS_MESSAGE)]


def test_recursive_alias_does_not_hang() -> None:
    assert errors("a: &x [1, *x]\n") == [(1, 11, "a[1]", ALIAS_MESSAGE)]


def test_alias_in_a_sequence_is_refused() -> None:
    text = MINIMAL.replace("{fsdp: 2, data: 1}", "{fsdp: 2, data: 1}, batch_axes: [&ax fsdp, *ax]")
    [(line, _, field, message)] = errors(text)
    assert (line, field, message) == (5, "mesh.batch_axes[1]", ALIAS_MESSAGE)


def test_alias_in_a_sequence_points_at_the_alias() -> None:
    text = "version: 1\nx: &ax fsdp\ny: [data, *ax]\n"
    [(line, col, field, _)] = errors(text)
    assert (line, col, field) == (3, 11, "y[1]")


def test_merge_key_refused() -> None:
    text = MINIMAL.replace("{top_k: 1}", "&r {top_k: 1}") + "parallelism:\n  <<: *r\n"
    assert errors(text) == [
        (7, 3, "parallelism", "merge keys '<<' are not supported; write the keys out")
    ]


def tag_message(tag: str) -> str:
    return (
        f"YAML tag {tag!r} is not supported; remove it (a value's type is how it is written: "
        "8, 0.5, true, null, text)"
    )


@pytest.mark.parametrize(
    ("value", "tag"),
    [
        ("!!python/object:os.system 'ls'", "!!python/object:os.system"),
        ("!!python/name:os.system", "!!python/name:os.system"),
        ("!!timestamp 2024-01-01", "!!timestamp"),
        ("!custom x", "!custom"),
        ("!<tag:yaml.org,2002:str> x", "!!str"),
        ("!%0A%1B[2J x", "!\n\x1b[2J"),  # percent escapes decode to control characters
    ],
)
def test_unsupported_scalar_tags_refused(value: str, tag: str) -> None:
    text = MINIMAL + f"description: {value}\n"
    assert errors(text) == [(6, 14, "description", tag_message(tag))]


# Every explicit tag is refused, core-schema ones included: each of these used to be
# misread (!!bool "yes" as false, !!null "2048" as null, !!int "٨" as 8) or to crash.
@pytest.mark.parametrize(
    ("value", "tag"),
    [
        ('!!int "eight"', "!!int"),
        ("!!str 8", "!!str"),
        ('!!bool "yes"', "!!bool"),
        ('!!null "2048"', "!!null"),
        ('!!float "x"', "!!float"),
        ('!!int "\u0668"', "!!int"),
        ('!!int " 8 "', "!!int"),
        ("!!int 8", "!!int"),  # even where it changes nothing
        ("!!binary aGVsbG8=", "!!binary"),
        ("!foo 8", "!foo"),
        ("! 8", "!"),  # the non-specific tag
    ],
)
def test_every_explicit_tag_is_refused(value: str, tag: str) -> None:
    text = MINIMAL.replace("top_k: 1", f"top_k: {value}")
    assert errors(text) == [(3, 17, "router.top_k", tag_message(tag))]


def test_tag_on_a_key_is_refused_and_not_echoed() -> None:
    found = errors('? !!int "x\\nfake.yaml:1:1: forged"\n: 1\n')
    assert found == [(1, 3, "", tag_message("!!int"))]


def test_tag_on_the_document_is_refused() -> None:
    assert errors('!!null ""\n') == [(1, 1, "", tag_message("!!null"))]
    assert errors("!!map {}\n") == [(1, 1, "", tag_message("!!map"))]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("mesh: {axes:", "mesh: !!python/object:os.system {axes:"),
        ("router: {top_k: 1}", "router: !!python/object/new:dict {top_k: 1}"),
        (
            "mesh: {axes: {fsdp: 2, data: 1}}",
            "mesh: {axes: {fsdp: 2, data: 1}, batch_axes: !!python/object/apply:os.system [fsdp]}",
        ),
    ],
)
def test_tags_on_collections_refused(old: str, new: str) -> None:
    assert old in MINIMAL
    found = errors(MINIMAL.replace(old, new))
    assert any(message.startswith("YAML tag '!!python/") for *_, message in found), found


# ---------------------------------------------------------------------------------------
# load_spec: from a path


def test_load_spec_from_path_relative_to_cwd(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "specs").mkdir()
    path = tmp_path / "specs" / "tiny.yaml"
    path.write_text(MINIMAL, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    loaded = load_spec(Path("specs/tiny.yaml"))
    assert loaded.source.display == "specs/tiny.yaml"
    assert loaded.source.name == "tiny"
    assert display_path(path) == "specs/tiny.yaml"


def test_display_path_outside_cwd_is_kept(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    outside = tmp_path / "elsewhere.yaml"
    assert display_path(outside) == outside.as_posix()


def test_load_spec_missing_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as info:
        load_spec(Path("absent.yaml"))
    assert [d.text() for d in info.value.diagnostics] == [
        "absent.yaml:1:1: cannot read spec: No such file or directory"
    ]


def test_load_spec_refuses_unprintable_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    name = "new\nline.yaml"
    (tmp_path / name).write_text(MINIMAL, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(Path(name))
    [d] = info.value.diagnostics
    assert d.file == ascii(name)
    assert d.message == "file path must be printable"


@pytest.mark.parametrize(
    ("value", "loaded"),
    [("2024-01-01", "2024-01-01"), ("yes", "yes"), ("on", "on"), ("010", 10), ("1:30", "1:30")],
)
def test_yaml_core_schema_no_yaml_1_1_surprises(value: str, loaded: object) -> None:
    """YAML 1.2 core schema: dates, yes/on and sexagesimal stay strings; 010 is decimal."""
    from moegen.load import SpecSource, _parse_yaml

    data, _ = _parse_yaml(SpecSource("x.yaml", "x", f"v: {value}\n", ""))
    assert data["v"] == loaded


# ---------------------------------------------------------------------------------------
# Untrusted input (issue 16): limits, positions, escaping. The CLI side is
# tests/test_hostile_inputs.py.


def test_nesting_up_to_the_limit_loads_and_one_more_is_refused() -> None:
    from moegen.load.yaml_limits import MAX_DEPTH

    # The document is level 1; `description` holds the rest.
    deep = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    found = errors(MINIMAL + f"description: {deep}\n")
    assert found == [(6, 14, "description", "must be a string, got a list")]
    deeper = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert errors(MINIMAL + f"description: {deeper}\n") == [
        (
            6,
            14 + MAX_DEPTH - 1,
            "",
            "invalid YAML: nesting is deeper than 32 levels; a spec needs about 4",
        )
    ]


def test_nesting_in_flow_mappings_and_block_sequences_is_counted() -> None:
    assert errors("a: " + "{b: " * 40 + "1" + "}" * 40 + "\n")[0][:2] == (1, 128)
    # Line n (n >= 2) opens level n: the root mapping is level 1.
    assert errors("a:\n" + "".join(" " * i + "-\n" for i in range(1, 40)))[0][:2] == (33, 33)


@pytest.mark.parametrize(
    ("value", "loaded"), [("1" * 30, int("1" * 30)), ("-" + "1" * 30, -int("1" * 30))]
)
def test_30_digit_integers_load(value: str, loaded: int) -> None:
    from moegen.load import SpecSource, _parse_yaml

    data, _ = _parse_yaml(SpecSource("x.yaml", "x", f"v: {value}\n", ""))
    assert data["v"] == loaded


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1" * 31, "integer has 31 digits; at most 30 are accepted"),
        ("9" * 5000, "integer has 5000 digits; at most 30 are accepted"),
        ("0." + "0" * 40 + "1", "number has 42 digits; at most 30 are accepted"),
        ("1" * 20 + "." + "1" * 11, "number has 31 digits; at most 30 are accepted"),
    ],
)
def test_overlong_numbers_are_refused_located(value: str, message: str) -> None:
    assert errors(MINIMAL.replace("batch: 2", f"batch: {value}")) == [
        (4, 17, "shapes.batch", message)
    ]


@pytest.mark.parametrize("digit", ["\u0668", "\uff18", "\u0e58"])  # Arabic-Indic, fullwidth, Thai
def test_non_ascii_digits_are_text_not_numbers(digit: str) -> None:
    # The core-schema patterns match [0-9] only (ASCII, unlike \d or int()).
    assert errors(MINIMAL.replace("top_k: 1", f"top_k: {digit}")) == [
        (3, 17, "router.top_k", f"must be an integer, got '{digit}'")
    ]


@pytest.mark.parametrize(
    ("char", "shown"),
    [("\x00", "U+0000"), ("\x07", "U+0007"), ("\x1b", "U+001B"), ("\x7f", "U+007F")],
)
def test_control_character_message_names_it_and_its_escape(char: str, shown: str) -> None:
    escape = f"\\x{ord(char):02x}"
    assert errors(f"version: 1\ndescription: a{char}b\n") == [
        (
            2,
            15,
            "",
            f"invalid YAML: control character {shown} is not allowed raw (YAML does not allow "
            f"it); write it as {escape} inside double quotes",
        )
    ]


@pytest.mark.parametrize("char", ["\x85", "\u2028", "\u2029", "\r", "\u202e", "\u2066"])
def test_raw_line_breaks_and_bidi_controls_are_refused_at_their_line(char: str) -> None:
    # In a comment on line 2: PyYAML would end the comment there and read what follows.
    text = f"version: 1\n# note{char}router: {{top_k: 1}}\n"
    [(line, col, field, message)] = errors(text)
    assert (line, col, field) == (2, 7, "")
    assert f"U+{ord(char):04X}" in message and "inside double quotes" in message


def test_crlf_line_ends_are_accepted_and_counted_once() -> None:
    text = MINIMAL.replace("\n", "\r\n").replace("batch: 2", "batch: 0")
    assert errors(text) == [(4, 17, "shapes.batch", "must be > 0, got 0")]


def test_columns_count_characters_and_skip_a_byte_order_mark() -> None:
    assert errors("\ufeffversion: 2\n" + MINIMAL.split("\n", 1)[1])[0][:3] == (1, 10, "version")
    text = MINIMAL + "description: ééé\n" + "layer: 1\n"
    assert errors(text)[0][:2] == (7, 1)
    assert errors("# ééé é\nversion: [1, 2\n")[0][:2] == (3, 1)


def test_escaped_line_separators_in_quoted_text_are_accepted() -> None:
    text = MINIMAL + 'description: "a\\u2028b\\Lc\\x85d\\u202ee"\n'
    assert load(text).spec.description == "a\u2028b\u2028c\x85d\u202ee"


def test_unknown_key_is_escaped_and_cut_short() -> None:
    [(_, _, _, message)] = errors(MINIMAL + '"x\\nfake.yaml:1:1: forged\\e": 1\n')
    assert message.startswith("unknown key 'x\\nfake.yaml:1:1: forged\\x1b'; expected one of:")
    [(_, _, _, message)] = errors(MINIMAL + "? " + "k" * 5000 + "\n: 1\n")
    assert message.startswith("unknown key '" + "k" * 56 + "...; expected one of:")


def test_user_keys_in_field_paths_are_escaped_and_cut_short() -> None:
    assert dotted(("mesh", "axes", "a\u202eb")) == "mesh.axes['a\\u202eb']"
    assert dotted(("mesh", "axes", "k" * 500)) == "mesh.axes['" + "k" * 56 + "...]"


def test_non_string_key_is_shown_escaped() -> None:
    assert errors(MINIMAL + "9" * 100 + ": 1\n") == [
        (6, 1, "", "keys must be strings, got " + "9" * 57 + "...; quote it")
    ]


def test_describe_escapes_text() -> None:
    assert describe("a\nb\x1b\u202e") == "'a\\nb\\x1b\\u202e'"


def test_many_unknown_keys_are_linear_and_capped() -> None:
    from moegen.diagnostics import MAX_REPORTED

    found = errors(MINIMAL + "".join(f"k{i}: 1\n" for i in range(3000)))
    assert len(found) == MAX_REPORTED + 1
    assert found[-1] == (
        6 + MAX_REPORTED, 1, "", "... and 2900 more problems, from here on; fix the ones above first"
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "start"),
    [
        ("\ufb01le", "file name '\ufb01le' must be ASCII letters, digits and '_' (it names the "
         "generated module; Python would import '\ufb01le' as 'file')"),
        ("caf\u00e9", "file name 'caf\u00e9' must be ASCII letters, digits and '_' (it names the "
         "generated module)"),
        ("a\u2028b", "file name 'a\\u2028b' must be ASCII"),
        ("a" * 101, "file name is 101 characters long; at most 100 can name the generated module"),
    ],
)  # fmt: skip
def test_module_name_must_be_short_ascii(name: str, start: str) -> None:
    [(line, col, field, message)] = errors(MINIMAL, name=name)
    assert (line, col, field) == (1, 1, "")
    assert message.startswith(start), message


def test_module_name_of_100_characters_is_accepted() -> None:
    assert load(MINIMAL, name="a" * 100).source.name == "a" * 100


def test_display_path_names_a_symlink_not_its_target(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "real.yaml").write_text(MINIMAL, encoding="utf-8")
    (tmp_path / "link.yaml").symlink_to("specs/real.yaml")
    monkeypatch.chdir(tmp_path)
    loaded = load_spec(Path("link.yaml"))
    assert (loaded.source.display, loaded.source.name) == ("link.yaml", "link")
    assert display_path(tmp_path / "link.yaml") == "link.yaml"
    assert display_path(Path("specs/../link.yaml")) == "link.yaml"
    assert display_path(Path("../elsewhere.yaml")) == "../elsewhere.yaml"


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/null"])
def test_symlink_to_a_device_is_refused(tmp_path: Path, monkeypatch, target: str) -> None:
    (tmp_path / "dev.yaml").symlink_to(target)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as info:
        load_spec(Path("dev.yaml"))
    assert [d.text() for d in info.value.diagnostics] == [
        "dev.yaml:1:1: spec path is a character device, not a regular file; give a YAML file's path"
    ]


def test_fifo_is_refused_without_blocking(tmp_path: Path, monkeypatch) -> None:
    import os

    os.mkfifo(tmp_path / "pipe.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match="named pipe"):
        load_spec(Path("pipe.yaml"))


def test_dangling_symlink_cannot_be_read(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "gone.yaml").symlink_to("absent.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as info:
        load_spec(Path("gone.yaml"))
    assert [d.text() for d in info.value.diagnostics] == [
        "gone.yaml:1:1: cannot read spec: No such file or directory"
    ]


def test_file_at_the_size_limit_loads_and_one_byte_more_is_refused_by_stat(
    tmp_path: Path, monkeypatch
) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(MINIMAL + "#" * (MAX_SPEC_BYTES - len(MINIMAL) - 1) + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert load_spec(Path("big.yaml")).spec.layer.embed_dim == 32
    with path.open("ab") as f:
        f.write(b"\n")
    with pytest.raises(SpecError) as info:
        load_spec(Path("big.yaml"))
    assert [d.message for d in info.value.diagnostics] == [
        f"spec is {MAX_SPEC_BYTES + 1} bytes; at most {MAX_SPEC_BYTES} are accepted"
    ]


# ---------------------------------------------------------------------------------------
# Diagnostics: always one printable line, whatever a stage puts in them


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ("a\nb", "a\\nb"),
        ("a\r\nb", "a\\r\\nb"),
        ("nul\x00", "nul\\x00"),
        ("\x1b[2J", "\\x1b[2J"),
        ("\x85\u2028\u2029", "\\x85\\u2028\\u2029"),
        ("\u202a\u202b\u202c\u202d\u202e", "\\u202a\\u202b\\u202c\\u202d\\u202e"),
        ("\u2066\u2067\u2068\u2069", "\\u2066\\u2067\\u2068\\u2069"),
        ("\U000e0001", "\\U000e0001"),
        ("café ﬁle: ok", "café ﬁle: ok"),  # printable text is kept as written
    ],
)
def test_diagnostic_escapes_every_unprintable_character(raw: str, escaped: str) -> None:
    d = Diagnostic(f"f{raw}.yaml", 1, 2, f"k{raw}", f"m{raw}")
    assert (d.file, d.field, d.message) == (f"f{escaped}.yaml", f"k{escaped}", f"m{escaped}")
    for line in (d.text(), d.github()):
        assert line.isprintable() and "\n" not in line, repr(line)


def test_forged_diagnostic_is_one_line_in_every_format() -> None:
    import json

    from moegen.diagnostics import format_diagnostics

    d = Diagnostic("spec.yaml", 1, 1, "", "got x\nfake.yaml:1:1: forged\x00\x1b[2J")
    for fmt in ("text", "github"):
        [line] = format_diagnostics([d], fmt).splitlines()
        assert line.isprintable() and "\x00" not in line and "\x1b" not in line
    [item] = json.loads(format_diagnostics([d], "json"))
    assert item["message"] == "got x\\nfake.yaml:1:1: forged\\x00\\x1b[2J"


def test_spec_error_caps_the_diagnostics_at_the_first_left_out() -> None:
    from moegen.diagnostics import MAX_REPORTED

    many = [Diagnostic("s.yaml", i, 1, "", "bad") for i in range(1, MAX_REPORTED + 2)]
    assert SpecError(many).diagnostics == sorted(many, key=lambda d: d.line)  # 101: all shown
    more = [*many, Diagnostic("s.yaml", MAX_REPORTED + 2, 1, "", "bad")]
    shown = SpecError(more).diagnostics
    assert shown[:MAX_REPORTED] == more[:MAX_REPORTED]
    assert shown[MAX_REPORTED:] == [
        Diagnostic(
            "s.yaml",
            MAX_REPORTED + 1,
            1,
            "",
            "... and 2 more problems, from here on; fix the ones above first",
        )
    ]
