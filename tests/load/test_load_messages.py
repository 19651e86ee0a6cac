"""Stage 1, `moegen.load`: strict types, spelling hints, every error kind located and reported together."""

from __future__ import annotations

import pytest
from load_cases import MINIMAL, VALID, errors, load, tag_message

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
        ("params: bfloat16", "params: bf16", "dtypes.params", "got 'bf16'; did you mean 'bfloat16'?"),
        ("compute: float32", "compute: fp32", "dtypes.compute", "got 'fp32'; did you mean 'float32'?"),
        ("compute: float32", "compute: f32", "dtypes.compute", "got 'f32'; did you mean 'float32'?"),
        ("compute: float32", "compute: float", "dtypes.compute", "got 'float'; did you mean 'float32'?"),
        # typos at least 0.8 similar to one choice
        ("score: sigmoid", "score: sigmod", "router.score", "got 'sigmod'; did you mean 'sigmoid'?"),
        # the same letters swapped, though less than 0.8 similar
        # too far from every choice: no hint
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
    ],
)  # fmt: skip
def test_mesh_axis_spelling_hints(old: str, new: str, field: str, message: str) -> None:
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
        (7, 15, "layer.activation", "must be 'swiglu', 'geglu', 'gelu', 'relu' or 'relu2', got 'gelu_tanh'"),
        (8, 3, "layer", ("unknown key 'hidden'; expected one of: num_experts, embed_dim, "
         "ffn_dim, activation, gelu_approximation, glu, shared_glu, ffn_bias, latent_dim, "
         "latent_bias, shared_ffn_dim, expert_input_norm_eps, shared_ffn_bias, "
         "shared_expert_gate, shared_experts, output_norm_eps, expert_output_norm_eps, "
         "shared_output_norm_eps")),
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
    text = MINIMAL.replace("{fsdp: 2, data: 1}", "{fsdp: 2, pipe: 2, dta: 1}")
    allowed = "must be 'data', 'fsdp', 'expert', 'tensor' or 'sequence'"
    assert errors(text) == [
        (5, 24, "mesh.axes.pipe", f"{allowed}, got 'pipe'"),
        (5, 33, "mesh.axes.dta", f"{allowed}, got 'dta'; did you mean 'data'?"),
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
